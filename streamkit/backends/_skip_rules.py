"""Recording an operator skip, whatever the backend: the checks, the event, its record.

:func:`record_skip` refuses what must not be skipped (an offset with no
durable event, a processor that never ran on the path, one already past the
offset, a second skip of the same offset with another reason, and an event
other than the one the processor is stalled at unless the operator says
``ahead``: a skip hides an event for good, so a mistyped offset must not
hide one the processor has not even met) before anything is written, and
then appends the ``streamkit.event-skipped`` event, naming the skipped
event's type, with its record sealed into the same transaction. A backend supplies the
three table operations (:class:`SkipStore`): where it keeps the records and
the facts about processors is its own business.
"""

from __future__ import annotations

from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit.errors import InvalidRequest
from streamkit.events import MAX_OFFSET, StreamEvent
from streamkit.log import Log, Stream
from streamkit.skips import SKIP_EVENT

__all__ = ["SkipStore", "record_skip"]


class SkipStore(Protocol):
    """A backend's skip records and the processor facts a skip is checked against."""

    def recorded_at(self, conn: Connection, path: str, slug: str, offset: int) -> int | None:
        """The offset of the skip event recorded for ``(path, slug, offset)``, or None."""
        ...

    def processor_facts(self, conn: Connection, path: str, slug: str) -> tuple[bool, int | None]:
        """Whether ``slug`` ever ran on ``path`` (a checkpoint or a lease), and its cursor."""
        ...

    def insert(self, conn: Connection, path: str, slug: str, offset: int, at: int) -> None:
        """Inside the skip event's transaction: record the skip (once; a repeat is ignored)."""
        ...


async def record_skip(
    log: Log,
    path: str,
    slug: str,
    offset: int,
    *,
    by: str,
    reason: str,
    store: SkipStore,
    ahead: bool = False,
    stalled_at: int | None = None,
) -> StreamEvent:
    """Skip the event at ``offset`` for processor ``slug`` on ``path``; return the skip event.

    Refused with :class:`~streamkit.errors.InvalidRequest` (nothing written)
    when the slug is empty or never ran on ``path`` here, no durable event has
    that offset, the processor's checkpoint is already past it (there is
    nothing left to skip), or it was skipped already with another ``by`` or
    ``reason`` (the message says by whom and why), or when the offset is not
    where the processor stands (``stalled_at`` as its host knows it, else the
    first durable event past its checkpoint) and ``ahead`` is False. The same
    skip again returns the event recorded the first time.
    """
    if isinstance(offset, bool) or not isinstance(offset, int) or not 1 <= offset <= MAX_OFFSET:
        raise InvalidRequest(
            f"the offset to skip must be an integer from 1 to {MAX_OFFSET} (2^63 - 1), got "
            f"{offset!r}; nothing was written",
            details={"path": path, "slug": slug, "offset": repr(offset)[:80]},
        )
    if not slug:
        raise InvalidRequest(
            "the processor slug to skip for is empty; name the processor (its contract slug, "
            "as `streamkit status` lists it); nothing was written",
            details={"path": path, "slug": slug, "offset": offset},
        )
    stream = log.stream(path)
    page = await stream.read(offset - 1, 1)
    if page is None or not page.events or page.events[0].offset != offset:
        raise InvalidRequest(
            f"there is no durable event at offset {offset} of {path!r} to skip for {slug!r}; "
            "nothing was written; `streamkit status` shows where the processor is stalled",
            details={"path": path, "slug": slug, "offset": offset},
        )
    earlier = await _existing_skip(log, path, slug, offset, store)
    if earlier is not None:
        previous = earlier.payload if isinstance(earlier.payload, dict) else {}
        if previous.get("by") == by and previous.get("reason") == reason:
            return earlier  # the same decision again: nothing new to record
        raise InvalidRequest(
            f"offset {offset} of {path!r} is already skipped for {slug!r}: by "
            f"{previous.get('by')!r}, because {previous.get('reason')!r} (recorded at offset "
            f"{earlier.offset}); a skip is recorded once, so nothing was written",
            details={
                "path": path,
                "slug": slug,
                "offset": offset,
                "by": previous.get("by"),
                "reason": previous.get("reason"),
                "recorded_at": earlier.offset,
            },
        )
    known, checkpoint = await log.query(lambda conn: store.processor_facts(conn, path, slug))
    if not known:
        raise InvalidRequest(
            f"no processor {slug!r} has run on {path!r} of this log (it has no checkpoint or "
            "lease here), so there is nothing to skip for it; check the slug with `streamkit "
            "status`; nothing was written",
            details={"path": path, "slug": slug, "offset": offset},
        )
    if checkpoint is not None and checkpoint >= offset:
        raise InvalidRequest(
            f"processor {slug!r} is already checkpointed through offset {checkpoint}, past "
            f"{offset}; there is nothing to skip and nothing was written",
            details={"path": path, "slug": slug, "offset": offset, "cursor": checkpoint},
        )
    skipped = page.events[0]
    if not ahead:
        await _refuse_unless_where_it_stands(stream, slug, skipped, checkpoint, stalled_at)
    payload: dict[str, Any] = {
        "slug": slug,
        "offset": offset,
        "type": skipped.type,
        "by": by,
        "reason": reason,
    }

    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        store.insert(conn, path, slug, offset, events[0].offset)

    return await log.append_control(
        path,
        {
            "type": SKIP_EVENT,
            "payload": payload,
            "idempotency_key": f"{SKIP_EVENT}/{slug}@{offset}",
        },
        seal,
    )


async def _refuse_unless_where_it_stands(
    stream: Stream, slug: str, skipped: StreamEvent, checkpoint: int | None, stalled_at: int | None
) -> None:
    """InvalidRequest unless ``skipped`` is the event the processor stands at."""
    if stalled_at is not None:
        stands, how = stalled_at, "is stalled at"
    else:
        after = await stream.read(checkpoint or 0, 1)
        if not after.events:
            return  # nothing past its checkpoint to compare with: the checks above hold
        stands, how = after.events[0].offset, "stands at its next event,"
    if skipped.offset == stands:
        return
    raise InvalidRequest(
        f"processor {slug!r} {how} offset {stands}, not {skipped.offset} (a "
        f"{skipped.type!r} event): a skip hides that event from it for good, so skipping an "
        'event other than the one it stands at needs --ahead ("ahead": true over HTTP); '
        "nothing was written",
        details={
            "slug": slug,
            "offset": skipped.offset,
            "type": skipped.type,
            "stands_at": stands,
            "reason": "not_where_it_stands",
        },
    )


async def _existing_skip(
    log: Log, path: str, slug: str, offset: int, store: SkipStore
) -> StreamEvent | None:
    """The skip event already recorded for ``(path, slug, offset)``, if any."""
    at = await log.query(lambda conn: store.recorded_at(conn, path, slug, offset))
    if at is None:
        return None
    page = await log.stream(path).read(at - 1, 1)
    return page.events[0] if page.events and page.events[0].offset == at else None
