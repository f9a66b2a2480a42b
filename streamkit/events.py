"""The event envelope: what an append takes, what the log commits, and the proof a read carries.

An input event is an :class:`EventInput` or a plain mapping with the same keys.
:func:`prepare_event` validates it once, up front, and serializes its JSON
parts, so a refused event is refused before anything touches storage. A
committed :class:`StreamEvent` is immutable and is exactly what a later read
returns: its payload and metadata are decoded from the JSON that was stored.

Two events are the "same body" for idempotency when their type, payload and
metadata are equal as JSON (an absent payload or metadata equals ``{}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel

from streamkit._json import encode_object, encode_object_plain
from streamkit._json_canonical import canonical_json
from streamkit._json_size import utf8_json_size
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit._timestamps import format_timestamp
from streamkit.errors import InvalidEvent, InvalidRequest
from streamkit.upcasting import MAX_VERSION

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_OFFSET",
    "MAX_TYPE_LENGTH",
    "RESERVED_PREFIX",
    "Appended",
    "EventInput",
    "PreparedEvent",
    "ReadPage",
    "ScannedRange",
    "StreamEvent",
    "appended_to_dicts",
    "canonical_json",
    "format_timestamp",
    "prepare_event",
    "prepare_event_plain",
    "prepare_events",
    "replayed_offsets",
    "same_body",
    "validate_path",
]

MAX_EVENT_BYTES = 1024 * 1024
"""The ceiling on one event's serialized size (type, payload, metadata, source, key)."""

MAX_TYPE_LENGTH = 256

MAX_NESTING = 100
"""The deepest a payload, metadata or source object may nest (the object itself is level 1).
Deeper JSON would hit Python's recursion limit when decoded on a deep call stack."""

_INPUT_FIELDS = frozenset(
    {
        "type",
        "payload",
        "metadata",
        "source",
        "idempotency_key",
        "offset",
        "ephemeral",
        "payload_version",
    }
)
_PATH_RE = re.compile(r"^/(?:[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)?$")
_MAX_PATH_LENGTH = 512
_MAX_KEY_LENGTH = 1024
_FAST_FIELDS = frozenset({"type", "payload", "idempotency_key", "source", "metadata"})


@dataclass(frozen=True, slots=True, kw_only=True)
class EventInput:
    """An event to append. Plain mappings with the same keys are accepted too."""

    type: str
    payload: Mapping[str, Any] | BaseModel | None = None
    metadata: Mapping[str, Any] | None = None
    source: Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    offset: int | None = None
    """A precondition: the event must land at exactly this offset, or the whole append is refused."""
    ephemeral: bool = False
    """Takes an offset and reaches live subscribers of this process, but is never written."""
    payload_version: int | None = None
    """The version of the payload's shape (see ``EventDefinition.version``); None: 1, or the
    version the appending processor's contract defines for the type."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEvent:
    """A committed event. ``offset`` is its position in its stream path (from 1)."""

    path: str
    offset: int
    type: str
    payload: Any = field(default_factory=dict)
    """A dict as stored; a processor's engine may hand its reduce a validated model instead."""
    metadata: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] | None = None
    idempotency_key: str | None = None
    created_at: str = ""
    ephemeral: bool = False
    payload_version: int = 1
    """The version of the payload's shape it was stored at (1 for an event stored without one)."""

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (a model payload is dumped in JSON mode)."""
        payload = self.payload
        if isinstance(payload, BaseModel):
            payload = payload.model_dump(mode="json")
        data: dict[str, Any] = {
            "path": self.path,
            "offset": self.offset,
            "type": self.type,
            "payload": payload,
            "metadata": self.metadata,
            "created_at": self.created_at,
        }
        if self.source is not None:
            data["source"] = self.source
        if self.idempotency_key is not None:
            data["idempotency_key"] = self.idempotency_key
        if self.ephemeral:
            data["ephemeral"] = True
        if self.payload_version != 1:
            data["payload_version"] = self.payload_version
        return data


class ScannedRange(NamedTuple):
    """A proof that the log holds exactly the pushed durable events in ``(after, through]``."""

    after: int
    through: int


class Appended(list[StreamEvent]):
    """What an append returns when some of its inputs were committed by an earlier call.

    A list of the committed events in input order, like any append's result,
    plus ``replayed``: the offsets among them that an earlier call committed
    (an idempotent retry's hits), so a caller can say "already committed at N"
    rather than "appended". An append with no such input returns a plain list;
    :func:`replayed_offsets` reads either.
    """

    __slots__ = ("replayed",)

    def __init__(self, events: list[StreamEvent], replayed: frozenset[int]) -> None:
        super().__init__(events)
        self.replayed = replayed


def replayed_offsets(committed: list[StreamEvent]) -> frozenset[int]:
    """The offsets of an append's result that an earlier call committed (see :class:`Appended`)."""
    return committed.replayed if isinstance(committed, Appended) else frozenset()


def appended_to_dicts(
    committed: list[StreamEvent], keys_kept_for: float | None = None
) -> list[dict[str, Any]]:
    """An append's result as JSON-ready data, each replayed event marked ``"replayed": true``.

    The one wire form of an append's answer (the control socket, HTTP). Each
    event with an idempotency key also says how long the key answers retries
    once retention takes the event: ``"keys_kept_for"``, seconds, or null for
    forever (the path's key window, :mod:`streamkit.key_window`).
    """
    replayed = replayed_offsets(committed)
    out = []
    for event in committed:
        data = event.to_dict()
        if event.offset in replayed:
            data["replayed"] = True
        if event.idempotency_key is not None:
            data["keys_kept_for"] = keys_kept_for
        out.append(data)
    return out


@dataclass(frozen=True, slots=True)
class ReadPage:
    """One page of a read.

    ``scanned_through_offset`` is how far the read proves the durable log: the
    last event's offset on a full page, else ``max(after_offset, durable head)``.
    It never passes the durable head. ``at_head`` says nothing durable lies past it.

    ``events`` is a list, except on a page read with ``types`` (the typed read
    a processor engine's catch-up makes): there it is a lazy sequence
    (``TypedEvents``) that builds each event as it is taken and keeps none, so
    a fold that takes each once and drops it holds one event at a time.
    Taking the same index twice builds two equal events, not one; it compares
    equal to the list of its events, and ``list(page.events)`` keeps them.
    """

    events: Sequence[StreamEvent]
    scanned_through_offset: int
    at_head: bool


@dataclass(slots=True)
class PreparedEvent:
    """A validated input with its JSON parts serialized once (internal to the log).

    Never changed once handed to a writer (the log's catalog stamps its version
    before that). Not frozen: a frozen dataclass stores each field
    through ``object.__setattr__``, which made building one, for every
    appended event, cost three times as much.
    """

    type: str
    payload_json: str
    metadata_json: str
    source_json: str | None
    idempotency_key: str | None
    offset: int | None
    ephemeral: bool
    index: int
    payload_version: int = 1
    version_named: bool = False
    """Whether the input named its payload version (else it is 1, or its known definition's)."""
    same_as: Callable[[PreparedEvent, StreamEvent], bool] | None = None
    """How a retry of it is compared with a stored event of another version or name (set by
    the log's catalog of definitions, which can lift both to one shape)."""

    def decoded(self, *, path: str, offset: int, created_at: str) -> StreamEvent:
        """The committed form: decoded from the serialized JSON, so it equals a later read."""
        return StreamEvent(
            path=path,
            offset=offset,
            type=self.type,
            payload=json.loads(self.payload_json),
            metadata=json.loads(self.metadata_json),
            source=None if self.source_json is None else json.loads(self.source_json),
            idempotency_key=self.idempotency_key,
            created_at=created_at,
            ephemeral=self.ephemeral,
            payload_version=self.payload_version,
        )


def validate_path(path: object) -> str:
    """Return ``path`` if it is ``/`` or ``/a/b`` (letters, digits, ``-``, ``_``, ``.``)."""
    if (
        not isinstance(path, str)
        or len(path) > _MAX_PATH_LENGTH
        or not _PATH_RE.fullmatch(path)
        or any(part in {".", ".."} for part in path.split("/"))
    ):
        raise InvalidRequest(
            f"stream path {path!r} is not of the form '/' or '/a/b' (segments of letters, "
            "digits, '-', '_' and '.', not '.' or '..' alone, at most "
            f"{_MAX_PATH_LENGTH} characters); nothing was read or written",
            details={"path": repr(path)},
        )
    return path


def _refuse(index: int, field_name: str, why: str, **details: Any) -> InvalidEvent:
    return InvalidEvent(
        f"event #{index}: field {field_name!r} {why}; nothing was appended",
        details={"index": index, "field": field_name, **details},
    )


def _dump_object(index: int, field_name: str, value: object) -> str:
    """``value`` (a JSON object) as compact JSON, or refuse it; runs for every event."""
    encode: Callable[[Any], str] = encode_object
    if type(value) is not dict:  # a plain dict skips the ABC checks
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if not isinstance(value, Mapping):
            raise _refuse(
                index, field_name, f"must be a JSON object (a dict), got {type(value).__name__}"
            )
        encode = encode_object_plain
    try:
        text = encode(value)
    except (TypeError, ValueError) as exc:
        raise _refuse(index, field_name, f"is not JSON serializable ({exc})") from exc
    except RecursionError as exc:
        raise _too_deep(index, field_name) from exc
    # The text is ASCII with every other character escaped, so a string that cannot
    # be UTF-8 (a lone surrogate, as cutting an emoji in half makes) shows as "\ud..."
    # here; so does a valid pair, which the exact check below lets through.
    if "\\ud" in text:
        _refuse_lone_surrogates(index, field_name, text)
    # Too deep? Every level opens and closes a bracket, so a text shorter than twice
    # the limit cannot be. Counting brackets (in C) over-counts, never under-counts,
    # the depth: only a text with that many brackets needs the walk.
    if (
        len(text) > 2 * MAX_NESTING
        and text.count("{") + text.count("[") > MAX_NESTING
        and _nesting(value) > MAX_NESTING
    ):
        raise _too_deep(index, field_name)
    return text


def _refuse_lone_surrogates(index: int, field_name: str, text: str) -> None:
    """Refuse ``text`` if a string in it (a key or a value) cannot be encoded as UTF-8."""
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _unencodable(index, field_name, exc) from None


def _unencodable(index: int, field_name: str, exc: UnicodeEncodeError) -> InvalidEvent:
    bad = exc.object[exc.start : exc.end]
    return _refuse(
        index,
        field_name,
        f"holds a string that cannot be encoded as UTF-8 (a lone surrogate, "
        f"{bad.encode('unicode_escape').decode('ascii')}, as cutting an emoji in half "
        "makes), which no reader could decode",
        value=bad.encode("unicode_escape").decode("ascii"),
    )


def _check_count(index: int, field_name: str, value: object, high: int, shown: str) -> None:
    """Refuse an optional whole-number field (an offset, a version) outside ``1..high``."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high
    ):
        raise _refuse(
            index, field_name, f"must be an integer from 1 to {shown}", value=repr(value)[:80]
        )


def _check_text(index: int, field_name: str, text: str) -> None:
    """Refuse a plain string field (type, idempotency key) that cannot be encoded as UTF-8."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _unencodable(index, field_name, exc) from None


def _nesting(value: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> int:
    """How deep ``value`` nests (a container is one level), counted up to MAX_NESTING + 1."""
    deepest = 0
    stack: list[tuple[Mapping[str, Any] | list[Any] | tuple[Any, ...], int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_NESTING:
                break
        for child in item.values() if isinstance(item, Mapping) else item:
            if isinstance(child, Mapping | list | tuple):
                stack.append((child, depth + 1))
    return deepest


def _too_deep(index: int, field_name: str) -> InvalidEvent:
    return _refuse(
        index,
        field_name,
        f"nests deeper than {MAX_NESTING} levels (or contains itself), which the log "
        "refuses so every reader can decode it",
    )


MAX_OFFSET = 2**63 - 1
"""The largest offset there can be (SQLite's largest integer); arguments past it are refused."""

RESERVED_PREFIX = "streamkit."
"""Durable types under this prefix are control events: only streamkit's own verbs write them."""


def prepare_event(
    raw: EventInput | Mapping[str, Any], index: int = 0, *, control: bool = False
) -> PreparedEvent:
    """Validate one input event and serialize it; raise :class:`InvalidEvent` naming the field.

    ``control=True`` is for streamkit's own operator verbs (a skip), which alone
    may write a durable event in the reserved ``streamkit.`` namespace.

    The commonest input by far, a dict of an ASCII type and a dict payload,
    is prepared here with only the checks such an input can fail; anything
    else, and any input that fails one, goes to :func:`prepare_event_plain`,
    which checks every field (the fast path's twin: the same event or the
    same refusal for every input). The shortcut is a speed trick: off under
    ``STREAMKIT_PLAIN=1``.
    """
    if type(raw) is dict and not control and SPEED_TRICKS:
        etype = raw.get("type")
        payload = raw.get("payload")
        if (
            type(etype) is str
            and type(payload) is dict
            and 0 < len(etype) <= MAX_TYPE_LENGTH
            and etype.isascii()  # so encodable, and its length is its size in bytes
            and not etype.isspace()
            and not etype.startswith(RESERVED_PREFIX)
        ):
            if len(raw) == 2:
                payload_json = _dump_object(index, "payload", payload)
                if len(etype) + len(payload_json) + 2 <= MAX_EVENT_BYTES:  # 2: metadata "{}"
                    return PreparedEvent(etype, payload_json, "{}", None, None, None, False, index)
            elif raw.keys() <= _FAST_FIELDS:
                # What a processor appends: a key, a source, maybe metadata, all plain.
                prepared = _prepare_keyed(raw, etype, payload, index)
                if prepared is not None:
                    return prepared
    return prepare_event_plain(raw, index, control=control)


def _prepare_keyed(
    raw: dict[str, Any], etype: str, payload: dict[str, Any], index: int
) -> PreparedEvent | None:
    """:func:`prepare_event`'s shortcut for a plain dict with a key, a source or metadata.

    None when a field is not of the plain kind (the full checks then decide).
    """
    key = raw.get("idempotency_key")
    source = raw.get("source")
    metadata = raw.get("metadata")
    if key is not None and (
        type(key) is not str or not 0 < len(key) <= _MAX_KEY_LENGTH or not key.isascii()
    ):
        return None
    if (source is not None and type(source) is not dict) or (
        metadata is not None and type(metadata) is not dict
    ):
        return None
    payload_json = _dump_object(index, "payload", payload)
    metadata_json = "{}" if metadata is None else _dump_object(index, "metadata", metadata)
    source_json = None if source is None else _dump_object(index, "source", source)
    size = len(etype) + len(payload_json) + len(metadata_json) + len(source_json or "")
    if key is not None:
        size += len(key)
    if size > MAX_EVENT_BYTES:
        return None
    return PreparedEvent(etype, payload_json, metadata_json, source_json, key, None, False, index)


def prepare_event_plain(
    raw: EventInput | Mapping[str, Any], index: int = 0, *, control: bool = False
) -> PreparedEvent:
    """:func:`prepare_event` with every field checked, whatever the input."""
    if isinstance(raw, EventInput):
        etype: object = raw.type
        payload: object = raw.payload
        metadata: object = raw.metadata
        source: object = raw.source
        key: object = raw.idempotency_key
        offset: object = raw.offset
        ephemeral: object = raw.ephemeral
        version: object = raw.payload_version
    elif type(raw) is dict or isinstance(raw, Mapping):
        if not raw.keys() <= _INPUT_FIELDS:
            unknown = set(raw) - _INPUT_FIELDS
            names = ", ".join(sorted(map(repr, map(str, unknown))))
            raise InvalidEvent(
                f"event #{index}: unknown field(s) {names} (allowed: "
                f"{', '.join(sorted(_INPUT_FIELDS))}); nothing was appended",
                details={"index": index, "fields": sorted(map(str, unknown))},
            )
        get = raw.get
        etype = get("type")
        payload = get("payload")
        metadata = get("metadata")
        source = get("source")
        key = get("idempotency_key")
        offset = get("offset")
        ephemeral = get("ephemeral", False)
        version = get("payload_version")
    else:
        raise InvalidEvent(
            f"event #{index}: expected an EventInput or a mapping, got {type(raw).__name__}; "
            "nothing was appended",
            details={"index": index},
        )

    if not isinstance(etype, str) or not etype or etype.isspace():
        raise _refuse(index, "type", "must be a non-empty string", value=repr(etype))
    _check_text(index, "type", etype)
    if len(etype) > MAX_TYPE_LENGTH:
        raise _refuse(
            index, "type", f"is {len(etype)} characters, over the limit of {MAX_TYPE_LENGTH}"
        )
    payload_json = "{}" if payload is None else _dump_object(index, "payload", payload)
    metadata_json = "{}" if metadata is None else _dump_object(index, "metadata", metadata)
    source_json = None if source is None else _dump_object(index, "source", source)
    if key is not None and (not isinstance(key, str) or not key or len(key) > _MAX_KEY_LENGTH):
        raise _refuse(
            index,
            "idempotency_key",
            f"must be a non-empty string of at most {_MAX_KEY_LENGTH} characters",
            value=repr(key)[:80],
        )
    if isinstance(key, str):
        _check_text(index, "idempotency_key", key)
    _check_count(index, "offset", offset, MAX_OFFSET, f"{MAX_OFFSET} (2^63 - 1)")
    if not isinstance(ephemeral, bool):
        raise _refuse(index, "ephemeral", "must be true or false", value=repr(ephemeral)[:80])
    _check_count(
        index,
        "payload_version",
        version,
        MAX_VERSION,
        f"{MAX_VERSION}, a version of the payload's shape",
    )
    if not ephemeral and not control and etype.startswith(RESERVED_PREFIX):
        # A host obeys control events (a skip moves a processor past an event), so
        # none may come through the ordinary append path, from any entry point.
        raise _refuse(
            index,
            "type",
            f"{etype!r} is in the reserved {RESERVED_PREFIX!r} namespace: durable events there "
            "are control records that only streamkit's operator verbs write (a skip is "
            "`streamkit skip`); choose a type of your own",
            value=etype[:80],
        )
    if ephemeral and key is not None:
        raise _refuse(
            index,
            "idempotency_key",
            "cannot be honoured on an ephemeral event (ephemerals are never stored)",
        )
    fixed = (len(etype) if etype.isascii() else len(etype.encode())) + len(
        key.encode() if isinstance(key, str) else b""
    )
    # The JSON here escapes every non-ASCII character (up to 6 bytes for one of
    # 2), and is never smaller than the same JSON in UTF-8: the exact measure is
    # only needed when this one is over.
    size = fixed + len(payload_json) + len(metadata_json) + len(source_json or "")
    if size > MAX_EVENT_BYTES:
        size = fixed + sum(map(utf8_json_size, (payload_json, metadata_json, source_json or "")))
    if size > MAX_EVENT_BYTES:
        raise InvalidEvent(
            f"event #{index} is {size} bytes as UTF-8 JSON (its type, payload, metadata, "
            f"source and key), over the ceiling of {MAX_EVENT_BYTES} bytes (1 MiB); nothing "
            "was appended",
            details={"index": index, "field": "payload", "size": size, "limit": MAX_EVENT_BYTES},
        )
    return PreparedEvent(
        etype,
        payload_json,
        metadata_json,
        source_json,
        key if isinstance(key, str) else None,
        offset if isinstance(offset, int) else None,
        ephemeral,
        index,
        version if isinstance(version, int) else 1,
        isinstance(version, int),
    )


def prepare_events(raws: Sequence[EventInput | Mapping[str, Any]]) -> list[PreparedEvent]:
    """Validate a whole append call; the first bad event refuses all of them."""
    if len(raws) == 1:
        return [prepare_event(raws[0], 0)]
    return [prepare_event(raw, i) for i, raw in enumerate(raws)]


def same_body(prepared: PreparedEvent, existing: StreamEvent) -> bool:
    """Whether a retried input matches a committed event (type, payload, metadata as JSON).

    Compared as JSON (:func:`canonical_json`). Of another payload version or type name,
    an input the log's catalog admitted is compared by the catalog, in the newer shape
    (see :mod:`streamkit.catalog`).
    """
    if prepared.same_as is not None and (
        prepared.payload_version != existing.payload_version or prepared.type != existing.type
    ):
        return prepared.same_as(prepared, existing)
    existing_payload = existing.payload
    if isinstance(existing_payload, BaseModel):
        existing_payload = existing_payload.model_dump(mode="json")
    return (
        prepared.type == existing.type
        and canonical_json(json.loads(prepared.payload_json)) == canonical_json(existing_payload)
        and canonical_json(json.loads(prepared.metadata_json)) == canonical_json(existing.metadata)
    )
