"""What a log knows of the event types it is given: payloads checked at the door, retries compared.

An :class:`EventCatalog` holds the event definitions of some processor
contracts (their own and their dependencies'; where two define one type,
both). A log opened with contracts
(``open_log(..., contracts=[...])``, and every host's log, with the
contracts of the processors it runs) passes each appended event of a type
it knows through :meth:`EventCatalog.admit` before anything is written:

- an event that names no ``payload_version`` is of the current shape: its
  payload must validate against the current model, and it is stored at the
  definition's version (so a producer that forgot the version cannot have
  its current-shape payload lifted again as an old one); where the
  definitions of its type disagree on that version, it must name one (an
  event under a type's former name is of an old shape: unnamed, version 1).
  During a rolling deploy old producers still send the old shape unnamed: a
  catalog made with ``unversioned=N`` (a host's ``[schema] unversioned``)
  reads an unnamed payload as version N instead (or the type's current
  version, where that is older), lifting it like any named old one;
- one that names an older version is lifted through the upcasters and must
  validate at the end (a version a retired type's DROP ends at is refused:
  no reader would ever see it);
- one that names a version newer than the definition is stored as it is:
  this code cannot judge it, and the processors that read it run newer code.

An event must fit every definition of its type that can judge it. Anything
else is refused with :class:`~streamkit.errors.InvalidEvent`
naming the event, its type and version and the first problem, and nothing
of the call is written: a payload its readers could not read is never
committed. Types the catalog does not know pass as they are.

An admitted event also carries the catalog's comparison for idempotent
retries: a retry that reaches the log in another version (or under the
type's other name) than the event its key names is compared after both are
lifted to the newer version, so a retry across a deploy returns the stored
event instead of a spurious ``IDEMPOTENCY_CONFLICT``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from streamkit._event_builders import failure_text
from streamkit._json_canonical import canonical_json
from streamkit.contract import EventDefinition, ProcessorContract
from streamkit.errors import InvalidEvent
from streamkit.events import PreparedEvent, StreamEvent
from streamkit.upcasting import DROP, upcast

__all__ = ["EventCatalog"]


class EventCatalog:
    """The event definitions of some contracts, by the names events are stored under.

    Each stored name (a type, or a name a definition was ``renamed_from``)
    maps to every distinct definition that reads it: two processors may each
    define the same type, and an append must fit every one of them.
    """

    __slots__ = ("_kinds", "_readers")

    def __init__(
        self, contracts: Iterable[ProcessorContract[Any]], *, unversioned: int | None = None
    ) -> None:
        readers: dict[str, list[tuple[str, EventDefinition]]] = {}

        def add(stored: str, current: str, definition: EventDefinition) -> None:
            known = readers.setdefault(stored, [])
            if all(seen is not definition for _, seen in known):
                known.append((current, definition))

        for contract in contracts:
            for etype in contract.payload_schemas():
                definition = contract.definition_for(etype)
                assert definition is not None  # every type with a schema has its definition
                add(etype, etype, definition)
            for old, current in contract.renames().items():
                definition = contract.definition_for(current)
                assert definition is not None  # a rename belongs to a definition
                add(old, current, definition)
        self._readers = readers
        self._kinds = {
            stored: _Kind(stored, known, unversioned) for stored, known in readers.items()
        }

    def __bool__(self) -> bool:
        return bool(self._readers)

    def stamp(self, event: PreparedEvent) -> None:
        """Name the version of an event that names none, as :meth:`admit` does, checking nothing.

        What the test helpers do to their inputs (``reduce_processor``,
        ``memory_stream``), so a test reads an unnamed payload as a host stores it,
        while a malformed one still reaches the fold as a stored one would.
        """
        kind = self._kinds.get(event.type)
        if kind is None or event.version_named or kind.unnamed is None:
            return
        event.payload_version = kind.unnamed
        event.version_named = True

    def admit(self, events: list[PreparedEvent]) -> list[PreparedEvent]:
        """``events``, each of a known type checked and stamped (see the module); raise to refuse.

        The events are the log's own, prepared for this call and not yet handed
        to a writer: they are stamped in place.
        """
        kinds = self._kinds
        for event in events:
            kind = kinds.get(event.type)
            if kind is None:
                continue
            version = event.payload_version if event.version_named else kind.unnamed
            if kind.validators and version is not None and version == kind.current:
                # The commonest case by far: the current shape under the current name.
                try:
                    for validate in kind.validators:
                        validate(event.payload_json)
                except Exception as exc:
                    raise _refused(event, version, kind.problem(exc)) from exc
            else:
                version = self._check(event, version, kind.readers)
            event.payload_version = version
            event.version_named = True
            event.same_as = self.same_body
        return events

    def _check(
        self, event: PreparedEvent, version: int | None, readers: list[tuple[str, EventDefinition]]
    ) -> int:
        """The version ``event`` is stored at, once every reader that can judge it has."""
        if version is None:
            versions = sorted({d.version for current, d in readers if current == event.type})
            raise _refused(
                event,
                event.payload_version,
                f"the definitions read here disagree on its current version ({versions}); "
                "name its payload_version",
            )
        payload: Any = None
        for current, definition in readers:
            latest = definition.version
            if version > latest:
                continue  # newer than this reader: code that knows the version reads it
            model = definition.payload_schema
            try:
                if version == latest:
                    model.model_validate_json(event.payload_json)
                    continue
                if payload is None:
                    payload = json.loads(event.payload_json)
                lifted = upcast(current, payload, version, latest, definition.upcasters)
                if lifted is DROP:
                    raise _refused(
                        event,
                        version,
                        f"its readers drop every version-{version} event (the type is "
                        "retired); append the current shape, or a type still read",
                    )
                model.model_validate(lifted)
            except InvalidEvent as exc:
                if exc.details.get("index") == event.index:
                    raise  # already this event's refusal
                raise _refused(event, version, exc.message) from exc
            except Exception as exc:  # the model's refusal, or an upcaster's (user code)
                raise _refused(event, version, f"{model.__name__}: {failure_text(exc)}") from exc
        return version

    def same_body(self, prepared: PreparedEvent, existing: StreamEvent) -> bool:
        """Whether a retry and a stored event are one body, compared in the newer shape.

        Compared by a definition that reads both names; False (the key's
        conflict stands) when none does, or a payload cannot be lifted.
        """
        if canonical_json(json.loads(prepared.metadata_json)) != canonical_json(existing.metadata):
            return False
        stored_readers = self._readers.get(existing.type, [])
        for current, definition in self._readers.get(prepared.type, []):
            if any(seen is definition for _, seen in stored_readers):
                stored = existing.payload
                if isinstance(stored, BaseModel):
                    stored = stored.model_dump(mode="json")
                newer = max(prepared.payload_version, existing.payload_version)
                try:
                    retried = upcast(
                        current,
                        json.loads(prepared.payload_json),
                        prepared.payload_version,
                        newer,
                        definition.upcasters,
                    )
                    kept = upcast(
                        current, stored, existing.payload_version, newer, definition.upcasters
                    )
                except Exception:
                    return False
                return retried is not DROP and canonical_json(retried) == canonical_json(kept)
        return False


class _Kind:
    """What the catalog knows of one stored type name, worked out once."""

    __slots__ = ("current", "readers", "unnamed", "validators")

    def __init__(
        self, stored: str, readers: list[tuple[str, EventDefinition]], unversioned: int | None
    ) -> None:
        self.readers = readers
        # Under a former name an event is of an old shape: unnamed, it is version 1, as a
        # stored event without a version reads. None: the definitions disagree.
        own = {d.version for current, d in readers if current == stored}
        current: int | None = (own.pop() if own else 1) if len(own) <= 1 else None
        # The fast path: every reader reads this name, at one version, with no lifting.
        self.current = current
        # What an unnamed payload is read as: the current version, or the host's word for
        # producers of an older release (never newer than the current version).
        self.unnamed = (
            current if unversioned is None or current is None else min(unversioned, current)
        )
        plain = all(current == stored and d.version == self.unnamed for current, d in readers)
        self.validators: tuple[Callable[[str], Any], ...] = (
            tuple(d.payload_schema.__pydantic_validator__.validate_json for _, d in readers)
            if plain
            else ()
        )

    def problem(self, exc: Exception) -> str:
        """Which model refused a payload on the fast path, and why."""
        if isinstance(exc, ValidationError):
            return f"{exc.title}: {failure_text(exc)}"
        return failure_text(exc)


def _refused(event: PreparedEvent, version: int | None, why: str) -> InvalidEvent:
    return InvalidEvent(
        f'event #{event.index}: its "{event.type}" payload (version {version}) does not fit '
        f"the current definition: {why}; nothing was appended",
        details={
            "index": event.index,
            "field": "payload",
            "type": event.type,
            "version": version,
            "error": why[:300],
        },
    )
