"""The public surface: the pinned export list and the error codes."""

from __future__ import annotations

import inspect

import streamkit.testing

import streamkit
import streamkit.errors

EXPECTED = {
    "SPEED_TRICKS",
    "DROP",
    "Upcaster",
    "LIVE_STATE_CHANGED",
    "Appended",
    "BatchInfo",
    "ControlClient",
    "CheckpointStorage",
    "CheckpointTooLarge",
    "Clock",
    "ControlSocketInUse",
    "ControlUnavailable",
    "Delivery",
    "EngineStatistics",
    "EventDefinition",
    "EventInput",
    "HostConfig",
    "IdempotencyConflict",
    "InternalError",
    "InvalidConfig",
    "InvalidContract",
    "InvalidEvent",
    "InvalidRequest",
    "CutoverRaced",
    "LeaseLost",
    "LiveSnapshot",
    "LiveState",
    "Log",
    "LogClosed",
    "LogOpenError",
    "LogTampered",
    "MalformedRequest",
    "NotFound",
    "OffsetConflict",
    "PayloadMalformed",
    "ReduceFailed",
    "ProcessEventArgs",
    "ProcessorContract",
    "ProcessorEngine",
    "ProcessorHost",
    "ProcessorSnapshot",
    "ProcessorStream",
    "ProcessorTimeout",
    "ReadPage",
    "ReduceCheckpoint",
    "ReduceCheckpointTable",
    "RemoteError",
    "RequestTooLarge",
    "SlowConsumer",
    "ScannedRange",
    "SchemaAhead",
    "SchemaCheckFailed",
    "SharedMap",
    "HistoryTruncated",
    "RetainFromInvalid",
    "StateNotSerializable",
    "StorageBusy",
    "StorageUnavailable",
    "StorageError",
    "Stream",
    "StreamEvent",
    "StreamProcessor",
    "StreamkitError",
    "Unauthorized",
    "Forbidden",
    "HostBusy",
    "RequestTimeout",
    "UndeclaredEmit",
    "UnknownOperation",
    "UntrustedSocket",
    "VersionRetired",
    "__version__",
    "apply_delta",
    "consumes_event",
    "define_processor_contract",
    "diff_json",
    "open_log",
    "replayed_offsets",
}


def test_all_is_pinned() -> None:
    """streamkit.__all__ is exactly the reviewed public list, and every name resolves."""
    assert set(streamkit.__all__) == EXPECTED
    assert len(streamkit.__all__) == len(EXPECTED)
    for name in streamkit.__all__:
        assert hasattr(streamkit, name), name


def test_testing_exports() -> None:
    """streamkit.testing exports the four helpers SPEC section 6 names."""
    for name in ("reduce_processor", "memory_stream", "memory_storage", "settle"):
        assert name in streamkit.testing.__all__
        assert callable(getattr(streamkit.testing, name))


def test_live_state_type_name() -> None:
    """The live-state delta type is the fixed string clients subscribe to."""
    assert streamkit.LIVE_STATE_CHANGED == "streamkit.live-state-changed"


def _error_classes() -> list[type[streamkit.StreamkitError]]:
    return [
        obj
        for _, obj in inspect.getmembers(streamkit.errors, inspect.isclass)
        if issubclass(obj, streamkit.StreamkitError)
    ]


def test_error_codes_are_stable_and_unique() -> None:
    """Every error class has its own SCREAMING_SNAKE code and also inherits a builtin."""
    codes: dict[str, str] = {}
    for cls in _error_classes():
        if cls is streamkit.StreamkitError or cls.__name__ == "RemoteError":
            continue
        assert cls.code.isupper(), cls
        assert " " not in cls.code, cls
        assert cls.code not in codes, f"{cls.__name__} reuses {codes.get(cls.code)}'s code"
        codes[cls.code] = cls.__name__
        builtins = [b for b in cls.__mro__ if b.__module__ == "builtins" and b is not object]
        assert any(b is not Exception and b is not BaseException for b in builtins), cls
    for required in (
        "INVALID_EVENT",
        "OFFSET_CONFLICT",
        "IDEMPOTENCY_CONFLICT",
        "REDUCE_CHECKPOINT_TOO_LARGE",
        "UNDECLARED_EMIT",
        "INVALID_CONTRACT",
        "LEASE_LOST",
        "PROCESSOR_TIMEOUT",
    ):
        assert required in codes
