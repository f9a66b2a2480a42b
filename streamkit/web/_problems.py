"""Refusals over HTTP: a StreamkitError as ``application/problem+json`` (RFC 9457), one mapping.

Every refusal the HTTP surface sends carries the error's stable ``code``,
``retryable`` and ``details`` beside RFC 9457's ``type``, ``title``,
``status`` and ``detail`` (the error's message: what was refused, why, and
that nothing was written). The status of each code is decided here and
nowhere else; a code not listed is a 400 if the caller can fix it by
changing the request, which every other StreamkitError is.

``type`` is the relative reference ``/problems/<code>``, which the host
itself serves (:func:`described`): the code, its status and what it means.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from streamkit.errors import StreamkitError

__all__ = ["PROBLEM_TYPE", "described", "problem", "problem_body", "status_of"]

PROBLEM_TYPE = "application/problem+json"

_STATUS: dict[str, int] = {
    "INVALID_EVENT": 422,
    "INVALID_REQUEST": 400,
    "MALFORMED_REQUEST": 400,
    "OFFSET_CONFLICT": 412,
    "IDEMPOTENCY_CONFLICT": 409,
    "UNDECLARED_EMIT": 422,
    "REQUEST_TOO_LARGE": 413,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "REQUEST_TIMEOUT": 408,
    "HOST_BUSY": 503,
    "NOT_FOUND": 404,
    "UNKNOWN_OP": 404,
    "LEASE_LOST": 409,
    "SLOW_CONSUMER": 409,
    "PROCESSOR_TIMEOUT": 504,
    "SCHEMA_AHEAD": 503,
    "PAYLOAD_MALFORMED": 503,
    "LOG_CLOSED": 503,
    "STORAGE_ERROR": 503,
    "STORAGE_BUSY": 503,
    "STORAGE_UNAVAILABLE": 503,
    "LOG_TAMPERED": 500,
    "INTERNAL": 500,
}


def _codes() -> dict[str, type[StreamkitError]]:
    found: dict[str, type[StreamkitError]] = {}
    pending: list[type[StreamkitError]] = [StreamkitError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not StreamkitError and cls.__module__ == "streamkit.errors":
            found.setdefault(cls.code, cls)
    return found


def _slug(code: str) -> str:
    return code.lower().replace("_", "-")


def described(slug: str) -> dict[str, Any] | None:
    """What ``/problems/<slug>`` answers: the code, its status and meaning; None if unknown."""
    for code, cls in _codes().items():
        if _slug(code) == slug:
            doc = (cls.__doc__ or "").strip().splitlines()
            return {
                "code": code,
                "status": _STATUS.get(code, 400),
                "retryable": cls.default_retryable,
                "meaning": doc[0].replace("``", "") if doc else "",
            }
    return None


def status_of(error: StreamkitError) -> int:
    """The HTTP status a refusal with ``error``'s code is sent with."""
    return _STATUS.get(error.code, 400)


def problem_body(
    error: StreamkitError, *, instance: str | None = None, status: int | None = None
) -> dict[str, Any]:
    """The RFC 9457 body of ``error``'s refusal (what :func:`problem` sends)."""
    body: dict[str, Any] = {
        "type": f"/problems/{_slug(error.code)}",
        "title": error.code,
        "status": status_of(error) if status is None else status,
        "detail": error.message,
        "code": error.code,
        "retryable": error.retryable,
        "details": error.details,
    }
    if instance is not None:
        body["instance"] = instance
    return body


def problem(
    error: StreamkitError, *, instance: str | None = None, status: int | None = None
) -> JSONResponse:
    """``error`` as an RFC 9457 problem response (with ``Retry-After`` when it is retryable).

    ``status`` overrides the code's own (a 405 from the router is an
    ``INVALID_REQUEST`` sent as 405); the body always says the status sent.
    """
    body = problem_body(error, instance=instance, status=status)
    status = body["status"]
    headers = {"Retry-After": "1"} if error.retryable and status >= 500 else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="streamkit"'}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_TYPE)
