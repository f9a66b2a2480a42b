"""The host commands of the CLI: status, snapshot, watch, skip, host, and append/read via a host."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path

import pytest
from support.host import Fragile, Pinged, Second, Tally
from support.upcasting import TaskBoard, board_log, stored_at, strict_board

from streamkit import ReduceCheckpointTable, open_log
from streamkit.cli import main
from streamkit.cli._retention_commands import retention_lines
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
async def host(short_dir: Path) -> AsyncIterator[ProcessorHost]:
    config = HostConfig.model_validate(
        {
            "db": str(short_dir / "c.db"),
            "lease": {"ttl": 5.0, "heartbeat": 0.1},
            "retry": {"initial_delay": 0.01, "max_delay": 0.02, "stall_after": 2},
            # Deltas published unwatched too: tests here need offsets held by ephemerals.
            "live_state": "always",
        }
    )
    running = ProcessorHost(config, processors=[Tally(), Pinged(), Fragile()])
    await running.start()
    try:
        yield running
    finally:
        await running.stop(grace=0.0)


async def until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def cli(*argv: str) -> tuple[int, str]:
    """Run the CLI in a worker thread (it runs its own event loop) against the host's loop."""
    return await asyncio.to_thread(run, *argv)


def test_the_retention_line_reads_as_a_sentence(tmp_path: Path) -> None:
    """Held at offset 1 by a processor, the line says nothing may be taken yet, and why."""
    lines = retention_lines(
        [
            {
                "path": "/",
                "head": 57,
                "start": 1,
                "horizon": 1,
                "held_by": [
                    {"kind": "processor", "name": "tally@1", "state": "serving", "why": "cursor"}
                ],
            }
        ]
    )
    assert lines == [
        "retention:",
        "  /  horizon 1 of head 57: nothing may be taken yet: every event is at or above the "
        "horizon; 57 offsets kept, held by processor tally@1 (serving): cursor",
    ]


def test_status_snapshot_without_a_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With no host, status and snapshot read the database; a missing checkpoint is refused."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "item")[0] == 0
    assert run("status", "--db", db) == (
        0,
        "host: not running (from the database)\nretention:\n  /  horizon 2 of head 1: 1 offset(s) below the horizon may be taken; nothing held\n",
    )
    assert run("status", "--db", db, "--json") == (
        0,
        '{"host":null,"hosts":[],"processors":[],"retention":'
        '[{"path":"/","head":1,"start":1,"horizon":2,"archived_segments":0,"archived_bytes":0,'
        '"keys_kept_for":null,"held_by":[],"needs":[]}]}\n',
    )
    assert run("snapshot", "tally", "--db", db) == (1, "")
    assert "has no checkpoint" in capsys.readouterr().err


def test_status_and_snapshot_after_a_host_ran(tmp_path: Path) -> None:
    """After a host stopped, status shows its checkpoint and released lease; snapshot its state."""
    db = tmp_path / "a.db"

    async def session() -> None:
        config = HostConfig.model_validate({"db": str(db)})
        async with ProcessorHost(config, processors=[Tally()], serve_control=False) as host:
            committed = await host.append("/", [{"type": "item"}, {"type": "item"}])
            await host.wait_until_processed("tally", committed[-1].offset)

    asyncio.run(session())
    code, out = run("status", "--db", str(db))
    assert code == 0
    assert out.splitlines()[1].startswith("tally  v1  path=/  cursor=")
    assert "lease=released (gen 1)  claim=-" in out
    code, out = run("snapshot", "tally", "--db", str(db), "--json")
    snapshot = json.loads(out)
    assert (snapshot["state"]["offsets"], snapshot["source"]) == ([1, 2], "checkpoint")


def test_offline_status_lag_never_negative(tmp_path: Path) -> None:
    """A checkpoint reduced past the durable head (through ephemeral offsets) shows the head, lag 0."""
    db = tmp_path / "a.db"

    async def session() -> None:
        config = HostConfig.model_validate({"db": str(db)})
        async with ProcessorHost(config, processors=[Tally()], serve_control=False) as host:
            committed = await host.append("/", [{"type": "item"}])
            await host.wait_until_processed("tally", committed[-1].offset)

    asyncio.run(session())
    conn = sqlite3.connect(db)
    try:
        ReduceCheckpointTable(conn, create_table=False).write(
            "tally", reducer_version="1", reduced_through_offset=9, state_json=None
        )
    finally:
        conn.close()
    code, out = run("status", "--db", str(db), "--json")
    assert code == 0
    (row,) = json.loads(out)["processors"]
    assert (row["cursor"], row["head"], row["lag"]) == (1, 1, 0)


def test_lag_counts_durable_events_not_offsets(tmp_path: Path) -> None:
    """Offsets that went to live-state deltas are holes, not lag: lag counts durable events."""
    db = tmp_path / "a.db"

    async def session() -> list[int]:
        # Published always, so each batch's delta takes an offset between the items.
        config = HostConfig.model_validate({"db": str(db), "live_state": "always"})
        async with ProcessorHost(config, processors=[Tally()], serve_control=False) as host:
            offsets = []
            for _ in range(3):
                (event,) = await host.append("/", [{"type": "item"}])
                await host.wait_until_processed("tally", event.offset)
                offsets.append(event.offset)
            return offsets

    offsets = asyncio.run(session())
    assert offsets[-1] - offsets[0] > 2  # deltas took offsets in between
    conn = sqlite3.connect(db)
    try:
        ReduceCheckpointTable(conn, create_table=False).write(
            "tally", reducer_version="1", reduced_through_offset=offsets[0], state_json=None
        )
    finally:
        conn.close()
    code, out = run("status", "--db", str(db), "--json")
    assert code == 0
    (row,) = json.loads(out)["processors"]
    assert (row["cursor"], row["head"], row["lag"]) == (offsets[0], offsets[-1], 2)


def test_skip_without_a_host_records_once(tmp_path: Path) -> None:
    """skip writes one durable skip event with who and why; running it again adds nothing."""
    db = str(tmp_path / "a.db")
    assert run("append", "--db", db, "item")[0] == 0
    # The processor ran here once (its checkpoint, through nothing yet): skips name it.
    with closing(sqlite3.connect(db)) as conn, conn:
        ReduceCheckpointTable(conn).write(
            "tally", reducer_version="1", reduced_through_offset=0, state_json=None
        )
    argv = ("skip", "tally", "--db", db, "--offset", "1", "--by", "ops", "--reason", "bad")
    expected = (0, "skipped offset 1 (item) for tally (recorded at offset 2)\n")
    assert run(*argv) == expected
    assert run(*argv) == expected
    _, out = run("read", "--db", db, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == ["item", "streamkit.event-skipped"]
    assert events[1]["payload"] == {
        "slug": "tally",
        "offset": 1,
        "type": "item",
        "by": "ops",
        "reason": "bad",
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["host", "--db", "{db}"], "no processors to run"),
        (["host", "--db", "{db}", "--processor", "nowhere_at_all:X"], "could not be found"),
        (["host", "--db", "{db}", "--processor", "not a class"], "is not of the form"),
        (["append", "--db", "{db}", "ping", "--ephemeral"], "--ephemeral needs a running host"),
        (["watch", "tally", "--db", "{db}"], "[CONTROL_UNAVAILABLE]"),
        (["skip", "tally", "--db", "{db}", "--offset", "5"], "no durable event at offset 5"),
    ],
)
def test_refusals_exit_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Refused host commands print `Error: ...`, exit 1 and start or write nothing."""
    db = tmp_path / "a.db"
    assert run("append", "--db", str(db), "seed")[0] == 0
    assert run(*[a.replace("{db}", str(db)) for a in argv]) == (1, "")
    err = capsys.readouterr().err
    assert err.startswith("Error: ")
    assert message in err
    code, out = run("read", "--db", str(db))
    assert code == 0
    assert out.startswith("1  ")
    assert out.endswith("Z  seed  {}\n")


@pytest.mark.parametrize("through", ["host", "file"])
async def test_an_idempotent_retry_says_already_committed(
    through: str, host: ProcessorHost, tmp_path: Path
) -> None:
    """A retry under the same key prints "already committed at N" (and "replayed" in --json)."""
    db = str(host.config.db) if through == "host" else str(tmp_path / "direct.db")
    argv = ("append", "--db", db, "item", "--idempotency-key", "order-7")
    code, first = await cli(*argv)
    assert code == 0
    assert "already committed" not in first
    offset = int(first.split()[0])
    code, again = await cli(*argv)
    assert code == 0
    assert again.startswith(f"{offset}  item  {{}}  (already committed at {offset} ")
    assert "nothing was appended" in again
    code, out = await cli(*argv, "--json")
    assert json.loads(out)["replayed"] is True
    assert json.loads(out)["offset"] == offset


async def test_a_keyed_append_through_a_host_notes_the_path_s_key_window(
    host: ProcessorHost, capfd: pytest.CaptureFixture[str]
) -> None:
    """Under a key window, ``append --idempotency-key`` says on stderr when the key is let go."""
    db = str(host.config.db)
    assert (await cli("append", "--db", db, "item", "--idempotency-key", "a"))[0] == 0
    assert "key window" not in capfd.readouterr().err
    assert host.store is not None
    await host.store.retention.set_key_window("/", 7200.0, by="ops", reason="r", now=time.time())
    code, out = await cli("append", "--db", db, "item", "--idempotency-key", "b", "--json")
    assert code == 0
    assert json.loads(out)["idempotency_key"] == "b"
    assert "this key answers retries for 7200 s after its event" in capfd.readouterr().err


async def test_commands_go_through_a_running_host(host: ProcessorHost) -> None:
    """append (ephemerals too), read --follow, status, snapshot, watch and skip use the socket."""
    db = str(host.config.db)
    code, out = await cli("append", "--db", db, "ping", "--ephemeral")
    assert code == 0
    assert out.endswith("  ping (ephemeral)  {}\n")
    await host.wait_until_processed("pinged", int(out.split()[0]))
    code, out = await cli("snapshot", "pinged", "--db", db, "--json")
    assert json.loads(out)["state"]["pings"] == 1
    code, out = await cli("append", "--db", db, "item")
    item = int(out.split()[0])
    code, out = await cli("read", "--db", db, "--follow", "--limit", "1")
    (line,) = out.splitlines()
    assert line.startswith(f"{item}  ")
    assert line.endswith("Z  item  {}")
    code, out = await cli("status", "--db", db)
    assert out.startswith(f"host: {host.owner} ")
    assert any(line.startswith("tally  v1  path=/  state=running") for line in out.splitlines())
    code, out = await cli("watch", "tally", "--db", db, "--limit", "1")
    assert out.startswith("seed rev=")
    assert out.endswith(f'{{"offsets":[{item}],"pings":0}}\n')
    code, out = await cli("append", "--db", db, "item", "--payload", '{"boom": true}')
    poison = int(out.split()[0])
    runner = host.runner("fragile")
    await until(lambda: runner.failures.stalled)
    code, out = await cli("status", "--db", db)
    assert f"STALLED at offset {poison}" in out
    code, out = await cli("skip", "fragile", "--db", db, "--offset", str(poison), "--by", "me")
    assert (code, out.startswith(f"skipped offset {poison} (item) for fragile")) == (0, True)
    await until(lambda: not runner.failures.stalled)
    assert poison in runner.skipped


async def test_expect_head_works_while_a_host_publishes_live_state(
    host: ProcessorHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """--expect-head through a running host passes though deltas take offsets; a stale one fails."""
    db = str(host.config.db)
    code, out = await cli("append", "--db", db, "item", "--json")
    seen = json.loads(out)["offset"]
    await host.wait_until_processed("tally", seen)  # live-state deltas took offsets after it
    code, out = await cli("append", "--db", db, "item", "--expect-head", str(seen), "--json")
    assert code == 0
    later = json.loads(out)["offset"]
    assert later > seen + 1  # the deltas' offsets lie between
    code, out = await cli("append", "--db", db, "item", "--expect-head", str(seen))
    assert code == 1
    err = capsys.readouterr().err
    assert "[OFFSET_CONFLICT]" in err
    assert f"retry with expect_head={later}" in err


async def test_status_over_several_hosts_says_which_host_holds_each_lease(short_dir: Path) -> None:
    """Two hosts, one processor each: each row names its holder, none says "here"."""
    db = str(short_dir / "m.db")
    made = []
    for name, processor in (("a", Tally()), ("b", Second())):
        config = HostConfig.model_validate(
            {"db": db, "socket": str(short_dir / f"{name}.sock"), "lease": {"ttl": 5.0}}
        )
        running = ProcessorHost(config, processors=[processor])
        await running.start()
        made.append(running)
    try:
        code, out = await cli("status", "--db", db)
    finally:
        for running in made:
            await running.stop(grace=0.0)
    assert code == 0, out
    a, b = made
    lines = {line.split()[0]: line for line in out.splitlines() if not line.startswith("host:")}
    assert f"lease=held by {a.owner} " in lines["tally"]
    assert f"lease=held by {b.owner} " in lines["second"]
    assert "held here" not in out
    assert sum(line.startswith("host: ") for line in out.splitlines()) == 2


async def test_status_names_each_kind_of_skipped_payload_and_where_a_processor_stopped(
    short_dir: Path,
) -> None:
    """Per (type, version) skipped counts, DROPs, and a strict processor stopped before an event.

    The host's default for every processor is "skip"; the strict board's contract says
    "stall", and a contract's word beats the host-wide default."""

    db = short_dir / "m.db"
    unreadable = {"type": "task.created", "payload": {"title": 1}, "payload_version": 3}
    async with open_log(db) as log:
        committed = await log.stream("/").append(
            stored_at(1, "a", 0, "ana"), unreadable, {"type": "task.retired", "payload": {}}
        )
    bad = committed[1].offset
    config = HostConfig.model_validate(
        {
            "db": str(db),
            "retry": {"initial_delay": 0.01, "max_delay": 0.02, "stall_after": 2},
            "on_malformed": "skip",
        }
    )
    async with ProcessorHost(
        config, processors=[TaskBoard(), strict_board("strict-board")]
    ) as running:
        await running.wait_until_processed("task-board", committed[-1].offset)
        strict = running.runner("strict-board")
        await until(lambda: strict.failures.stalled)
        code, out = await cli("status", "--db", str(db))
        # Through the host, a payload its processors cannot read is refused at the door.
        refused, _ = await cli("append", "--db", str(db), "task.created", "--payload", "{}")
        assert refused == 1
        assert running.log is not None
        assert await running.log.stream("/").head() == committed[-1].offset
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert code == 0
    assert f"malformed[task.created v3]=1 (first at {bad})" in lines["task-board"]
    assert "dropped=1 (an upcaster returned DROP)" in lines["task-board"]
    assert f"STALLED at offset {bad}" in lines["strict-board"]
    assert f"stopped before offset {bad} (PAYLOAD_MALFORMED)" in lines["strict-board"]


async def test_status_names_what_the_data_check_at_start_found(short_dir: Path) -> None:
    """A host of older code on a log newer code wrote: the status line says so."""
    db = short_dir / "s.db"
    async with open_log(db) as log:
        offsets = await board_log(log, "/")
    config = HostConfig.model_validate({"db": str(db)})
    async with ProcessorHost(config, processors=[TaskBoard()]):
        code, out = await cli("status", "--db", str(db))
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("task-board")]
    assert (
        f"schema check at start: task.created v4: 1 events ({offsets[6]}..{offsets[6]}): AHEAD"
        in line
    )
