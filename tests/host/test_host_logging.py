"""The daemon's log lines: one format for its own lines and for the libraries' underneath."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from streamkit.engine._fold import report
from streamkit.host._logging import configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers = handlers
        root.setLevel(level)
        structlog.reset_defaults()


def _fail() -> None:
    raise RuntimeError("boom")


@pytest.mark.usefixtures("restored_logging")
def test_a_librarys_traceback_is_one_json_line_in_a_json_log() -> None:
    """A stdlib logger's exception (uvicorn's, say) is a JSON object with its traceback inside."""
    out = io.StringIO()
    configure_logging("json", out)
    structlog.get_logger("streamkit.host").info("host.started", n=1)
    try:
        _fail()
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    logging.getLogger("uvicorn.error").info("Started server process")  # below WARNING: dropped
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["host.started", "Exception in ASGI application"]
    library = lines[1]
    assert library["logger"] == "uvicorn.error"
    assert library["level"] == "error"
    (raised,) = library["exception"]  # structured: type, message, frames; no locals
    assert (raised["exc_type"], raised["exc_value"]) == ("RuntimeError", "boom")
    assert raised["frames"][-1]["name"] == "_fail"
    assert all("locals" not in frame for frame in raised["frames"])
    assert "timestamp" in library


@pytest.mark.usefixtures("restored_logging")
def test_a_reduce_failure_logs_its_traceback_as_structured_frames_without_locals() -> None:
    """A failure of user code reported by the engine is one JSON line whose exception holds
    the user's frame, and no local variable of any frame."""
    out = io.StringIO()
    configure_logging("json", out)
    secret = "hunter2"

    def reduce() -> None:
        token = secret
        raise ValueError(f"cannot fold {len(token)}")

    try:
        reduce()
    except ValueError as exc:
        report("processor.reduce_failed", exc, slug="orders", offset=7)
    (line,) = [json.loads(text) for text in out.getvalue().splitlines()]
    assert (line["event"], line["slug"], line["offset"]) == ("processor.reduce_failed", "orders", 7)
    (raised,) = line["exception"]
    assert raised["exc_type"] == "ValueError"
    assert raised["frames"][-1]["name"] == "reduce"
    assert "hunter2" not in out.getvalue()


@pytest.mark.usefixtures("restored_logging")
def test_a_librarys_warning_is_key_value_text_on_a_terminal_log() -> None:
    """The console format renders stdlib lines as it renders streamkit's own."""
    out = io.StringIO()
    configure_logging("console", out)
    logging.getLogger("asyncio").warning("slow callback")
    (line,) = out.getvalue().splitlines()
    assert "slow callback" in line
    assert "[warning" in line
