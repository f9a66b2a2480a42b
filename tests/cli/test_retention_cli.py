"""``streamkit retention run``: by the flags for one path, or the config's policies, said exactly."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from streamkit import open_log
from streamkit.cli import main
from streamkit.cli._retention_commands import policy_lines
from streamkit.config import RetentionPolicy
from streamkit.host._retention_job import PolicyRecord


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def fill(db: Path, path: str, count: int) -> None:
    async def go() -> None:
        async with open_log(db) as log:
            await log.stream(path).append(
                *({"type": "n", "payload": {"i": i}} for i in range(count))
            )

    asyncio.run(go())


def test_keep_last_and_keep_for_narrow_a_run_and_it_says_what_stopped_it(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    fill(tmp_path / "a.db", "/", 10)
    code, said = run("retention", "run", "/", "--delete", "--keep-last", "4", "--db", db)
    assert (code, said) == (
        0,
        "/: deleted 6 events in 1 chunk(s); it starts at offset 7 (horizon 11, stopped by "
        "keep_last)\n",
    )
    code, said = run("retention", "run", "/", "--delete", "--keep-for", "1h", "--json", "--db", db)
    done = json.loads(said)
    assert (code, done["events"], done["stopped_by"], done["start_after"]) == (0, 0, "keep_for", 7)


def test_without_a_path_the_configs_policies_run_each_once(tmp_path: Path) -> None:
    fill(tmp_path / "app.db", "/orders", 8)
    fill(tmp_path / "app.db", "/clicks", 5)
    (tmp_path / "streamkit.toml").write_text(
        'db = "app.db"\n'
        '[[retention]]\npath = "/orders"\nkeep_last = 2\narchive = "archive"\n'
        '[[retention]]\npath = "/clicks"\nkeep_for = "2w"\ndelete = true\n'
    )
    config = str(tmp_path / "streamkit.toml")
    code, said = run("retention", "run", "--config", config, "--json")
    orders, clicks = (json.loads(line) for line in said.splitlines())
    assert code == 0
    assert (orders["path"], orders["events"], orders["mode"], orders["stopped_by"]) == (
        "/orders",
        6,
        "archive",
        "keep_last",
    )
    assert Path(orders["segments"][0]).parent == tmp_path / "archive"
    assert (clicks["path"], clicks["events"], clicks["stopped_by"]) == ("/clicks", 0, "keep_for")


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["/", "--keep-last", "2"], "retention run PATH needs --archive DIR or --delete"),
        (
            ["/", "--delete", "--keep-for", "3 fortnights"],
            "--keep-for '3 fortnights' is not a duration",
        ),
        (["--delete"], "--delete need a PATH"),
        ([], "has no [[retention]] policy"),
    ],
)
def test_a_run_that_says_too_little_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], refused: str
) -> None:
    fill(tmp_path / "app.db", "/", 3)
    (tmp_path / "streamkit.toml").write_text('db = "app.db"\n')
    config = str(tmp_path / "streamkit.toml")
    code, said = run("retention", "run", *argv, "--config", config)
    err = capsys.readouterr().err
    assert (code, said) == (1, "")
    assert refused in err
    assert "nothing was written" in err
    code, said = run("read", "--db", str(tmp_path / "app.db"))
    assert len(said.splitlines()) == 3


def test_status_names_who_runs_the_policies_and_a_failing_ones_error() -> None:
    policy = RetentionPolicy(path="/orders", keep_for=86400, keep_last=10, delete=True)
    record = PolicyRecord(policy, runs=3, failures=1, events_taken=120)
    record.last_run = {"events": 20, "stopped_by": "keep_for"}
    record.last_error = {"code": "STORAGE_ERROR", "message": "disk full; nothing was written"}
    job = {
        "holder": "host-a",
        "interval": 600.0,
        "holds_lease": True,
        "policies": [record.to_dict()],
    }
    assert policy_lines(job) == [
        "retention policies: run every 600 s by host-a",
        "  /orders  keep 86400 s, keep last 10, delete; 3 run(s), 120 events taken; last run took "
        "20 (stopped by keep_for); FAILING (1 failure(s)): disk full; nothing was written "
        "[STORAGE_ERROR]",
    ]
    idle = {**job, "holder": None, "policies": [PolicyRecord(policy).to_dict()]}
    assert policy_lines(idle)[0].endswith("by nobody yet (no host holds the retention lease)")
    assert policy_lines(idle)[1].endswith("0 events taken; not run yet")
    assert policy_lines(None) == []


def test_retention_keys_shows_sets_and_restores_a_path_s_key_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forever by default; --keep-for sets it with a record; --forever restores; bad input refused."""
    db = tmp_path / "log.db"
    fill(db, "/", 1)
    assert run("retention", "keys", "/", "--db", str(db)) == (
        0,
        "/: keys answer forever (no key window set)\n",
    )
    code, said = run(
        "retention", "keys", "/", "--db", str(db), "--keep-for", "30d", "--reason", "audit"
    )
    assert (code, said) == (0, "keys of taken events of / answer 30d (recorded at offset 2 of /)\n")
    code, shown = run("retention", "keys", "/", "--db", str(db), "--json")
    window = json.loads(shown)
    assert (window["keep_for"], window["reason"]) == (30 * 86400, "audit")
    code, horizon = run("retention", "horizon", "--db", str(db))
    assert "keys kept 30d" in horizon
    capsys.readouterr()
    assert run("retention", "keys", "/", "--db", str(db), "--keep-for", "10m", "--reason", "x")[0]
    assert "at least 3600" in capsys.readouterr().err
    assert run("retention", "keys", "/", "--db", str(db), "--forever")[0]
    assert "needs --reason" in capsys.readouterr().err
    assert run("retention", "keys", "/", "--db", str(db), "--forever", "--reason", "back")[0] == 0
    assert run("retention", "keys", "/", "--db", str(db))[1].endswith("(no key window set)\n")


def test_forgetting_on_a_log_no_host_ever_ran_says_there_is_nothing_to_forget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No host tables yet: not a storage error, but the plain answer, nothing written."""
    db = tmp_path / "fresh.db"
    fill(db, "/", 2)
    code, _ = run("processor", "forget", "board", "--db", str(db), "--reason", "gone")
    out = capsys.readouterr().err
    assert code != 0
    assert "there is no checkpoint of processor 'board' in this log to forget" in out
    assert "[NOT_FOUND]" in out
    assert "STORAGE_ERROR" not in out
