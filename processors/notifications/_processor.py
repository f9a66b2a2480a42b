"""Notifications: rules turn events into messages sent through channels, each at most once.

:class:`NotificationsProcessor` watches the stream for the event types its
rules name. Each matching event becomes one notification per rule, with a
stable id ``<rule>@<offset>`` (the rule's name and the source event's offset).
The processor renders it (``string.Template`` over the payload), keeps it in
its state as *pending*, and delivers it through the rule's channel in the
background, recording every outcome as an event:

- ``notification.sent`` when the channel accepted it;
- ``notification.attempt-failed`` with the time of the next try (backoff);
- ``notification.dead-lettered`` (with a ``dlq.dead-lettered`` record for the
  dead-letter queue) after the rule's ``max_attempts``, or at once when the
  channel says retrying cannot help;
- ``notification.render-failed`` (with a ``dlq.dead-lettered`` record) when a
  payload lacks a field a template names: nothing is sent, nothing is lost,
  the processor moves on.

What it guarantees, and why:

- **A sent notification is never attempted again by a replay or a restart.**
  Deliveries start only in the at-head pass, from state, so a catch-up over
  old events first folds every outcome already recorded. The state forgets a
  notification once its outcome is folded, and remembering it longer would buy
  nothing: a source event is reduced again only at an offset above the
  checkpoint cursor, and then its outcome, appended after it, lies above the
  cursor too and is folded again before the at-head pass. Within one
  incarnation, attempts in flight (and outcomes not folded yet) are kept in
  memory, so a second at-head pass does not start them twice.
- **At least once at the edge.** A host that dies after a channel accepted a
  notification and before ``notification.sent`` is committed sends it again
  after the revive: with the same id, so the webhook's ``Idempotency-Key`` and
  the email's ``Message-ID`` let a receiver drop the duplicate.
- **Bounded state.** Only pending notifications are kept, with their rendered
  text (at most 32 KiB each): at most ``max_pending`` of them and at most
  ``max_pending_bytes`` of text. A notification past either bound is
  dead-lettered at once ("backlog full"), so the checkpoint stays below its
  2 MiB ceiling and nothing is lost.

A DLQ replay of a notification record re-appends
``notification.resend-requested`` (the record's payload, marked with
``metadata["dlq"]``); the processor delivers it again with a fresh attempt
budget and settles the record: ``dlq.record-succeeded`` beside
``notification.sent``, or the record dead-lettered again (as that replay)
beside ``notification.dead-lettered``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streamkit.processors.dlq import (
    DEAD_LETTERED,
    DLQ_EVENTS,
    RECORD_SUCCEEDED,
    record_succeeded_event,
)
from streamkit.processors.notifications._asks import Ask, Asks
from streamkit.processors.notifications._events import (
    NOTIFICATION_ATTEMPT_FAILED,
    NOTIFICATION_EVENTS,
    NOTIFICATION_RESEND_REQUESTED,
    NOTIFICATION_SENT,
    OWN_TYPES,
    NotificationAttemptFailed,
    NotificationDeadLettered,
    NotificationRenderFailed,
    NotificationSent,
    NotificationsState,
    PendingNotification,
)
from streamkit.processors.notifications._failures import (
    dead_letter_events,
    ref_of,
    render_failed_events,
)
from streamkit.processors.notifications._rules import (
    MAX_RENDERED_BYTES,
    Backoff,
    ContractSchemas,
    NotificationRule,
    RenderError,
    check_rules,
)
from streamkit.processors.notifications.channels import (
    Channel,
    ChannelError,
    Notification,
    build_channels,
)

from streamkit import (
    IdempotencyConflict,
    InvalidConfig,
    ProcessEventArgs,
    ProcessorContract,
    StreamEvent,
    StreamkitError,
    StreamProcessor,
    define_processor_contract,
)

__all__ = ["NotificationsProcessor"]

# How long past an attempt's timeout its outcome may take to be folded before
# the at-head pass treats the attempt as lost and tries again.
_OUTCOME_GRACE = 5.0


@dataclass(slots=True)
class _Flight:
    """An attempt this incarnation started, kept until state shows its outcome."""

    attempt: int
    request_offset: int
    deadline: float
    done: bool = False
    recorded_offset: int | None = None


class NotificationsProcessor(StreamProcessor[NotificationsState]):
    """Sends a notification per matching event and rule, through named channels.

    ``rules``: :class:`NotificationRule` objects or mappings of their fields.
    ``channels``: name -> :class:`Channel`, or a spec mapping for
    :func:`channel_from_config` (``{"kind": "outbox", "path": ...}``); the
    default is one ``"log"`` channel. ``sources``: contracts that own the
    events the rules watch; their payload schemas validate those events and let
    templates be checked when the processor is built. ``backoff`` spaces the
    retries; ``attempt_timeout`` bounds one delivery; ``max_pending`` and
    ``max_pending_bytes`` bound the notifications kept in state (their count,
    and the size of their text; the checkpoint holds at most 2 MiB). ``clock``
    gives epoch seconds (retry times).

    Raises :class:`~streamkit.errors.InvalidConfig` for a broken rule, channel
    or setting, so a misconfigured processor never starts.
    """

    def __init__(
        self,
        *,
        rules: Iterable[NotificationRule | Mapping[str, Any]],
        channels: Mapping[str, Channel | Mapping[str, Any]] | None = None,
        sources: Iterable[ProcessorContract[Any]] = (),
        slug: str = "notifications",
        version: str = "1",
        backoff: Backoff | Mapping[str, Any] | None = None,
        attempt_timeout: float = 30.0,
        max_pending: int = 1000,
        max_pending_bytes: int = 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._channels = build_channels(channels)
        deps: dict[str, ProcessorContract[Any]] = {
            NOTIFICATION_EVENTS.slug: NOTIFICATION_EVENTS,
            DLQ_EVENTS.slug: DLQ_EVENTS,
        }
        if isinstance(sources, (str, bytes, Mapping)):
            sources = [sources]  # type: ignore[list-item]  # refused just below, with its name
        for source in sources:
            if not isinstance(source, ProcessorContract):
                raise InvalidConfig(
                    f"notification sources must be contracts (e.g. Board.contract), got "
                    f"{source!r}; no processor was built",
                    details={"field": "sources"},
                )
            deps.setdefault(source.slug, source)
        self.contract = define_processor_contract(
            slug=slug,
            version=version,
            description="renders notifications for events and delivers them through channels",
            state_schema=NotificationsState,
            events={},
            processor_deps=list(deps.values()),
            # Rules may watch types nobody declares, so take every durable event
            # and let the reduce pick (a catalog would refuse undeclared types).
            consumes=["*"],
            # A source event its owner's model cannot read is not notified, counted in
            # `status` and /metrics: one unreadable event must not hold back every later
            # notification (its owner processor stalls on it by default, loudly).
            on_malformed="skip",
            emits=sorted(
                (OWN_TYPES - {NOTIFICATION_RESEND_REQUESTED}) | {DEAD_LETTERED, RECORD_SUCCEEDED}
            ),
        )
        self.rules = check_rules(
            rules,
            self._channels,
            ContractSchemas(self.contract),
            OWN_TYPES | set(self.contract.emits),
        )
        self._asks = Asks(self.rules)
        if isinstance(backoff, Backoff):
            self.backoff = backoff
        else:
            try:
                self.backoff = Backoff.model_validate(dict(backoff or {}))
            except Exception as exc:
                raise InvalidConfig(
                    f"notification backoff is invalid: {exc}; no processor was built",
                    details={"field": "backoff"},
                ) from exc
        if isinstance(attempt_timeout, bool) or not (
            isinstance(attempt_timeout, (int, float)) and attempt_timeout > 0
        ):
            raise InvalidConfig(
                f"attempt_timeout must be a positive number of seconds, got {attempt_timeout!r}",
                details={"field": "attempt_timeout"},
            )
        for name, bound, low in (
            ("max_pending", max_pending, 1),
            ("max_pending_bytes", max_pending_bytes, MAX_RENDERED_BYTES),
        ):
            if isinstance(bound, bool) or not (isinstance(bound, int) and bound >= low):
                raise InvalidConfig(
                    f"{name} must be an integer of at least {low}, got {bound!r}; no processor "
                    "was built",
                    details={"field": name},
                )
        self.attempt_timeout = float(attempt_timeout)
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._clock = clock
        self._in_flight: dict[str, _Flight] = {}

    @property
    def channels(self) -> Mapping[str, Channel]:
        """The configured channels by name."""
        return dict(self._channels)

    # -- reduce (pure) -------------------------------------------------------------

    def _has_room(
        self, pending: Mapping[str, PendingNotification], fresh: PendingNotification
    ) -> bool:
        if len(pending) >= self.max_pending:
            return False
        used = sum(p.weight() for p in pending.values())
        return used + fresh.weight() <= self.max_pending_bytes

    def reduce(self, event: StreamEvent, state: NotificationsState) -> NotificationsState | None:
        if event.type in OWN_TYPES and event.type != NOTIFICATION_RESEND_REQUESTED:
            return self._reduce_outcome(event.payload, state)
        asks = self._asks.of(event)
        if not asks:
            return None
        pending = dict(state.pending)
        for ask in asks:
            fresh = ask.notification
            if fresh is None:
                continue  # recorded by process_event as notification.render-failed
            current = pending.get(ask.id)
            if current is not None:
                if ask.ref is not None:
                    # A replay of a notification still owed: the owed delivery
                    # answers the replay too.
                    pending[ask.id] = current.model_copy(
                        update={"dlq_record_id": ask.ref.record_id, "replay": ask.ref.replay}
                    )
                continue
            if not self._has_room(pending, fresh):
                continue  # dead-lettered by process_event: "backlog full"
            pending[ask.id] = fresh
        if pending == state.pending:
            return None
        return state.model_copy(update={"pending": pending})

    def _reduce_outcome(self, body: Any, state: NotificationsState) -> NotificationsState | None:
        pending = state.pending
        if isinstance(body, NotificationSent):
            return state.model_copy(
                update={
                    "pending": state.without(body.notification_id, body.request_offset),
                    "sent": state.sent + 1,
                }
            )
        if isinstance(body, NotificationAttemptFailed):
            update: dict[str, Any] = {"failed_attempts": state.failed_attempts + 1}
            current = pending.get(body.notification_id)
            if (
                current is not None
                and current.request_offset == body.request_offset
                and body.attempt > current.attempts
            ):
                changed = current.model_copy(
                    update={
                        "attempts": body.attempt,
                        "retry_at": body.retry_at,
                        "last_error": body.error,
                    }
                )
                update["pending"] = {**pending, body.notification_id: changed}
            return state.model_copy(update=update)
        if isinstance(body, NotificationDeadLettered):
            return state.model_copy(
                update={
                    "pending": state.without(body.notification_id, body.request_offset),
                    "dead_lettered": state.dead_lettered + 1,
                }
            )
        if isinstance(body, NotificationRenderFailed):
            return state.model_copy(update={"render_failed": state.render_failed + 1})
        return None

    # -- effects -------------------------------------------------------------------

    def process_event(self, args: ProcessEventArgs[NotificationsState]) -> None:
        event = args.event
        if event is not None and event.type not in OWN_TYPES - {NOTIFICATION_RESEND_REQUESTED}:
            refusals: list[dict[str, Any]] = []
            for ask in self._asks.of(event):
                if ask.failure is not None:
                    refusals.extend(self._render_failed(ask, ask.failure))
                elif ask.notification is not None and ask.id not in args.state.pending:
                    refusals.extend(self._backlog_full(ask.notification))
            if refusals:
                # Hold the cursor until the refusals are recorded: a crash before
                # that replays this event, and the idempotency keys make the
                # second recording a no-op if the first one landed.
                args.block_processor_while(lambda: _record(args, refusals))
        if args.delivery.caught_up:
            self._deliver_owed(args)

    def _render_failed(self, ask: Ask, error: RenderError) -> list[dict[str, Any]]:
        return render_failed_events(ask, error, self.contract.slug, self.idempotency_key)

    def _backlog_full(self, notification: PendingNotification) -> list[dict[str, Any]]:
        """Dead-letter a notification the state had no room for (``max_pending`` reached)."""
        error = (
            f"the notifications backlog is full (at most {self.max_pending} notifications and "
            f"{self.max_pending_bytes} bytes of text wait in state), so this "
            "notification was dead-lettered at once instead of being kept; replay it once "
            "the channel has caught up"
        )
        return self._dead_letter(notification, attempts=0, error=error, retryable=True)

    def _dead_letter(
        self, notification: PendingNotification, *, attempts: int, error: str, retryable: bool
    ) -> list[dict[str, Any]]:
        return dead_letter_events(
            notification,
            self.contract.slug,
            self.idempotency_key,
            attempts=attempts,
            error=error,
            retryable=retryable,
        )

    def _deliver_owed(self, args: ProcessEventArgs[NotificationsState]) -> None:
        """The at-head pass: start every due notification not in flight; wake for the rest."""
        state = args.state
        now = self._clock()
        self._forget_settled(state, args.event)
        wake: float | None = None
        for pending in state.pending.values():
            flight = self._in_flight.get(pending.id)
            if flight is not None:
                # Its outcome is not folded yet. Come back after its deadline in
                # case recording it fails, so it is retried rather than forgotten.
                due = flight.deadline
            elif pending.retry_at is not None and pending.retry_at > now:
                due = pending.retry_at
            else:
                due = self._start(args, pending, now).deadline
            wake = due if wake is None else min(wake, due)
        if wake is not None:
            args.schedule_wakeup(wake)

    def _forget_settled(self, state: NotificationsState, event: StreamEvent | None) -> None:
        for nid, flight in list(self._in_flight.items()):
            pending = state.pending.get(nid)
            folded = (
                pending is None
                or pending.request_offset != flight.request_offset
                or pending.attempts >= flight.attempt
                or (
                    flight.recorded_offset is not None
                    and event is not None
                    and event.offset >= flight.recorded_offset
                )
            )
            lost = flight.done and flight.recorded_offset is None
            if folded or lost:
                del self._in_flight[nid]

    def _start(
        self, args: ProcessEventArgs[NotificationsState], pending: PendingNotification, now: float
    ) -> _Flight:
        attempt = pending.attempts + 1
        flight = _Flight(
            attempt=attempt,
            request_offset=pending.request_offset,
            deadline=now + self.attempt_timeout + _OUTCOME_GRACE,
        )
        self._in_flight[pending.id] = flight
        notification = Notification(
            id=pending.id,
            rule=pending.rule,
            channel=pending.channel,
            recipients=tuple(pending.recipients),
            subject=pending.subject,
            body=pending.body,
            source_offset=pending.source_offset,
            source_type=pending.source_type,
            attempt=attempt,
            replay=pending.replay,
        )
        args.run_in_background(lambda: self._attempt(args, pending, notification, flight))
        return flight

    async def _attempt(
        self,
        args: ProcessEventArgs[NotificationsState],
        pending: PendingNotification,
        notification: Notification,
        flight: _Flight,
    ) -> None:
        """One delivery attempt, then its outcome as events (keyed by id, request, attempt)."""
        try:
            outcome = await self._try_send(pending, notification)
            try:
                committed = await args.append(*outcome)
            except IdempotencyConflict as exc:
                # This attempt's outcome is already in the log (an earlier run of
                # the same attempt whose result we never saw): the first one stands.
                offset = exc.details.get("offset")
                flight.recorded_offset = offset if isinstance(offset, int) else None
            else:
                flight.recorded_offset = committed[-1].offset
        finally:
            flight.done = True

    async def _try_send(
        self, pending: PendingNotification, notification: Notification
    ) -> list[dict[str, Any]]:
        nid, request, attempt = pending.id, pending.request_offset, notification.attempt
        channel = self._channels.get(pending.channel)
        try:
            if channel is None:
                raise ChannelError(
                    f'channel "{pending.channel}" of notification "{nid}" is not configured '
                    "any more; nothing was sent; configure it and replay the dead letter",
                    details={"channel": pending.channel, "notification_id": nid},
                    retryable=False,
                )
            receipt = await asyncio.wait_for(channel.send(notification), self.attempt_timeout)
        except asyncio.CancelledError:
            raise  # the host is stopping: no outcome; the revive tries this attempt again
        except Exception as exc:
            error = _describe(exc)
            retryable = exc.retryable if isinstance(exc, StreamkitError) else True
            if attempt >= pending.max_attempts or not retryable:
                return self._dead_letter(
                    pending, attempts=attempt, error=error, retryable=retryable
                )
            failed = NotificationAttemptFailed(
                notification_id=nid,
                request_offset=request,
                dlq_record_id=pending.dlq_record_id,
                replay=pending.replay,
                attempt=attempt,
                error=error,
                retry_at=self._clock() + self.backoff.delay(nid, attempt),
            )
            return [
                {
                    "type": NOTIFICATION_ATTEMPT_FAILED,
                    "payload": failed.model_dump(mode="json"),
                    "idempotency_key": self.idempotency_key(f"{nid}/{request}/a{attempt}/failed"),
                }
            ]
        sent = NotificationSent(
            notification_id=nid,
            request_offset=request,
            dlq_record_id=pending.dlq_record_id,
            replay=pending.replay,
            rule=pending.rule,
            channel=pending.channel,
            source_offset=pending.source_offset,
            attempt=attempt,
            receipt=_json_receipt(receipt),
        )
        events: list[dict[str, Any]] = [
            {
                "type": NOTIFICATION_SENT,
                "payload": sent.model_dump(mode="json"),
                "idempotency_key": self.idempotency_key(f"{nid}/{request}/sent"),
            }
        ]
        ref = ref_of(pending)
        if ref is not None:
            events.append(record_succeeded_event(ref))
        return events

    def project_live_state(self, state: NotificationsState) -> Any:
        """Counters and, per pending notification, where it stands (not its text)."""
        return {
            "sent": state.sent,
            "failed_attempts": state.failed_attempts,
            "dead_lettered": state.dead_lettered,
            "render_failed": state.render_failed,
            "pending": {
                nid: {
                    "rule": p.rule,
                    "channel": p.channel,
                    "attempts": p.attempts,
                    "retry_at": p.retry_at,
                    "last_error": p.last_error,
                    "dlq_record_id": p.dlq_record_id,
                }
                for nid, p in state.pending.items()
            },
        }


# -- helpers -----------------------------------------------------------------------


async def _record(args: ProcessEventArgs[NotificationsState], events: list[dict[str, Any]]) -> None:
    """Append refusal outcomes; a conflict means a first run recorded them (atomically)."""
    with contextlib.suppress(IdempotencyConflict):
        await args.append(*events)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the channel did not answer within the attempt timeout"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, StreamkitError) else f"{type(exc).__name__}: {text}"


def _json_receipt(receipt: object) -> dict[str, Any]:
    # The receipt goes into notification.sent: one that is not JSON must not
    # make the outcome unrecordable (that would send the notification again).
    if isinstance(receipt, Mapping):
        try:
            loaded: dict[str, Any] = json.loads(json.dumps(dict(receipt), default=str))
        except (TypeError, ValueError):
            pass
        else:
            return loaded
    return {"value": repr(receipt)[:500]}
