"""The processor host: runs processors over a log as a daemon (``streamkit host``)."""

from streamkit.host._host import HostService, ProcessorHost
from streamkit.host._watch import Subscription

__all__ = ["HostService", "ProcessorHost", "Subscription"]
