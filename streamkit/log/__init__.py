"""The backend-neutral log: the :class:`Log` and :class:`Stream` API every backend serves."""

from streamkit.log._follow import Follow
from streamkit.log._log import MAX_READ_LIMIT, Log, ProcessorStreamView, Stream
from streamkit.log._types import read_matching, type_matcher
from streamkit.protocols import LogStats

__all__ = [
    "MAX_READ_LIMIT",
    "Follow",
    "Log",
    "LogStats",
    "ProcessorStreamView",
    "Stream",
    "read_matching",
    "type_matcher",
]
