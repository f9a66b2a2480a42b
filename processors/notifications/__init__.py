"""Notifications: rules turn events into messages sent through channels, each at most once."""

from streamkit.processors.notifications._asks import (
    notification_id,
)
from streamkit.processors.notifications._events import (
    NOTIFICATION_ATTEMPT_FAILED,
    NOTIFICATION_DEAD_LETTERED,
    NOTIFICATION_EVENTS,
    NOTIFICATION_RENDER_FAILED,
    NOTIFICATION_RESEND_REQUESTED,
    NOTIFICATION_SENT,
    NotificationAttemptFailed,
    NotificationDeadLettered,
    NotificationRenderFailed,
    NotificationSent,
    NotificationsState,
    PendingNotification,
    ResendRequested,
)
from streamkit.processors.notifications._failures import OPERATION_RENDER, OPERATION_SEND
from streamkit.processors.notifications._processor import NotificationsProcessor
from streamkit.processors.notifications._rules import (
    MAX_RENDERED_BYTES,
    Backoff,
    NotificationRule,
)
from streamkit.processors.notifications.channels import (
    Channel,
    ChannelError,
    LogChannel,
    Notification,
    OutboxChannel,
    Receipt,
    SmtpChannel,
    WebhookChannel,
    build_channels,
    channel_from_config,
    read_outbox,
)

__all__ = [
    "MAX_RENDERED_BYTES",
    "NOTIFICATION_ATTEMPT_FAILED",
    "NOTIFICATION_DEAD_LETTERED",
    "NOTIFICATION_EVENTS",
    "NOTIFICATION_RENDER_FAILED",
    "NOTIFICATION_RESEND_REQUESTED",
    "NOTIFICATION_SENT",
    "OPERATION_RENDER",
    "OPERATION_SEND",
    "Backoff",
    "Channel",
    "ChannelError",
    "LogChannel",
    "Notification",
    "NotificationAttemptFailed",
    "NotificationDeadLettered",
    "NotificationRenderFailed",
    "NotificationRule",
    "NotificationSent",
    "NotificationsProcessor",
    "NotificationsState",
    "OutboxChannel",
    "PendingNotification",
    "Receipt",
    "ResendRequested",
    "SmtpChannel",
    "WebhookChannel",
    "build_channels",
    "channel_from_config",
    "notification_id",
    "read_outbox",
]
