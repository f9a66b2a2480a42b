"""The four notification channels, each against a real local peer (file, HTTP, SMTP, structlog)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from notifications_support import SmtpPeer, WebhookPeer
from streamkit.processors.notification_channels import (
    Channel,
    ChannelError,
    LogChannel,
    Notification,
    OutboxChannel,
    SmtpChannel,
    WebhookChannel,
    channel_from_config,
    read_outbox,
)
from structlog.testing import capture_logs

from streamkit import InvalidConfig


def _note(nid: str = "welcome@7", **overrides: object) -> Notification:
    fields: dict[str, object] = {
        "id": nid,
        "rule": "welcome",
        "channel": "test",
        "recipients": ("ada@example.com",),
        "subject": "Hello",
        "body": "Welcome, Ada. Cost: $5",
        "source_offset": 7,
        "source_type": "user.joined",
    }
    fields.update(overrides)
    return Notification(**fields)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_every_shipped_channel_satisfies_the_protocol(tmp_path: Path) -> None:
    """LogChannel, OutboxChannel, WebhookChannel and SmtpChannel are all Channels."""
    for channel in (
        LogChannel(),
        OutboxChannel(tmp_path / "o.jsonl"),
        WebhookChannel("http://127.0.0.1:1/"),
        SmtpChannel("127.0.0.1", 25, sender="app@example.com"),
    ):
        assert isinstance(channel, Channel)


async def test_log_channel_writes_one_structlog_event() -> None:
    """The log channel logs notification.delivered with the id, recipients and text."""
    with capture_logs() as logs:
        receipt = await LogChannel().send(_note())
    assert receipt == {"channel": "log"}
    (line,) = [entry for entry in logs if entry["event"] == "notification.delivered"]
    assert line["notification_id"] == "welcome@7"
    assert line["recipients"] == ["ada@example.com"]
    assert line["body"] == "Welcome, Ada. Cost: $5"


async def test_outbox_appends_one_json_line_per_notification(tmp_path: Path) -> None:
    """Each send appends one line with the id; two channels on one file both append."""
    path = tmp_path / "outbox.jsonl"
    first, second = OutboxChannel(path), OutboxChannel(path)
    receipt = await first.send(_note("a@1"))
    await second.send(_note("b@2"))
    await first.send(_note("c@3", body="line\nbreak"))
    assert receipt["channel"] == "outbox"
    assert receipt["bytes"] == len(path.read_bytes().splitlines(keepends=True)[0])
    lines = read_outbox(path)
    assert [line["id"] for line in lines] == ["a@1", "b@2", "c@3"]
    assert lines[2]["body"] == "line\nbreak"
    assert lines[0]["recipients"] == ["ada@example.com"]


def test_read_outbox_ignores_a_torn_last_line(tmp_path: Path) -> None:
    """A last line without its newline (a crash mid-write) is not read as a notification."""
    path = tmp_path / "outbox.jsonl"
    path.write_text('{"id": "a@1"}\n{"id": "b@', encoding="utf-8")
    assert read_outbox(path) == [{"id": "a@1"}]
    assert read_outbox(tmp_path / "missing.jsonl") == []


async def test_outbox_in_a_missing_directory_fails_clearly(tmp_path: Path) -> None:
    """An outbox whose directory does not exist raises a ChannelError naming the path."""
    path = tmp_path / "nope" / "outbox.jsonl"
    with pytest.raises(ChannelError, match="could not be opened") as caught:
        await OutboxChannel(path).send(_note())
    assert caught.value.code == "NOTIFICATION_CHANNEL_FAILED"
    assert not path.exists()


async def test_webhook_posts_json_with_the_idempotency_key() -> None:
    """The webhook POSTs the notification as JSON with Idempotency-Key = the notification id."""
    with WebhookPeer() as peer:
        receipt = await WebhookChannel(peer.url, headers={"X-Team": "ops"}).send(_note())
    assert receipt == {"channel": "webhook", "url": peer.url, "status": 200}
    (request,) = peer.requests
    assert request["headers"]["idempotency-key"] == "welcome@7"
    assert request["headers"]["content-type"] == "application/json"
    assert request["headers"]["x-team"] == "ops"
    assert request["json"]["id"] == "welcome@7"
    assert request["json"]["body"] == "Welcome, Ada. Cost: $5"


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False), (404, False)]
)
async def test_webhook_error_status_says_whether_to_retry(status: int, retryable: bool) -> None:
    """A 5xx or 429 is a retryable ChannelError; another 4xx is a refusal that is not."""
    with WebhookPeer([status]) as peer, pytest.raises(ChannelError) as caught:
        await WebhookChannel(peer.url).send(_note())
    assert caught.value.retryable is retryable
    assert caught.value.details["status"] == status
    assert f"HTTP {status}" in str(caught.value)


async def test_webhook_unreachable_is_retryable() -> None:
    """A connection refused is a retryable ChannelError."""
    url = f"http://127.0.0.1:{_free_port()}/hook"
    with pytest.raises(ChannelError, match="could not be reached") as caught:
        await WebhookChannel(url, timeout=2).send(_note())
    assert caught.value.retryable


def test_webhook_refuses_a_non_http_url() -> None:
    """A webhook url must be http(s); anything else is refused when the channel is built."""
    with pytest.raises(InvalidConfig, match="http:// or https://"):
        WebhookChannel("ftp://example.com/hook")


async def test_smtp_delivers_the_message_to_a_local_server() -> None:
    """The SMTP channel sends one email with the subject, body and an id-derived Message-ID."""
    with SmtpPeer() as peer:
        channel = SmtpChannel("127.0.0.1", peer.port, sender="app@example.com", timeout=5)
        receipt = await channel.send(_note(recipients=("ada@example.com", "bob@example.com")))
    (received,) = peer.messages
    assert received["from"] == "app@example.com"
    assert received["to"] == ["ada@example.com", "bob@example.com"]
    message = received["message"]
    assert message["Subject"] == "Hello"
    assert message["X-Notification-Id"] == "welcome@7"
    assert message["Message-ID"] == "<welcome-7@streamkit.local>"
    assert message.get_content().strip() == "Welcome, Ada. Cost: $5"
    assert receipt == {
        "channel": "smtp",
        "message_id": "<welcome-7@streamkit.local>",
        "refused": [],
    }


async def test_smtp_partial_refusal_is_a_delivery_with_the_refused_listed() -> None:
    """One refused recipient among accepted ones still delivers; the receipt names the refused."""
    with SmtpPeer() as peer:
        channel = SmtpChannel("127.0.0.1", peer.port, sender="app@example.com", timeout=5)
        receipt = await channel.send(_note(recipients=("ada@example.com", "nobody@example.com")))
    assert receipt["refused"] == ["nobody@example.com"]
    assert peer.messages[0]["to"] == ["ada@example.com"]


async def test_smtp_every_recipient_refused_is_not_retryable() -> None:
    """When the server refuses every recipient the error is final, and nothing was delivered."""
    with SmtpPeer() as peer:
        channel = SmtpChannel("127.0.0.1", peer.port, sender="app@example.com", timeout=5)
        with pytest.raises(ChannelError, match="refused every recipient") as caught:
            await channel.send(_note(recipients=("nobody@example.com",)))
    assert not caught.value.retryable
    assert peer.messages == []


async def test_smtp_unreachable_is_retryable() -> None:
    """A server that is not listening is a retryable ChannelError."""
    channel = SmtpChannel("127.0.0.1", _free_port(), sender="app@example.com", timeout=2)
    with pytest.raises(ChannelError, match="could not take") as caught:
        await channel.send(_note())
    assert caught.value.retryable


async def test_smtp_without_recipients_is_refused_without_connecting() -> None:
    """A notification with no recipients cannot be emailed: a final ChannelError."""
    channel = SmtpChannel("127.0.0.1", _free_port(), sender="app@example.com")
    with pytest.raises(ChannelError, match="no recipients") as caught:
        await channel.send(_note(recipients=()))
    assert not caught.value.retryable


def test_channel_from_config_builds_each_kind(tmp_path: Path) -> None:
    """Spec mappings build the shipped channels (as a host config file names them)."""
    outbox = channel_from_config("o", {"kind": "outbox", "path": str(tmp_path / "o.jsonl")})
    assert isinstance(outbox, OutboxChannel)
    assert isinstance(channel_from_config("l", {"kind": "log"}), LogChannel)
    hook = channel_from_config("w", {"kind": "webhook", "url": "http://127.0.0.1/", "timeout": 3})
    assert isinstance(hook, WebhookChannel)
    assert hook.timeout == 3
    mail = channel_from_config("m", {"kind": "smtp", "host": "mx", "sender": "a@b.c"})
    assert isinstance(mail, SmtpChannel)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "pigeon"}, "kind must be one of"),
        ({"kind": "outbox"}, "needs path"),
        ({"kind": "webhook", "url": "http://x/", "colour": 1}, "colour"),
        ("outbox", "must be a channel object or a mapping"),
    ],
)
def test_channel_from_config_refuses_bad_specs(spec: object, message: str) -> None:
    """An unknown kind, a missing or unknown key is refused with InvalidConfig naming it."""
    with pytest.raises(InvalidConfig, match=message):
        channel_from_config("c", spec)  # type: ignore[arg-type]
