"""The stream a host's engine runs over: fenced by its lease, skips hidden, claims reported.

One per engine incarnation (:class:`EngineStream`), bound to the lease that
engine runs under. Every durable append it makes commits only under that
lease (the fence runs in the append's transaction) and carries
``source.processor.lease``, so the log shows which holder wrote it and that
no stale holder wrote after a takeover.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from streamkit.events import EventInput, ReadPage, StreamEvent
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import ProcessorStreamView
from streamkit.skips import filter_page

__all__ = ["EngineStream"]


class EngineStream:
    """The stream an engine sees: the processor's view, minus skipped events, claims reported.

    One per engine incarnation, bound to the lease that engine runs under: its
    appends are fenced by that lease and no other, so an old engine's late
    append can never pass under a lease taken again later.
    """

    __slots__ = ("_held", "_on_claim", "_skipped", "_view")

    def __init__(
        self,
        view: ProcessorStreamView,
        held: HeldLease,
        skipped: set[int],
        on_claim: Callable[[float | None], None],
    ) -> None:
        self._view = view
        self._held = held
        self._skipped = skipped  # the runner's own set: skips made later apply at once
        self._on_claim = on_claim

    @property
    def path(self) -> str:
        return self._view.path

    async def append(self, *events: EventInput | Mapping[str, Any]) -> list[StreamEvent]:
        # Every durable append of the engine commits only under its own lease.
        held = self._held
        lease = held.lease
        stamp = {"owner": lease.owner, "generation": lease.generation}
        return await self._view.append(*(_with_lease(e, stamp) for e in events), fence=held.fence)

    async def read(
        self,
        after_offset: int = 0,
        limit: int = 500,
        *,
        types: Mapping[str, type[BaseModel]] | None = None,
    ) -> ReadPage:
        # A processor that needs history retention archived (a rebuild, a new
        # processor) reads it from the archive, through the same fold.
        page = await self._view.read(after_offset, limit, types=types, include_archive=True)
        return filter_page(page, self._skipped)

    async def claim(self, at: float | None) -> None:
        await self._view.claim(at)
        self._on_claim(at)


def _with_lease(
    event: EventInput | Mapping[str, Any], stamp: dict[str, Any]
) -> EventInput | Mapping[str, Any]:
    """An engine's event with ``source.processor.lease`` naming the lease it is written under.

    The engine stamps ``source.processor`` on what the processor appends; the
    host adds which owner and generation wrote it, so the log itself shows
    that no stale holder wrote after a takeover.
    """
    # Plain dicts (what the engine's stamping makes) skip the ABC checks: this
    # runs for every event a processor appends.
    if type(event) is not dict and not isinstance(event, Mapping):
        return event
    source = event.get("source")
    if type(source) is not dict and not isinstance(source, Mapping):
        return event
    processor = source.get("processor")
    if type(processor) is not dict and not isinstance(processor, Mapping):
        return event
    return {**event, "source": {**source, "processor": {**processor, "lease": stamp}}}
