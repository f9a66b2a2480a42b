"""Request bodies over HTTP: read within a byte budget, parsed as strict JSON, or refused.

A body is read only when its ``Content-Type`` declares JSON
(``application/json`` or ``application/<thing>+json``); any other is refused
(400) unread. That is what keeps a page on another origin out: a browser
sends a cross-origin request without a preflight only with a form's or
``text/plain`` content type. A body past the budget is refused (413) as soon
as its declared length or its bytes so far pass it, before the rest is read;
a body that is not UTF-8 JSON (or holds NaN or Infinity, which JSON has not)
is refused (400); a body still arriving :data:`BODY_SECONDS` after its head is
refused (408). Nothing is written in any of these cases.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, NoReturn

from starlette.requests import Request

from streamkit.errors import MalformedRequest, RequestTimeout, RequestTooLarge

__all__ = ["BODY_SECONDS", "json_body"]

BODY_SECONDS = 30.0
"""The default of ``[http] body_timeout``: seconds a body may take once its head is in."""


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


async def json_body(request: Request, limit: int, timeout: float = BODY_SECONDS) -> Any:  # noqa: ASYNC109 - the body's deadline, enforced here
    """The request's body parsed as JSON; RequestTooLarge past ``limit`` bytes, else MalformedRequest.

    RequestTimeout when it is not all there ``timeout`` seconds after this begins.
    """
    declared_type = request.headers.get("content-type")
    if not _is_json(declared_type):
        shown = "none" if declared_type is None else repr(declared_type[:100])
        raise MalformedRequest(
            f"the request body must be sent as Content-Type: application/json (it was {shown}); "
            "nothing was read or written",
            details={"content_type": None if declared_type is None else declared_type[:100]},
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    size = 0
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                chunks.append(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(
            f"the request body did not arrive within {timeout:g} s ({size} bytes came); "
            "nothing was written; send it again",
            details={"received": size},
        ) from exc
    raw = b"".join(chunks)
    if not raw.strip():
        raise MalformedRequest(
            "the request has no body; send a JSON event object (or a list of them); "
            "nothing was written",
            details={},
        )
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError as exc:
        raise MalformedRequest(
            "the request body nests arrays or objects too deeply to read (no event may nest "
            "more than 100 levels); nothing was written",
            details={"error": "nested too deeply"},
        ) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedRequest(
            f"the request body is not UTF-8 JSON ({exc}); nothing was written",
            details={"error": str(exc)[:200]},
        ) from exc


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _too_large(size: int, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"the request body is at least {size} bytes, over the {limit} bytes this host takes "
        "in one request; nothing was written; send fewer events per request",
        details={"size": size, "limit": limit},
    )
