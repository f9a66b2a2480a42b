"""The command line: exit codes, exact output, errors, follow across processes, and its docs."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamkit.cli import build_parser, main

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
STREAMKIT = str(Path(sys.executable).parent / "streamkit")


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_append_then_read_prints_events(tmp_path: Path) -> None:
    """append prints the committed event; read prints offset, type and payload per line."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t.one", "--payload", '{"n": 1}') == (0, '1  t.one  {"n":1}\n')
    assert run("append", "--db", db, "t.two") == (0, "2  t.two  {}\n")
    assert run("read", "--db", db) == (0, '1  t.one  {"n":1}\n2  t.two  {}\n')
    assert run("read", "--db", db, "--after", "1") == (0, "2  t.two  {}\n")
    assert run("read", "--db", db, "--limit", "1") == (0, '1  t.one  {"n":1}\n')


def test_append_json_and_paths(tmp_path: Path) -> None:
    """--json prints the committed event as one JSON object; --path selects the stream."""
    db = str(tmp_path / "a.db")
    code, out = run("append", "--db", db, "--path", "/orders", "o.placed", "--json")
    assert code == 0
    event = json.loads(out)
    assert (event["path"], event["offset"], event["type"]) == ("/orders", 1, "o.placed")
    assert run("read", "--db", db) == (0, "")
    code, out = run("read", "--db", db, "--path", "/orders", "--json")
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["o.placed"]


def test_idempotent_retry_and_conflict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A retry with the same key returns the first event; a different body exits 1 and writes nothing."""
    db = str(tmp_path / "a.db")
    first = run("append", "--db", db, "t", "--payload", '{"a":1}', "--idempotency-key", "k")
    again = run("append", "--db", db, "t", "--payload", '{"a":1}', "--idempotency-key", "k")
    assert first == again == (0, '1  t  {"a":1}\n')
    code, out = run("append", "--db", db, "t", "--payload", '{"a":2}', "--idempotency-key", "k")
    assert (code, out) == (1, "")
    assert capsys.readouterr().err.startswith('Error: idempotency key "k"')
    assert run("read", "--db", db) == (0, '1  t  {"a":1}\n')


def test_expect_offset_refuses_stale_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--expect-offset refuses with OFFSET_CONFLICT when the event would land elsewhere."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t", "--expect-offset", "1")[0] == 0
    assert run("append", "--db", db, "t", "--expect-offset", "1") == (1, "")
    assert "[OFFSET_CONFLICT]" in capsys.readouterr().err
    assert run("append", "--db", db, "t", "--expect-offset", "2")[0] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["append", "--db", "{db}", "t", "--payload", "[1]"], "must be a JSON object"),
        (["append", "--db", "{db}", "t", "--payload", "{nope"], "not valid JSON"),
        (["append", "--db", "{db}", "t", "--payload", "[" * 50_000], "nests too deeply"),
        (
            ["append", "--db", "{db}", "t", "--payload", '{"a":' + "[" * 150 + "]" * 150 + "}"],
            "nests deeper than 100 levels",
        ),
        (["append", "--db", "{db}", "", "--payload", "{}"], "'type' must be a non-empty string"),
        (["append", "--db", "{db}", "--path", "no-slash", "t"], "stream path"),
        (["append", "--db", "{db}", "t", "--expect-offset", "0"], "expected a number >= 1"),
        (["read", "--db", "{db}", "--after", "-1"], "expected a number >= 0"),
        (["read", "--db", "{missing}"], "no log file at"),
    ],
)
def test_refusals_exit_one_with_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Bad flags and bad events print `Error: ...` naming the problem, exit 1, and write nothing."""
    db = tmp_path / "a.db"
    assert run("append", "--db", str(db), "seed")[0] == 0
    filled = [
        a.replace("{db}", str(db)).replace("{missing}", str(tmp_path / "missing.db")) for a in argv
    ]
    try:
        code, out = run(*filled)
    except SystemExit as exc:  # argparse refusals exit from parse_args
        code, out = int(exc.code or 0), ""
    assert code == 1
    assert out == ""
    err = capsys.readouterr().err
    assert "Error: " in err
    assert message in err
    assert run("read", "--db", str(db)) == (0, "1  seed  {}\n")
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.slow
def test_read_follow_sees_another_process_append(tmp_path: Path) -> None:
    """read --follow prints an event that another process appends after it started."""
    db = str(tmp_path / "f.db")
    assert run("append", "--db", db, "before")[0] == 0
    follower = subprocess.Popen(
        [STREAMKIT, "read", "--db", db, "--follow", "--limit", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
        assert first["type"] == "before"
        subprocess.run([STREAMKIT, "append", "--db", db, "after"], check=True, capture_output=True)
        second = json.loads(follower.stdout.readline())
        assert (second["offset"], second["type"]) == (2, "after")
        assert follower.wait(timeout=20) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command answers --help with exit 0 and a usage line."""
    for name in _subcommands():
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert f"usage: streamkit {name}" in capsys.readouterr().out


def test_every_command_and_flag_is_documented() -> None:
    """docs/cli.md has a section per command naming every one of its flags."""
    text = DOCS.read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## streamkit ([\w-]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for name, parser in _subcommands().items():
        assert name in sections, f"docs/cli.md has no '## streamkit {name}' section"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert flag in sections[name], f"{flag} of `{name}` is not in docs/cli.md"


def test_main_module_runs() -> None:
    """`python -m streamkit --help` works like the console script."""
    done = subprocess.run(
        [sys.executable, "-m", "streamkit", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert "append" in done.stdout


def test_append_refuses_the_reserved_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A durable streamkit.* event is refused by the CLI's append with INVALID_EVENT; nothing is written."""
    db = str(tmp_path / "a.db")
    payload = '{"slug": "tally", "offset": 2, "by": "me", "reason": "forged"}'
    code, out = run("append", "--db", db, "streamkit.event-skipped", "--payload", payload)
    assert (code, out) == (1, "")
    err = capsys.readouterr().err
    assert "reserved 'streamkit.' namespace" in err
    assert "nothing was appended" in err
    assert run("read", "--db", db) == (0, "")


def test_append_refuses_a_lone_surrogate_in_the_payload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--payload '{"v": "\\ud800"}' (valid JSON, not valid UTF-8) is refused; nothing is written."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t", "--payload", '{"v": "\\ud800"}') == (1, "")
    assert "cannot be encoded as UTF-8" in capsys.readouterr().err
    assert run("read", "--db", db) == (0, "")
