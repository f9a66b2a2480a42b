"""The settings models of a host: every key of streamkit.toml, typed and checked.

Each section is a frozen pydantic model that refuses unknown keys and
booleans for numbers; a refusal carries its key, the problem and the fix,
which :mod:`._sources` turns into one :class:`~streamkit.errors.InvalidConfig`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple, TextIO

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from streamkit._targets import default_socket, is_postgres_target, postgres_target, sqlite_target
from streamkit.contract import CutoverMode, StartFrom
from streamkit.control import MAX_SOCKET_PATH_BYTES
from streamkit.errors import InvalidRequest, LogOpenError
from streamkit.events import validate_path
from streamkit.failure_policy import OnMalformed, OnReduceError
from streamkit.history import RETENTION_CHUNK, RETENTION_SHARE
from streamkit.records import RetentionAsk

# The public names of this module are listed once, in streamkit.config's __all__.

DEFAULT_CONFIG_NAME = "streamkit.toml"

_CLASS_PATH_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")

# The PydanticCustomError type our own validators raise: its context carries the
# fix, so one formatter turns every refusal into "key: problem; fix: ...".
_OWN_ERROR = "streamkit_config"


def _refusal(problem: str, fix: str, *, key: str | None = None) -> PydanticCustomError:
    # Braces in a user's value would be read as template fields by pydantic.
    safe = problem.replace("{", "(").replace("}", ")")
    context = {"fix": fix} if key is None else {"fix": fix, "key": key}
    return PydanticCustomError(_OWN_ERROR, safe, context)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic would read `ttl = true` as 1: a boolean is never a number here.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation is not bool:
            raise _refusal(
                f"{str(value).lower()} is a boolean, not a number",
                "write a number (e.g. ttl = 10)",
            )
        return value


class LeaseSettings(_Section):
    """How long a processor lease lasts and how often the host renews it (seconds)."""

    ttl: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    heartbeat: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds between renewals; ``None`` means ``ttl / 3`` (see :attr:`heartbeat_interval`)."""

    @field_validator("heartbeat")
    @classmethod
    def _heartbeat_below_ttl(cls, value: float | None, info: ValidationInfo) -> float | None:
        ttl = info.data.get("ttl")
        if value is not None and isinstance(ttl, float) and value >= ttl:
            raise _refusal(
                f"heartbeat {value:g} s is not shorter than the lease ttl {ttl:g} s, so the lease "
                "would expire between renewals",
                f"set heartbeat below ttl (ttl / 3 = {ttl / 3:g} is the default) or raise ttl",
            )
        return value

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between renewals: ``heartbeat`` if set, else a third of ``ttl``."""
        return self.ttl / 3 if self.heartbeat is None else self.heartbeat


class RetrySettings(_Section):
    """Backoff for a failing batch: doubling from ``initial_delay`` up to ``max_delay``."""

    initial_delay: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    max_delay: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    stall_after: int = Field(default=10, ge=1)
    """Consecutive failures of one processor after which status reports it stalled."""

    @field_validator("max_delay")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("initial_delay")
        if isinstance(initial, float) and value < initial:
            raise _refusal(
                f"max_delay {value:g} s is below initial_delay {initial:g} s",
                "set max_delay to at least initial_delay",
            )
        return value

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (1 -> ``initial_delay``)."""
        if failures < 1:
            return 0.0
        # Cap the exponent: past ~64 doublings every sane max_delay is reached anyway.
        return min(self.max_delay, self.initial_delay * 2.0 ** min(failures - 1, 64))


class ProcessorSpec(_Section):
    """One processor to run: its class as ``module:Class``, its stream path and kwargs.

    ``on_malformed`` (``"skip"`` or ``"stall"``), when set, overrides the
    contract's choice for a stored payload that does not validate, and
    ``on_reduce_error`` its choice for an event the reduce raises on;
    ``cutover`` (``"auto"`` or ``"manual"``) the contract's choice of when a
    new version built in the shadow takes over; ``start`` (``"beginning"``,
    ``"start"`` or ``"head"``) the contract's word on where the processor
    starts on its path the first time it runs there.
    """

    # "class" is a keyword in Python, so the field is class_path and the file's
    # key is its alias; by-name validation keeps ProcessorSpec(class_path=...)
    # working from code (and tells pydantic's mypy plugin the alias is not dynamic).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)

    class_path: str = Field(
        validation_alias=AliasChoices("class", "class_path"), serialization_alias="class"
    )
    path: str = "/"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    name: str | None = Field(default=None, min_length=1)
    on_malformed: OnMalformed | None = None
    on_reduce_error: OnReduceError | None = None
    cutover: CutoverMode | None = None
    start: StartFrom | None = None

    @field_validator("class_path")
    @classmethod
    def _class_path_shape(cls, value: str) -> str:
        if not _CLASS_PATH_RE.match(value):
            raise _refusal(
                f"{value!r} is not of the form 'module:Class'",
                'write it as "package.module:ClassName" (a colon between the importable '
                "module and the class name)",
            )
        return value

    @field_validator("path")
    @classmethod
    def _stream_path(cls, value: str) -> str:
        return _stream_path_of(value)

    @property
    def label(self) -> str:
        """How logs and errors name this processor: its ``name``, else its class path."""
        return self.name or self.class_path


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds_of(value: object) -> float:
    """A duration as streamkit.toml writes it (``"90d"``, ``"12h"``, or seconds) in seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise _refusal(
            f"{value!r} is not a duration",
            'write a number of seconds or a number with a unit: "45s", "30m", "12h", "90d", "2w"',
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class RetentionPolicy(_Section):
    """One ``[[retention]]`` table: how much of a path's history to keep, and where the rest goes.

    Events go only below the path's horizon (what every processor and hold
    still needs, docs/retention.md), and of those only the ones older than
    ``keep_for`` and outside the newest ``keep_last`` offsets: a policy
    names at least one. ``archive`` (a directory for the segment files,
    relative to the file) or ``delete = true`` says where they go.
    """

    path: str
    keep_for: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Seconds (or ``"90d"``-style text): events younger than this stay."""
    keep_last: int | None = Field(default=None, ge=0)
    """The newest offsets that stay."""
    archive: Path | None = None
    delete: bool = False
    chunk: int = Field(default=RETENTION_CHUNK, ge=1, le=1_000_000)
    """Events per transaction (appends go on between chunks)."""
    share: float = Field(default=RETENTION_SHARE, gt=0, le=1, allow_inf_nan=False)
    """The most of the log writer's time the run takes while other writes go on (1: all)."""

    @field_validator("keep_for", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return value if value is None else seconds_of(value)

    @field_validator("path")
    @classmethod
    def _stream_path(cls, value: str) -> str:
        return _stream_path_of(value)

    @model_validator(mode="after")
    def _complete(self) -> RetentionPolicy:
        if self.keep_for is None and self.keep_last is None:
            raise _refusal(
                f"the policy of {self.path!r} says neither how long nor how much to keep",
                'set keep_for = "90d" (by age) and/or keep_last = 1000000 (by count)',
                key="keep_for",
            )
        if (self.archive is None) == (not self.delete):
            raise _refusal(
                f"the policy of {self.path!r} must either archive or delete, and not both",
                'set archive = "archive/orders" (a directory for the segment files) or '
                "delete = true (no archive is kept)",
                key="archive",
            )
        return self

    @property
    def mode(self) -> Literal["archive", "delete"]:
        """Where the events go."""
        return "delete" if self.archive is None else "archive"

    def ask(
        self,
        *,
        through: int | None = None,
        share: float | None = None,
        fence: Callable[[Any], None] | None = None,
    ) -> RetentionAsk:
        """The run this policy asks for (``share``: the policy's own unless given)."""
        return RetentionAsk(
            self.path,
            through=through,
            archive=None if self.archive is None else str(self.archive),
            chunk=self.chunk,
            keep_for=self.keep_for,
            keep_last=self.keep_last,
            fence=fence,
            share=self.share if share is None else share,
        )


def _stream_path_of(value: str) -> str:
    try:
        return validate_path(value)
    except InvalidRequest:
        raise _refusal(
            f"{value!r} is not a stream path",
            "use '/' or '/a/b': segments of letters, digits, '-', '_' and '.', "
            "each not '.' or '..' alone",
        ) from None


class SchemaSettings(_Section):
    """``[schema]``: how a host reads what producers wrote, and how hard it checks at start."""

    sample: int = Field(default=200, ge=0, le=1_000_000)
    """Stored payloads of each (type, version) a processor reads that the start-time check
    pushes through its upcasters and model (0: judge from the summary of stored types only)."""
    unversioned: int | None = Field(default=None, ge=1, le=1_000_000)
    """The payload version an append that names none is read as (lifted by the upcasters):
    set it during a rolling deploy whose old producers send the old shape unnamed. Unset:
    the current version of its type."""


class LimitSettings(_Section):
    """What the host holds for each client at most (bytes)."""

    subscriber_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=1024**3)
    """Unread data one watcher or follower may have queued before the slow-reader policy acts."""


_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class HttpSettings(_Section):
    """The HTTP surface (the ``web`` extra): where it listens, who may call it, when it is unhealthy.

    ``http = "127.0.0.1:8700"`` in streamkit.toml is short for ``[http]``
    with ``listen`` alone. Any address but the loopback needs a token.
    """

    listen: str
    """``HOST:PORT`` (``[::1]:8700`` for IPv6; ``:8700`` is the loopback); port 0 takes a free one."""
    token_file: Path | None = None
    """A file holding the bearer token requests must carry; none: the host makes one at start."""
    open_metrics: bool = False
    """Serve ``/metrics`` without the token (for a scraper that cannot send one)."""
    stuck_after: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """Seconds a processor's cursor may stand still behind a moving head before it is unhealthy."""
    follow_stale_after: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """Seconds without a look for other processes' commits before the host is unhealthy."""
    max_connections: int = Field(default=256, ge=1, le=100_000)
    """Connections served at once; more are answered 503."""
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    """The largest request body (each event is still held to the log's own limit)."""
    head_timeout: float = Field(default=10.0, gt=0, le=300, allow_inf_nan=False)
    """Seconds a request's head may take to arrive (from the connection, or its first byte)."""
    body_timeout: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    """Seconds a request's body may take to arrive once its head has."""
    cors_origins: tuple[str, ...] = ()
    """Origins whose pages may call this host from a browser (none: CORS stays off)."""
    allowed_hosts: tuple[str, ...] = ()
    """Names clients reach this host by besides its address (a proxy's, a DNS name)."""

    @field_validator("allowed_hosts")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", name):
                raise _refusal(
                    f"{name!r} is not a host name",
                    "name each one as a browser would send it in Host, without scheme or port, "
                    'e.g. "ops.example.com"',
                )
        return tuple(name.lower() for name in value)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin == "*" or not re.fullmatch(r"https?://[^/\s]+", origin):
                raise _refusal(
                    f"{origin!r} is not an origin a browser sends",
                    'name each one as scheme://host[:port], e.g. "https://ops.example.com" '
                    "(no wildcard: the token must not be usable from any page)",
                )
        return value

    @field_validator("listen")
    @classmethod
    def _an_address(cls, value: str) -> str:
        split_address(value)
        return value

    @model_validator(mode="after")
    def _token_off_loopback(self) -> HttpSettings:
        host, _ = split_address(self.listen)
        if host not in _LOOPBACK and self.token_file is None:
            raise _refusal(
                f"listening on {host!r} (not the loopback) without a token would let anyone "
                "who reaches it append and skip",
                'set token_file = "http.token" under [http] or pass --http-token-file FILE',
                key="token_file",
            )
        return self

    @property
    def host(self) -> str:
        """The address to bind."""
        return split_address(self.listen)[0]

    @property
    def port(self) -> int:
        """The port to bind (0: any free one)."""
        return split_address(self.listen)[1]


def split_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``[IPV6]:PORT``; refused (as a config error) otherwise."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if sep and not host:
        host = "127.0.0.1"  # ":8700": the loopback, the safe default
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _refusal(
            f"{text!r} is not an address to listen on",
            'write HOST:PORT, e.g. "127.0.0.1:8700" (port 0 takes a free one)',
        )
    return host, int(port)


class HostConfig(_Section):
    """Everything ``streamkit host`` needs, validated; see the module docstring for the file."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)

    db: Path | str
    """A SQLite file, or a PostgreSQL URL (kept as written, password and all)."""
    processors: tuple[ProcessorSpec, ...] = ()
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    shutdown_grace: float = Field(default=10.0, ge=0, le=3600, allow_inf_nan=False)
    log_format: Literal["auto", "json", "console"] = "auto"
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    schema_check: Literal["auto", "warn", "refuse", "off"] = "auto"
    """At start, what stored events these processors would skip or stall at (judged from the
    log's summary of stored types and a sample of each key) do: ``"auto"`` refuses the start
    for a new version whose problems lie in what the serving version already reduced and warns
    of the rest; ``"warn"`` warns of all; ``"refuse"`` refuses on any; ``"off"`` checks none."""
    schema_settings: SchemaSettings = Field(
        default_factory=SchemaSettings,
        validation_alias=AliasChoices("schema", "schema_settings"),
        serialization_alias="schema",
    )
    """``[schema]`` in the file (``schema`` is a name pydantic keeps): the start-time
    check's sample per stored key."""
    on_malformed: OnMalformed | None = None
    """The default for every processor whose contract and ``[[processors]]`` entry are silent
    on a payload that does not validate (unset: ``"stall"``)."""
    on_reduce_error: OnReduceError | None = None
    """The same default for an event a reduce raises on (unset: ``"stall"``)."""
    live_state: Literal["watched", "always"] = "watched"
    """When batches publish live-state deltas: while a client watches (no cost otherwise), or always."""
    processor_share: float = Field(default=0.2, gt=0, le=1, allow_inf_nan=False)
    """While clients append, the most of the time the processors' batches take (1: no pacing)."""
    rebuild_share: float = Field(default=0.25, gt=0, le=1, allow_inf_nan=False)
    """While serving processors work, the most of the time a rebuild in the shadow takes."""
    socket: Path | None = Field(default=None, validate_default=True)
    """The control socket; ``None`` means ``<db>.sock`` (see :attr:`socket_path`)."""
    shared_socket_dir: bool = False
    """Start even though other users may replace files in the socket's directory."""
    http: HttpSettings | None = None
    """The HTTP surface; None serves none (``http = "HOST:PORT"`` is short for its listen)."""
    retention: tuple[RetentionPolicy, ...] = ()
    """``[[retention]]`` policies, run by the host holding the retention lease."""
    retention_interval: float = Field(default=600.0, gt=0, le=7 * 86400, allow_inf_nan=False)
    """Seconds between two runs of the policies."""
    schedules: tuple[dict[str, Any], ...] = ()
    """``[[schedules]]`` tables: what ``streamkit schedules sync`` defines at deploy (the
    schedules processor's plugin reads and checks them; the host itself does not)."""

    @field_validator("http", mode="before")
    @classmethod
    def _http_shorthand(cls, value: object) -> object:
        return {"listen": value} if isinstance(value, str) else value

    @field_validator("db", mode="before")
    @classmethod
    def _db_target(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            if is_postgres_target(value):
                postgres_target(value)  # refused here, by name, rather than at start
                return value
            return Path(sqlite_target(value))
        except LogOpenError as exc:
            raise _refusal(
                exc.message, "give a SQLite file path, sqlite://PATH or postgresql://..."
            ) from exc

    @field_validator("db")
    @classmethod
    def _db_is_a_file(cls, value: Path | str) -> Path | str:
        if isinstance(value, str):
            return value  # a PostgreSQL URL, checked above
        if str(value) == ":memory:" or value.name in ("", ".", ".."):
            raise _refusal(
                f"{str(value)!r} is not a database file a host can share with other processes",
                'name a file, e.g. db = "app.db"',
            )
        return value

    @field_validator("socket")
    @classmethod
    def _socket_fits(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        db = info.data.get("db")
        if value is not None:
            path = value
        elif isinstance(db, Path | str):
            path = _default_socket(db)
        else:
            return value  # the db error is reported on its own
        size = len(os.fsencode(path))
        if size > MAX_SOCKET_PATH_BYTES:
            origin = "the default socket path (the db path + '.sock')" if value is None else "it"
            raise _refusal(
                f"{origin} {str(path)!r} is {size} bytes long, over the {MAX_SOCKET_PATH_BYTES} "
                "bytes a Unix socket path may have",
                'set a shorter path with socket = "/tmp/myapp.sock" in the file or --socket',
            )
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> HostConfig:
        seen: dict[str, int] = {}
        for index, spec in enumerate(self.processors):
            if spec.name is None:
                continue
            if spec.name in seen:
                raise _refusal(
                    f"the name {spec.name!r} is already used by processors[{seen[spec.name]}]",
                    "give each processor its own name, or leave name out",
                    key=f"processors[{index}].name",
                )
            seen[spec.name] = index
        return self

    @model_validator(mode="after")
    def _one_policy_per_path(self) -> HostConfig:
        seen: dict[str, int] = {}
        for index, policy in enumerate(self.retention):
            if policy.path in seen:
                raise _refusal(
                    f"the path {policy.path!r} already has a policy in retention[{seen[policy.path]}]",
                    "give each path one [[retention]] table",
                    key=f"retention[{index}].path",
                )
            seen[policy.path] = index
        return self

    @property
    def socket_path(self) -> Path:
        """The control socket: ``socket`` if set, else ``<db>.sock`` beside the database."""
        return _default_socket(self.db) if self.socket is None else self.socket

    def resolved_log_format(self, stream: TextIO | None = None) -> Literal["json", "console"]:
        """``log_format`` with ``auto`` decided: console on a TTY (stderr by default), else JSON."""
        if self.log_format != "auto":
            return self.log_format
        target = sys.stderr if stream is None else stream
        try:
            return "console" if target.isatty() else "json"
        except (AttributeError, ValueError):  # a closed or fake stream is not a terminal
            return "json"


def _default_socket(db: Path | str) -> Path:
    return Path(default_socket(db))


class ResolvedProcessor(NamedTuple):
    """A processor spec with its constructed instance (a ``StreamProcessor``)."""

    spec: ProcessorSpec
    # Typed loosely so this module never imports the processor layer at import
    # time; resolve_processors has proven it is a StreamProcessor instance.
    processor: Any

    @property
    def slug(self) -> str:
        """The processor's contract slug."""
        return str(self.processor.contract.slug)


# ---------------------------------------------------------------------------
# Loading
