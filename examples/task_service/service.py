"""The task service's processors as the host runs them, and the ``streamkit.toml`` that runs them.

Four processors on one stream:

- :class:`TaskRunner`: the first-party tasks processor with one handler,
  ``create-task`` (:class:`CreateTask`), which creates a task in a small store
  of files (``<data_dir>/effects``) and fails for some inputs;
- :class:`~task_service.board.TaskBoard`: the board clients watch;
- :class:`BoardNotifications`: one outbox line per task created on the board;
- the first-party DLQ (``DlqProcessor``), which replays what the runner gave up on.

``create-task`` fails on purpose for some inputs, so every path is exercised:

- ``flaky: true``: the first attempt fails ("the board database is busy"), the
  retry succeeds;
- a category with a lock file in ``<data_dir>/locks`` fails every attempt
  ("category is locked") until the lock is removed: the task dead-letters, and
  a DLQ replay after the unlock creates it;
- an empty title fails every attempt ("a task needs a title"): the task
  dead-letters, its replay fails again and the DLQ abandons it.

The handler is idempotent, as a task handler must be (attempts are at least
once: a host killed mid-attempt runs the attempt again): its effect is one file
per ``ctx.idempotency_key``, created atomically only if absent, so a re-run
finds the file and returns the same result.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamkit.processors.notifications import NotificationsProcessor
from streamkit.processors.tasks import TaskContext, TasksProcessor

from task_service.board import BOARD_CONTRACT, CREATE_TASK, TASK_CREATED

OUTBOX_RULE = {
    "name": "task-created",
    "event_type": TASK_CREATED,
    "subject": "New task ${task_id} in ${category}",
    "template": "${title} (${category}) is on the board.",
    "recipients": ["team-${category}@example.com"],
    "channel": "outbox",
    "max_attempts": 5,
}


class TaskFailed(Exception):
    """The create-task handler refused this attempt (the message says why)."""


@dataclass(frozen=True)
class Effect:
    """One task created in the store: which run created it, for which task."""

    key: str
    task_id: str
    title: str
    category: str


def _effect_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32] + ".json"


class CreateTask:
    """The ``create-task`` handler: ``args = {title, category, flaky}`` -> the created task.

    Writes one effect file per run key and appends a line to
    ``<data_dir>/handler.log`` for every attempt that reached the store
    (``applied`` or ``existing``), so a reader can count re-runs the key absorbed.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, delay: float = 0.1) -> None:
        self.data_dir = Path(data_dir)
        self.delay = delay
        self.effects = self.data_dir / "effects"
        self.locks = self.data_dir / "locks"
        self.effects.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(parents=True, exist_ok=True)

    async def __call__(self, args: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        title = str(args.get("title", "")).strip()
        category = str(args.get("category", ""))
        await asyncio.sleep(self.delay)  # the work itself
        if not title:
            raise TaskFailed("a task needs a title; this request has none")
        if (self.locks / category).exists():
            raise TaskFailed(f'category "{category}" is locked; try again once it is unlocked')
        if args.get("flaky") and ctx.attempt == 1:
            raise TaskFailed("the board database is busy")
        effect = Effect(
            key=ctx.idempotency_key, task_id=ctx.task_id, title=title, category=category
        )
        outcome = await asyncio.to_thread(self._store, effect)
        await asyncio.to_thread(self._journal, effect, outcome)
        return {"created": True, "task_id": ctx.task_id, "title": title, "category": category}

    def _store(self, effect: Effect) -> str:
        final = self.effects / _effect_name(effect.key)
        if final.exists():
            return "existing"
        # Write aside, then link into place: the link is atomic and refuses an
        # existing name, so a torn write never counts and a re-run never doubles.
        temp = self.effects / f".{final.name}.{os.getpid()}.{id(effect)}.tmp"
        body = json.dumps(effect.__dict__, sort_keys=True).encode()
        with open(temp, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, final)
        except FileExistsError:
            return "existing"
        finally:
            temp.unlink()
        return "applied"

    def _journal(self, effect: Effect, outcome: str) -> None:
        line = json.dumps({"key": effect.key, "task_id": effect.task_id, "outcome": outcome})
        fd = os.open(self.data_dir / "handler.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_effects(data_dir: str | os.PathLike[str]) -> Iterator[Effect]:
    """Every task the handler created (one per effect file)."""
    effects = Path(data_dir) / "effects"
    if not effects.is_dir():
        return
    for file in sorted(effects.glob("*.json")):
        yield Effect(**json.loads(file.read_bytes()))


def read_journal(data_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The handler's journal: one entry per attempt that reached the store."""
    journal = Path(data_dir) / "handler.log"
    if not journal.exists():
        return []
    entries = []
    for line in journal.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entries.append(json.loads(line))
    return entries


class TaskRunner(TasksProcessor):
    """The tasks processor with the ``create-task`` handler writing under ``data_dir``."""

    def __init__(
        self,
        *,
        data_dir: str,
        backoff_base: float = 0.2,
        backoff_max: float = 5.0,
        concurrency: int = 16,
    ) -> None:
        super().__init__(
            handlers={CREATE_TASK: CreateTask(data_dir)},
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            concurrency=concurrency,
        )


class BoardNotifications(NotificationsProcessor):
    """One outbox line per task created on the board (rule ``task-created``)."""

    def __init__(self, *, outbox: str) -> None:
        super().__init__(
            rules=[OUTBOX_RULE],
            channels={"outbox": {"kind": "outbox", "path": outbox}},
            sources=[BOARD_CONTRACT],
        )


def config_toml(
    *,
    db: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    dlq_max_attempts: int = 1,
    lease_ttl: float = 2.0,
    shutdown_grace: float = 5.0,
) -> str:
    """The ``streamkit.toml`` that runs the service over ``db``, with absolute paths.

    ``db`` is a SQLite file or a ``postgresql://`` URL (kept as it is).
    """
    db_path: Path | str = (
        db
        if isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))
        else Path(db).resolve()
    )
    data = Path(data_dir).resolve()
    processors: list[tuple[str, Mapping[str, Any]]] = [
        ("task_service.service:TaskRunner", {"data_dir": str(data)}),
        ("task_service.board:TaskBoard", {}),
        ("task_service.service:BoardNotifications", {"outbox": str(data / "outbox.jsonl")}),
        (
            "streamkit.processors.dlq:DlqProcessor",
            {"max_attempts": dlq_max_attempts},
        ),
    ]
    lines = [
        f"db = {json.dumps(str(db_path))}",
        f"shutdown_grace = {shutdown_grace}",
        "",
        "[lease]",
        f"ttl = {lease_ttl}",
    ]
    for class_path, kwargs in processors:
        lines += ["", "[[processors]]", f"class = {json.dumps(class_path)}"]
        if kwargs:
            lines.append("[processors.kwargs]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in kwargs.items()]
    return "\n".join(lines) + "\n"
