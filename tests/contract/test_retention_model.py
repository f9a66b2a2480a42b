"""Retention against a model, under random schedules: appends, processors, holds, runs, crashes.

Over every backend of ``support.backends``. Processors advance their
checkpoints, operators place and release holds and forget processors,
retention runs archive or delete in random chunks, and some runs crash at a
phase of a chunk, leaving what a killed process would: a half-written
segment file, a whole segment no row records, or a cut transaction that
never committed. After every step:

- no event a processor has not passed, or a hold keeps, has been taken;
- the log holds every appended event from the path's start on, and nothing
  else; no offset was ever handed out twice;
- while nothing was deleted without an archive, the history read with its
  archive is the history appended (a rebuild's fold equals the state before
  the cut); once something was, a read from the beginning is refused, never
  a jump;
- the archive proves itself, and after a run that completes no file is in
  the archive directory that its records do not name;
- a retry of any key ever acknowledged returns its offset and appends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.backends import WITH_MEMORY, Backend
from support.retention import retention_rows

import streamkit.backends._retention.chunk_prep as chunk_prep
import streamkit.backends._retention.run as truncation
from streamkit import StreamEvent
from streamkit.backends import host_store
from streamkit.backends._retention.cuts import Cut, TruncationRows
from streamkit.backends._retention.segments import segment_name, segment_range
from streamkit.errors import HistoryTruncated, IdempotencyConflict
from streamkit.holds import check_hold
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.protocols import LeaseAsk, RetentionAsk

PATH = "/"
SLUGS = ("p1", "p2", "p3")
TTL = 3600.0
CRASHES = (None, None, "mid-write", "after-segment", "in-transaction")


class Crash(Exception):
    """The process dies here (a test stand-in for kill -9)."""


class CrashingRows:
    """The backend's rows, whose cut writes all of it, then dies before its transaction commits.

    A killed process never runs its cleanup: the segment file the cut would
    have recorded is put back after the rollback removed it.
    """

    def __init__(self, rows: TruncationRows, survive: int) -> None:
        self._rows = rows
        self._survive = survive
        self.kept: tuple[str, bytes] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows, name)

    def move_start(self, conn: Any, cut: Cut) -> None:
        self._rows.move_start(conn, cut)
        if self._survive > 0:
            self._survive -= 1
            return
        if cut.segment is not None:
            self.kept = (cut.segment.file, Path(cut.segment.file).read_bytes())
        raise Crash("killed inside the cut's transaction")


class RetentionModel(RuleBasedStateMachine):
    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.target = self.backend.fresh()
        self.loop = asyncio.new_event_loop()
        self.log: Log = self.target.open(**self.target.backend.fast)
        self.store = host_store(self.log)
        self.run(self.store.prepare())
        self.archive = Path(tempfile.mkdtemp(prefix="sk-model-"))
        self.items: list[tuple[int, int, str | None]] = []
        """Every durable item appended: (offset, n, key)."""
        self.acked: dict[str, tuple[int, int]] = {}
        self.handed = 0
        """The highest offset any append (control events included) was given."""
        self.cursors: dict[str, int] = {}
        self.held: dict[str, HeldLease] = {}
        self.holds: dict[str, int] = {}
        self.deleted = False
        self.next_key = 0
        self.next_hold = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.log.aclose())
        self.loop.close()
        self.target.remove()
        shutil.rmtree(self.archive, ignore_errors=True)

    # -- what the model knows --------------------------------------------------------

    def start(self) -> int:
        found = self.run(self.store.retention.horizons(time.time(), PATH))
        return found[0].start if found else 1

    def head(self) -> int:
        return int(self.run(self.log.stream(PATH).head()))

    def horizon(self) -> int:
        needs = [cursor + 1 for cursor in self.cursors.values()] + list(self.holds.values())
        return min([self.head() + 1, *needs])

    def saw(self, events: list[StreamEvent]) -> None:
        for event in events:
            self.handed = max(self.handed, event.offset)

    # -- rules -----------------------------------------------------------------------

    @rule(ns=st.lists(st.integers(1, 9), min_size=1, max_size=6), keyed=st.booleans())
    def append(self, ns: list[int], keyed: bool) -> None:
        events = []
        for n in ns:
            event: dict[str, Any] = {"type": "item", "payload": {"n": n}}
            if keyed:
                event["idempotency_key"] = f"k{self.next_key}"
                self.next_key += 1
            events.append(event)
        committed = self.run(self.log.stream(PATH).append(*events))
        offsets = [e.offset for e in committed]
        assert offsets[0] > self.handed, "an offset was handed out again"
        assert offsets == sorted(set(offsets))
        self.saw(committed)
        for event, n in zip(committed, ns, strict=True):
            self.items.append((event.offset, n, event.idempotency_key))
            if event.idempotency_key is not None:
                self.acked[event.idempotency_key] = (event.offset, n)

    @precondition(lambda self: bool(self.acked))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.acked)))
        offset, n = self.acked[key]
        head = self.head()
        body = {"type": "item", "payload": {"n": n}, "idempotency_key": key}
        (again,) = self.run(self.log.stream(PATH).append(body))
        assert again.offset == offset
        assert self.head() == head, "a retry appended"
        other = {"type": "item", "payload": {"n": n + 100}, "idempotency_key": key}
        with contextlib.suppress(IdempotencyConflict):
            self.run(self.log.stream(PATH).append(other))
            raise AssertionError(f"key {key} took another body")
        assert self.head() == head

    @rule(slug=st.sampled_from(SLUGS), step=st.integers(0, 40))
    def advance(self, slug: str, step: int) -> None:
        head = self.head()
        # A processor new to the path starts at its start (what is left of it).
        cursor = min(head, self.cursors.get(slug, self.start() - 1) + step)
        held = self.held.get(slug)
        if held is None:
            lease = self.run(
                self.store.try_acquire(LeaseAsk(PATH, slug, "model", time.time(), TTL))
            )
            assert lease is not None
            held = HeldLease(
                lease,
                self.store.check_fence,
                ttl=TTL,
                renewal_started=time.monotonic(),
                clock=time.time,
            )
            self.held[slug] = held
        storage = self.store.checkpoints(held, PATH)
        self.run(
            storage.save(slug, reducer_version="1", reduced_through_offset=cursor, state_json="{}")
        )
        self.cursors[slug] = cursor

    @rule()
    def catch_up(self) -> None:
        """Every processor known reaches the head (a host at rest)."""
        for slug in sorted(self.cursors):
            self.advance(slug, 10_000)

    @precondition(lambda self: bool(self.cursors))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        slug = data.draw(st.sampled_from(sorted(self.cursors)))
        event = self.run(
            self.store.retention.forget_processor(
                slug, None, by="model", reason="gone for good", now=time.time(), ttl=TTL
            )
        )
        self.saw([event])
        del self.cursors[slug]

    @rule(back=st.integers(0, 20))
    def hold(self, back: int) -> None:
        start = max(self.start(), self.horizon() - back)
        name = f"h{self.next_hold}"
        self.next_hold += 1
        hold = check_hold(PATH, name, start, None, "model", "kept for a while", time.time())
        self.saw([self.run(self.store.retention.place_hold(hold))])
        self.holds[name] = start

    @precondition(lambda self: bool(self.holds))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.holds)))
        event = self.run(self.store.retention.release_hold(PATH, name, by="model", reason="done"))
        self.saw([event])
        del self.holds[name]

    @rule(
        archive=st.sampled_from([True, True, False]),
        through=st.one_of(st.none(), st.integers(1, 80)),
        chunk=st.integers(1, 7),
        crash=st.sampled_from(CRASHES),
        crash_at=st.integers(0, 2),
    )
    def retain(
        self, archive: bool, through: int | None, chunk: int, crash: str | None, crash_at: int
    ) -> None:
        """A run; one that crashes dies in its chunk number ``crash_at`` (from 0)."""
        horizon, before = self.horizon(), self.start()
        rows = retention_rows(self.log)
        crashing = CrashingRows(rows, crash_at) if crash == "in-transaction" else None
        real_write = chunk_prep.write_segment
        chunks = [0]

        def write(*args: Any) -> Any:
            folder, path, first, last = args[0], args[1], args[2], args[3]
            chunks[0] += 1
            if chunks[0] <= crash_at:
                return real_write(*args)
            if crash == "mid-write":
                partial = Path(folder) / (segment_name(path, first, last) + ".partial")
                Path(folder).mkdir(parents=True, exist_ok=True)
                partial.write_bytes(b"half a segment")
                raise Crash("killed while writing the segment")
            written = real_write(*args)
            if crash == "after-segment":
                raise Crash("killed after the segment was written")
            return written

        chunk_prep.write_segment = write
        try:
            done = self.run(
                truncation.run_retention(
                    self.log,
                    crashing if crashing is not None else rows,
                    RetentionAsk(
                        PATH,
                        through=through,
                        archive=str(self.archive) if archive else None,
                        chunk=chunk,
                    ),
                )
            )
        except Crash:
            done = None
        finally:
            chunk_prep.write_segment = real_write
        if crashing is not None and crashing.kept is not None:
            file, data = crashing.kept
            Path(file).write_bytes(data)  # the rollback's cleanup never ran
        after = self.start()
        assert before <= after <= horizon, (before, after, horizon)
        note(f"run {'archived' if archive else 'deleted'}, crash {crash}, took {after > before}")
        if crash is not None and done is not None:
            note("a run meant to crash ended first")
        self.saw(self.run(self.log.stream(PATH).read(after - 1, 10_000)).events)
        if after > before and not archive:
            self.deleted = True
        if done is not None and archive:
            recorded = {s.file for s in self.run(self.store.retention.segments(PATH))}
            files = {str(f) for f in self.archive.iterdir()}
            assert recorded <= files
            # A crashed run's file stays only while its range is not taken yet (it
            # could be a live run's, about to be recorded).
            dead = [
                f
                for f in files - recorded
                if (segment_range(PATH, Path(f).name) or (0, 0))[1] < after
            ]
            assert not dead, f"left in the archive: {dead}"

    @rule(
        archive=st.sampled_from([True, True, False]),
        chunk=st.integers(1, 7),
        crash=st.sampled_from(CRASHES),
        crash_at=st.integers(0, 2),
    )
    def retain_at_rest(self, archive: bool, chunk: int, crash: str | None, crash_at: int) -> None:
        """Every processor caught up, then a run: most of the history may go."""
        self.catch_up()
        self.retain(archive, None, chunk, crash, crash_at)

    # -- what must hold after every step ---------------------------------------------

    @invariant()
    def nothing_needed_was_taken(self) -> None:
        assert self.start() <= self.horizon()

    @invariant()
    def the_log_holds_every_item_from_its_start(self) -> None:
        start = self.start()
        page = self.run(self.log.stream(PATH).read(start - 1, 10_000))
        got = [(e.offset, e.payload["n"]) for e in page.events if e.type == "item"]
        assert got == [(offset, n) for offset, n, _ in self.items if offset >= start]
        assert all(e.offset >= start for e in page.events)

    @invariant()
    def the_history_is_whole_with_its_archive_or_refused(self) -> None:
        stream = self.log.stream(PATH)
        if self.start() == 1:
            return
        with contextlib.suppress(HistoryTruncated):
            self.run(stream.read(0, 10))
            raise AssertionError("a plain read below the start was not refused")
        if self.deleted:
            with contextlib.suppress(HistoryTruncated):
                self.run(read_all(stream, include_archive=True))
                raise AssertionError("a read over deleted history was not refused")
            return
        events = self.run(read_all(stream, include_archive=True))
        folded = [(e.offset, e.payload["n"]) for e in events if e.type == "item"]
        assert folded == [(offset, n) for offset, n, _ in self.items]
        assert all(e.type == "item" or e.type.startswith("streamkit.") for e in events)

    @invariant()
    def the_archive_proves_itself(self) -> None:
        assert self.run(self.store.retention.verify_archive(PATH)) == []


async def read_all(stream: Any, *, include_archive: bool) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    after = 0
    while True:
        page = await stream.read(after, 50, include_archive=include_archive)
        events += page.events
        if page.scanned_through_offset <= after or page.at_head:
            return events
        after = page.scanned_through_offset


MODEL_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# One test case per backend: the same model, every storage engine.
def _case_for(backend: Backend) -> type:
    case = type(f"RetentionModel_{backend.name}", (RetentionModel,), {"backend": backend}).TestCase
    case.settings = MODEL_SETTINGS
    return case


# (A private in-memory log too: the model keeps to the one log it opens.)
globals().update({f"TestRetentionModel_{name}": _case_for(b) for name, b in WITH_MEMORY.items()})
