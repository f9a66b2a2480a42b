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
    - ``malformed_by_type``: the skipped payloads per stored (type, version),
      each ``{type, version, count, first_offsets}`` (the first few offsets).
    - ``reduce_failures_by_type``: the skipped reduces per type, each
      ``{type, count, first_offsets}``.
    - ``dropped_events``: events an upcaster dropped (it returned DROP: the
      current code no longer reads their type); never folded, counted here.
    - ``stopped_at``: the offset of the event the engine stopped before (a
      payload newer than the code, or a malformed one its processor stalls
      on), or None; nothing at or after it is reduced by this engine.
    - ``refusing_cancel``: cancelled work still running now, by label;
      ``refused_cancel``: how many there ever were.
    - ``background_in_flight``: ``run_in_background`` attempts not yet settled.
    - ``pending_waiters``: callers of ``wait_until_processed`` still waiting.
    - ``claimed_at``: the revive time the engine wants claimed (the earliest
      of its deadlines), or None; ``claim_held``: the claim it last sent,
      which differs while a background claim stands after the work it
      covered settled (its revive releases it).
    - ``live_behind``: batches ran unpublished since the last live-state delta.
    - ``rebuild``: while a new contract version re-reduces the log before it
      serves, how far it came (``{version, through, target, events, seconds,
      events_per_second, eta_seconds}``); None otherwise.
    """

    events_reduced: int
    batches: int
    batch_failures: int
    last_error: BaseException | None
    failed_at: int | None
    malformed_payloads: int
    last_malformed: dict[str, Any] | None
    malformed_by_type: tuple[dict[str, Any], ...]
    reduce_failures: int
    last_reduce_failure: dict[str, Any] | None
    reduce_failures_by_type: tuple[dict[str, Any], ...]
    dropped_events: int
    stopped_at: int | None
    refusing_cancel: tuple[str, ...]
    refused_cancel: int
    background_in_flight: int
    pending_waiters: int
    claimed_at: float | None
    claim_held: float | None
    live_behind: bool
    rebuild: dict[str, Any] | None = None

    @classmethod
    def nothing_yet(cls) -> EngineStatistics:
        """The snapshot of an engine that has done nothing: every count 0, every incident None."""
        return cls(
            events_reduced=0,
            batches=0,
            batch_failures=0,
            last_error=None,
            failed_at=None,
            malformed_payloads=0,
            last_malformed=None,
            malformed_by_type=(),
            reduce_failures=0,
            last_reduce_failure=None,
            reduce_failures_by_type=(),
            dropped_events=0,
            stopped_at=None,
            refusing_cancel=(),
            refused_cancel=0,
            background_in_flight=0,
            pending_waiters=0,
            claimed_at=None,
            claim_held=None,
            live_behind=False,
        )

    @property
    def incidents(self) -> dict[str, Any]:
        """The incident fields as one mapping, as ``status`` shows them."""
        return {
            "malformed_payloads": self.malformed_payloads,
            "last_malformed": self.last_malformed,
            "malformed_by_type": [dict(kind) for kind in self.malformed_by_type],
            "reduce_failures": self.reduce_failures,
            "last_reduce_failure": self.last_reduce_failure,
            "reduce_failures_by_type": [dict(kind) for kind in self.reduce_failures_by_type],
            "dropped_events": self.dropped_events,
            "stopped_at": self.stopped_at,
            "refusing_cancel": list(self.refusing_cancel),
            "refused_cancel": self.refused_cancel,
        }
