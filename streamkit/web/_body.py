"""Request bodies over HTTP: read within a byte budget, parsed as strict JSON, or refused.

A body past the budget is refused (413) as soon as its declared length or
its bytes so far pass it, before the rest is read; a body that is not UTF-8
JSON (or holds NaN or Infinity, which JSON has not) is refused (400). Nothing
is written in either case.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from starlette.requests import Request

from streamkit.errors import MalformedRequest, RequestTooLarge

__all__ = ["json_body"]


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


async def json_body(request: Request, limit: int) -> Any:
    """The request's body parsed as JSON; RequestTooLarge past ``limit`` bytes, else MalformedRequest."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise MalformedRequest(
            "the request has no body; send a JSON event object (or a list of them); "
            "nothing was written",
            details={},
        )
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedRequest(
            f"the request body is not UTF-8 JSON ({exc}); nothing was written",
            details={"error": str(exc)[:200]},
        ) from exc


def _too_large(size: int, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"the request body is at least {size} bytes, over the {limit} bytes this host takes "
        "in one request; nothing was written; send fewer events per request",
        details={"size": size, "limit": limit},
    )
