"""What an event asks the notifications processor to deliver, read the same way by reduce and effects.

A watched event asks for one notification per rule on its type, in the order
the rules were configured, each with the stable id ``<rule>@<offset>``
(:func:`notification_id`) and answering the request at the event's own offset.
A ``notification.resend-requested`` event asks for one notification, answering
the request at *its* offset with a fresh attempt budget: either the rendered
text it carries, or its ``source_payload`` rendered again with the rule of that
name as configured now.

Reading an event is pure and never raises for a bad template, a missing field
or a rule no longer configured: the failure travels in the :class:`Ask`. That
is what lets ``reduce`` and ``process_event`` each read the event on their own
and agree: ``reduce`` keeps the notifications it has room for, and
``process_event`` records every other ask (a render failure, or a backlog too
full to hold it), so nothing an event asks for is silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from streamkit.processors.dlq import ReplayRef, replay_ref
from streamkit.processors.notifications._events import (
    NOTIFICATION_RESEND_REQUESTED,
    PendingNotification,
    ResendRequested,
)
from streamkit.processors.notifications._rules import (
    NotificationRule,
    Rendered,
    RenderError,
    payload_dict,
    render,
)

from streamkit import StreamEvent

__all__ = ["Ask", "Asks", "notification_id"]


def notification_id(rule: str, source_offset: int) -> str:
    """The stable id of the notification ``rule`` makes for the event at ``source_offset``."""
    return f"{rule}@{source_offset}"


@dataclass(frozen=True, slots=True)
class Ask:
    """One delivery an event asks for: rendered, or why it could not be."""

    id: str
    rule: str
    source_offset: int
    source_type: str
    request_offset: int
    ref: ReplayRef | None
    notification: PendingNotification | None
    failure: RenderError | None
    source_payload: dict[str, Any]


class Asks:
    """The configured rules, indexed to read what each event asks for."""

    def __init__(self, rules: Iterable[NotificationRule]) -> None:
        self._by_type: dict[str, list[NotificationRule]] = {}
        self._by_name: dict[str, NotificationRule] = {}
        for rule in rules:
            self._by_type.setdefault(rule.event_type, []).append(rule)
            self._by_name[rule.name] = rule

    def of(self, event: StreamEvent) -> list[Ask]:
        """What ``event`` asks for: nothing, one ask per matching rule, or one resend."""
        etype = event.type
        if etype == NOTIFICATION_RESEND_REQUESTED:
            body = event.payload
            if not isinstance(body, ResendRequested):
                return []
            return [self._resend(body, event.offset, replay_ref(event))]
        rules = self._by_type.get(etype)
        if not rules:
            return []
        payload = payload_dict(event.payload)
        asks: list[Ask] = []
        for rule in rules:
            nid = notification_id(rule.name, event.offset)
            notification: PendingNotification | None = None
            failure: RenderError | None = None
            try:
                notification = _pending(nid, rule, render(rule, payload), event.offset, etype)
            except RenderError as exc:
                failure = exc
            asks.append(
                Ask(
                    nid,
                    rule.name,
                    event.offset,
                    etype,
                    event.offset,
                    None,
                    notification,
                    failure,
                    payload,
                )
            )
        return asks

    def _resend(self, body: ResendRequested, offset: int, ref: ReplayRef | None) -> Ask:
        rule = self._by_name.get(body.rule)
        payload = dict(body.source_payload or {})
        notification: PendingNotification | None = None
        failure: RenderError | None = None
        try:
            if body.source_payload is not None:
                if rule is None:
                    raise RenderError(
                        "",
                        f'rule "{body.rule}" is not configured any more, so notification '
                        f'"{body.notification_id}" cannot be rendered again; configure the rule '
                        "and replay it",
                    )
                notification = _pending(
                    body.notification_id,
                    rule,
                    render(rule, payload),
                    body.source_offset,
                    body.source_type,
                )
            elif body.body is None or body.channel is None:
                raise RenderError(
                    "",
                    f'the resend of notification "{body.notification_id}" has neither the '
                    "rendered notification (channel and body) nor a source_payload to render",
                )
            else:
                notification = PendingNotification(
                    id=body.notification_id,
                    rule=body.rule,
                    channel=body.channel,
                    recipients=list(body.recipients or ()),
                    subject=body.subject or "",
                    body=body.body,
                    source_offset=body.source_offset,
                    source_type=body.source_type,
                    request_offset=offset,
                    # Already rendered, so a rule removed since can still be
                    # resent; it gets a rule's default budget.
                    max_attempts=rule.max_attempts if rule is not None else 5,
                )
        except RenderError as exc:
            failure = exc
        if notification is not None:
            notification = notification.model_copy(
                update={
                    "request_offset": offset,
                    "dlq_record_id": None if ref is None else ref.record_id,
                    "replay": 0 if ref is None else ref.replay,
                }
            )
        return Ask(
            body.notification_id,
            body.rule,
            body.source_offset,
            body.source_type,
            offset,
            ref,
            notification,
            failure,
            payload,
        )


def _pending(
    nid: str, rule: NotificationRule, rendered: Rendered, offset: int, etype: str
) -> PendingNotification:
    return PendingNotification(
        id=nid,
        rule=rule.name,
        channel=rule.channel,
        recipients=rendered.recipients,
        subject=rendered.subject,
        body=rendered.body,
        source_offset=offset,
        source_type=etype,
        request_offset=offset,
        max_attempts=rule.max_attempts,
    )
