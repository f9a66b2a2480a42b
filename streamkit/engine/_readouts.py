"""What an engine reports: its identity, position, counters and incidents, read-only.

The half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it)
that hosts read for ``status`` and metrics. Every value is a plain read of
the engine's own fields (nothing here does I/O or changes the engine), so a
status request costs the engine nothing.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from streamkit.engine._claims import ClaimKeeper
from streamkit.engine._fold import Fold
from streamkit.engine._strays import Strays
from streamkit.engine._waiters import CursorWaiters
from streamkit.errors import StreamkitError
from streamkit.processor import StreamProcessor

__all__ = ["EngineReadouts"]

S = TypeVar("S")


class EngineReadouts(Generic[S]):
    """The read-only half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it).

    The attributes below are the engine's; they are named here so each
    property's use of them is checked.
    """

    _processor: StreamProcessor[S]
    _slug: str
    _version: str
    _cursor: int
    _latched: StreamkitError | None
    _events_reduced: int
    _batches: int
    _batch_failures: int
    _last_error: BaseException | None
    _failed_at: int | None
    _fold: Fold[S]
    _claims: ClaimKeeper
    _strays: Strays
    _waiters: CursorWaiters

    @property
    def processor(self) -> StreamProcessor[S]:
        """The processor this engine drives."""
        return self._processor

    @property
    def slug(self) -> str:
        """The processor's contract slug (its checkpoint and live-state key)."""
        return self._slug

    @property
    def version(self) -> str:
        """The contract version the state is reduced under."""
        return self._version

    @property
    def cursor(self) -> int:
        """The offset the state is reduced through (0 before the checkpoint is loaded)."""
        return self._cursor

    @property
    def latched_error(self) -> StreamkitError | None:
        """The non-retryable refusal every later call fails with, if one was latched."""
        return self._latched

    @property
    def events_reduced(self) -> int:
        """Events folded by the reduce (valid payloads only) by this engine."""
        return self._events_reduced

    @property
    def batches(self) -> int:
        """Batches committed by this engine."""
        return self._batches

    @property
    def batch_failures(self) -> int:
        """Batches that failed (and persisted nothing)."""
        return self._batch_failures

    @property
    def last_error(self) -> BaseException | None:
        """The latest failure: a failed batch, or a swallowed one (reduce, payload, effect)."""
        return self._last_error

    @property
    def failed_at(self) -> int | None:
        """The offset whose ``process_event`` or blocker failed the latest failed batch.

        None if that batch failed elsewhere (reading the log, writing the
        checkpoint) or none failed.
        """
        return self._failed_at

    @property
    def incidents(self) -> dict[str, Any]:
        """Payloads skipped as malformed, reduces that raised, work that ignored its cancel.

        Each latest is ``{offset, type, error}`` or None. Neither wedges the
        processor (a malformed payload is skipped, a raising reduce keeps the
        previous state), so this is where an operator sees them.
        ``refusing_cancel`` names the cancelled work still running now and
        ``refused_cancel`` counts all there were (see ``_strays``).
        """
        fold = self._fold
        return {
            "malformed_payloads": fold.malformed,
            "last_malformed": fold.last_malformed,
            "reduce_failures": fold.reduce_failures,
            "last_reduce_failure": fold.last_reduce_failure,
            "refusing_cancel": self._strays.refusing_cancel,
            "refused_cancel": self._strays.refused_cancel,
        }

    @property
    def background_in_flight(self) -> int:
        """``run_in_background`` attempts started and not yet settled."""
        return self._claims.in_flight

    @property
    def pending_waiters(self) -> int:
        """Callers of :meth:`wait_until_processed` still waiting."""
        return len(self._waiters)

    @property
    def claimed_at(self) -> float | None:
        """The revive time this engine wants claimed: the earliest of its deadlines, or None."""
        return self._claims.wanted

    @property
    def claim_held(self) -> float | None:
        """The claim this engine last sent, or None: what its stream holds once that landed.

        It differs from :attr:`claimed_at` while a background claim stands after
        the work it covered settled (its revive releases it).
        """
        return self._claims.held
