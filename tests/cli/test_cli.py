"""The command line: exit codes, exact output, errors, follow across processes, and its docs."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

import streamkit
from streamkit import open_log
from streamkit.cli import build_parser, main

DOCS = ROOT / "docs" / "cli.md"
STREAMKIT = str(Path(sys.executable).parent / "streamkit")


def read_untimed(*argv: str) -> tuple[int, str]:
    """``streamkit read`` without its created_at column (the rest is exact)."""
    code, out = run("read", *argv)
    return code, re.sub(r"^(\d+)  \d{4}-\d\d-\d\dT[\d:.]+Z  ", r"\1  ", out, flags=re.M)


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
    assert read_untimed("--db", db) == (0, '1  t.one  {"n":1}\n2  t.two  {}\n')
    assert read_untimed("--db", db, "--after", "1") == (0, "2  t.two  {}\n")
    assert read_untimed("--db", db, "--limit", "1") == (0, '1  t.one  {"n":1}\n')


def test_append_json_and_paths(tmp_path: Path) -> None:
    """--json prints the committed event as one JSON object; --path selects the stream."""
    db = str(tmp_path / "a.db")
    code, out = run("append", "--db", db, "--path", "/orders", "o.placed", "--json")
    assert code == 0
    event = json.loads(out)
    assert (event["path"], event["offset"], event["type"]) == ("/orders", 1, "o.placed")
    assert read_untimed("--db", db) == (0, "")
    code, out = run("read", "--db", db, "--path", "/orders", "--json")
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["o.placed"]


def test_idempotent_retry_and_conflict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A retry with the same key returns the first event; a different body exits 1 and writes nothing."""
    db = str(tmp_path / "a.db")
    first = run("append", "--db", db, "t", "--payload", '{"a":1}', "--idempotency-key", "k")
    again = run("append", "--db", db, "t", "--payload", '{"a":1}', "--idempotency-key", "k")
    assert first == (0, '1  t  {"a":1}\n')
    assert again == (
        0,
        '1  t  {"a":1}  (already committed at 1 by an earlier call with this idempotency key; '
        "nothing was appended)\n",
    )
    code, out = run("append", "--db", db, "t", "--payload", '{"a":2}', "--idempotency-key", "k")
    assert (code, out) == (1, "")
    assert capsys.readouterr().err.startswith('Error: idempotency key "k"')
    assert read_untimed("--db", db) == (0, '1  t  {"a":1}\n')


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
        (
            ["append", "--db", "{db}", "t", "--expect-offset", "0"],
            "expected a whole number from 1 to",
        ),
        (["append", "--db", "{db}", "t", "--expect-offset", "-3"], "from 1 to 9223372036854775807"),
        (["read", "--db", "{db}", "--after", "-1"], "expected a whole number from 0 to"),
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
    assert read_untimed("--db", str(db)) == (0, "1  seed  {}\n")
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


def test_no_help_text_speaks_of_a_sqlite_only_world(capsys: pytest.CaptureFixture[str]) -> None:
    """Every --db says the log may be a SQLite file or a PostgreSQL URL; no help says "SQLite log" or "log file"."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "PostgreSQL" in capsys.readouterr().out
    for name, parser in _subcommands().items():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # (argparse wraps the help)
        assert "SQLite log" not in out, name
        assert "log file" not in out, name
        if any("--db" in action.option_strings for action in parser._actions):
            assert "postgresql:// URL" in out, name


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
    assert read_untimed("--db", db) == (0, "")


def test_append_refuses_a_lone_surrogate_in_the_payload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--payload '{"v": "\\ud800"}' (valid JSON, not valid UTF-8) is refused; nothing is written."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t", "--payload", '{"v": "\\ud800"}') == (1, "")
    assert "cannot be encoded as UTF-8" in capsys.readouterr().err
    assert read_untimed("--db", db) == (0, "")


def test_numbers_past_2_63_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--after and --offset past 2^63 - 1 are usage errors, not tracebacks."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t")[0] == 0
    for argv, low in (
        (["read", "--db", db, "--after", str(2**63)], 0),
        (["skip", "tally", "--db", db, "--offset", str(2**63)], 1),  # an offset is >= 1
    ):
        with pytest.raises(SystemExit) as caught:
            run(*argv)
        assert caught.value.code == 1
        assert f"from {low} to 9223372036854775807" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["nan", "-1", "0", "inf", "soon"])
def test_dlq_replay_refuses_a_bad_timeout_before_writing(
    tmp_path: Path, timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--timeout nan / -1 / inf is a usage error before the replay request is written."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t")[0] == 0
    with pytest.raises(SystemExit) as caught:
        run("dlq", "replay", "--db", db, "--wait", "--timeout", timeout)
    assert caught.value.code == 1
    assert "seconds" in capsys.readouterr().err
    assert read_untimed("--db", db) == (0, "1  t  {}\n")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """streamkit --version prints the version and exits 0."""
    with pytest.raises(SystemExit) as caught:
        run("--version")
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"streamkit {streamkit.__version__}"


def test_read_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`streamkit read | head -1` prints no traceback and exits 0."""
    db = str(tmp_path / "a.db")

    async def fill() -> None:
        # Far more than a pipe holds, so the writer really meets the closed pipe.
        async with open_log(db) as log:
            await log.stream("/").append(*({"type": "t", "payload": {"n": n}} for n in range(5000)))

    asyncio.run(fill())
    done = subprocess.run(
        f"set -o pipefail; {sys.executable} -m streamkit read --db {db} | head -n 1",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert re.match(r"1  \S+Z  t  ", done.stdout)
    assert "Traceback" not in done.stderr


def test_skip_refuses_an_empty_or_unknown_slug_without_a_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no host running, skip "" and skip of a slug that never ran are refused, nothing written."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "t")[0] == 0
    assert run("skip", "", "--db", db, "--offset", "1")[0] == 1
    assert "slug to skip for is empty" in capsys.readouterr().err
    assert run("skip", "nope", "--db", db, "--offset", "1")[0] == 1
    assert "no processor 'nope' has run" in capsys.readouterr().err
    assert read_untimed("--db", db) == (0, "1  t  {}\n")


def test_db_may_be_omitted_when_streamkit_toml_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --db, commands use the db of ./streamkit.toml (relative to the file); else refuse."""
    monkeypatch.chdir(tmp_path)
    assert run("read")[0] == 1
    assert "no --db was given and there is no streamkit.toml" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    (tmp_path / "streamkit.toml").write_text('db = "data/app.db"\n')
    assert run("append", "t.one") == (0, "1  t.one  {}\n")
    assert read_untimed() == (0, "1  t.one  {}\n")
    assert (tmp_path / "data" / "app.db").exists()
    assert run("status", "--json")[0] == 0


def test_read_as_a_processor_prints_events_in_its_current_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--as module:Class, or a slug of streamkit.toml: lifted with a note; an unknown slug refused."""
    from support.upcasting import stored_at

    db = str(tmp_path / "a.db")

    async def fill() -> None:
        async with open_log(db) as log:
            await log.stream("/").append(stored_at(1, "a", 0, "ana"), stored_at(3, "b", 2, "bo"))

    asyncio.run(fill())
    code, out = run("read", "--db", db, "--as", "support.upcasting:TaskBoard", "--json")
    first, second = (json.loads(line) for line in out.splitlines())
    assert code == 0
    assert (first["type"], first["payload_version"]) == ("task.created", 3)
    assert first["upcast"] == {"from_type": "task.opened", "from_version": 1}
    assert "upcast" not in second
    (tmp_path / "streamkit.toml").write_text(
        f'db = "{db}"\n\n[[processors]]\nclass = "support.upcasting:TaskBoard"\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out = run("read", "--as", "task-board")
    assert code == 0
    assert out.splitlines()[0].endswith("(from task.opened v1)")
    assert '"owner":"ana"' in out.splitlines()[0]
    assert run("read", "--as", "nobody")[0] == 1
    assert "no such processor" in capsys.readouterr().err
