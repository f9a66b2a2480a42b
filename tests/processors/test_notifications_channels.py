"""The four notification channels, each against a real local peer (file, HTTP, SMTP, structlog)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
from streamkit.processors.notifications.channels import (
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
from support.notifications import SmtpPeer, WebhookPeer

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


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_webhook_follows_no_redirect(status: int) -> None:
    """A 3xx is a non-retryable failure naming the status and Location; nothing goes there."""
    with (
        WebhookPeer() as elsewhere,
        WebhookPeer([status], location=elsewhere.url) as peer,
        pytest.raises(ChannelError) as caught,
    ):
        await WebhookChannel(peer.url, headers={"Authorization": "Bearer s3cret"}).send(_note())
    error = caught.value
    assert not error.retryable
    assert f"HTTP {status}" in error.message
    assert elsewhere.url in error.message
    assert "never followed" in error.message
    assert error.details["location"] == elsewhere.url
    # The credentials and the key went to the configured url only.
    assert len(peer.requests) == 1
    assert peer.requests[0]["headers"]["authorization"] == "Bearer s3cret"
    assert elsewhere.requests == []
    assert elsewhere.gets == 0


async def test_webhook_drip_is_cut_off_at_one_total_deadline() -> None:
    """A receiver dripping a byte every 0.4 s is ended at the 1 s deadline; no thread is left."""
    with WebhookPeer(drip_every=0.4, body_bytes=100) as peer:
        # The drip would take 40 s; the bound only keeps a broken channel from hanging the run.
        async with asyncio.timeout(20):
            with pytest.raises(ChannelError) as caught:
                await WebhookChannel(peer.url, timeout=1.0).send(_note())
        # The attempt ran on the event loop: no worker thread of the loop's pool was used.
        assert [t.name for t in threading.enumerate() if t.name.startswith("asyncio")] == []
    assert caught.value.retryable
    assert "within 1 s" in caught.value.message


async def test_webhook_reads_at_most_64_kib_of_a_huge_answer() -> None:
    """A 400 MB answer body is not read into memory: the channel stops after 64 KiB."""
    with WebhookPeer(body_bytes=400 * 1024 * 1024) as peer:
        receipt = await WebhookChannel(peer.url, timeout=10).send(_note())
        await asyncio.sleep(0.2)
        sent = peer.body_bytes_sent
    assert receipt["status"] == 200
    # The server got to push only what the socket buffers took before the hang-up.
    assert sent < 64 * 1024 * 1024


async def test_other_channels_keep_sending_while_webhooks_drip(tmp_path: Path) -> None:
    """Eight dripping webhook attempts at once do not hold up an outbox write meanwhile."""
    with WebhookPeer(drip_every=0.5, body_bytes=100) as peer:
        hooks = [
            asyncio.ensure_future(WebhookChannel(peer.url, timeout=3.0).send(_note(f"n@{i}")))
            for i in range(8)
        ]
        await asyncio.sleep(0.3)
        outbox = OutboxChannel(tmp_path / "out.jsonl")
        for i in range(20):
            await outbox.send(_note(f"o@{i}"))
        # Every outbox line is on disk while every webhook attempt is still dripping.
        still_dripping = [not hook.done() for hook in hooks]
        outcomes = await asyncio.gather(*hooks, return_exceptions=True)
    assert len(read_outbox(tmp_path / "out.jsonl")) == 20
    assert all(still_dripping)
    assert all(isinstance(outcome, ChannelError) for outcome in outcomes)
