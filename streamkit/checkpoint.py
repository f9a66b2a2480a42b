"""Reduce checkpoints: what a processor's stored state and cursor are, and the rules a write obeys.

A checkpoint is one row per processor slug and contract version: the version the
state was reduced under, the cursor (the offset every effect has run through), the state
as JSON (NULL while the reduce has never changed the initial state), and the
offset that state was reduced through (NULL: the cursor). The engine reads it
once when it starts and writes it once per batch; a large state is written
only every so many events, and a restart reduces the durable events between
the state's offset and the cursor again (reduce only: their effects ran).

One version of each slug is *serving*: its effects run, and status and
snapshots show its row. Another version builds its own row in the shadow
(reduce only) until it reaches the serving version's cursor; then one
write, the *cutover* (:meth:`~streamkit.protocols.CheckpointStorage.serve`),
makes it serving from that offset on. The row it replaced is kept, so a
rollback finds it where it stopped.

Every store (:class:`~streamkit.protocols.CheckpointStorage`; the SQLite one
is :class:`~streamkit.ReduceCheckpointTable`) keeps these rules:

- A write moves the cursor, the version and (when given) the state together,
  or nothing at all.
- ``state_json=None`` leaves the stored state exactly as it was; the cursor and
  version still move. An unchanged state costs no rewrite of a large column.
- ``state_offset`` is stored as given: ``None`` says the state (written now or
  kept) is the cursor's; an offset says it lags, reduced through that offset.
  It is never past the cursor.
- A cutover writes the new version's row (state whole) and moves the serving
  mark in one transaction, and only while the version it replaces still
  serves at or below the cutover offset (:func:`check_cutover`; else
  :class:`~streamkit.errors.CutoverRaced` and nothing is written). One
  version serves at a time.
- :func:`check_checkpoint` runs before any storage is touched: a malformed
  write, or a state past :data:`MAX_CHECKPOINT_STATE_BYTES`, is refused and the
  stored checkpoint stays as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from streamkit.errors import CheckpointTooLarge, CutoverRaced, InvalidRequest, VersionRetired

__all__ = [
    "BEGAN_EVENT",
    "CUTOVER_EVENT",
    "MAX_CHECKPOINT_STATE_BYTES",
    "SHADOW_MARK",
    "CheckpointRow",
    "ReduceCheckpoint",
    "check_checkpoint",
    "check_cutover",
    "check_not_retired",
    "check_rollback",
    "checkpoint_of",
    "shadow_lease_slug",
    "shown_cursor",
    "shown_snapshot",
]

CUTOVER_EVENT = "streamkit.cutover"
"""The control event a host's cutover appends on the processor's path, in the cutover's transaction.

Its payload is ``{slug, from_version, to_version, offset}``: ``offset`` is
where the new version's effects begin (after it). Written only by the cutover;
it is a record for people and tools, and no processor consumes it.
"""

BEGAN_EVENT = "streamkit.processor-began"
"""The control event of a processor's first checkpoint on its path, when it declared it starts
past offset 1 (``start = "start"`` or ``"head"``): ``{slug, version, start, from, skipped, by}``.

``from`` is the first offset it reduces; ``skipped`` how many offsets below
it (taken by retention or not) it never reduces. Written in the transaction
of that first checkpoint, so no processor starts past history unrecorded.
"""

SHADOW_MARK = "~"
"""Between a slug and a version in the name of a shadow lease (a slug never holds it)."""


def shadow_lease_slug(slug: str, version: str) -> str:
    """The lease name under which ``version`` of ``slug`` builds in the shadow on a host."""
    return f"{slug}{SHADOW_MARK}{version}"


MAX_CHECKPOINT_STATE_BYTES: int = 2 * 1024 * 1024 - 4096
"""The largest serialized state (UTF-8 bytes) one checkpoint row may hold.

A state that grows past it is a reduce that keeps the events rather than a
summary of them; retrying cannot help, so the refusal is not retryable.
"""


@dataclass(frozen=True, slots=True)
class ReduceCheckpoint:
    """A stored checkpoint as read back.

    ``state_json`` is ``None`` when the reduce never changed the initial state;
    the caller then starts from its contract's initial state. ``state_offset``
    is ``None`` when that state is the cursor's, else the offset it was
    reduced through (the events after it, up to the cursor, are reduced
    again on restore).
    """

    reducer_version: str
    reduced_through_offset: int
    state_json: str | None
    state_offset: int | None = None
    serving: bool = True
    """Whether this version is the slug's serving one (a shadow's row is not)."""
    cutover_offset: int = 0
    """The offset this version last became serving at: its effects ran for the events after it."""
    retired_at: int | None = None
    """Where a cutover replaced this version (None: never, or served again since).

    A retired version does not build or serve again by itself: hosts still
    running its code leave the processor to those running the serving one,
    until an operator's rollback lifts it (:func:`check_not_retired`).
    """

    retain_from: int | None = None
    """What the stored state still needs from the log (its processor's ``retain_from``)."""

    @property
    def state_through_offset(self) -> int:
        """The offset the stored state was reduced through."""
        return self.reduced_through_offset if self.state_offset is None else self.state_offset


class CheckpointRow(NamedTuple):
    """A checkpoint write as a store takes it (checked already by :func:`check_checkpoint`).

    ``path`` is the stream the processor reads (None: a store that was not
    told; such a row holds back retention on every path). ``retain_from`` is
    what the processor's state still needs
    (:meth:`~streamkit.StreamProcessor.retain_from`; None: nothing beyond the cursor).
    """

    slug: str
    reducer_version: str
    reduced_through_offset: int
    state_json: str | None
    state_offset: int | None = None
    path: str | None = None
    retain_from: int | None = None


def checkpoint_of(row: Sequence[Any]) -> ReduceCheckpoint:
    """The checkpoint of a stored row, its columns in the order the table has them."""
    version, offset, state, state_offset, serving, cutover, retired, retain_from = row
    return ReduceCheckpoint(
        reducer_version=str(version),
        reduced_through_offset=int(offset),
        state_json=None if state is None else str(state),
        state_offset=None if state_offset is None else int(state_offset),
        serving=bool(serving),
        cutover_offset=int(cutover),
        retired_at=None if retired is None else int(retired),
        retain_from=None if retain_from is None else int(retain_from),
    )


def check_not_retired(slug: str, own: ReduceCheckpoint | None, serving: ReduceCheckpoint) -> None:
    """Refuse to run a version a cutover replaced, while another version serves.

    :class:`~streamkit.errors.VersionRetired` (not retryable): the hosts
    still running its code leave the processor to those running the serving
    version, rather than build it again and cut back (two releases taking
    turns). An operator's rollback lifts it.
    """
    if own is None or own.retired_at is None or own.serving:
        return
    raise VersionRetired(
        f"processor {slug!r}: version {own.reducer_version!r} was replaced by version "
        f"{serving.reducer_version!r} at offset {own.retired_at}; this code is version "
        f"{own.reducer_version!r}, so it leaves the processor to hosts running version "
        f"{serving.reducer_version!r}; deploy that code here, or make version "
        f"{own.reducer_version!r} serve again with `streamkit processor rollback {slug} "
        f"--to {own.reducer_version}`; nothing was processed",
        details={
            "slug": slug,
            "version": own.reducer_version,
            "serving": serving.reducer_version,
            "retired_at": own.retired_at,
        },
        retryable=False,
    )


def check_rollback(
    slug: str, version: str, serving: ReduceCheckpoint | None, own: ReduceCheckpoint | None
) -> None:
    """Refuse a rollback to ``version`` that would not make it serve again (InvalidRequest).

    A rollback lifts the retirement of a version a cutover replaced; hosts
    running its code then build it from its kept row up to the serving
    cursor and cut back over, with the same fence as any cutover.
    """
    problem = None
    if own is None:
        problem = f"version {version!r} of {slug!r} has no checkpoint in this log"
    elif own.serving:
        problem = f"version {version!r} of {slug!r} serves already"
    elif own.retired_at is None:
        problem = (
            f"version {version!r} of {slug!r} was never replaced (it is a version building in "
            "the shadow: it cuts over by itself)"
        )
    if problem is not None:
        raise InvalidRequest(
            f"rollback refused: {problem}; nothing was changed",
            details={
                "slug": slug,
                "version": version,
                "serving": None if serving is None else serving.reducer_version,
            },
        )


def check_checkpoint(
    slug: object,
    reducer_version: object,
    reduced_through_offset: object,
    state_json: object,
    state_offset: object = None,
    retain_from: object = None,
) -> None:
    """Refuse a checkpoint write no store may take, before any storage is touched.

    Every :class:`~streamkit.protocols.CheckpointStorage` calls it first:
    malformed arguments are :class:`~streamkit.errors.InvalidRequest`, a state
    that is not valid Unicode text likewise, and a state over
    :data:`MAX_CHECKPOINT_STATE_BYTES` is :class:`~streamkit.errors.CheckpointTooLarge`
    (not retryable). Nothing is written in any of these cases.
    """
    _check_arguments(
        slug, reducer_version, reduced_through_offset, state_json, state_offset, retain_from
    )
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


def check_cutover(
    slug: str,
    version: str,
    through: int,
    serving: ReduceCheckpoint | None,
    replacing: str | None,
) -> None:
    """Refuse a cutover of ``version`` at ``through`` unless ``replacing`` still serves below it.

    ``serving`` is the slug's serving row as read inside the cutover's
    transaction (locked where the backend can). ``replacing`` is the version
    the new one took its target from (None: the slug had none). The serving
    version moved on (another version cut over, or it processed events past
    ``through``): :class:`~streamkit.errors.CutoverRaced`, nothing written.
    """
    if serving is None:
        if replacing is None:
            return
        now, moved = None, "no version serves any more"
    else:
        now = serving.reducer_version
        if now == replacing:
            if serving.reduced_through_offset <= through:
                return
            moved = f"version {now!r} has processed through offset {serving.reduced_through_offset}"
        else:
            moved = f"version {now!r} serves now"
    raise CutoverRaced(
        f"processor {slug!r}: the cutover of version {version!r} at offset {through} was "
        f"refused: it was built to replace version {replacing!r}, but {moved}; nothing was "
        "written; the new version reduces the events since and tries again",
        details={"slug": slug, "version": version, "through": through, "serving": now},
    )


def _check_arguments(
    slug: object,
    reducer_version: object,
    reduced_through_offset: object,
    state_json: object,
    state_offset: object,
    retain_from: object,
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
    elif state_offset is not None and (
        isinstance(state_offset, bool)
        or not isinstance(state_offset, int)
        or not 0 <= state_offset <= reduced_through_offset
    ):
        problem = (
            f"state_offset must be None or an integer from 0 to reduced_through_offset "
            f"({reduced_through_offset}), got {state_offset!r}"
        )
    elif retain_from is not None and (
        isinstance(retain_from, bool) or not isinstance(retain_from, int) or retain_from < 0
    ):
        problem = f"retain_from must be None or an integer >= 0, got {retain_from!r}"
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


def shown_snapshot(snapshot: dict[str, Any], head: int) -> dict[str, Any]:
    """A snapshot as shown: its ``offset`` (and ``cursor``) never past the durable head.

    The same rule as :func:`shown_cursor`, so ``snapshot``, ``status`` and the
    log name one number for one thing.
    """
    shown = dict(snapshot)
    for key in ("offset", "cursor"):
        if isinstance(shown.get(key), int):
            shown[key] = min(shown[key], head)
    return shown
