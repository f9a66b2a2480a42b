"""The backend-neutral log: the :class:`Log` and :class:`Stream` API every backend serves.

A backend calls back on the log's :class:`Feed` (exported here with the
:class:`Push` it publishes and the :data:`WakeList` it fills): that is the
upward half of the backend boundary, whose downward half is
:class:`~streamkit.protocols.LogBackend`.
"""

from streamkit.log._follow import MAX_BUFFERED_BYTES, Feed, Follow, Push, WakeList, wake
from streamkit.log._log import Log
from streamkit.log._stream import MAX_READ_LIMIT, ProcessorStreamView, Stream
from streamkit.log._time import after_offset_for, timestamp_param
from streamkit.log._types import read_matching, type_matcher
from streamkit.protocols import LogStats

__all__ = [
    "MAX_BUFFERED_BYTES",
    "MAX_READ_LIMIT",
    "Feed",
    "Follow",
    "Log",
    "LogStats",
    "ProcessorStreamView",
    "Push",
    "Stream",
    "WakeList",
    "after_offset_for",
    "read_matching",
    "timestamp_param",
    "type_matcher",
    "wake",
]
