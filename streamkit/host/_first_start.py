"""A new processor's first checkpoint, written where it declared it starts.

A processor may declare where it starts on its path the first time it runs
there (``start``: ``beginning``, ``start`` or ``head``; see
:mod:`streamkit.contract`). A version of a slug that never served, declared
to start past offset 1, gets its first checkpoint written there, with its
``streamkit.processor-began`` record, in one transaction, before its engine
first loads a checkpoint: ``start`` is after the history retention took (the
path's start, minus one), ``head`` after the path's head as it is then. A
failure fails the engine's load (retried with backoff): the engine never
starts from offset 0 against the declaration, which could run effects for the
whole history. Another host that began it first wins; this one restores from
its checkpoint.
"""

from __future__ import annotations

from typing import Any

import structlog

from streamkit.contract import StartFrom
from streamkit.errors import InvalidRequest
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.processor import StreamProcessor
from streamkit.protocols import Clock, FirstCheckpoint, HostStore

__all__ = ["FirstStart"]

_log = structlog.get_logger("streamkit.host")


class FirstStart:
    """The declared start of one runner's processor, and its first checkpoint when due."""

    def __init__(
        self,
        start: StartFrom | None,
        processor: StreamProcessor[Any],
        *,
        path: str,
        log: Log,
        store: HostStore,
        clock: Clock,
    ) -> None:
        self._start = start
        self._processor = processor
        self._path = path
        self._log = log
        self._store = store
        self._clock = clock
        self._held: HeldLease | None = None
        self.began: dict[str, Any] | None = None
        """The record of its first checkpoint past offset 1, when this host wrote it."""

    def arm(self, held: HeldLease, *, never_served: bool) -> None:
        """Under ``held``, a new engine: its first checkpoint is due if the slug never served
        and it declared a start past offset 1."""
        declared = self._start in ("start", "head")
        self._held = held if declared and never_served else None

    async def before_load(self) -> None:
        """The engine's hook before it loads its checkpoint: write the first one, if due."""
        held = self._held
        if held is None:
            return
        contract = self._processor.contract
        if self._start == "head":
            after = await self._log.stream(self._path).head()
        else:
            known = await self._store.retention.horizons(self._clock(), self._path)
            after = known[0].start - 1 if known else 0
        try:
            first = FirstCheckpoint(
                contract.slug,
                contract.version,
                contract.dump_state(contract.initial_state()),
                str(self._start),
                after,
                held.lease.owner,
            )
            record = await self._store.begin_processor(held, self._path, first)
        except InvalidRequest:
            began = await self._store.version_rows(contract.slug, contract.version)
            if began[0] is None:
                raise
            self._held = None  # another host began it meanwhile: restore from it
            return
        self._held = None
        self.began = {**record.payload, "offset": record.offset}
        _log.warning(
            "processor.began",
            slug=contract.slug,
            path=self._path,
            start=self._start,
            first_offset=after + 1,
            skipped=after,
            record=record.offset,
            detail="a new processor declared where it starts: the offsets before it are "
            "never reduced by it",
        )
