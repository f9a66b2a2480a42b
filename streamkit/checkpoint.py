"""Reduce checkpoints: what a processor's stored state and cursor are, and the rules a write obeys.

A checkpoint is one row per processor slug: the contract version the state was
reduced under, the offset it was reduced through, and the state as JSON (NULL
while the reduce has never changed the initial state). The engine reads it once
when it starts and writes it once per batch.

Every store (:class:`~streamkit.protocols.CheckpointStorage`; the SQLite one
is :class:`~streamkit.ReduceCheckpointTable`) keeps these rules:

- A write moves the cursor, the version and (when given) the state together,
  or nothing at all.
- ``state_json=None`` leaves the stored state exactly as it was; the cursor and
  version still move. An unchanged state costs no rewrite of a large column.
- :func:`check_checkpoint` runs before any storage is touched: a malformed
  write, or a state past :data:`MAX_CHECKPOINT_STATE_BYTES`, is refused and the
  stored checkpoint stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamkit.errors import CheckpointTooLarge, InvalidRequest

__all__ = ["MAX_CHECKPOINT_STATE_BYTES", "ReduceCheckpoint", "check_checkpoint", "shown_cursor"]

MAX_CHECKPOINT_STATE_BYTES: int = 2 * 1024 * 1024 - 4096
"""The largest serialized state (UTF-8 bytes) one checkpoint row may hold.

A state that grows past it is a reduce that keeps the events rather than a
summary of them; retrying cannot help, so the refusal is not retryable.
"""


@dataclass(frozen=True, slots=True)
class ReduceCheckpoint:
    """A stored checkpoint as read back.

    ``state_json`` is ``None`` when the reduce never changed the initial state;
    the caller then starts from its contract's initial state.
    """

    reducer_version: str
    reduced_through_offset: int
    state_json: str | None


def check_checkpoint(
    slug: object, reducer_version: object, reduced_through_offset: object, state_json: object
) -> None:
    """Refuse a checkpoint write no store may take, before any storage is touched.

    Every :class:`~streamkit.protocols.CheckpointStorage` calls it first:
    malformed arguments are :class:`~streamkit.errors.InvalidRequest`, a state
    that is not valid Unicode text likewise, and a state over
    :data:`MAX_CHECKPOINT_STATE_BYTES` is :class:`~streamkit.errors.CheckpointTooLarge`
    (not retryable). Nothing is written in any of these cases.
    """
    _check_arguments(slug, reducer_version, reduced_through_offset, state_json)
    if isinstance(state_json, str):
        try:
            size = len(state_json.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidRequest(
                f'checkpoint "{slug}": the state JSON is not valid Unicode text ({exc.reason} '
                f"at character {exc.start}); serialize it with ensure_ascii=True or fix the "
                "value; nothing was written",
                details={"slug": slug, "position": exc.start},
            ) from exc
        if size > MAX_CHECKPOINT_STATE_BYTES:
            raise CheckpointTooLarge(
                f'checkpoint "{slug}": the reduced state serializes to {size} bytes, over '
                f"the ceiling of {MAX_CHECKPOINT_STATE_BYTES} bytes (2 MiB - 4 KiB) for one "
                "checkpoint row; a reduce must keep a summary, not the events; nothing was "
                "written and the stored checkpoint is unchanged",
                details={"slug": slug, "size": size, "limit": MAX_CHECKPOINT_STATE_BYTES},
                retryable=False,
            )


def _check_arguments(
    slug: object, reducer_version: object, reduced_through_offset: object, state_json: object
) -> None:
    problem: str | None = None
    if not isinstance(slug, str) or not slug:
        problem = f"slug must be a non-empty string, got {slug!r}"
    elif not isinstance(reducer_version, str):
        problem = f"reducer_version must be a string, got {reducer_version!r}"
    elif (
        isinstance(reduced_through_offset, bool)
        or not isinstance(reduced_through_offset, int)
        or reduced_through_offset < 0
    ):
        problem = f"reduced_through_offset must be an integer >= 0, got {reduced_through_offset!r}"
    elif state_json is not None and not isinstance(state_json, str):
        problem = f"state_json must be a JSON string or None, got {type(state_json).__name__}"
    if problem is not None:
        raise InvalidRequest(
            f"checkpoint write refused: {problem}; nothing was written",
            details={"slug": repr(slug)[:200]},
        )


def shown_cursor(cursor: int | None, head: int) -> int | None:
    """The cursor as status shows it: never past the durable head.

    An engine's cursor passes the head when it reduced through offsets that
    went to ephemerals; no durable event can land below it, so "through the
    head" is the whole truth for an operator.
    """
    return None if cursor is None else min(cursor, head)
