"""The task-service drill: load, a kill -9, a DLQ replay, and an accounting that must balance.

Run from the repository (``examples/`` on the import path)::

    PYTHONPATH=examples python -m task_service.drill --seconds 20

It runs the whole service in ``streamkit host`` (a real daemon process) over a
fresh SQLite file and:

1. starts 3 producer processes that request ``create-task`` tasks through the
   host's control socket for ``--seconds`` (each request carries an
   idempotency key; a producer re-sends an unacknowledged request until the
   host acknowledges it);
2. kills the host with SIGKILL once, in the middle, and starts a new one at
   once (it takes over when the dead host's lease expires);
3. stops ingestion, waits until the service is quiet (every task succeeded or
   dead-lettered, every created task on the board and notified);
4. unlocks the locked category and replays the DLQ (``streamkit dlq replay
   --wait``), waits for the replayed tasks to settle, stops the host with
   SIGTERM;
5. reads the whole log, the handler's store and the outbox, and prints the
   accounting report (:mod:`task_service.accounting` defines every term).

A progress line shows how far it is while it runs. It exits 0 when nothing
was duplicated and nothing lost, 1 otherwise (or when a step did not finish in
time: every wait is bounded and says what it was waiting for). Every child
process is killed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from streamkit import Log, StreamkitError, apply_delta, open_log
from streamkit.control import ControlClient, live_server_at
from task_service.accounting import Accounting, Ledger, account
from task_service.producer import LOCKED_CATEGORY
from task_service.service import config_toml, read_effects, read_journal

EXAMPLES = Path(__file__).resolve().parent.parent


class DrillFailed(Exception):
    """A step of the drill did not happen (in time); the message says which and why."""


class BoardWatcher:
    """A client of the board's live state: seed, then JSON patches; re-seeds after a drop.

    It runs beside the drill for the whole run, across the kill: when the host
    dies the watch connection drops, and it watches the new host as soon as
    that one answers (a new host starts a new revision epoch, so it re-seeds).
    """

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.state: Any = None
        self.rev: int | None = None
        self.seeds = 0
        self.deltas = 0
        self.drops = 0

    async def run(self) -> None:
        while True:
            watch = ControlClient(self.socket).watch("watch", slug="task-board")
            try:
                async for message in watch:
                    if message["kind"] == "seed":
                        self.state, self.rev = message["state"], message["rev"]
                        self.seeds += 1
                    elif message["from"] == self.rev:
                        self.state = apply_delta(self.state, message["patch"])
                        self.rev = message["to"]
                        self.deltas += 1
            except StreamkitError:
                self.drops += 1  # the host went away (or is not up yet): watch again
            finally:
                await watch.aclose()
            await asyncio.sleep(0.1)


class Drill:
    """One run: its directory, its children, and the ledger it keeps from the log."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.tty = out.isatty()
        self.dir = Path(args.dir or tempfile.mkdtemp(prefix="task-service-drill-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        # A SQLite file in the run directory, or the PostgreSQL log --db names.
        self.db: Path | str = args.db if args.db else self.dir / "tasks.db"
        self.data = self.dir / "data"
        # A Unix socket path is short (about 100 bytes): keep it under /tmp.
        self.sockets = Path(tempfile.mkdtemp(prefix="skdrill", dir="/tmp"))
        self.socket = self.sockets / "host.sock"
        self.stop_file = self.dir / "stop-producers"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(EXAMPLES), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.host: subprocess.Popen[bytes] | None = None
        self.hosts_started = 0
        self.producers: list[subprocess.Popen[bytes]] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.ledger = Ledger()
        self.log: Log | None = None
        self.watcher = BoardWatcher(self.socket)
        self.board: dict[str, Any] = {}
        self.started = time.monotonic()
        self.phase = "starting"
        self.kill: dict[str, float | int] = {}
        self.last_progress = 0.0
        self.last_line = ""

    # -- children -----------------------------------------------------------------------

    def spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.dir / log_name, "ab") as log:
            child = subprocess.Popen(
                argv, env=self.env, cwd=self.dir, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        self.children.append(child)
        return child

    async def start_host(self) -> subprocess.Popen[bytes]:
        self.hosts_started += 1
        argv = [
            sys.executable,
            "-m",
            "streamkit",
            "host",
            "--config",
            str(self.dir / "streamkit.toml"),
        ]
        argv += ["--socket", str(self.socket), "--log-format", "json"]
        host = self.spawn(argv, f"host-{self.hosts_started}.log")
        await self.wait_for(
            lambda: live_server_at(self.socket),
            f"host {self.hosts_started} to answer on its control socket",
            within=30,
            child=host,
        )
        self.host = host
        return host

    def kill_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)

    async def wait_for(
        self,
        check: Callable[[], bool],
        what: str,
        *,
        within: float,
        child: subprocess.Popen[bytes] | None = None,
    ) -> None:
        deadline = time.monotonic() + within
        while not check():
            if child is not None and child.poll() is not None:
                raise DrillFailed(f"waiting for {what}: the process exited with {child.returncode}")
            if time.monotonic() > deadline:
                raise DrillFailed(f"waited {within:g} s for {what}; it did not happen")
            await asyncio.sleep(0.05)

    # -- watching the log ---------------------------------------------------------------

    async def read_log(self) -> None:
        """Fold the events committed since the last call into the ledger."""
        assert self.log is not None
        stream = self.log.stream("/")
        while True:
            page = await stream.read(after_offset=self.ledger.through, limit=500)
            self.ledger.fold(page.events)
            if page.at_head or not page.events:
                return

    def progress(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_progress < (0.5 if self.tty else 2.0):
            return
        led = self.ledger
        line = (
            f"[{now - self.started:5.1f}s] {self.phase:<12} requested {sum(led.requests.values()):>5}"
            f" | succeeded {len(led.succeeded):>5} | dead-lettered {len(led.dead_lettered):>4}"
            f" | in flight {len(led.live):>4} | on board {len(led.board_created):>5}"
            f" | notified {len(led.notified):>5} | events {led.events}"
        )
        if force and line.partition("]")[2] == self.last_line.partition("]")[2]:
            return  # nothing moved since the last line
        self.last_progress, self.last_line = now, line
        self.out.write(("\r" + line) if self.tty else (line + "\n"))
        self.out.flush()

    def say(self, text: str) -> None:
        if self.tty:
            self.out.write("\n")
        self.out.write(f"== {text}\n")
        self.out.flush()

    async def tick(self) -> None:
        await self.read_log()
        self.progress()

    async def lag(self) -> int | None:
        """The largest lag of the host's processors, or None if it does not answer."""
        try:
            async with ControlClient(self.socket, timeout=5) as client:
                status = await client.request("status")
        except StreamkitError:
            return None
        rows = status.get("processors", [])
        if not rows or any(row.get("state") != "running" for row in rows):
            return None
        return max(int(row.get("lag") or 0) for row in rows)

    def check_host(self) -> None:
        """Fail at once if the running host died (the drill kills it only once, itself)."""
        if self.host is not None and self.host.poll() is not None:
            raise DrillFailed(
                f"host {self.hosts_started} exited by itself with {self.host.returncode}; its "
                f"log is host-{self.hosts_started}.log in {self.dir}"
            )

    async def wait_quiet(self, ids: set[str], *, after_replay: bool) -> None:
        deadline = time.monotonic() + self.args.settle_timeout
        quiet_polls = 0
        while True:
            self.check_host()
            await self.tick()
            problems = self.ledger.outstanding(ids, after_replay=after_replay)
            lag = await self.lag()
            if not problems and lag == 0:
                quiet_polls += 1
                if quiet_polls >= 2:  # quiet twice in a row: nothing was still on its way
                    return
            else:
                quiet_polls = 0
            if time.monotonic() > deadline:
                why = "; ".join(problems) or f"processor lag is {lag}"
                raise DrillFailed(
                    f"the service did not go quiet within {self.args.settle_timeout:g} s: {why}"
                )
            await asyncio.sleep(0.2)

    # -- the run ------------------------------------------------------------------------

    async def run(self) -> Accounting:
        args = self.args
        (self.data / "locks").mkdir(parents=True, exist_ok=True)
        (self.data / "locks" / LOCKED_CATEGORY).touch()
        (self.dir / "streamkit.toml").write_text(
            config_toml(db=self.db, data_dir=self.data, lease_ttl=args.lease_ttl)
        )
        shown = self.db.name if isinstance(self.db, Path) else "in PostgreSQL (--db)"
        self.say(f"run directory {self.dir} (log {shown})")
        host = await self.start_host()
        self.say(f"host 1 started (pid {host.pid}): tasks, task-board, notifications, dlq")
        watching = asyncio.create_task(self.watcher.run())
        # The drill reads the log the host writes, as any other process may.
        self.log = open_log(self.db)
        try:
            return await self.run_started()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await self.log.aclose()

    async def run_started(self) -> Accounting:
        args = self.args
        for n in range(1, args.producers + 1):
            argv = [sys.executable, "-m", "task_service.producer", "--socket", str(self.socket)]
            argv += ["--name", f"p{n}", "--rate", str(args.rate), "--stop", str(self.stop_file)]
            argv += ["--out", str(self.dir / f"producer-p{n}.jsonl"), "--seed", args.seed]
            self.producers.append(self.spawn(argv, f"producer-p{n}.err"))
        # The clock starts once every producer is up and acknowledged: on a loaded
        # machine starting the producers alone can take seconds of the run.
        await self.wait_for(
            lambda: (
                any(p.poll() is not None for p in self.producers)  # checked below
                or all(
                    (self.dir / f"producer-p{n}.jsonl").exists()
                    and (self.dir / f"producer-p{n}.jsonl").stat().st_size > 0
                    for n in range(1, args.producers + 1)
                )
            ),
            "every producer's first request to be acknowledged",
            within=self.args.settle_timeout,
        )
        self.say(
            f"{args.producers} producers requesting tasks for {args.seconds:g} s "
            f"(about {args.rate:g}/s each); SIGKILL of the host at {args.kill_at:g} s"
        )
        self.started = time.monotonic()
        self.phase = "ingesting"
        while time.monotonic() - self.started < args.seconds:
            if not self.kill and time.monotonic() - self.started >= args.kill_at:
                await self.kill_and_restart()
            self.check_host()
            for producer in self.producers:
                if producer.poll() not in (None, 0):
                    raise DrillFailed(
                        f"a producer exited with {producer.returncode}; see its .err file in "
                        f"{self.dir}"
                    )
            await self.tick()
            await asyncio.sleep(0.1)

        self.stop_file.touch()
        self.phase = "draining"
        await self.wait_for(
            lambda: all(p.poll() is not None for p in self.producers),
            "the producers to finish their last request",
            within=70,
        )
        if any(p.returncode != 0 for p in self.producers):
            raise DrillFailed(f"a producer failed; see the producer-*.err files in {self.dir}")
        requested, resends = self.producer_records()
        self.say(
            f"ingestion stopped at {time.monotonic() - self.started:.1f} s: "
            f"{len(requested)} tasks requested and acknowledged ({resends} re-sends)"
        )
        await self.wait_quiet(set(requested), after_replay=False)
        self.progress(force=True)
        pending = sum(1 for s in self.ledger.records.values() if s == "pending")
        self.say(
            f"quiet: {pending} dead-lettered record(s) pending; unlocking category "
            f'"{LOCKED_CATEGORY}" and replaying the DLQ (streamkit dlq replay --wait)'
        )
        (self.data / "locks" / LOCKED_CATEGORY).unlink()
        self.phase = "replaying"
        report = await self.replay()
        self.say(
            "replay report: "
            + ", ".join(
                f"{kind} {len(report.get(kind, []))}"
                for kind in ("replayed", "retried", "abandoned", "skipped")
            )
        )
        await self.wait_quiet(set(requested), after_replay=True)
        self.progress(force=True)
        await self.check_board()
        self.phase = "stopping"
        assert self.host is not None
        self.host.send_signal(signal.SIGTERM)
        await self.wait_for(
            lambda: self.host is not None and self.host.poll() is not None,
            "the host to stop after SIGTERM",
            within=30,
        )
        if self.host.returncode != 0:
            raise DrillFailed(f"the host exited with {self.host.returncode} after SIGTERM")
        self.say("host stopped (SIGTERM, exit 0); reading the log, the store and the outbox")
        await self.read_log()
        return account(
            self.ledger,
            producers=requested,
            effects=[e.__dict__ for e in read_effects(self.data)],
            journal=read_journal(self.data),
            outbox=read_outbox_lines(self.data / "outbox.jsonl"),
            producer_resends=resends,
        )

    async def check_board(self) -> None:
        """The watcher's copy of the board must come to equal the board's snapshot."""
        async with ControlClient(self.socket, timeout=10) as client:
            snapshot = await client.request("snapshot", slug="task-board")
        self.board = snapshot["state"]
        await self.wait_for(
            lambda: self.watcher.state == self.board,
            "the live board a client watches to match the board's snapshot",
            within=15,
        )
        self.say(
            f"the board as a client watched it live ({self.watcher.seeds} seeds, "
            f"{self.watcher.deltas} patches, {self.watcher.drops} reconnects) equals "
            "its snapshot"
        )

    async def kill_and_restart(self) -> None:
        assert self.host is not None
        killed_at = time.monotonic() - self.started
        old = self.host
        old.kill()  # SIGKILL: no shutdown, no lease release
        await self.wait_for(lambda: old.poll() is not None, "the killed host to exit", within=10)
        self.phase = "restarting"
        self.say(f"SIGKILL to host 1 (pid {old.pid}) at {killed_at:.1f} s; starting host 2")
        new = await self.start_host()
        self.kill = {
            "at": round(killed_at, 2),
            "restarted_after": round(time.monotonic() - self.started - killed_at, 2),
            "killed_pid": old.pid,
            "new_pid": new.pid,
        }
        self.phase = "ingesting"
        self.say(
            f"host 2 answers (pid {new.pid}) {self.kill['restarted_after']} s after the kill; "
            f"it takes over the leases when they expire (ttl {self.args.lease_ttl:g} s)"
        )

    async def replay(self) -> dict[str, Any]:
        argv = [sys.executable, "-m", "streamkit", "dlq", "replay", "--db", str(self.db)]
        argv += ["--socket", str(self.socket), "--by", "drill", "--wait"]
        argv += ["--timeout", str(self.args.settle_timeout), "--json"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=self.env,
            cwd=self.dir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(
                proc.communicate(), timeout=self.args.settle_timeout + 15
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise DrillFailed("`streamkit dlq replay --wait` did not finish in time") from None
        if proc.returncode != 0:
            raise DrillFailed(f"`streamkit dlq replay` failed: {stderr.decode().strip()}")
        completed: dict[str, Any] = json.loads(stdout)
        if completed.get("error"):
            raise DrillFailed(f"the DLQ refused the replay: {completed['error']}")
        report: dict[str, Any] = completed["report"]
        return report

    def producer_records(self) -> tuple[dict[str, dict[str, Any]], int]:
        requested: dict[str, dict[str, Any]] = {}
        resends = 0
        for n in range(1, self.args.producers + 1):
            for line in (self.dir / f"producer-p{n}.jsonl").read_text().splitlines():
                entry = json.loads(line)
                if "summary" in entry:
                    resends += int(entry["summary"]["resent"])
                else:
                    requested[entry["task_id"]] = entry
        return requested, resends


def read_outbox_lines(path: Path) -> list[dict[str, Any]]:
    """The outbox's lines; one a crash tore (not JSON) is skipped: it was never reported sent."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(raw))
    return lines


def render(
    report: Accounting, args: argparse.Namespace, kill: dict[str, Any], board: dict[str, Any]
) -> str:
    """The report as text: each count with what it counts."""
    r = report
    rows = [
        (
            "requested",
            r.requested,
            "task ids the producers requested (each acknowledged by the host)",
        ),
        (
            "succeeded",
            r.succeeded,
            f"task.succeeded: {r.succeeded_first_try} first try, {r.succeeded_after_retry} after "
            f"retries, {r.succeeded_after_replay} after a DLQ replay",
        ),
        ("dead-lettered", r.dead_lettered, "gave up after their attempts and went to the DLQ"),
        ("replayed", r.replayed, "DLQ records the replay handed back to the tasks processor"),
        ("abandoned", r.abandoned, "DLQ records abandoned: their replay failed too"),
        (
            "duplicates",
            r.duplicates,
            "created more than once (requested, succeeded, stored, on the board or notified twice)",
        ),
        (
            "lost",
            r.lost,
            "not settled (succeeded or abandoned), or missing from the log, store, board or outbox",
        ),
    ]
    killed = (
        f"host killed with SIGKILL at {kill['at']} s, new host up {kill['restarted_after']} s later"
        if kill
        else "the host was NOT killed"
    )
    out = [
        f"task-service drill: {args.seconds:g} s, {args.producers} producers; {killed}",
        *(f"  {name:<14}{value:>6}   {what}" for name, value, what in rows),
    ]
    rep = r.replay_report
    if rep is not None:
        counts = ", ".join(
            f"{kind} {len(rep['report'].get(kind, []))}"
            for kind in ("replayed", "retried", "abandoned", "skipped")
        )
        out.append(
            f"  replay report  {counts} (the DLQ's dlq.replay-completed for the request at "
            f"offset {rep['request_offset']}, written as it handed the records back; a record "
            "whose replayed task then failed again is abandoned later, on the line above)"
        )
    out.append(
        f"  also           {r.attempts} attempts, {r.failed_attempts} failed "
        f"({r.interrupted_attempts} interrupted by the kill); {r.producer_resends} producer "
        f"re-sends; {r.handler_reruns_absorbed} handler re-runs absorbed by the idempotency key; "
        f"{r.notifications_sent} notifications sent, {r.outbox_lines} outbox lines "
        f"({r.outbox_resent_lines} re-sent with the same id)"
    )
    if board:
        columns = ", ".join(
            f"{name} {col['done']} done/{col['dead_lettered']} dead-letterings"
            for name, col in sorted(board.get("categories", {}).items())
        )
        out.append(f"  the board      {board.get('created', 0)} created: {columns}")
        # The board counts dead-letterings (events): a task whose replay failed again
        # was dead-lettered twice. The log's own count must agree with it.
        total = board.get("dead_lettered", 0)
        agrees = "=" if total == r.dead_letterings else "!= (MISMATCH)"
        out.append(
            f"                 {total} dead-letterings on the board {agrees} "
            f"{r.dead_letterings} task.dead-lettered events in the log: {r.dead_lettered} "
            f"tasks, {r.dead_letterings - r.dead_lettered} of them again after a replay"
        )
    if r.unexpected:
        out.append(f"  unexpected     {r.unexpected}")
    for kind, examples in r.examples.items():
        out.append(f"  {kind}: {', '.join(examples)}")
    verdict = "OK" if r.ok else "FAILED"
    out.append(f"RESULT: {verdict} (duplicates {r.duplicates}, lost {r.lost})")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m task_service.drill",
        description="Run the task service under load, kill -9 its host once, replay the DLQ, "
        "and account for every requested task.",
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="how long producers request tasks (default 20)"
    )
    parser.add_argument("--producers", type=int, default=3, help="producer processes (default 3)")
    parser.add_argument(
        "--rate", type=float, default=15.0, help="requests per second per producer (default 15)"
    )
    parser.add_argument(
        "--kill-at",
        type=float,
        default=None,
        help="seconds in when the host is killed (default: half way)",
    )
    parser.add_argument(
        "--lease-ttl", type=float, default=2.0, help="the host's lease ttl (default 2)"
    )
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="how long each wait for quiet may take (default 60)",
    )
    parser.add_argument(
        "--dir", default=None, help="run directory (default: a new temporary one, kept)"
    )
    parser.add_argument("--seed", default="drill", help="seed of the producers' choices")
    parser.add_argument(
        "--db",
        default=None,
        help="the log: a postgresql:// URL (its schema should be new), or by default "
        "tasks.db in the run directory",
    )
    parser.add_argument(
        "--report-json", default=None, help="also write the report as JSON to this file"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.producers < 1 or args.rate <= 0:
        parser.error("--seconds and --rate must be positive and --producers at least 1")
    if args.kill_at is None:
        args.kill_at = args.seconds / 2
    if not 0 < args.kill_at < args.seconds:
        parser.error("--kill-at must be after the start and before --seconds")
    return args


async def main_async(args: argparse.Namespace, out: TextIO) -> int:
    drill = Drill(args, out)
    # SIGINT or SIGTERM stops the drill the same way a failure does: children killed.
    loop = asyncio.get_running_loop()
    running = asyncio.current_task()
    assert running is not None
    stopped_by: list[str] = []

    def stop(signum: signal.Signals) -> None:
        stopped_by.append(signum.name)
        running.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        report = await drill.run()
    except DrillFailed as exc:
        drill.say(f"drill FAILED: {exc}")
        out.write(f"logs and data are in {drill.dir}\n")
        return 1
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        drill.say(f"drill stopped by {stopped_by[0]}; its processes were killed")
        out.write(f"logs and data are in {drill.dir}\n")
        return 130
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        drill.kill_children()
        shutil.rmtree(drill.sockets, ignore_errors=True)
    out.write(render(report, args, drill.kill, drill.board) + "\n")
    out.write(f"logs and data are in {drill.dir}\n")
    if args.report_json:
        payload = json.loads(report.to_json()) | {
            "kill": drill.kill,
            "hosts_started": drill.hosts_started,
            "board": drill.board,
            "watcher": {
                "seeds": drill.watcher.seeds,
                "patches": drill.watcher.deltas,
                "drops": drill.watcher.drops,
                "matches_snapshot": drill.watcher.state == drill.board,
            },
        }
        text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        await asyncio.to_thread(Path(args.report_json).write_text, text)
    return 0 if report.ok and drill.kill else 1


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv), sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
