"""Processor contracts: what a processor is called, what it folds into, what it reads and writes.

A :class:`ProcessorContract` names a processor (its ``slug``, the key of its
checkpoint and live state), the ``version`` its state was reduced under, the
event types it ``consumes`` and ``emits``, and how to build its initial state.
:func:`define_processor_contract` builds one from pydantic models: a state
schema and a catalog of the events the processor owns, each with a payload
schema. The engine validates a consumed payload against the catalog before the
reduce sees it.

Guarantees: a contract that exists is well-formed. Every refusal raises
:class:`~streamkit.errors.InvalidContract` at definition time, naming the field
and the value, so a processor with a broken contract never starts:

- the slug is 1-128 characters of letters, digits, ``-``, ``_`` and ``.``,
  starting with a letter or digit; the version is a non-empty string;
- the state schema is a pydantic model that constructs from ``{}`` and whose
  initial state survives a JSON round trip (checkpoints store it as JSON);
- ``consumes`` and ``emits`` are lists of type strings (a bare string is
  refused, not split into characters); ``emits`` may not be ``"*"``;
- no event type is owned both locally and by a dependency, or by two
  dependencies; no processor depends on itself or lists a dependency twice;
- when the contract has an events catalog, every type it consumes or emits is
  known: owned locally or by a dependency (``"*"`` aside);
- nothing declares, consumes or emits the live-state delta type
  (``streamkit.live-state-changed``): deltas describe state and never feed it;
- ``on_malformed`` and ``on_reduce_error`` are ``"skip"``, ``"stall"`` or
  unset (``None``: the host's default, else ``"stall"``; see
  :func:`failure_choice`).

A contract with no catalog (``events=None``) is allowed: its reduce sees raw
dict payloads. A hand-built :class:`ProcessorContract` with an ``initial``
factory instead of a state schema keeps a raw JSON state (dicts, lists,
numbers), checkpointed with :mod:`json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from streamkit.errors import InvalidContract
from streamkit.events import MAX_TYPE_LENGTH
from streamkit.failure_policy import (
    OnMalformed,
    OnReduceError,
    check_on_malformed,
    check_on_reduce_error,
)
from streamkit.live_state import LIVE_STATE_CHANGED
from streamkit.upcasting import Upcaster, check_versions

__all__ = [
    "CutoverMode",
    "EventDefinition",
    "ProcessorContract",
    "StartFrom",
    "check_cutover_mode",
    "check_start_from",
    "define_processor_contract",
]

S = TypeVar("S")
M = TypeVar("M", bound=BaseModel)

_SLUG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")


CutoverMode = Literal["auto", "manual"]
"""When a new version built in the shadow takes over: as soon as it reaches the
serving version's cursor (``auto``), or when an operator says so (``manual``:
it follows the serving version meanwhile)."""


StartFrom = Literal["beginning", "start", "head"]
"""Where a processor that never ran on its path starts: at offset 1 (reading
the archive below a path's start), at the path's start (the history retention
took is not reduced), or at the head (nothing before it is). Undeclared, a
host refuses a new processor on a path whose history was taken
(docs/retention.md, "A new processor on a path with history taken")."""


def check_start_from(where: str, value: object) -> StartFrom | None:
    """``value`` if it is None or a :data:`StartFrom` choice, else :class:`InvalidContract`."""
    if value is None or value == "beginning" or value == "start" or value == "head":
        return value
    raise InvalidContract(
        f'{where}: start must be "beginning", "start" or "head" (or None: undeclared), got '
        f"{value!r}",
        details={"field": "start", "value": repr(value)[:200]},
    )


def check_cutover_mode(where: str, value: object) -> CutoverMode:
    """``value`` if it is a :data:`CutoverMode` choice, else :class:`InvalidContract`."""
    if value == "auto" or value == "manual":
        return value
    raise InvalidContract(
        f'{where}: cutover must be "auto" or "manual", got {value!r}',
        details={"field": "cutover", "value": repr(value)[:200]},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EventDefinition:
    """One event type a contract owns: what it means and the pydantic model of its payload.

    ``ephemeral=True`` documents that the type is appended as an ephemeral
    event: it reaches a processor only when a contract names it in
    ``consumes`` (``"*"`` never sweeps ephemerals).

    ``version`` is the version of ``payload_schema`` (from 1); ``upcasters``
    maps each older version k to the function that lifts a version-k payload
    (a JSON dict) to version k + 1, or returns :data:`~streamkit.DROP` for an
    event no longer read (see :mod:`streamkit.upcasting`); ``renamed_from``
    lists the names this type was stored under before.
    """

    description: str
    payload_schema: type[BaseModel]
    ephemeral: bool = False
    version: int = 1
    upcasters: Mapping[int, Upcaster] = field(default_factory=dict, hash=False)
    renamed_from: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):
            raise InvalidContract(
                f"EventDefinition.description must be a string, got {self.description!r}",
                details={"field": "description"},
            )
        if not (
            isinstance(self.payload_schema, type) and issubclass(self.payload_schema, BaseModel)
        ):
            raise InvalidContract(
                "EventDefinition.payload_schema must be a pydantic model class (a BaseModel "
                f"subclass), got {self.payload_schema!r}",
                details={"field": "payload_schema", "value": repr(self.payload_schema)[:200]},
            )
        if not isinstance(self.ephemeral, bool):
            raise InvalidContract(
                f"EventDefinition.ephemeral must be True or False, got {self.ephemeral!r}",
                details={"field": "ephemeral"},
            )
        _, chain = check_versions("EventDefinition", self.version, self.upcasters)
        object.__setattr__(self, "upcasters", MappingProxyType(chain))
        object.__setattr__(
            self, "renamed_from", _type_list(None, "renamed_from", self.renamed_from)
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class ProcessorContract(Generic[S]):
    """A processor's identity, its state, and the events it consumes and emits.

    Usually built by :func:`define_processor_contract`. Built by hand, pass
    ``initial`` (a zero-argument factory of the initial state) and, optionally,
    ``state_schema`` (a pydantic model the checkpointed state is restored with);
    without ``events`` the reduce sees raw dict payloads.

    ``consumes=None`` (or ``["*"]``) means every durable event.
    ``on_malformed`` says what the engine does at a stored payload that does
    not validate: ``"skip"`` it (counted per type and version in ``status``)
    or ``"stall"`` before it with :class:`~streamkit.errors.PayloadMalformed`.
    ``on_reduce_error`` says the same of an event the reduce raises on:
    ``"skip"`` it (the state keeps what it was, counted) or ``"stall"``
    before it with :class:`~streamkit.errors.ReduceFailed`. Unset (``None``),
    each takes the host's default, else ``"stall"`` (:func:`failure_choice`).
    ``cutover`` says when this version, built in the shadow beside another
    serving version, takes over: ``"auto"`` (once caught up) or ``"manual"``
    (when an operator runs ``streamkit processor cutover``). ``start`` says
    where it starts on a path the first time it runs there (see
    :data:`StartFrom`).
    """

    slug: str
    version: str
    description: str = ""
    initial: Callable[[], S]
    state_schema: type[BaseModel] | None = None
    events: Mapping[str, EventDefinition] | None = None
    processor_deps: tuple[ProcessorContract[Any], ...] = ()
    consumes: tuple[str, ...] | None = None
    emits: tuple[str, ...] = ()
    compact_state: bool = False
    on_malformed: OnMalformed | None = None
    on_reduce_error: OnReduceError | None = None
    cutover: CutoverMode = "auto"
    start: StartFrom | None = None
    _schemas: dict[str, type[BaseModel]] = field(init=False, repr=False)
    _renames: dict[str, str] = field(init=False, repr=False)
    _definitions: dict[str, EventDefinition] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        slug = self.slug
        if not isinstance(slug, str) or not _SLUG_RE.match(slug):
            raise InvalidContract(
                f"contract slug {slug!r} is not 1-128 characters of letters, digits, '-', '_' "
                "and '.' starting with a letter or digit; it keys the checkpoint, the live "
                "state and idempotency keys, so it must be stable and plain",
                details={"field": "slug", "value": repr(slug)[:200]},
            )
        if not isinstance(self.version, str) or not self.version:
            raise InvalidContract(
                f'contract "{slug}": version must be a non-empty string (bump it to re-reduce '
                f"state from offset 0), got {self.version!r}",
                details={"slug": slug, "field": "version", "value": repr(self.version)[:200]},
            )
        if not isinstance(self.description, str):
            raise InvalidContract(
                f'contract "{slug}": description must be a string, got {self.description!r}',
                details={"slug": slug, "field": "description"},
            )
        if not callable(self.initial):
            raise InvalidContract(
                f'contract "{slug}": initial must be a zero-argument factory of the initial '
                f"state, got {self.initial!r}",
                details={"slug": slug, "field": "initial"},
            )
        if self.state_schema is not None and not (
            isinstance(self.state_schema, type) and issubclass(self.state_schema, BaseModel)
        ):
            raise InvalidContract(
                f'contract "{slug}": state_schema must be a pydantic model class, got '
                f"{self.state_schema!r}",
                details={"slug": slug, "field": "state_schema"},
            )
        check_on_malformed(f'contract "{slug}"', self.on_malformed)
        check_on_reduce_error(f'contract "{slug}"', self.on_reduce_error)
        check_cutover_mode(f'contract "{slug}"', self.cutover)
        check_start_from(f'contract "{slug}"', self.start)
        events = _check_catalog(slug, self.events)
        deps = _check_deps(slug, self.processor_deps)
        consumes = None if self.consumes is None else _type_list(slug, "consumes", self.consumes)
        emits = _type_list(slug, "emits", self.emits)
        if "*" in emits:
            raise InvalidContract(
                f'contract "{slug}": emits cannot be "*"; name every type the processor appends',
                details={"slug": slug, "field": "emits"},
            )
        # One owner per event type, or the payload schema a consumer validates
        # against would depend on which dependency happened to be listed first.
        schemas: dict[str, type[BaseModel]] = {}
        owners: dict[str, str] = {}
        for dep in deps:
            for etype, definition in (dep.events or {}).items():
                if events is not None and etype in events:
                    raise InvalidContract(
                        f'contract "{slug}": event "{etype}" is defined in its own events and '
                        f'also owned by its dependency "{dep.slug}"; an event has one owner, so '
                        "drop the local definition and consume the dependency's",
                        details={"slug": slug, "event": etype, "dep": dep.slug},
                    )
                if etype in owners:
                    raise InvalidContract(
                        f'contract "{slug}": event "{etype}" is declared by two dependencies, '
                        f'"{owners[etype]}" and "{dep.slug}"; an event has one owner, so one of '
                        "them must stop declaring it",
                        details={"slug": slug, "event": etype, "deps": [owners[etype], dep.slug]},
                    )
                owners[etype] = dep.slug
                schemas[etype] = definition.payload_schema
        for etype, definition in (events or {}).items():
            schemas[etype] = definition.payload_schema
        definitions = {
            etype: definition for dep in deps for etype, definition in (dep.events or {}).items()
        }
        definitions.update(events or {})
        renames = _check_renames(slug, deps, events, schemas)
        if events is not None:
            for name, types, allowed in (
                ("consumes", consumes or (), {"*"}),
                ("emits", emits, set()),
            ):
                unknown = [t for t in types if t not in schemas and t not in allowed]
                if unknown:
                    raise InvalidContract(
                        f'contract "{slug}": {name} names {", ".join(map(repr, unknown))}, which '
                        "neither its events nor any dependency's events define; add an "
                        "EventDefinition for it or the contract that owns it to processor_deps",
                        details={"slug": slug, "field": name, "unknown": unknown},
                    )
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "processor_deps", deps)
        object.__setattr__(self, "consumes", consumes)
        object.__setattr__(self, "emits", emits)
        object.__setattr__(self, "_schemas", schemas)
        object.__setattr__(self, "_renames", renames)
        object.__setattr__(self, "_definitions", definitions)
        self._check_initial_state()

    def initial_state(self) -> S:
        """A fresh initial state (a new object on every call)."""
        return self.initial()

    def payload_schema_for(self, event_type: str) -> type[BaseModel] | None:
        """The payload model of ``event_type`` (owned locally or by a dependency), or None."""
        return self._schemas.get(event_type)

    def payload_schemas(self) -> dict[str, type[BaseModel]]:
        """Every event type with a payload model (owned locally or by a dependency)."""
        return dict(self._schemas)

    def definition_for(self, event_type: str) -> EventDefinition | None:
        """The definition of ``event_type`` (owned locally or by a dependency), or None."""
        return self._definitions.get(event_type)

    def payload_version_of(self, event_type: str) -> int:
        """The version of ``event_type``'s payload model (1 for a type without a definition)."""
        definition = self._definitions.get(event_type)
        return 1 if definition is None else definition.version

    def renames(self) -> dict[str, str]:
        """Each old type name a definition reads (its ``renamed_from``) -> the type it is now."""
        return dict(self._renames)

    def dump_state(self, state: S) -> str:
        """The JSON a checkpoint stores: a pydantic state's own JSON, anything else via json.

        With ``compact_state`` every field at its default is left out (at any
        depth): it restores as the schema's default.
        """
        if isinstance(state, BaseModel):
            return state.model_dump_json(exclude_defaults=self.compact_state)
        return json.dumps(state, separators=(",", ":"), allow_nan=False)

    def load_state(self, text: str) -> S:
        """A state back from checkpoint JSON, through the state schema when there is one."""
        if self.state_schema is None:
            raw: S = json.loads(text)
            return raw
        return self.state_schema.model_validate_json(text)  # type: ignore[return-value]

    def restored_json(self, stored: Any) -> Any:
        """A checkpoint's state as JSON data, restored through the state schema and shown whole.

        What a reader of a stored state (the CLI, a host that does not run the
        processor) shows: with ``compact_state`` the stored JSON leaves out
        every field at its default, so raw, it lacks them.
        """
        state = self.load_state(json.dumps(stored))
        return state.model_dump(mode="json") if isinstance(state, BaseModel) else state

    def _check_initial_state(self) -> None:
        slug = self.slug
        try:
            state = self.initial()
        except Exception as exc:
            raise InvalidContract(
                f'contract "{slug}": the initial state must build with no arguments (a state '
                f"schema constructs from {{}}, so give every field a default); building it "
                f"raised {exc!r}",
                details={"slug": slug, "field": "state_schema", "error": repr(exc)[:500]},
            ) from exc
        # Checkpoints keep the state as JSON and restore it (through the schema,
        # when there is one): a state that does not come back equal would
        # silently change on every restart.
        try:
            restored = self.load_state(self.dump_state(state))
        except Exception as exc:
            raise InvalidContract(
                f'contract "{slug}": the initial state does not survive a JSON round trip '
                f"({exc!r}); checkpoints store state as JSON, so every field must be "
                "JSON-serializable and restore to the same value",
                details={"slug": slug, "field": "state_schema", "error": repr(exc)[:500]},
            ) from exc
        if restored != state:
            raise InvalidContract(
                f'contract "{slug}": the initial state changes when it is written as JSON and '
                "read back; checkpoints store state as JSON, so use types that round-trip (lists "
                "rather than tuples or sets, str keys, no custom objects)",
                details={"slug": slug, "field": "state_schema"},
            )


def define_processor_contract(
    *,
    slug: str,
    version: str,
    description: str = "",
    state_schema: type[M],
    events: Mapping[str, EventDefinition] | None = None,
    processor_deps: Iterable[ProcessorContract[Any]] = (),
    consumes: Iterable[str] | None = None,
    emits: Iterable[str] = (),
    compact_state: bool = False,
    on_malformed: OnMalformed | None = None,
    on_reduce_error: OnReduceError | None = None,
    cutover: CutoverMode = "auto",
    start: StartFrom | None = None,
) -> ProcessorContract[M]:
    """Define a processor contract whose state is the pydantic model ``state_schema``.

    The initial state is ``state_schema()``, so every field needs a default.
    ``compact_state=True`` leaves every field at its default out of the
    checkpoint (a state of many similar entries, such as a queue, stays small
    under the checkpoint ceiling); such a field restores as the schema's
    default, so changing a default then needs a version bump.
    ``on_malformed`` and ``on_reduce_error`` are ``"skip"``, ``"stall"`` or
    None (the host's default, else stall), ``cutover`` is ``"auto"`` or
    ``"manual"``, and ``start`` is where the processor starts on a path the
    first time (see :class:`ProcessorContract`).
    ``events`` maps each type this processor owns to its
    :class:`EventDefinition`; omit it (``None``) for a processor that reduces
    raw dict payloads. ``processor_deps`` are other contracts whose events this
    one may consume or emit. Raises :class:`~streamkit.errors.InvalidContract`
    for any rule in this module's docstring.
    """
    if not (isinstance(state_schema, type) and issubclass(state_schema, BaseModel)):
        raise InvalidContract(
            f'contract "{slug}": state_schema must be a pydantic model class (a BaseModel '
            f"subclass with a default for every field), got {state_schema!r}",
            details={"slug": repr(slug)[:200], "field": "state_schema"},
        )
    name = slug if isinstance(slug, str) else repr(slug)
    return ProcessorContract(
        slug=slug,
        version=version,
        description=description,
        initial=state_schema,
        state_schema=state_schema,
        events=events,
        processor_deps=_check_deps(name, processor_deps),
        consumes=None if consumes is None else _type_list(name, "consumes", consumes),
        emits=_type_list(name, "emits", emits),
        compact_state=bool(compact_state),
        on_malformed=on_malformed,
        on_reduce_error=on_reduce_error,
        cutover=cutover,
        start=start,
    )


def _check_event_type(slug: str | None, field_name: str, etype: object) -> str:
    where = _where(slug)
    if not isinstance(etype, str) or not etype.strip() or len(etype) > MAX_TYPE_LENGTH:
        raise InvalidContract(
            f"{where}: {field_name} holds {etype!r}, which is not an event type (a "
            f"non-empty string of at most {MAX_TYPE_LENGTH} characters)",
            details={"slug": slug, "field": field_name, "value": repr(etype)[:200]},
        )
    if etype == LIVE_STATE_CHANGED:
        raise InvalidContract(
            f'{where}: {field_name} names "{LIVE_STATE_CHANGED}", the live-state delta '
            "type; deltas describe state and are never reduced, emitted or owned by a processor "
            "(watch them through a subscription instead)",
            details={"slug": slug, "field": field_name, "value": etype},
        )
    return etype


def _type_list(slug: str | None, field_name: str, types: object) -> tuple[str, ...]:
    if isinstance(types, str) or not isinstance(types, Iterable):
        raise InvalidContract(
            f"{_where(slug)}: {field_name} must be a list of event types, got {types!r}"
            + (f"; write [{types!r}]" if isinstance(types, str) else ""),
            details={"slug": slug, "field": field_name, "value": repr(types)[:200]},
        )
    return tuple(dict.fromkeys(_check_event_type(slug, field_name, t) for t in types))


def _where(slug: str | None) -> str:
    """How a refusal names what it refuses: a contract by its slug, else an event definition."""
    return "EventDefinition" if slug is None else f'contract "{slug}"'


def _check_catalog(
    slug: str, events: Mapping[str, EventDefinition] | None
) -> dict[str, EventDefinition] | None:
    if events is None:
        return None
    if not isinstance(events, Mapping):
        raise InvalidContract(
            f'contract "{slug}": events must map event types to EventDefinition, got '
            f"{type(events).__name__}",
            details={"slug": slug, "field": "events"},
        )
    catalog: dict[str, EventDefinition] = {}
    for etype, definition in events.items():
        _check_event_type(slug, "events", etype)
        if not isinstance(definition, EventDefinition):
            raise InvalidContract(
                f'contract "{slug}": events["{etype}"] must be an EventDefinition, got '
                f"{type(definition).__name__}",
                details={"slug": slug, "field": "events", "event": etype},
            )
        catalog[etype] = definition
    return catalog


def _check_renames(
    slug: str,
    deps: tuple[ProcessorContract[Any], ...],
    events: Mapping[str, EventDefinition] | None,
    schemas: Mapping[str, type[BaseModel]],
) -> dict[str, str]:
    """Old name -> current type over every definition the contract sees; one reading per name.

    A name still defined as a type of its own, or renamed into two types,
    would make a stored event's meaning depend on which rule ran first; a
    type renamed from itself is a cycle.
    """
    definitions = [
        (etype, definition) for dep in deps for etype, definition in (dep.events or {}).items()
    ]
    definitions.extend((events or {}).items())
    renames: dict[str, str] = {}
    for etype, definition in definitions:
        for old in definition.renamed_from:
            if old == etype:
                raise InvalidContract(
                    f'contract "{slug}": event "{etype}" is renamed from itself; renamed_from '
                    "lists the names it was stored under before",
                    details={"slug": slug, "event": etype, "renamed_from": old},
                )
            if old in schemas:
                raise InvalidContract(
                    f'contract "{slug}": event "{etype}" is renamed from "{old}", which is still '
                    "defined as a type of its own; a stored name has one reading, so drop one "
                    "definition (a type that is split keeps its name and an upcaster)",
                    details={"slug": slug, "event": etype, "renamed_from": old},
                )
            if renames.get(old, etype) != etype:
                raise InvalidContract(
                    f'contract "{slug}": "{old}" is renamed into both "{renames[old]}" and '
                    f'"{etype}"; a stored name has one reading',
                    details={"slug": slug, "renamed_from": old, "events": [renames[old], etype]},
                )
            renames[old] = etype
    return renames


def _check_deps(slug: str, deps: object) -> tuple[ProcessorContract[Any], ...]:
    if isinstance(deps, str) or not isinstance(deps, Iterable):
        raise InvalidContract(
            f'contract "{slug}": processor_deps must be a list of contracts, got {deps!r}',
            details={"slug": slug, "field": "processor_deps"},
        )
    checked: list[ProcessorContract[Any]] = []
    seen: set[str] = set()
    for dep in deps:
        if not isinstance(dep, ProcessorContract):
            raise InvalidContract(
                f'contract "{slug}": processor_deps holds {dep!r}, which is not a contract '
                "(pass the other processor's contract, e.g. OtherProcessor.contract)",
                details={"slug": slug, "field": "processor_deps", "value": repr(dep)[:200]},
            )
        if dep.slug == slug:
            raise InvalidContract(
                f'contract "{slug}": a processor cannot list itself in processor_deps; its own '
                "events belong in events",
                details={"slug": slug, "field": "processor_deps"},
            )
        if dep.slug in seen:
            raise InvalidContract(
                f'contract "{slug}": processor_deps lists "{dep.slug}" twice',
                details={"slug": slug, "field": "processor_deps", "dep": dep.slug},
            )
        seen.add(dep.slug)
        checked.append(dep)
    return tuple(checked)
