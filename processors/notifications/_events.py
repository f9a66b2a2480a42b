"""The events and the state of the notifications processor.

Every outcome event names the notification (``notification_id``) and the
*request* it answers: ``request_offset`` is the offset of the event that asked
for this delivery, the source event the first time and the
``notification.resend-requested`` event for a resend. Outcomes of an older
request never touch a newer one, and idempotency keys built from the id,
the request and the attempt are unique per delivery attempt. Outcomes of a DLQ
replay also carry ``dlq_record_id`` and ``replay``, for readers of the log.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from streamkit.processors._definitions import definition

from streamkit import ProcessorContract, define_processor_contract

__all__ = [
    "NOTIFICATION_ATTEMPT_FAILED",
    "NOTIFICATION_DEAD_LETTERED",
    "NOTIFICATION_EVENTS",
    "NOTIFICATION_RENDER_FAILED",
    "NOTIFICATION_RESEND_REQUESTED",
    "NOTIFICATION_SENT",
    "OWN_TYPES",
    "NotificationAttemptFailed",
    "NotificationDeadLettered",
    "NotificationRenderFailed",
    "NotificationSent",
    "NotificationsState",
    "PendingNotification",
    "ResendRequested",
]

NOTIFICATION_SENT = "notification.sent"
NOTIFICATION_ATTEMPT_FAILED = "notification.attempt-failed"
NOTIFICATION_DEAD_LETTERED = "notification.dead-lettered"
NOTIFICATION_RENDER_FAILED = "notification.render-failed"
NOTIFICATION_RESEND_REQUESTED = "notification.resend-requested"


class _Outcome(BaseModel):
    notification_id: str
    request_offset: int
    """The offset of the event that asked for this delivery (source event or resend request)."""
    dlq_record_id: str | None = None
    replay: int = 0


class NotificationSent(_Outcome):
    """A channel accepted the notification (``receipt`` is what it returned)."""

    rule: str
    channel: str
    source_offset: int
    attempt: int
    receipt: dict[str, Any] = Field(default_factory=dict)


class NotificationAttemptFailed(_Outcome):
    """One delivery attempt failed; the next one is due at ``retry_at`` (epoch seconds)."""

    attempt: int
    error: str
    retry_at: float


class NotificationDeadLettered(_Outcome):
    """The notification was given up on after ``attempts`` (0: it never got a chance)."""

    rule: str
    attempts: int
    error: str
    retryable: bool = True


class NotificationRenderFailed(_Outcome):
    """A rule could not render over its event (a missing field, say): nothing was sent."""

    rule: str
    source_offset: int
    source_type: str
    field: str
    error: str


class ResendRequested(BaseModel):
    """Deliver a notification again with a fresh attempt budget (what a DLQ replay appends).

    Either the rendered notification (``channel``, ``recipients``, ``subject``,
    ``body``) or ``source_payload``, rendered again with the rule of that name
    as configured now (the way to resend after fixing a rule). A DLQ replay
    marks the event with ``metadata["dlq"] = {"record_id", "replay"}``.
    """

    model_config = ConfigDict(extra="forbid")

    notification_id: str = Field(min_length=1)
    rule: str
    source_offset: int
    source_type: str
    channel: str | None = None
    recipients: list[str] | None = None
    subject: str | None = None
    body: str | None = None
    source_payload: dict[str, Any] | None = None


class _NoState(BaseModel):
    pass


NOTIFICATION_EVENTS: ProcessorContract[Any] = define_processor_contract(
    slug="notification-events",
    version="1",
    description="the events of streamkit.processors.notifications (a catalog to depend on)",
    state_schema=_NoState,
    events={
        NOTIFICATION_SENT: definition("a channel accepted a notification", NotificationSent),
        NOTIFICATION_ATTEMPT_FAILED: definition(
            "a delivery attempt failed; it is retried at retry_at", NotificationAttemptFailed
        ),
        NOTIFICATION_DEAD_LETTERED: definition(
            "a notification was given up on", NotificationDeadLettered
        ),
        NOTIFICATION_RENDER_FAILED: definition(
            "a rule's template could not render over its event", NotificationRenderFailed
        ),
        NOTIFICATION_RESEND_REQUESTED: definition(
            "deliver a notification again (a dead-letter replay)", ResendRequested
        ),
    },
)
"""The notification event types and their payload schemas, to list in ``processor_deps``."""

OWN_TYPES = frozenset(NOTIFICATION_EVENTS.events or ())


class PendingNotification(BaseModel):
    """A notification owed: rendered, not yet sent or dead-lettered."""

    id: str
    rule: str
    channel: str
    recipients: list[str]
    subject: str
    body: str
    source_offset: int
    source_type: str
    request_offset: int
    max_attempts: int
    attempts: int = 0
    retry_at: float | None = None
    last_error: str | None = None
    dlq_record_id: str | None = None
    replay: int = 0

    def weight(self) -> int:
        """Roughly what this notification costs in the checkpoint, in bytes."""
        text = self.subject, self.body, *self.recipients
        return 256 + sum(len(part.encode()) for part in text)


class NotificationsState(BaseModel):
    """Pending notifications by id, and counters (never the history of sent ones)."""

    pending: dict[str, PendingNotification] = Field(default_factory=dict)
    sent: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    render_failed: int = 0

    def without(self, nid: str, request_offset: int) -> dict[str, PendingNotification]:
        """``pending`` minus ``nid`` if it answers ``request_offset``; else unchanged.

        An outcome of an older request (a late duplicate) never settles a newer one.
        """
        current = self.pending.get(nid)
        if current is None or current.request_offset != request_offset:
            return self.pending
        return {key: value for key, value in self.pending.items() if key != nid}
