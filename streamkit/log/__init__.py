"""The backend-neutral log: the :class:`Log` and :class:`Stream` API every backend serves."""

from streamkit.log._log import (
    MAX_READ_LIMIT,
    Follow,
    Log,
    LogStats,
    ProcessorStreamView,
    Stream,
)

__all__ = [
    "MAX_READ_LIMIT",
    "Follow",
    "Log",
    "LogStats",
    "ProcessorStreamView",
    "Stream",
]
