"""One call of a task handler: awaited, its exits held as failures, its error as text.

A handler runs as an asyncio task of its own. Whatever it raises is the
attempt's failure, recorded as text of at most ``_ERROR_CHARS`` characters;
``SystemExit`` and ``KeyboardInterrupt`` too, which would otherwise leave the
event loop from that task and stop the host (:class:`~streamkit.processor.ExitRefused`).
A handler whose call returns something that is not awaitable fails the
attempt with an error saying how to write it. Every failed attempt is one
``task.attempt_failed`` line in the host's log, with the handler's traceback
when it raised (:func:`log_failure`).
"""

from __future__ import annotations

import inspect
from typing import Any

import structlog
from streamkit.processors.tasks._events import _ERROR_CHARS, LiveTask, TaskContext, TaskHandler

from streamkit.processor import USER_EXITS, exit_refused

__all__ = ["error_text", "log_failure", "run_handler"]

_log = structlog.get_logger("streamkit.processors.tasks")


async def run_handler(handler: TaskHandler, args: dict[str, Any], ctx: TaskContext) -> Any:
    """Call ``handler`` and await what it returns (see the module)."""
    try:
        result = handler(args, ctx)
        if not inspect.isawaitable(result):
            raise TypeError(
                f"the handler returned {type(result).__name__}, not an awaitable: write it as "
                "`async def handler(args, ctx): ...` (run blocking work inside it with "
                "`await asyncio.to_thread(...)`)"
            )
        return await result
    except USER_EXITS as exc:
        raise exit_refused(exc, f"task handler {ctx.name!r}") from exc


def error_text(exc: BaseException) -> str:
    """What an attempt's failure records of ``exc``: its type and message, cut to size."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_ERROR_CHARS]


def log_failure(task: LiveTask, attempt: int, error: str, exc: BaseException | None) -> None:
    """One line in the host's log for a failed attempt, with the handler's traceback if it raised."""
    _log.warning(
        "task.attempt_failed",
        task_id=task.task_id,
        name=task.name,
        attempt=attempt,
        max_attempts=task.max_attempts,
        error=error,
        exc_info=exc,
    )
