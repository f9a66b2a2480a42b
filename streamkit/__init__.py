"""streamkit: event-sourced stream processing over a durable log (a SQLite file, or PostgreSQL).

The public names live here; everything else is an implementation detail.
"""

from streamkit._json_diff import diff_json
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit._version import __version__
from streamkit.backends import open_log
from streamkit.backends.sqlite.checkpoints import ReduceCheckpointTable
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.config import HostConfig
from streamkit.contract import EventDefinition, ProcessorContract, define_processor_contract
from streamkit.control import ControlClient
from streamkit.engine import BatchInfo, EngineStatistics, ProcessorEngine, ProcessorSnapshot
from streamkit.errors import (
    CheckpointTooLarge,
    ControlSocketInUse,
    ControlUnavailable,
    CutoverRaced,
    Forbidden,
    HostBusy,
    IdempotencyConflict,
    InternalError,
    InvalidConfig,
    InvalidContract,
    InvalidEvent,
    InvalidRequest,
    LeaseLost,
    LogClosed,
    LogOpenError,
    LogTampered,
    MalformedRequest,
    NotFound,
    OffsetConflict,
    PayloadMalformed,
    ProcessorTimeout,
    RemoteError,
    RequestTimeout,
    RequestTooLarge,
    RetainFromInvalid,
    SchemaAhead,
    SchemaCheckFailed,
    SlowConsumer,
    StateNotSerializable,
    StorageBusy,
    StorageError,
    StorageUnavailable,
    StreamkitError,
    Unauthorized,
    UndeclaredEmit,
    UnknownOperation,
    UntrustedSocket,
    VersionRetired,
)
from streamkit.events import (
    Appended,
    EventInput,
    ReadPage,
    ScannedRange,
    StreamEvent,
    replayed_offsets,
)
from streamkit.host import ProcessorHost
from streamkit.live_state import LIVE_STATE_CHANGED, LiveSnapshot, LiveState, apply_delta
from streamkit.log import Log, Stream
from streamkit.processor import Delivery, ProcessEventArgs, StreamProcessor, consumes_event
from streamkit.protocols import CheckpointStorage, Clock, ProcessorStream
from streamkit.shared_map import SharedMap
from streamkit.upcasting import DROP, Upcaster

__all__ = [
    "DROP",
    "LIVE_STATE_CHANGED",
    "SPEED_TRICKS",
    "Appended",
    "BatchInfo",
    "CheckpointStorage",
    "CheckpointTooLarge",
    "Clock",
    "ControlClient",
    "ControlSocketInUse",
    "ControlUnavailable",
    "CutoverRaced",
    "Delivery",
    "EngineStatistics",
    "EventDefinition",
    "EventInput",
    "Forbidden",
    "HostBusy",
    "HostConfig",
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
    "NotFound",
    "OffsetConflict",
    "PayloadMalformed",
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
    "RequestTimeout",
    "RequestTooLarge",
    "RetainFromInvalid",
    "ScannedRange",
    "SchemaAhead",
    "SchemaCheckFailed",
    "SharedMap",
    "SlowConsumer",
    "StateNotSerializable",
    "StorageBusy",
    "StorageError",
    "StorageUnavailable",
    "Stream",
    "StreamEvent",
    "StreamProcessor",
    "StreamkitError",
    "Unauthorized",
    "UndeclaredEmit",
    "UnknownOperation",
    "UntrustedSocket",
    "Upcaster",
    "VersionRetired",
    "__version__",
    "apply_delta",
    "consumes_event",
    "define_processor_contract",
    "diff_json",
    "open_log",
    "replayed_offsets",
]
