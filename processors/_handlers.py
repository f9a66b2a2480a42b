"""Resolving the handlers a first-party processor is built with.

A handler may be given as a callable or, so a host's TOML config can name it,
as a ``"module:function"`` string. Both the tasks and the DLQ processors take
handlers this way; a bad one (not importable, not callable, or a plain
``def`` rather than ``async def``) is refused when the processor is built,
before anything runs, with ``INVALID_CONTRACT`` naming which handler and why.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from streamkit import InvalidContract

H = TypeVar("H", bound=Callable[..., Any])


def resolve_handler(what: str, handler: H | str, details: dict[str, Any]) -> H:
    """Return ``handler``, importing it first if it is a ``"module:function"`` string.

    ``what`` names the handler in messages (e.g. ``task handler "send-invoice"``).
    """
    if isinstance(handler, str):
        module_name, _, attr = handler.partition(":")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise InvalidContract(
                f"{what}: cannot import {handler!r} ({exc}); name an async function as "
                '"module:function"; nothing was built',
                details={**details, "handler": handler},
            ) from exc
        return resolve_handler(what, cast(H, target), details)
    if not callable(handler):
        raise InvalidContract(
            f'{what} must be an async function or a "module:function" string, got '
            f"{handler!r}; nothing was built",
            details=details,
        )
    if not _is_async(handler):
        # A plain function would run on the event loop, out of reach of its timeout,
        # and its non-awaitable result would leave the run in flight forever.
        name = getattr(handler, "__name__", type(handler).__name__)
        raise InvalidContract(
            f"{what} is a plain function ({name}); a handler must be a coroutine function: "
            f"write it as `async def {name}(args, ctx): ...` and run blocking work inside it "
            "with `await asyncio.to_thread(...)`; nothing was built",
            details={**details, "handler": repr(handler)[:200]},
        )
    return handler


def _is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine: an async function, bound, partial or object."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)
