"""Handlers given to the tasks and DLQ processors as callables or "module:function" strings."""

from __future__ import annotations

import pytest
from streamkit.processors.dlq import DlqProcessor
from streamkit.processors.tasks import TasksProcessor

from streamkit import InvalidContract


async def sample_handler(args: dict[str, object], ctx: object) -> None:
    """A handler importable by name from this module."""


def test_string_handlers_are_imported_by_name() -> None:
    """A "module:function" string resolves to that function for tasks and DLQ replays."""
    name = f"{__name__}:sample_handler"
    tasks = TasksProcessor(handlers={"sample": name})
    dlq = DlqProcessor(handlers={"op": name})
    assert tasks._handlers["sample"] is sample_handler
    assert dlq._handlers["op"] is sample_handler


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_such_module_here:fn", "cannot import 'no_such_module_here:fn'"),
        (f"{__name__}:missing", f"cannot import '{__name__}:missing'"),
        (42, "must be an async function"),
    ],
)
def test_bad_handlers_are_refused_when_built(handler: object, message: str) -> None:
    """An unimportable name or a non-callable is refused with INVALID_CONTRACT naming it."""
    with pytest.raises(InvalidContract, match='task handler "t"') as tasks_error:
        TasksProcessor(handlers={"t": handler})  # type: ignore[dict-item]
    assert message in str(tasks_error.value)
    with pytest.raises(InvalidContract, match='DLQ replay handler for "op"') as dlq_error:
        DlqProcessor(handlers={"op": handler})  # type: ignore[dict-item]
    assert message in str(dlq_error.value)


def plain_handler(args: dict[str, object], ctx: object) -> None:
    """A plain `def`: refused, it would run on the loop out of reach of its timeout."""


class AsyncCallable:
    async def __call__(self, args: dict[str, object], ctx: object) -> None:
        return None


def test_a_plain_def_handler_is_refused_with_how_to_write_it() -> None:
    """A non-coroutine handler is refused at construction, by object or by name."""
    for handler in (plain_handler, f"{__name__}:plain_handler", lambda args, ctx: None):
        with pytest.raises(InvalidContract, match="is a plain function") as caught:
            TasksProcessor(handlers={"t": handler})  # type: ignore[dict-item]
        assert "async def" in str(caught.value)
        with pytest.raises(InvalidContract, match="is a plain function"):
            DlqProcessor(handlers={"op": handler})  # type: ignore[dict-item]


def test_async_callables_partials_and_methods_are_accepted() -> None:
    """An object with an async __call__, a partial of an async function, a bound method pass."""
    import functools

    class Holder:
        async def run(self, args: dict[str, object], ctx: object) -> None:
            return None

    for handler in (AsyncCallable(), functools.partial(sample_handler), Holder().run):
        TasksProcessor(handlers={"t": handler})
