"""The processor engine: one serial chain per processor over a stream."""

from streamkit.engine._engine import (
    MAX_CATCH_UP_PAGE,
    PAGE_SIZE,
    REVIVE_AFTER,
    REVIVE_AFTER_MAX,
    BatchInfo,
    ProcessorEngine,
    ProcessorSnapshot,
)
from streamkit.engine._fold import Fold

__all__ = [
    "MAX_CATCH_UP_PAGE",
    "PAGE_SIZE",
    "REVIVE_AFTER",
    "REVIVE_AFTER_MAX",
    "BatchInfo",
    "Fold",
    "ProcessorEngine",
    "ProcessorSnapshot",
]
