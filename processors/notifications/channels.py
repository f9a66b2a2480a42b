"""Notification channels: where a rendered notification goes, and the receipt it leaves.

A channel is anything with ``async send(notification) -> receipt`` (the
:class:`Channel` protocol). The receipt is a small JSON object recorded in the
``notification.sent`` event; a failure is an exception, preferably a
:class:`ChannelError` whose ``retryable`` flag says whether trying again can
help (a refused recipient cannot; a server that is down may).

Four channels ship:

- :class:`LogChannel` writes one structlog line per notification;
- :class:`OutboxChannel` appends one JSON line per notification to a file
  opened with ``O_APPEND`` and fsyncs it before returning, so a receipt means
  the line is on disk;
- :class:`WebhookChannel` POSTs the notification as JSON with an
  ``Idempotency-Key`` header equal to the notification id, with httpx on the
  event loop: one deadline per attempt, no redirect followed, the answer's
  body capped;
- :class:`SmtpChannel` sends an email with stdlib ``smtplib`` in a worker
  thread; its ``Message-ID`` is derived from the notification id.

Every channel gets the same notification id on every attempt of one
notification, so a receiver that remembers ids can discard the duplicate a crash
between "sent" and "recorded as sent" may cause.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import smtplib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

from streamkit import InvalidConfig, StreamkitError

__all__ = [
    "Channel",
    "ChannelError",
    "LogChannel",
    "Notification",
    "OutboxChannel",
    "Receipt",
    "SmtpChannel",
    "WebhookChannel",
    "build_channels",
    "channel_from_config",
    "read_outbox",
]

Receipt = dict[str, Any]
"""What a channel returns: a JSON object about the delivery, kept in ``notification.sent``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One rendered notification, as a channel receives it.

    ``id`` is stable: the same notification has the same id on every attempt,
    after every restart and on every replay. ``attempt`` counts from 1 within
    the current budget; ``replay`` is 0 for the original delivery and the DLQ
    replay number otherwise.
    """

    id: str
    rule: str
    channel: str
    recipients: tuple[str, ...]
    subject: str
    body: str
    source_offset: int
    source_type: str
    attempt: int = 1
    replay: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The notification as a JSON-ready dict (recipients as a list)."""
        data = asdict(self)
        data["recipients"] = list(self.recipients)
        return data


class ChannelError(StreamkitError, OSError):
    """A channel could not deliver a notification; ``retryable`` says whether a retry may help."""

    code = "NOTIFICATION_CHANNEL_FAILED"
    default_retryable = True


@runtime_checkable
class Channel(Protocol):
    """Delivers a notification; returns a JSON-ready receipt or raises (ideally ChannelError).

    ``send`` may be cancelled (an attempt that outlives its timeout is): a
    channel must then leave nothing half-written that a retry would trip on.
    """

    async def send(self, notification: Notification) -> Receipt: ...


class LogChannel:
    """Writes each notification as one structlog event (``notification.delivered``)."""

    def __init__(self, *, logger_name: str = "streamkit.notifications") -> None:
        self.logger_name = logger_name

    async def send(self, notification: Notification) -> Receipt:
        structlog.get_logger(self.logger_name).info(
            "notification.delivered",
            notification_id=notification.id,
            rule=notification.rule,
            recipients=list(notification.recipients),
            subject=notification.subject,
            body=notification.body,
            attempt=notification.attempt,
        )
        return {"channel": "log"}

    def __repr__(self) -> str:
        return f"LogChannel(logger_name={self.logger_name!r})"


class OutboxChannel:
    """Appends one JSON line per notification to ``path``, fsync'd before ``send`` returns.

    The file is opened with ``O_APPEND`` for every write, so several processes
    (or channel instances) may share it without overwriting each other; within
    one channel, writes are serialized. A newly created file's directory is
    fsync'd too, so the file itself survives a power cut. Each line is
    ``notification.to_dict()``: read the file back with :func:`read_outbox`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    async def send(self, notification: Notification) -> Receipt:
        line = json.dumps(notification.to_dict(), separators=(",", ":"), sort_keys=True) + "\n"
        size = await asyncio.to_thread(self._write, line.encode("utf-8"))
        return {"channel": "outbox", "path": str(self.path), "bytes": size}

    def _write(self, data: bytes) -> int:
        with self._lock:
            created = not self.path.exists()
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ChannelError(
                    f"outbox file {str(self.path)!r} could not be opened for appending ({exc}); "
                    "nothing was written; create its directory or fix its permissions",
                    details={"path": str(self.path), "error": str(exc)},
                ) from exc
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_directory(self.path.parent)
        return len(data)

    def __repr__(self) -> str:
        return f"OutboxChannel({str(self.path)!r})"


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms cannot open a directory; the file's own fsync still held
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_outbox(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every notification line of an outbox file, in order (a missing file has none).

    A torn last line (a crash mid-write of a line that was never fsync'd, so
    never reported sent) is ignored.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines: list[dict[str, Any]] = []
    for raw in text.splitlines(keepends=True):
        if not raw.endswith("\n"):
            break
        lines.append(json.loads(raw))
    return lines


# HTTP answers that say "try later" rather than "this request is wrong".
_RETRYABLE_HTTP = frozenset({408, 425, 429})

MAX_RESPONSE_BYTES = 64 * 1024
"""The most of a webhook's response body read; the rest is never read into memory."""


class WebhookChannel:
    """POSTs the notification as JSON to ``url`` with ``Idempotency-Key: <notification id>``.

    - Any 2xx answer is a delivery. A 5xx, 408, 425 or 429 answer, a timeout
      or a connection failure is a retryable :class:`ChannelError`; any other
      4xx (the receiver refuses this request) is not retryable, so the
      notification is dead-lettered without burning its remaining attempts.
    - No redirect is followed: a 3xx is a non-retryable :class:`ChannelError`
      naming the status and its ``Location`` (the receiver moved: fix the
      url). So the body, ``Authorization`` and every other configured header
      go to ``url`` and nowhere else.
    - ``timeout`` is ONE deadline for the whole attempt: connecting, sending
      and reading the answer together. A receiver that drips its answer is
      cut off at the deadline and the attempt is over: it runs on the event
      loop (httpx), so nothing is left running and no thread is held.
    - At most :data:`MAX_RESPONSE_BYTES` of the answer's body are read.

    Needs httpx (``pip install 'streamkit-events[webhook]'``): an async client whose
    cancellation really ends the request and which follows no redirect unless
    told to.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidConfig(
                f"webhook url must start with http:// or https://, got {url!r}; no channel "
                "was built",
                details={"field": "url", "value": repr(url)[:200]},
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise InvalidConfig(
                f"webhook timeout must be a finite number of seconds above 0, got {timeout!r}; "
                "no channel was built",
                details={"field": "timeout", "value": repr(timeout)[:200]},
            )
        try:
            import httpx  # an optional extra: only a webhook channel needs it
        except ImportError as exc:
            raise InvalidConfig(
                "the webhook channel needs httpx, which is not installed; install it with "
                "`pip install 'streamkit-events[webhook]'`; no channel was built",
                details={"field": "kind", "missing": "httpx"},
            ) from exc
        self._httpx = httpx
        self.url = url
        self.timeout = float(timeout)
        self.headers = dict(headers or {})

    async def send(self, notification: Notification) -> Receipt:
        body = json.dumps(notification.to_dict(), separators=(",", ":")).encode("utf-8")
        status = await self._post(notification.id, body)
        return {"channel": "webhook", "url": self.url, "status": status}

    async def _post(self, notification_id: str, body: bytes) -> int:
        httpx = self._httpx
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "Idempotency-Key": notification_id,
        }
        details: dict[str, Any] = {"url": self.url, "notification_id": notification_id}
        try:
            # One deadline over connect, send and the whole answer; httpx's own
            # timeouts are per socket operation, which a dripping server never trips.
            async with (
                asyncio.timeout(self.timeout),
                httpx.AsyncClient(follow_redirects=False, timeout=None, trust_env=False) as client,
                client.stream("POST", self.url, content=body, headers=headers) as response,
            ):
                status: int = response.status_code
                location: str | None = response.headers.get("location")
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_RESPONSE_BYTES:
                        break  # the rest is never read: closing the stream drops it
        except TimeoutError as exc:
            raise ChannelError(
                f"webhook {self.url} gave no complete answer to notification "
                f'"{notification_id}" within {self.timeout:g} s (connecting, sending and the '
                "answer together); the attempt was ended; it may be retried",
                details={**details, "timeout": self.timeout},
            ) from exc
        except httpx.HTTPError as exc:
            raise ChannelError(
                f"webhook {self.url} could not be reached for notification "
                f'"{notification_id}" ({exc!r}); it may be retried',
                details={**details, "error": repr(exc)[:500]},
            ) from exc
        details["status"] = status
        if 300 <= status < 400:
            raise ChannelError(
                f"webhook {self.url} answered HTTP {status} to notification "
                f'"{notification_id}", a redirect to {location!r}; redirects are never followed '
                "(the notification and its headers go to the configured url only); no retry: "
                "set the channel's url to where the receiver now is",
                details={**details, "location": location},
                retryable=False,
            )
        if not 200 <= status < 300:
            retryable = status >= 500 or status in _RETRYABLE_HTTP
            raise ChannelError(
                f"webhook {self.url} answered HTTP {status} to notification "
                f'"{notification_id}"; '
                + ("it may be retried" if retryable else "the receiver refused it; no retry"),
                details=details,
                retryable=retryable,
            )
        return status

    def __repr__(self) -> str:
        return f"WebhookChannel({self.url!r})"


class SmtpChannel:
    """Sends each notification as an email through the SMTP server at ``host:port``.

    The recipients are the notification's; ``sender`` is the From address.
    The ``Message-ID`` is derived from the notification id (and an
    ``X-Notification-Id`` header carries it), so a mailbox or relay that
    deduplicates by Message-ID drops a resent duplicate. A 5xx refusal (every
    recipient refused, the sender refused, the message refused) is not
    retryable; a 4xx answer, a timeout or a connection failure is. ``starttls``
    upgrades the connection; ``username``/``password`` log in after it.
    ``smtplib`` runs in a worker thread; ``timeout`` bounds each socket wait.
    """

    def __init__(
        self,
        host: str,
        port: int = 25,
        *,
        sender: str,
        timeout: float = 10.0,
        starttls: bool = False,
        username: str | None = None,
        password: str | None = None,
        domain: str = "streamkit.local",
    ) -> None:
        if not isinstance(host, str) or not host:
            raise InvalidConfig(
                f"smtp host must be a non-empty string, got {host!r}; no channel was built",
                details={"field": "host"},
            )
        if not isinstance(sender, str) or "@" not in sender:
            raise InvalidConfig(
                f"smtp sender must be an email address, got {sender!r}; no channel was built",
                details={"field": "sender"},
            )
        self.host = host
        self.port = int(port)
        self.sender = sender
        self.timeout = float(timeout)
        self.starttls = starttls
        self.username = username
        self._password = password
        self.domain = domain

    async def send(self, notification: Notification) -> Receipt:
        if not notification.recipients:
            raise ChannelError(
                f'notification "{notification.id}" has no recipients, so there is nobody to '
                "email; nothing was sent; give its rule recipients",
                details={"notification_id": notification.id},
                retryable=False,
            )
        message = self._message(notification)
        refused = await asyncio.to_thread(self._deliver, notification.id, message)
        return {
            "channel": "smtp",
            "message_id": message["Message-ID"],
            "refused": sorted(refused),
        }

    def _message(self, notification: Notification) -> EmailMessage:
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = ", ".join(notification.recipients)
        message["Subject"] = notification.subject
        local = "".join(c if c.isalnum() or c in "-._" else "-" for c in notification.id)
        message["Message-ID"] = f"<{local}@{self.domain}>"
        message["X-Notification-Id"] = notification.id
        message.set_content(notification.body)
        return message

    def _deliver(self, notification_id: str, message: EmailMessage) -> dict[str, Any]:
        details: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "notification_id": notification_id,
        }
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
                if self.starttls:
                    smtp.starttls()
                if self.username is not None:
                    smtp.login(self.username, self._password or "")
                refused = smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            raise ChannelError(
                f"smtp server {self.host}:{self.port} refused every recipient of notification "
                f'"{notification_id}" ({_smtp_refusals(exc.recipients)}); no retry',
                details={**details, "refused": sorted(exc.recipients)},
                retryable=False,
            ) from exc
        except smtplib.SMTPResponseException as exc:
            retryable = not 500 <= exc.smtp_code < 600
            raise ChannelError(
                f"smtp server {self.host}:{self.port} answered {exc.smtp_code} "
                f'{_decode(exc.smtp_error)} to notification "{notification_id}"; '
                + ("it may be retried" if retryable else "no retry"),
                details={**details, "smtp_code": exc.smtp_code},
                retryable=retryable,
            ) from exc
        except (smtplib.SMTPException, OSError) as exc:
            raise ChannelError(
                f"smtp server {self.host}:{self.port} could not take notification "
                f'"{notification_id}" ({exc!r}); it may be retried',
                details={**details, "error": repr(exc)[:300]},
            ) from exc
        return dict(refused)

    def __repr__(self) -> str:
        return f"SmtpChannel({self.host!r}, {self.port}, sender={self.sender!r})"


def _decode(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _smtp_refusals(recipients: Mapping[str, tuple[int, bytes]]) -> str:
    return "; ".join(f"{who}: {code} {_decode(text)}" for who, (code, text) in recipients.items())


@dataclass(frozen=True, slots=True)
class _Kind:
    build: Any
    required: Sequence[str] = field(default_factory=tuple)


_KINDS: dict[str, _Kind] = {
    "log": _Kind(lambda spec: LogChannel(**spec)),
    "outbox": _Kind(lambda spec: OutboxChannel(**spec), ("path",)),
    "webhook": _Kind(lambda spec: WebhookChannel(**spec), ("url",)),
    "smtp": _Kind(lambda spec: SmtpChannel(**spec), ("host", "sender")),
}


def channel_from_config(name: str, spec: Mapping[str, Any]) -> Channel:
    """Build a shipped channel from a JSON-ready spec, e.g. ``{"kind": "log"}``.

    ``kind`` is ``log``, ``outbox``, ``webhook`` or ``smtp``; the other keys
    are the channel's keyword arguments (``path``; ``url``, ``timeout``,
    ``headers``; ``host``, ``port``, ``sender``, ...). This is how a host
    configuration file names channels. Raises
    :class:`~streamkit.errors.InvalidConfig` naming the channel and the key.
    """
    if not isinstance(spec, Mapping):
        raise InvalidConfig(
            f'notification channel "{name}" must be a channel object or a mapping with a '
            f'"kind", got {type(spec).__name__}',
            details={"channel": name},
        )
    options = dict(spec)
    kind = options.pop("kind", None)
    known = _KINDS.get(kind) if isinstance(kind, str) else None
    if known is None:
        raise InvalidConfig(
            f'notification channel "{name}": kind must be one of {sorted(_KINDS)}, got {kind!r}',
            details={"channel": name, "field": "kind", "value": repr(kind)[:200]},
        )
    missing = [key for key in known.required if key not in options]
    if missing:
        raise InvalidConfig(
            f'notification channel "{name}" ({kind}) needs {", ".join(missing)}',
            details={"channel": name, "field": missing[0]},
        )
    try:
        channel: Channel = known.build(options)
    except TypeError as exc:
        raise InvalidConfig(
            f'notification channel "{name}" ({kind}): {exc}',
            details={"channel": name, "error": str(exc)},
        ) from exc
    return channel


def build_channels(
    channels: Mapping[str, Channel | Mapping[str, Any]] | None,
) -> dict[str, Channel]:
    """Channels by name from channel objects or :func:`channel_from_config` specs.

    None gives one ``"log"`` channel. Raises
    :class:`~streamkit.errors.InvalidConfig` for anything that is neither.
    """
    if channels is None:
        return {"log": LogChannel()}
    if not isinstance(channels, Mapping):
        raise InvalidConfig(
            f"notification channels must map names to channels, got {type(channels).__name__}",
            details={"field": "channels"},
        )
    built: dict[str, Channel] = {}
    for name, channel in channels.items():
        if isinstance(channel, Mapping):
            built[name] = channel_from_config(name, channel)
        elif isinstance(channel, Channel):
            built[name] = channel
        else:
            raise InvalidConfig(
                f'notification channel "{name}" has no async send(notification) method: '
                f"{channel!r}",
                details={"channel": name},
            )
    return built
