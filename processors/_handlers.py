"""Resolving the handlers a first-party processor is built with.

A handler may be given as a callable or, so a host's TOML config can name it,
as a ``"module:function"`` string. Both the tasks and the DLQ processors take
handlers this way; a bad one is refused when the processor is built, before
anything runs, with ``INVALID_CONTRACT`` naming which handler and why.
"""

from __future__ import annotations

import importlib
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
    return handler
