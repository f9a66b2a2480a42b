"""The effects a processor's ``process_event`` appends: checked, stamped, and rerun-safe.

Every event an effect appends must be a type the contract ``emits``, with a
payload that matches its declared schema (else ``UNDECLARED_EMIT`` or
``INVALID_EVENT``, and nothing is appended), and is stamped
``source.processor = {slug, version, while_processing}``, so the log shows
which processor wrote it while processing which event. A rerun of an effect
(after a failed batch or a crash) that meets its own first run's event under
the same idempotency key keeps that event instead of failing forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from pydantic import BaseModel

from streamkit.contract import ProcessorContract
from streamkit.engine._fold import report
from streamkit.errors import IdempotencyConflict, InvalidEvent, UndeclaredEmit
from streamkit.events import EventInput, StreamEvent
from streamkit.protocols import ProcessorStream

__all__ = ["EffectAppender"]

_INPUT_FIELDS = tuple(f.name for f in fields(EventInput))

Swallowed = Callable[[str, BaseException, StreamEvent | None], None]


class EffectAppender:
    """Appends the effects of one processor's engine to its stream."""

    def __init__(
        self, contract: ProcessorContract[Any], stream: ProcessorStream, swallowed: Swallowed
    ) -> None:
        self._contract = contract
        self._slug = contract.slug
        self._version = contract.version
        self._emits = frozenset(contract.emits)
        self._stream = stream
        self._swallowed = swallowed

    def emit(
        self, during: StreamEvent | None, events: Sequence[EventInput | Mapping[str, Any]]
    ) -> asyncio.Task[list[StreamEvent]]:
        """Stamp and start an append made by ``process_event``; a failure is reported, not raised."""
        processor_source: dict[str, Any] = {"slug": self._slug, "version": self._version}
        if during is not None:
            processor_source["while_processing"] = {"offset": during.offset, "type": during.type}
        stamped = [self._stamp(raw, index, processor_source) for index, raw in enumerate(events)]
        task = asyncio.get_running_loop().create_task(self._append(during, stamped))

        def appended(done: asyncio.Task[list[StreamEvent]]) -> None:
            error = None if done.cancelled() else done.exception()
            if error is not None:
                self._swallowed("processor.append_failed", error, during)

        task.add_done_callback(appended)
        return task

    async def _append(
        self, during: StreamEvent | None, events: list[dict[str, Any]]
    ) -> list[StreamEvent]:
        """Append an effect's events; on a rerun of the same effect, keep what the first run wrote.

        A batch that failed, or ran before a crash, runs its effects again. An
        effect whose body is not deterministic (a timestamp in its payload)
        then meets its own earlier event under the same idempotency key with a
        different body, and a plain append would refuse it on every retry,
        wedging the processor. The rule: when the event a key already names was
        written by THIS processor while processing THIS same event, it is the
        first run's output of this very effect, and the rerun returns it (the
        first run's body stands). Any other conflict is raised as it is.
        """
        pending = events
        for _ in range(len(events)):
            try:
                return await self._stream.append(*pending)
            except IdempotencyConflict as exc:
                earlier = await self._earlier_run_of(during, exc)
                key = exc.details.get("key")
                if earlier is None or not any(e.get("idempotency_key") == key for e in pending):
                    raise
                report(
                    "processor.effect_rerun_kept_first",
                    None,
                    slug=self._slug,
                    offset=None if during is None else during.offset,
                    key=key,
                    recorded_at=earlier.offset,
                    detail="a rerun's body differed; the event the first run wrote stands",
                )
                pending = [
                    {**e, "payload": earlier.payload, "metadata": earlier.metadata}
                    if e.get("idempotency_key") == key
                    else e
                    for e in pending
                ]
        return await self._stream.append(*pending)

    async def _earlier_run_of(
        self, during: StreamEvent | None, conflict: IdempotencyConflict
    ) -> StreamEvent | None:
        """The event ``conflict`` names, if this processor wrote it while processing ``during``."""
        offset = conflict.details.get("offset")
        if during is None or not isinstance(offset, int) or offset < 1:
            return None
        page = await self._stream.read(offset - 1, 1)
        if not page.events or page.events[0].offset != offset:
            return None
        existing = page.events[0]
        source = existing.source if isinstance(existing.source, Mapping) else {}
        stamp = source.get("processor")
        if not isinstance(stamp, Mapping) or stamp.get("slug") != self._slug:
            return None
        seen = stamp.get("while_processing")
        if not isinstance(seen, Mapping) or seen.get("offset") != during.offset:
            return None
        return existing

    def _stamp(
        self, raw: EventInput | Mapping[str, Any], index: int, processor_source: dict[str, Any]
    ) -> dict[str, Any]:
        if isinstance(raw, EventInput):
            data = {name: getattr(raw, name) for name in _INPUT_FIELDS}
        elif isinstance(raw, Mapping):
            data = dict(raw)
        else:
            raise InvalidEvent(
                f"event #{index}: expected an EventInput or a mapping, got "
                f"{type(raw).__name__}; nothing was appended",
                details={"index": index},
            )
        etype = data.get("type")
        if not isinstance(etype, str) or etype not in self._emits:
            raise UndeclaredEmit(
                f'processor "{self._slug}" tried to append {etype!r}, which its contract does '
                f"not list in emits ({sorted(self._emits)}); nothing was appended; add it to "
                "emits (and define it in events or a dependency)",
                details={"slug": self._slug, "type": repr(etype)[:300]},
            )
        schema = self._contract.payload_schema_for(etype)
        payload = data.get("payload")
        checked = schema is None or isinstance(payload, schema)
        if isinstance(payload, BaseModel):
            # Its JSON form, once, here: the log then takes a plain dict by its
            # shortest path, and a model of the declared schema needs no check.
            try:
                payload = payload.model_dump(mode="json")
            except Exception as exc:
                raise _refused(index, etype, "cannot be serialized to JSON", exc) from exc
            data["payload"] = payload
        if schema is not None and not checked:
            try:
                schema.model_validate(payload or {})
            except Exception as exc:
                why = f"does not match its declared schema {schema.__name__}"
                raise _refused(index, etype, why, exc) from exc
        if schema is not None:
            # The payload is of the current model, so it is of the current version: said
            # only when not 1 (a dict without the field stays on the log's shortest path).
            version = self._contract.payload_version_of(etype)
            named = data.get("payload_version")
            if named is not None and named != version:
                raise InvalidEvent(
                    f'event #{index}: "{etype}" names payload_version {named!r}, but its payload '
                    f"is of the current model {schema.__name__}, version {version}; nothing was "
                    "appended; leave payload_version out",
                    details={"index": index, "field": "payload_version", "type": etype},
                )
            if version != 1:
                data["payload_version"] = version
        source = data.get("source")
        if source is None or isinstance(source, Mapping):
            data["source"] = {**(source or {}), "processor": processor_source}
        return data


def _refused(index: int, etype: str, why: str, exc: Exception) -> InvalidEvent:
    """The refusal of an emitted event's payload (``why`` it was refused, ``exc`` the cause)."""
    return InvalidEvent(
        f'event #{index}: the payload of "{etype}" {why} ({exc}); nothing was appended',
        details={"index": index, "field": "payload", "type": etype},
    )
