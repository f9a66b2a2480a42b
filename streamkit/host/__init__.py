"""The processor host: runs processors over a log as a daemon (``streamkit host``)."""

from streamkit.host._host import HostService, ProcessorHost
from streamkit.host._live_watch import Subscription
from streamkit.host._logging import configure_logging
from streamkit.host._metrics import parse_created_at
from streamkit.host._runner import ProcessorRunner

__all__ = [
    "HostService",
    "ProcessorHost",
    "ProcessorRunner",
    "Subscription",
    "configure_logging",
    "parse_created_at",
]
