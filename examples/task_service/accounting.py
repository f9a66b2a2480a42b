"""The drill's books: what the producers asked for against what the log, the store and the outbox say.

:class:`Ledger` folds the log's events, read page by page as they come, into
per-task tallies; the drill uses it for its progress line, to decide when the
service is quiet, and for the final :class:`Accounting`.

The terms of the report, per task id a producer requested:

- **requested**: ids the producers requested (each acknowledged by the host).
- **succeeded**: ids with a ``task.succeeded`` (first try, after retries, or
  after a DLQ replay).
- **dead-lettered**: ids whose run gave up (``task.dead-lettered``) at least once.
- **replayed**: DLQ records the replay handed back (``dlq.record-replaying``).
- **abandoned**: DLQ records abandoned (their replays ran out).
- **duplicates** (must be 0): ids created more than once by any measure:
  more than one original ``task.requested`` (a producer's re-send appended
  twice), more than one ``task.succeeded``, more than one effect in the
  handler's store, more than one ``board.task-created``, or more than one
  distinct notification id in the outbox.
- **lost** (must be 0): ids that by the end are neither succeeded nor
  abandoned, are missing from the log, or succeeded without their effect in
  the store, their board entry, or their outbox line.

A settled id is succeeded or abandoned, so with nothing lost,
``requested == succeeded + abandoned``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkit.processors.dlq import replay_ref

from streamkit import StreamEvent


@dataclass
class Ledger:
    """Per-task tallies folded from the log, one event at a time, in offset order."""

    through: int = 0
    events: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    replay_requests: Counter[str] = field(default_factory=Counter)
    succeeded: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    live: set[str] = field(default_factory=set)
    task_attempts: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    failed_attempts: int = 0
    interrupted: int = 0
    rejected: int = 0
    records: dict[str, str] = field(default_factory=dict)
    """DLQ record id -> its status (pending, replaying, succeeded, abandoned)."""
    record_task: dict[str, str] = field(default_factory=dict)
    replayed: set[str] = field(default_factory=set)
    board_created: Counter[str] = field(default_factory=Counter)
    created_at_offset: dict[int, str] = field(default_factory=dict)
    notified: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    notifications_failed: int = 0
    replay_reports: list[dict[str, Any]] = field(default_factory=list)

    def fold(self, events: Iterable[StreamEvent]) -> None:
        """Fold events read from the log (raw payloads), in offset order."""
        for event in events:
            self.through = max(self.through, event.offset)
            self.events += 1
            p = event.payload
            kind = event.type
            if kind == "task.requested":
                if replay_ref(event) is None:
                    self.requests[p["task_id"]] += 1
                else:
                    self.replay_requests[p["task_id"]] += 1
                self.live.add(p["task_id"])
            elif kind == "task.attempt-started":
                self.attempts += 1
                self.task_attempts[p["task_id"]] += 1
            elif kind == "task.attempt-failed":
                self.failed_attempts += 1
                if "was interrupted" in p.get("error", ""):
                    self.interrupted += 1
            elif kind == "task.succeeded":
                self.succeeded[p["task_id"]] += 1
                self.live.discard(p["task_id"])
            elif kind in ("task.dead-lettered", "task.cancelled"):
                if kind == "task.dead-lettered":
                    self.dead_lettered[p["task_id"]] += 1
                self.live.discard(p["task_id"])
            elif kind == "task.rejected":
                self.rejected += 1
            elif kind == "dlq.dead-lettered":
                self.records[p["record_id"]] = "pending"
                self.record_task[p["record_id"]] = p.get("resource_id") or p["record_id"]
            elif kind == "dlq.record-replaying":
                self.records[p["record_id"]] = "replaying"
                self.replayed.add(p["record_id"])
            elif kind == "dlq.record-succeeded":
                self.records[p["record_id"]] = "succeeded"
            elif kind == "dlq.record-abandoned":
                self.records[p["record_id"]] = "abandoned"
            elif kind == "dlq.replay-completed":
                self.replay_reports.append(dict(p))
            elif kind == "board.task-created":
                self.board_created[p["task_id"]] += 1
                self.created_at_offset[event.offset] = p["task_id"]
            elif kind == "notification.sent":
                task_id = self.created_at_offset.get(p["source_offset"])
                if task_id is not None:
                    self.notified[task_id].add(p["notification_id"])
            elif kind == "notification.dead-lettered":
                self.notifications_failed += 1

    # -- what the drill waits for ------------------------------------------------------

    def abandoned_tasks(self) -> set[str]:
        return {self.record_task[r] for r, s in self.records.items() if s == "abandoned"}

    def outstanding(self, requested: Iterable[str], *, after_replay: bool) -> list[str]:
        """Why the service is not quiet yet (empty when it is), for ids in ``requested``."""
        problems: list[str] = []
        ids = list(requested)
        missing = [t for t in ids if not self.requests[t]]
        if missing:
            problems.append(f"{len(missing)} requested task(s) not in the log, e.g. {missing[0]}")
        if self.live:
            problems.append(f"{len(self.live)} task(s) still running or waiting for a retry")
        unboarded = [t for t in self.succeeded if not self.board_created[t]]
        if unboarded:
            problems.append(f"{len(unboarded)} succeeded task(s) not on the board yet")
        unnotified = [t for t in self.board_created if not self.notified.get(t)]
        if unnotified:
            problems.append(f"{len(unnotified)} created task(s) not notified yet")
        if after_replay:
            open_records = [r for r, s in self.records.items() if s in ("pending", "replaying")]
            if open_records:
                problems.append(f"{len(open_records)} DLQ record(s) not settled yet")
            abandoned = self.abandoned_tasks()
            unsettled = [t for t in ids if not self.succeeded[t] and t not in abandoned]
            if unsettled:
                problems.append(f"{len(unsettled)} task(s) neither succeeded nor abandoned")
        return problems


@dataclass
class Accounting:
    """The drill's report (see the module docstring for each term)."""

    requested: int
    succeeded: int
    succeeded_first_try: int
    succeeded_after_retry: int
    succeeded_after_replay: int
    dead_lettered: int
    dead_letterings: int
    """task.dead-lettered events: a task whose replay failed again counts twice."""
    replayed: int
    abandoned: int
    duplicates: int
    lost: int
    duplicate_kinds: dict[str, int]
    lost_kinds: dict[str, int]
    examples: dict[str, list[str]]
    attempts: int
    failed_attempts: int
    interrupted_attempts: int
    producer_resends: int
    handler_reruns_absorbed: int
    notifications_sent: int
    outbox_lines: int
    outbox_resent_lines: int
    replay_report: dict[str, Any] | None
    unexpected: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.lost == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"ok": self.ok}, sort_keys=True)


def account(
    ledger: Ledger,
    *,
    producers: Mapping[str, Mapping[str, Any]],
    effects: Iterable[Mapping[str, Any]],
    journal: Iterable[Mapping[str, Any]],
    outbox: Iterable[Mapping[str, Any]],
    producer_resends: int,
) -> Accounting:
    """Compare what ``producers`` requested (task id -> their record) with everything written."""
    ids = set(producers)
    effects_by_task: Counter[str] = Counter(e["task_id"] for e in effects)
    outbox_list = list(outbox)
    outbox_ids_by_task: defaultdict[str, set[str]] = defaultdict(set)
    outbox_id_counts: Counter[str] = Counter()
    for line in outbox_list:
        # The outbox line names the board event it announces by offset.
        task_id = ledger.created_at_offset.get(line.get("source_offset", -1))
        outbox_id_counts[line["id"]] += 1
        if task_id is not None:
            outbox_ids_by_task[task_id].add(line["id"])
    abandoned = ledger.abandoned_tasks()

    duplicate_sets = {
        "requested twice": {t for t, n in ledger.requests.items() if n > 1},
        "succeeded twice": {t for t, n in ledger.succeeded.items() if n > 1},
        "created twice in the store": {t for t, n in effects_by_task.items() if n > 1},
        "on the board twice": {t for t, n in ledger.board_created.items() if n > 1},
        "notified under two ids": {t for t, s in outbox_ids_by_task.items() if len(s) > 1},
    }
    lost_sets = {
        "not in the log": {t for t in ids if not ledger.requests[t]},
        "never settled": {t for t in ids if not ledger.succeeded[t] and t not in abandoned},
        "succeeded, not in the store": {
            t for t in ids if ledger.succeeded[t] and not effects_by_task[t]
        },
        "succeeded, not on the board": {
            t for t in ids if ledger.succeeded[t] and not ledger.board_created[t]
        },
        "on the board, no outbox line": {
            t for t in ids if ledger.board_created[t] and not outbox_ids_by_task[t]
        },
        "unknown to the producers": {t for t in ledger.requests if t not in ids},
    }
    duplicated = set().union(*duplicate_sets.values())
    lost = set().union(*lost_sets.values())

    # What each kind of request should come to (an "ok" one retries if the kill
    # interrupted its attempt).
    expected = {
        "ok": {"first try", "retry"},
        "flaky": {"retry"},
        "locked": {"replay"},
        "invalid": {"abandoned"},
    }
    unexpected: Counter[str] = Counter()
    first_try = after_retry = after_replay = 0
    for task_id, record in producers.items():
        if ledger.succeeded[task_id]:
            if ledger.replay_requests[task_id]:
                outcome = "replay"
                after_replay += 1
            elif ledger.task_attempts[task_id] == 1:
                outcome = "first try"
                first_try += 1
            else:
                outcome = "retry"
                after_retry += 1
        else:
            outcome = "abandoned" if task_id in abandoned else "unsettled"
        want = expected.get(str(record.get("kind")), set())
        if outcome not in want:
            unexpected[f"{record.get('kind')} -> {outcome}"] += 1

    reports = ledger.replay_reports
    return Accounting(
        requested=len(ids),
        succeeded=sum(1 for t in ids if ledger.succeeded[t]),
        succeeded_first_try=first_try,
        succeeded_after_retry=after_retry,
        succeeded_after_replay=after_replay,
        dead_lettered=sum(1 for t in ids if ledger.dead_lettered[t]),
        dead_letterings=sum(ledger.dead_lettered[t] for t in ids),
        replayed=len(ledger.replayed),
        abandoned=len({r for r, s in ledger.records.items() if s == "abandoned"}),
        duplicates=len(duplicated),
        lost=len(lost),
        duplicate_kinds={k: len(v) for k, v in duplicate_sets.items()},
        lost_kinds={k: len(v) for k, v in lost_sets.items()},
        examples={k: sorted(v)[:3] for k, v in (duplicate_sets | lost_sets).items() if v},
        attempts=ledger.attempts,
        failed_attempts=ledger.failed_attempts,
        interrupted_attempts=ledger.interrupted,
        producer_resends=producer_resends,
        handler_reruns_absorbed=sum(1 for j in journal if j.get("outcome") == "existing"),
        notifications_sent=sum(len(s) for s in ledger.notified.values()),
        outbox_lines=len(outbox_list),
        outbox_resent_lines=sum(n - 1 for n in outbox_id_counts.values()),
        replay_report=reports[-1] if reports else None,
        unexpected=dict(unexpected),
    )
