"""The processor engine: one serial chain per processor over a stream."""

from streamkit.engine._engine import (
    MAX_CATCH_UP_PAGE,
    PAGE_SIZE,
    REVIVE_AFTER,
    REVIVE_AFTER_MAX,
    BatchInfo,
    EngineStatistics,
    ProcessorEngine,
    ProcessorSnapshot,
)
from streamkit.engine._fold import Fold
from streamkit.engine._skip_tally import SkipTally, shown_tally
from streamkit.engine._strays import CANCEL_WAIT

__all__ = [
    "CANCEL_WAIT",
    "MAX_CATCH_UP_PAGE",
    "PAGE_SIZE",
    "REVIVE_AFTER",
    "REVIVE_AFTER_MAX",
    "BatchInfo",
    "EngineStatistics",
    "Fold",
    "ProcessorEngine",
    "ProcessorSnapshot",
    "SkipTally",
    "shown_tally",
]
