"""Notification rules and their templates: what is checked when a rule is defined, and rendering.

A rule maps one event type to a body template, an optional subject template,
recipient templates and a channel name. Templates are :class:`string.Template`
strings over the event's payload: ``$field`` or ``${field}``, and dotted paths
into nested objects (``${task.title}``); ``$$`` is a literal dollar.

What is refused when a rule is defined (:class:`~streamkit.errors.InvalidConfig`,
so a processor with a broken rule never starts): a malformed template (a stray
``$``), a name that is not a plain identifier, an unknown channel, two rules
with one name, and, when the event type's payload schema is known, a template
field the schema does not have. Rendering is pure and deterministic; a field
missing from an actual payload is a :class:`RenderError`, which the processor
records as an outcome event instead of sending anything.
"""

from __future__ import annotations

import json
import re
import string
import zlib
from collections.abc import Collection, Iterable, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from streamkit import InvalidConfig, ProcessorContract

__all__ = [
    "MAX_RENDERED_BYTES",
    "Backoff",
    "ContractSchemas",
    "NotificationRule",
    "RenderError",
    "Rendered",
    "check_rule",
    "check_rules",
    "payload_dict",
    "render",
]

MAX_RENDERED_BYTES = 32 * 1024
"""The largest subject plus body one notification may render to (it waits in state)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")


class _Template(string.Template):
    # Dotted paths reach into nested objects; a trailing dot ("Hi $name.") is
    # punctuation, because every segment after a dot must be non-empty.
    idpattern = r"(?a:[_a-z][_a-z0-9]*(?:\.[_a-z0-9]+)*)"


class RenderError(Exception):
    """A template named a field the payload does not have (``field``), or could not render."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Rendered(BaseModel):
    """A rule rendered over one payload."""

    subject: str
    body: str
    recipients: list[str]


class NotificationRule(BaseModel):
    """When an event of ``event_type`` is appended, send a notification through ``channel``.

    ``template`` is the body, ``subject`` the subject, ``recipients`` a list of
    templates (a literal address is a template without fields). ``name`` keys
    the notification ids (``<name>@<offset>``): keep it stable, because renaming
    a rule makes its old notifications look new. ``max_attempts`` counts
    deliveries tried before the notification is dead-lettered.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    event_type: str = Field(min_length=1, max_length=256)
    template: str
    subject: str = ""
    recipients: tuple[str, ...] = ()
    channel: str = "log"
    max_attempts: int = Field(default=5, ge=1, le=100)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "a rule name is 1-64 letters, digits, '-', '_' or '.', starting with a letter "
                "or digit (it becomes part of every notification id)"
            )
        return value

    def templates(self) -> Iterable[tuple[str, str]]:
        """(where, template) for the subject, the body and each recipient."""
        yield "subject", self.subject
        yield "template", self.template
        for index, recipient in enumerate(self.recipients):
            yield f"recipients[{index}]", recipient

    def fields(self) -> list[str]:
        """Every field path the rule's templates name, in order of first use."""
        seen: dict[str, None] = {}
        for _, text in self.templates():
            for name in _Template(text).get_identifiers():
                seen.setdefault(name, None)
        return list(seen)


class Backoff(BaseModel):
    """How long to wait before retrying a failed delivery.

    The n-th retry waits ``min(max_delay, initial * multiplier ** (n - 1))``
    seconds, spread by up to ``jitter`` (a fraction) in either direction. The
    jitter is derived from the notification id and attempt, so it is the same
    on every host and in every test run, yet spreads notifications that failed
    together.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial: float = Field(default=1.0, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    max_delay: float = Field(default=300.0, gt=0)
    jitter: float = Field(default=0.1, ge=0, lt=1)

    def delay(self, notification_id: str, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        base = min(self.max_delay, self.initial * self.multiplier ** max(0, attempt - 1))
        if not self.jitter:
            return base
        spread = zlib.crc32(f"{notification_id}#{attempt}".encode()) / 0xFFFFFFFF  # 0..1
        return base * (1 + self.jitter * (2 * spread - 1))


def check_rules(
    rules: Iterable[NotificationRule | Mapping[str, Any]],
    channels: Iterable[str],
    schemas: Mapping[str, type[BaseModel]],
    forbidden: Collection[str] = (),
) -> tuple[NotificationRule, ...]:
    """Validate every rule (see the module docstring); return them as models, in order.

    ``forbidden`` are event types no rule may watch (the processor's own).
    """
    known_channels = set(channels)
    checked: list[NotificationRule] = []
    names: set[str] = set()
    if isinstance(rules, (str, bytes, Mapping)):
        raise InvalidConfig(
            f"notification rules must be a list of rules, got {type(rules).__name__}",
            details={"field": "rules"},
        )
    for index, raw in enumerate(rules):
        if isinstance(raw, NotificationRule):
            rule = raw
        else:
            try:
                rule = NotificationRule.model_validate(raw)
            except Exception as exc:
                raise InvalidConfig(
                    f"notification rule #{index} is invalid: {exc}; no processor was built",
                    details={"rule": index, "error": str(exc)[:1000]},
                ) from exc
        if rule.name in names:
            raise InvalidConfig(
                f'two notification rules are named "{rule.name}"; the name keys notification '
                "ids, so each rule needs its own",
                details={"rule": rule.name, "field": "name"},
            )
        names.add(rule.name)
        if rule.channel not in known_channels:
            raise InvalidConfig(
                f'notification rule "{rule.name}" sends through channel "{rule.channel}", which '
                f"is not configured (channels: {sorted(known_channels)}); add it to channels",
                details={"rule": rule.name, "field": "channel", "value": rule.channel},
            )
        if rule.event_type in forbidden:
            raise InvalidConfig(
                f'notification rule "{rule.name}" watches "{rule.event_type}", an event the '
                "notifications processor appends or consumes itself; a notification about its "
                "own outcomes could feed itself forever, so rules may not watch them",
                details={"rule": rule.name, "field": "event_type", "value": rule.event_type},
            )
        check_rule(rule, schemas.get(rule.event_type))
        checked.append(rule)
    return tuple(checked)


def check_rule(rule: NotificationRule, schema: type[BaseModel] | None) -> None:
    """Refuse a malformed template, or a field ``schema`` (when known) does not define."""
    for where, text in rule.templates():
        if not _Template(text).is_valid():
            raise InvalidConfig(
                f'notification rule "{rule.name}": {where} {text!r} is not a valid template '
                "(write $field or ${field}, and $$ for a literal dollar)",
                details={"rule": rule.name, "field": where},
            )
    if schema is None:
        return
    for path in rule.fields():
        problem = _schema_misses(schema, path)
        if problem is not None:
            raise InvalidConfig(
                f'notification rule "{rule.name}" uses ${{{path}}}, but the payload schema '
                f'{schema.__name__} of "{rule.event_type}" {problem}; fix the template or the '
                "schema; no processor was built",
                details={"rule": rule.name, "field": path, "event_type": rule.event_type},
            )


def _schema_misses(schema: type[BaseModel], path: str) -> str | None:
    model: type[BaseModel] | None = schema
    for segment in path.split("."):
        if model is None:
            return None  # past a dict or Any: only the payload itself can tell
        fields = model.model_fields
        by_name = {(info.alias or name): info for name, info in fields.items()} | dict(
            fields.items()
        )
        info = by_name.get(segment)
        if info is None:
            return f"has no field {segment!r} (it has {sorted(fields)})"
        model = _nested_model(info.annotation)
    return None


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    # Optional[Model] and Model | None still name one nested model.
    models = [
        arg for arg in get_args(annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)
    ]
    others = [arg for arg in get_args(annotation) if arg is not type(None) and arg not in models]
    return models[0] if len(models) == 1 and not others else None


class _PayloadView(Mapping[str, str]):
    """The payload as ``string.Template`` sees it: dotted paths, values as text."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        self._payload = payload

    def __getitem__(self, path: str) -> str:
        value: Any = self._payload
        for segment in path.split("."):
            if isinstance(value, Mapping) and segment in value:
                value = value[segment]
            elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
                value = value[int(segment)]
            else:
                raise KeyError(path)
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return str(value)
        return json.dumps(value, separators=(",", ":"), sort_keys=True)

    def __iter__(self) -> Any:
        return iter(self._payload)

    def __len__(self) -> int:
        return len(self._payload)


def payload_dict(payload: Any) -> dict[str, Any]:
    """An event payload as templates see it: a validated model as its JSON, else the dict."""
    if isinstance(payload, BaseModel):
        dumped: dict[str, Any] = payload.model_dump(mode="json")
        return dumped
    return dict(payload) if isinstance(payload, Mapping) else {}


def render(rule: NotificationRule, payload: Mapping[str, Any]) -> Rendered:
    """Render ``rule`` over ``payload``.

    Raises :class:`RenderError` naming a missing field, or when the subject and
    body come to more than :data:`MAX_RENDERED_BYTES` (a notification waits in
    state until it is sent, and the state has a size ceiling).
    """
    view = _PayloadView(payload)
    out: dict[str, str] = {}
    recipients: list[str] = []
    for where, text in rule.templates():
        try:
            value = _Template(text).substitute(view)
        except KeyError as exc:
            field = str(exc.args[0]) if exc.args else "?"
            raise RenderError(
                field,
                f'rule "{rule.name}": {where} uses ${{{field}}}, which the payload of this '
                f'"{rule.event_type}" event does not have (it has {sorted(payload)})',
            ) from None
        except ValueError as exc:
            raise RenderError("", f'rule "{rule.name}": {where} cannot render ({exc})') from None
        if where.startswith("recipients"):
            recipients.extend(part.strip() for part in value.split(",") if part.strip())
        else:
            out[where] = value
    size = len(out["subject"].encode()) + len(out["template"].encode())
    if size > MAX_RENDERED_BYTES:
        raise RenderError(
            "",
            f'rule "{rule.name}" rendered {size} bytes, over the {MAX_RENDERED_BYTES}-byte '
            "limit of one notification (it is kept in state until sent); shorten the template",
        )
    return Rendered(subject=out["subject"], body=out["template"], recipients=recipients)


class ContractSchemas(Mapping[str, type[BaseModel]]):
    """The payload schemas a contract knows, as the mapping ``check_rules`` reads."""

    def __init__(self, contract: ProcessorContract[Any]) -> None:
        self._contract = contract

    def __getitem__(self, etype: str) -> type[BaseModel]:
        schema = self._contract.payload_schema_for(etype)
        if schema is None:
            raise KeyError(etype)
        return schema

    def __iter__(self) -> Any:
        for dep in self._contract.processor_deps:
            yield from dep.events or ()

    def __len__(self) -> int:
        return sum(len(dep.events or ()) for dep in self._contract.processor_deps)
