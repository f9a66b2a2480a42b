"""The processor engine: one serial chain per processor over a stream."""

from streamkit.engine._engine import (
    PAGE_SIZE,
    REVIVE_AFTER,
    REVIVE_AFTER_MAX,
    BatchInfo,
    ProcessorEngine,
    ProcessorSnapshot,
)
from streamkit.engine._fold import Fold

__all__ = [
    "PAGE_SIZE",
    "REVIVE_AFTER",
    "REVIVE_AFTER_MAX",
    "BatchInfo",
    "Fold",
    "ProcessorEngine",
    "ProcessorSnapshot",
]
