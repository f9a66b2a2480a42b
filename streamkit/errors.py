"""Coded errors: every failure streamkit raises on purpose.

Each error carries a stable ``code`` (SCREAMING_SNAKE, safe to match on), a
``retryable`` flag (whether the same call may succeed later without changes)
and ``details`` (a JSON-friendly dict naming the values involved). Each class
also inherits the builtin that fits, so ``except ValueError`` keeps working
for callers who do not know streamkit.

Messages follow one shape: what was refused, why, what was and was not
written, and the way out.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

__all__ = [
    "CheckpointTooLarge",
    "ControlSocketInUse",
    "ControlUnavailable",
    "CutoverRaced",
    "Forbidden",
    "HistoryTruncated",
    "HostBusy",
    "IdempotencyConflict",
    "InternalError",
    "InvalidConfig",
    "InvalidContract",
    "InvalidEvent",
    "InvalidRequest",
    "LeaseLost",
    "LogClosed",
    "LogOpenError",
    "LogTampered",
    "MalformedRequest",
    "NotFound",
    "OffsetConflict",
    "PayloadMalformed",
    "ProcessorTimeout",
    "ReduceFailed",
    "RemoteError",
    "RequestTimeout",
    "RequestTooLarge",
    "RetainFromInvalid",
    "SchemaAhead",
    "SchemaCheckFailed",
    "SlowConsumer",
    "StateNotSerializable",
    "StorageBusy",
    "StorageError",
    "StreamkitError",
    "Unauthorized",
    "UndeclaredEmit",
    "UnknownOperation",
    "UntrustedSocket",
    "VersionRetired",
    "did_you_mean",
]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``choices`` to a mistyped ``word``, else ``""``.

    The one wording every refusal of an unknown name uses (config keys, processor slugs,
    task names), so that a typo is answered the same way everywhere.
    """
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


class StreamkitError(Exception):
    """The root of every error streamkit raises on purpose."""

    code: ClassVar[str] = "STREAMKIT_ERROR"
    default_retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.retryable: bool = self.default_retryable if retryable is None else retryable

    def to_dict(self) -> dict[str, Any]:
        """The error as a JSON-friendly dict (for the CLI and the control socket)."""
        return {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "details": self.details,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidEvent(StreamkitError, ValueError):
    """An event envelope broke a rule of the log; the whole append wrote nothing."""

    code = "INVALID_EVENT"


class SchemaAhead(StreamkitError, RuntimeError):
    """A stored payload is of a version newer than the processor's code; it stopped before it."""

    code = "SCHEMA_AHEAD"
    default_retryable = True


class PayloadMalformed(StreamkitError, RuntimeError):
    """A stored payload does not validate, and its processor stalls rather than skip it.

    Raised for a processor whose ``on_malformed`` is ``"stall"``: it stopped
    before the event. Retryable: new code that reads the payload (a fixed
    model or an upcaster), or an operator's ``streamkit skip``, moves it on.
    """

    code = "PAYLOAD_MALFORMED"
    default_retryable = True


class ReduceFailed(StreamkitError, RuntimeError):
    """A processor's reduce raised on an event, and the processor stalls rather than skip it.

    Raised for a processor whose ``on_reduce_error`` is ``"stall"`` (the
    default): it stopped before the event, so no state it serves omits it.
    ``details`` name the event and carry the reduce's error with a bounded
    traceback excerpt. Retryable: code whose reduce reads the event, or an
    operator's ``streamkit skip``, moves it on.
    """

    code = "REDUCE_FAILED"
    default_retryable = True


class SchemaCheckFailed(StreamkitError, RuntimeError):
    """A host set to ``schema_check = "refuse"`` found stored events its code would skip or
    stall at, and did not start (nothing was written)."""

    code = "SCHEMA_CHECK_FAILED"


class InvalidRequest(StreamkitError, ValueError):
    """An argument to a log or engine call was out of range or of the wrong kind."""

    code = "INVALID_REQUEST"


class OffsetConflict(StreamkitError, ValueError):
    """An ``offset`` or ``expect_head`` precondition did not hold; the whole append wrote nothing."""

    code = "OFFSET_CONFLICT"

    @classmethod
    def of_head(cls, path: str, expected: int, actual: int) -> OffsetConflict:
        """The refusal of ``append(..., expect_head=expected)`` on a path whose head is ``actual``."""
        return cls(
            f"the append expected the durable head of {path!r} to be offset {expected}, but it "
            f"is {actual}: something was appended since that read; nothing was appended (read "
            f"from {expected} again, decide again, and retry with expect_head={actual})",
            details={"path": path, "expected_head": expected, "actual_head": actual},
        )


class IdempotencyConflict(StreamkitError, ValueError):
    """An idempotency key already names an event with a different body."""

    code = "IDEMPOTENCY_CONFLICT"


class LogOpenError(StreamkitError, OSError):
    """A file could not be opened as a streamkit log; it was not modified."""

    code = "LOG_OPEN_REFUSED"


class LogClosed(StreamkitError, RuntimeError):
    """The log (or stream) was used after it was closed."""

    code = "LOG_CLOSED"


class StorageError(StreamkitError, OSError):
    """The storage (SQLite, PostgreSQL) failed underneath an operation; the message says
    what became of the write (rolled back, or unknown when a connection broke at commit)."""

    code = "STORAGE_ERROR"


class StorageBusy(StorageError):
    """Another connection held the database lock for longer than the busy timeout."""

    code = "STORAGE_BUSY"
    default_retryable = True


class StorageUnavailable(StorageError):
    """The database server could not be reached (or the connection broke); retry later."""

    code = "STORAGE_UNAVAILABLE"
    default_retryable = True


class LogTampered(StorageError):
    """The log's storage was changed behind its back: its write-ahead log deleted or replaced
    under a live process, or an archive segment that no longer matches its record (size, hash,
    manifest). Refused: nothing written, nothing read from it."""

    code = "LOG_TAMPERED"


class InvalidContract(StreamkitError, ValueError):
    """A processor contract broke a rule of ``define_processor_contract``."""

    code = "INVALID_CONTRACT"


class UndeclaredEmit(StreamkitError, ValueError):
    """A processor tried to append an event type its contract does not emit."""

    code = "UNDECLARED_EMIT"


class CheckpointTooLarge(StreamkitError, ValueError):
    """A reduced state serializes past the checkpoint ceiling; nothing was written."""

    code = "REDUCE_CHECKPOINT_TOO_LARGE"


class StateNotSerializable(StreamkitError, TypeError):
    """A reduced state cannot be written as JSON, so it cannot be checkpointed; nothing was written."""

    code = "REDUCE_STATE_NOT_SERIALIZABLE"


class HistoryTruncated(StreamkitError, LookupError):
    """A read began below the first offset a path still holds: its history before was taken.

    ``details``: ``path``, ``requested`` (the offset the read began after),
    ``start`` (the first offset still held) and ``archive`` (the segment files
    of what was archived; empty when it was deleted). Never a silent jump.
    """

    code = "HISTORY_TRUNCATED"


class RetainFromInvalid(StreamkitError, ValueError):
    """A processor's ``retain_from(state)`` raised or gave no offset; the checkpoint was not written."""

    code = "RETAIN_FROM_INVALID"


class LeaseLost(StreamkitError, RuntimeError):
    """This host no longer holds the lease of a processor; its write was fenced off."""

    code = "LEASE_LOST"


class CutoverRaced(StreamkitError, RuntimeError):
    """A version's cutover found the serving version moved on since it took its target.

    Nothing was written; the new version reduces the events since and tries again.
    """

    code = "CUTOVER_RACED"
    default_retryable = True


class VersionRetired(StreamkitError, RuntimeError):
    """A cutover replaced this processor version; its code leaves the processor to the new one."""

    code = "VERSION_RETIRED"


class ProcessorTimeout(StreamkitError, TimeoutError):
    """A wait on a processor ran past its timeout."""

    code = "PROCESSOR_TIMEOUT"
    default_retryable = True


class InvalidConfig(StreamkitError, ValueError):
    """A host configuration (file or flags) was refused at start; nothing was started."""

    code = "INVALID_CONFIG"


class ControlSocketInUse(StreamkitError, OSError):
    """A control socket could not be created: a live server or a non-socket file holds the path."""

    code = "CONTROL_SOCKET_IN_USE"


class SlowConsumer(StreamkitError, RuntimeError):
    """A stream's reader fell further behind than its byte budget; resume from ``resume_after``."""

    code = "SLOW_CONSUMER"
    default_retryable = True


class UntrustedSocket(StreamkitError, PermissionError):
    """A control socket (or its directory) that another user could own or replace; unused."""

    code = "CONTROL_SOCKET_UNTRUSTED"


class ControlUnavailable(StreamkitError, ConnectionError):
    """No answer over a control socket: nothing listens, the connection dropped, or it timed out."""

    code = "CONTROL_UNAVAILABLE"
    default_retryable = True


class MalformedRequest(StreamkitError, ValueError):
    """A control request line was not a JSON object with a string ``op``; nothing was done."""

    code = "MALFORMED_REQUEST"


class UnknownOperation(StreamkitError, ValueError):
    """A control request named an operation the server does not offer; nothing was done."""

    code = "UNKNOWN_OP"


class RequestTooLarge(StreamkitError, ValueError):
    """A control request line was longer than the server accepts; it was discarded unread."""

    code = "REQUEST_TOO_LARGE"


class Unauthorized(StreamkitError, PermissionError):
    """An HTTP request without the host's bearer token (or with another); nothing was done."""

    code = "UNAUTHORIZED"


class RequestTimeout(StreamkitError, TimeoutError):
    """An HTTP request's head or body did not arrive in time; nothing was done."""

    code = "REQUEST_TIMEOUT"
    default_retryable = True


class HostBusy(StreamkitError, ConnectionRefusedError):
    """The host serves as many HTTP requests at once as it takes; nothing was done."""

    code = "HOST_BUSY"
    default_retryable = True


class Forbidden(StreamkitError, PermissionError):
    """An HTTP request a browser made from a page this host does not trust; nothing was done."""

    code = "FORBIDDEN"


class NotFound(StreamkitError, LookupError):
    """An HTTP request named a processor, task or route this host does not have; nothing was done."""

    code = "NOT_FOUND"


class InternalError(StreamkitError, RuntimeError):
    """A server-side handler failed unexpectedly; the server logged it and kept serving."""

    code = "INTERNAL"


class RemoteError(StreamkitError):
    """An error reply whose code this client does not know; ``.code`` is the remote code."""

    code = "REMOTE_ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str,
        details: Mapping[str, Any] | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, details=details, retryable=retryable)
        # The class-level code is only a fallback; each instance carries the code
        # the server sent, so callers can match on it like on any StreamkitError.
        vars(self)["code"] = code
