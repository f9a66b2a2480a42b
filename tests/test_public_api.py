"""The public surface: the pinned export list, error codes, and the layering between modules."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import streamkit.testing

import streamkit
import streamkit.errors

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "LIVE_STATE_CHANGED",
    "BatchInfo",
    "CheckpointStorage",
    "CheckpointTooLarge",
    "Clock",
    "ControlSocketInUse",
    "ControlUnavailable",
    "Delivery",
    "EventDefinition",
    "EventInput",
    "IdempotencyConflict",
    "InternalError",
    "InvalidConfig",
    "InvalidContract",
    "InvalidEvent",
    "InvalidRequest",
    "LeaseLost",
    "LiveSnapshot",
    "LiveState",
    "Log",
    "LogClosed",
    "LogOpenError",
    "LogTampered",
    "MalformedRequest",
    "OffsetConflict",
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
    "StateNotSerializable",
    "StorageBusy",
    "StorageError",
    "Stream",
    "StreamEvent",
    "StreamProcessor",
    "StreamkitError",
    "UndeclaredEmit",
    "UnknownOperation",
    "UntrustedSocket",
    "__version__",
    "apply_delta",
    "consumes_event",
    "define_processor_contract",
    "diff_json",
    "open_log",
}

# Which streamkit modules each lower layer may import; nothing below the engine
# may reach up into the engine, the host or the CLI.
LOWER_LAYERS = {
    "errors": set(),
    "events": {"errors"},
    "protocols": {"events", "errors"},
    "log": {"errors", "events", "protocols"},
    "checkpoint": {"errors"},
    "live_state": {"errors"},
    "lease": {"errors"},
}
UPPER = {"engine", "host", "cli", "processor", "contract"}


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


def _streamkit_imports(module: str) -> set[str]:
    path = ROOT / "streamkit" / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name.startswith("streamkit."):
                found.add(name.split(".")[1])
    return found


@pytest.mark.parametrize("module", sorted(LOWER_LAYERS))
def test_lower_layers_never_import_upward(module: str) -> None:
    """events, log, checkpoint and the other lower modules never import engine, host or cli."""
    seen = set()
    todo = [module]
    # Follow the module's private helpers too (log -> _log_writer -> ...).
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for imported in _streamkit_imports(current):
            assert imported not in UPPER, f"{current} imports streamkit.{imported}"
            if imported.startswith("_"):
                todo.append(imported)
            else:
                assert imported in LOWER_LAYERS[module] | {module}, (
                    f"{current} (layer {module}) imports streamkit.{imported}"
                )


def test_first_party_processors_use_only_the_public_api() -> None:
    """Modules in processors/ import streamkit only through its public packages."""
    allowed = {"streamkit", "streamkit.testing", "streamkit.processors"}
    for path in sorted((ROOT / "processors").glob("**/*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("streamkit"):
                    assert node.module in allowed or node.module.startswith(
                        "streamkit.processors."
                    ), f"{path.name} imports {node.module}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("streamkit"):
                        assert alias.name in allowed, f"{path.name} imports {alias.name}"
