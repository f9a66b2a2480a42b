"""The records of a notification given up on: its outcome event and its DLQ record.

A notification that cannot render, or that ran out of attempts (or that the
channel says retrying cannot help), is settled by two events appended
together: ``notification.render-failed`` or ``notification.dead-lettered``,
and a ``dlq.dead-lettered`` record whose replay re-appends
``notification.resend-requested`` with what is needed to send it again. Both
carry idempotency keys derived from the notification's id and request, so a
first run's records are never written twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from streamkit.processors.dlq import ReplayRef, dead_lettered_event
from streamkit.processors.notifications._asks import Ask
from streamkit.processors.notifications._events import (
    NOTIFICATION_DEAD_LETTERED,
    NOTIFICATION_EVENTS,
    NOTIFICATION_RENDER_FAILED,
    NOTIFICATION_RESEND_REQUESTED,
    NotificationDeadLettered,
    NotificationRenderFailed,
    PendingNotification,
    ResendRequested,
)
from streamkit.processors.notifications._rules import RenderError

__all__ = [
    "MAX_RECORDED_PAYLOAD",
    "OPERATION_RENDER",
    "OPERATION_SEND",
    "dead_letter_events",
    "ref_of",
    "render_failed_events",
]

OPERATION_SEND = "notification.send"
"""The DLQ ``operation`` of a notification given up on after delivery attempts."""
OPERATION_RENDER = "notification.render"
"""The DLQ ``operation`` of a notification whose rule could not render."""

MAX_RECORDED_PAYLOAD = 256 * 1024
"""The largest source payload a render-failure DLQ record carries for a replay."""


def render_failed_events(
    ask: Ask, error: RenderError, slug: str, key: Callable[[str], str]
) -> list[dict[str, Any]]:
    """The outcome of a notification whose rule could not render, and its DLQ record."""
    nid, request = ask.id, ask.request_offset
    body = NotificationRenderFailed(
        notification_id=nid,
        request_offset=request,
        dlq_record_id=None if ask.ref is None else ask.ref.record_id,
        replay=0 if ask.ref is None else ask.ref.replay,
        rule=ask.rule,
        source_offset=ask.source_offset,
        source_type=ask.source_type,
        field=error.field,
        error=str(error),
    )
    kept = len(json.dumps(ask.source_payload, default=str)) <= MAX_RECORDED_PAYLOAD
    resend = ResendRequested(
        notification_id=nid,
        rule=ask.rule,
        source_offset=ask.source_offset,
        source_type=ask.source_type,
        source_payload=ask.source_payload if kept else None,
    )
    why = str(error)
    if not kept:
        # The record must fit in one event (1 MiB): a huge payload stays in
        # the log at source_offset, and a replay of this record says so.
        why += (
            f" (the payload is over {MAX_RECORDED_PAYLOAD} bytes, so this record does not "
            f"carry it; it is the event at offset {ask.source_offset})"
        )
    return [
        {
            "type": NOTIFICATION_RENDER_FAILED,
            "payload": body.model_dump(mode="json"),
            "idempotency_key": key(f"{nid}/{request}/render-failed"),
        },
        _dlq_record(slug, key, nid, request, ask.ref, OPERATION_RENDER, resend, why, attempts=0),
    ]


def dead_letter_events(
    notification: PendingNotification,
    slug: str,
    key: Callable[[str], str],
    *,
    attempts: int,
    error: str,
    retryable: bool,
) -> list[dict[str, Any]]:
    """The outcome of a notification given up on, and its DLQ record."""
    nid, request = notification.id, notification.request_offset
    ref = ref_of(notification)
    body = NotificationDeadLettered(
        notification_id=nid,
        request_offset=request,
        dlq_record_id=notification.dlq_record_id,
        replay=notification.replay,
        rule=notification.rule,
        attempts=attempts,
        error=error,
        retryable=retryable,
    )
    resend = ResendRequested(
        notification_id=nid,
        rule=notification.rule,
        source_offset=notification.source_offset,
        source_type=notification.source_type,
        channel=notification.channel,
        recipients=notification.recipients,
        subject=notification.subject,
        body=notification.body,
    )
    return [
        {
            "type": NOTIFICATION_DEAD_LETTERED,
            "payload": body.model_dump(mode="json"),
            "idempotency_key": key(f"{nid}/{request}/dead-lettered"),
        },
        _dlq_record(slug, key, nid, request, ref, OPERATION_SEND, resend, error, attempts=attempts),
    ]


def _dlq_record(
    slug: str,
    key: Callable[[str], str],
    nid: str,
    request: int,
    ref: ReplayRef | None,
    operation: str,
    resend: ResendRequested,
    error: str,
    *,
    attempts: int,
) -> dict[str, Any]:
    """The ``dlq.dead-lettered`` record whose replay is ``resend`` (or re-records ``ref``)."""
    return dead_lettered_event(
        record_id=f"{slug}/{nid}",
        origin=slug,
        operation=operation,
        payload=resend.model_dump(mode="json", exclude_none=True),
        error=error,
        attempts=attempts,
        resource_id=nid,
        request_type=NOTIFICATION_RESEND_REQUESTED,
        request_version=NOTIFICATION_EVENTS.payload_version_of(NOTIFICATION_RESEND_REQUESTED),
        replay_of=ref,
        idempotency_key=key(f"{nid}/{request}/dlq"),
    )


def ref_of(notification: PendingNotification) -> ReplayRef | None:
    """The DLQ replay a pending notification answers, if it is one."""
    if notification.dlq_record_id is None or notification.replay < 1:
        return None
    return ReplayRef(record_id=notification.dlq_record_id, replay=notification.replay)
