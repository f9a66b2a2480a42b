"""What an engine has done so far, read at one moment: :class:`EngineStatistics`.

One frozen snapshot instead of many counters read one by one: the values in
it belong together (a status page shows them side by side), reading it does
no I/O and changes nothing, and it cannot change under its reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EngineStatistics"]


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A :class:`~streamkit.engine.ProcessorEngine`'s counters and incidents at one moment.

    - ``events_reduced``: events folded by the reduce (valid payloads only).
    - ``batches``: batches committed; ``batch_failures``: batches that failed
      (and persisted nothing).
    - ``last_error``: the latest failure, a failed batch or a swallowed one
      (reduce, payload, effect); ``failed_at``: the offset whose
      ``process_event`` or blocker failed the latest failed batch (None if it
      failed elsewhere, or none failed).
    - ``malformed_payloads`` / ``last_malformed``, ``reduce_failures`` /
      ``last_reduce_failure``: events skipped as malformed and reduces that
      raised (each latest ``{offset, type, error}`` or None); neither wedges
      the processor, so this is where an operator sees them.
    - ``dropped_events``: events an upcaster dropped (it returned DROP: the
      current code no longer reads their type); never folded, counted here.
    - ``refusing_cancel``: cancelled work still running now, by label;
      ``refused_cancel``: how many there ever were.
    - ``background_in_flight``: ``run_in_background`` attempts not yet settled.
    - ``pending_waiters``: callers of ``wait_until_processed`` still waiting.
    - ``claimed_at``: the revive time the engine wants claimed (the earliest
      of its deadlines), or None; ``claim_held``: the claim it last sent,
      which differs while a background claim stands after the work it
      covered settled (its revive releases it).
    - ``live_behind``: batches ran unpublished since the last live-state delta.
    """

    events_reduced: int
    batches: int
    batch_failures: int
    last_error: BaseException | None
    failed_at: int | None
    malformed_payloads: int
    last_malformed: dict[str, Any] | None
    reduce_failures: int
    last_reduce_failure: dict[str, Any] | None
    dropped_events: int
    refusing_cancel: tuple[str, ...]
    refused_cancel: int
    background_in_flight: int
    pending_waiters: int
    claimed_at: float | None
    claim_held: float | None
    live_behind: bool

    @property
    def incidents(self) -> dict[str, Any]:
        """The incident fields as one mapping, as ``status`` shows them."""
        return {
            "malformed_payloads": self.malformed_payloads,
            "last_malformed": self.last_malformed,
            "reduce_failures": self.reduce_failures,
            "last_reduce_failure": self.last_reduce_failure,
            "dropped_events": self.dropped_events,
            "refusing_cancel": list(self.refusing_cancel),
            "refused_cancel": self.refused_cancel,
        }
