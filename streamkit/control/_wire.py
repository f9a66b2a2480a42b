"""The control socket's wire format: encoding lines, refusals, and rebuilding errors.

Private to :mod:`streamkit.control`. Every line is one JSON object, UTF-8,
``\\n``-terminated; encoding refuses NaN and infinities (not JSON) and turns
pydantic models and objects with ``to_dict()`` into JSON data. An error always
encodes: details that will not encode are replaced by their ``repr``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from streamkit.errors import (
    ControlUnavailable,
    InvalidRequest,
    MalformedRequest,
    RemoteError,
    StreamkitError,
)

__all__ = [
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "READ_CHUNK",
    "decode_reply",
    "encode",
    "encode_request",
    "error_from_reply",
    "error_line",
    "invalid_args",
    "malformed",
    "reject_constant",
    "result_of",
    "unavailable",
]


MAX_REQUEST_BYTES: Final = 2 * 1024 * 1024
"""The longest request line a server reads (without its newline)."""

MAX_REPLY_BYTES: Final = 1024 * 1024 * 1024
"""The longest reply line a client buffers: far above any real reply, so only a broken peer hits it."""

READ_CHUNK = 64 * 1024
"""How much a peer reads from the socket at a time."""


def malformed(why: str) -> MalformedRequest:
    return MalformedRequest(
        f"malformed request: {why}; send one JSON object per line, like "
        '{"id": 1, "op": "status"}; nothing was done',
        details={"reason": why},
    )


def invalid_args(op: str, model: type[BaseModel], exc: ValidationError) -> InvalidRequest:
    """The refusal of arguments that did not validate against ``model``."""
    accepted = sorted(model.model_fields)
    problems: list[str] = []
    errors: list[dict[str, str]] = []
    for error in exc.errors():
        arg = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        if error["type"] == "extra_forbidden":
            problem = f"unknown argument (accepted: {', '.join(accepted) or 'none'})"
        elif error["type"] == "missing":
            problem = "required argument missing"
        else:
            shown = repr(error.get("input"))
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            problem = f"{error['msg']} (got {shown})"
        problems.append(f"{arg!r}: {problem}")
        errors.append({"arg": arg, "problem": problem})
    return InvalidRequest(
        f"op {op!r} refused its arguments: {'; '.join(problems)}; nothing was done",
        details={"op": op, "errors": errors},
    )


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(message: Mapping[str, Any]) -> bytes:
    text = json.dumps(
        message,
        ensure_ascii=False,
        allow_nan=False,
        separators=(",", ":"),
        default=_json_default,
    )
    return text.encode("utf-8") + b"\n"


def error_line(request_id: Any, error: StreamkitError) -> bytes:
    payload = error.to_dict()
    try:
        return encode({"id": request_id, "ok": False, "error": payload})
    except (TypeError, ValueError, RecursionError):
        # Details that will not encode must not turn a refusal into a crash.
        payload["details"] = {"unencodable_details": repr(error.details)[:1000]}
        return encode({"id": request_id, "ok": False, "error": payload})


def error_from_reply(error: Any) -> StreamkitError:
    """Rebuild the error of a ``{"ok": false}`` reply.

    A code of a :class:`~streamkit.errors.StreamkitError` subclass this process
    knows comes back as that class (``OFFSET_CONFLICT`` as ``OffsetConflict``);
    any other as :class:`~streamkit.errors.RemoteError` whose ``.code`` is the
    remote code.
    """
    if not isinstance(error, Mapping):
        return ControlUnavailable(
            f"the server sent an error reply without an error object ({error!r}); the "
            "outcome of the request is unknown",
            retryable=False,
        )
    code = str(error.get("code") or "REMOTE_ERROR")
    message = str(error.get("message") or f"remote error {code}")
    details = error.get("details")
    details = details if isinstance(details, Mapping) else {}
    retryable = error.get("retryable")
    retryable = retryable if isinstance(retryable, bool) else None
    known = _classes_by_code().get(code)
    if known is not None:
        with contextlib.suppress(Exception):
            return known(message, details=details, retryable=retryable)
    return RemoteError(message, code=code, details=details, retryable=retryable)


def _classes_by_code() -> dict[str, type[StreamkitError]]:
    # Computed per call so error classes defined after import (by processors,
    # say) are known too; error replies are rare enough for that to be free.
    found: dict[str, type[StreamkitError]] = {}
    pending: list[type[StreamkitError]] = [StreamkitError]
    while pending:
        cls = pending.pop(0)
        if cls is not RemoteError:
            found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def encode_request(request_id: int, op: str, args: Mapping[str, Any]) -> bytes:
    reserved = sorted({"id", "op"} & set(args))
    if reserved:
        raise InvalidRequest(
            f"argument name(s) {reserved} are reserved by the wire format; nothing was sent",
            details={"op": op, "reserved": reserved},
        )
    try:
        return encode({"id": request_id, "op": op, **args})
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(
            f"the arguments of op {op!r} are not JSON ({exc}); nothing was sent",
            details={"op": op},
        ) from exc


def decode_reply(raw: bytes, op: str) -> dict[str, Any]:
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ControlUnavailable(
            f"the server's reply to op {op!r} is not JSON ({exc}); the outcome is unknown",
            retryable=False,
        ) from exc
    if not isinstance(reply, dict):
        raise ControlUnavailable(
            f"the server's reply to op {op!r} is not a JSON object; the outcome is unknown",
            retryable=False,
        )
    return reply


def result_of(reply: Mapping[str, Any], op: str) -> Any:
    if reply.get("ok") is not True:
        raise error_from_reply(reply.get("error"))
    if "event" in reply or "end" in reply:
        raise InvalidRequest(
            f"op {op!r} is a streaming op; use watch() for it (the connection was closed)",
            details={"op": op},
        )
    return reply.get("result")


def unavailable(path: object, exc: OSError, doing: str) -> ControlUnavailable:
    return ControlUnavailable(
        f"no control server reachable at {str(path)!r} while {doing} "
        f"({exc.strerror or exc or type(exc).__name__}); is the host running on this "
        "database? if the request was sent, it may or may not have been applied",
        details={"path": str(path)},
    )
