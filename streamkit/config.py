"""The host's configuration: one typed, validated settings object, from a file and flags.

``streamkit host`` reads a ``streamkit.toml`` (stdlib :mod:`tomllib`) and/or
command-line flags into one frozen :class:`HostConfig`. Everything is checked
before anything starts: a refused configuration raises
:class:`~streamkit.errors.InvalidConfig` naming each offending key (as
``processors[1].class``), what is wrong with it, and the fix; no database is
opened, no socket is created, no processor is built.

The file (every key but ``db`` is optional; relative ``db`` and ``socket``
paths are resolved against the directory holding the file)::

    db = "app.db"                  # the SQLite log file
    socket = "/tmp/app.sock"       # control socket; default: "<db>.sock" beside the db
    shared_socket_dir = false      # allow a socket directory other users may write (see host.md)
    log_format = "auto"            # "auto" (JSON unless stderr is a TTY), "json", "console"
    synchronous = "FULL"           # SQLite PRAGMA synchronous: "FULL" or "NORMAL"
    shutdown_grace = 10            # seconds to settle background work on SIGTERM/SIGINT

    [lease]
    ttl = 10                       # seconds a lease lasts without a heartbeat
    heartbeat = 3                  # seconds between renewals; default ttl / 3; must be < ttl

    [retry]                        # a failing batch is retried whole, with backoff
    initial_delay = 0.5            # seconds before the first retry
    max_delay = 30                 # the backoff doubles up to this many seconds
    stall_after = 10               # consecutive failures before the processor counts as stalled

    [limits]
    subscriber_bytes = 4194304     # unread data one watcher or follower may queue (4 MiB)

    [[processors]]
    class = "myapp.board:Board"    # "module:Class", a StreamProcessor subclass
    path = "/orders"               # the stream path it runs on (default "/")
    name = "orders-board"          # optional label for logs and status
    [processors.kwargs]            # keyword arguments for the class (default none)
    limit = 50

The flags (:func:`add_host_arguments`) override the file key by key:
``--config FILE``, ``--db FILE``, ``--socket FILE``, ``--lease-ttl SECONDS``,
``--grace SECONDS``, ``--log-format FORMAT`` and, repeated,
``--processor 'module:Class[@/path][{"kw": ...}]'``. Any ``--processor`` flag
replaces the file's whole ``[[processors]]`` list, so what runs is exactly what
the command line names. Relative paths given as flags resolve against the
current directory.

:func:`resolve_processors` is the second half of the check: it imports each
class, proves it is a :class:`~streamkit.processor.StreamProcessor`, builds it
with its kwargs and refuses two processors with one slug on one path.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import json
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TextIO

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from streamkit._targets import sqlite_target
from streamkit.control._socket import MAX_SOCKET_PATH_BYTES
from streamkit.errors import InvalidConfig, InvalidRequest, LogOpenError
from streamkit.events import validate_path
from streamkit.processor import StreamProcessor

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "MAX_SOCKET_PATH_BYTES",
    "HostConfig",
    "LeaseSettings",
    "LimitSettings",
    "ProcessorSpec",
    "ResolvedProcessor",
    "RetrySettings",
    "add_host_arguments",
    "config_from_args",
    "config_from_namespace",
    "find_config",
    "load_config",
    "resolve_processors",
    "shared_slug",
]

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
    """One processor to run: its class as ``module:Class``, its stream path and kwargs."""

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
        try:
            return validate_path(value)
        except InvalidRequest:
            raise _refusal(
                f"{value!r} is not a stream path",
                "use '/' or '/a/b': segments of letters, digits, '-', '_' and '.', "
                "each not '.' or '..' alone",
            ) from None

    @property
    def label(self) -> str:
        """How logs and errors name this processor: its ``name``, else its class path."""
        return self.name or self.class_path


class LimitSettings(_Section):
    """What the host holds for each client at most (bytes)."""

    subscriber_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=1024**3)
    """Unread data one watcher or follower may have queued before the slow-reader policy acts."""


class HostConfig(_Section):
    """Everything ``streamkit host`` needs, validated; see the module docstring for the file."""

    db: Path
    processors: tuple[ProcessorSpec, ...] = ()
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    shutdown_grace: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    log_format: Literal["auto", "json", "console"] = "auto"
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    socket: Path | None = Field(default=None, validate_default=True)
    """The control socket; ``None`` means ``<db>.sock`` (see :attr:`socket_path`)."""
    shared_socket_dir: bool = False
    """Start even though other users may replace files in the socket's directory."""

    @field_validator("db", mode="before")
    @classmethod
    def _db_target(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return sqlite_target(value)
        except LogOpenError as exc:
            raise _refusal(exc.message, "give a SQLite file path or sqlite://PATH") from exc

    @field_validator("db")
    @classmethod
    def _db_is_a_file(cls, value: Path) -> Path:
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
        elif isinstance(db, Path):
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


def _default_socket(db: Path) -> Path:
    return db.with_name(db.name + ".sock")


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


def find_config(directory: Path | None = None) -> Path | None:
    """``streamkit.toml`` in ``directory`` (default: the current one), if there is one."""
    candidate = (Path.cwd() if directory is None else directory) / DEFAULT_CONFIG_NAME
    return candidate if candidate.is_file() else None


def load_config(path: str | os.PathLike[str]) -> HostConfig:
    """Read and validate a ``streamkit.toml``; raise :class:`InvalidConfig` if it is refused."""
    file = Path(path)
    return _validate(_read_toml(file), source=str(file), origins={})


def config_from_args(
    *,
    config: str | os.PathLike[str] | None = None,
    db: str | os.PathLike[str] | None = None,
    processors: Sequence[str] = (),
    lease_ttl: str | float | None = None,
    grace: str | float | None = None,
    log_format: str | None = None,
    socket: str | os.PathLike[str] | None = None,
    shared_socket_dir: bool | None = None,
    cwd: Path | None = None,
) -> HostConfig:
    """The file at ``config`` (if any) with each given flag overriding its key.

    ``processors`` are ``--processor`` values (``module:Class[@/path][{json kwargs}]``);
    any of them replace the file's list. Relative flag paths resolve against
    ``cwd`` (default: the current directory). Raises :class:`InvalidConfig`.
    """
    base = Path.cwd() if cwd is None else cwd
    data: dict[str, Any] = {} if config is None else _read_toml(base / Path(config))
    origins: dict[str, str] = {}
    if db is not None:
        data["db"] = _resolve(base, db)
        origins["db"] = "--db"
    if socket is not None:
        data["socket"] = _resolve(base, socket)
        origins["socket"] = "--socket"
    if shared_socket_dir:
        data["shared_socket_dir"] = True
        origins["shared_socket_dir"] = "--shared-socket-dir"
    if lease_ttl is not None:
        lease = data.get("lease")
        data["lease"] = {**(lease if isinstance(lease, dict) else {}), "ttl": lease_ttl}
        origins["lease.ttl"] = "--lease-ttl"
    if grace is not None:
        data["shutdown_grace"] = grace
        origins["shutdown_grace"] = "--grace"
    if log_format is not None:
        data["log_format"] = log_format
        origins["log_format"] = "--log-format"
    if processors:
        data["processors"] = [_processor_flag(index, text) for index, text in enumerate(processors)]
        for index in range(len(processors)):
            origins[f"processors[{index}]"] = f"--processor #{index + 1}"
    source = "command-line flags" if config is None else f"{config} and command-line flags"
    if "db" not in data:
        raise _invalid(
            source,
            [
                (
                    "db",
                    "no database file was given",
                    'set db = "app.db" in streamkit.toml or pass --db FILE',
                )
            ],
        )
    return _validate(data, source=source, origins=origins)


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the host's configuration flags to ``parser`` (see :func:`config_from_namespace`)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"a {DEFAULT_CONFIG_NAME} (default: ./{DEFAULT_CONFIG_NAME} if it exists)",
    )
    parser.add_argument("--db", metavar="FILE", help="the SQLite log file")
    parser.add_argument(
        "--processor",
        action="append",
        default=[],
        # No brackets in the metavar: argparse's usage wrapping chokes on them.
        metavar="MODULE:CLASS",
        help="a processor to run, as module:Class, optionally @/path and JSON kwargs "
        '(repeatable; replaces the file\'s list), e.g. myapp.board:Board@/orders{"limit": 5}',
    )
    parser.add_argument("--lease-ttl", metavar="SECONDS", help="lease lifetime (default 10)")
    parser.add_argument(
        "--grace", metavar="SECONDS", help="shutdown grace for background work (default 10)"
    )
    parser.add_argument(
        "--log-format", metavar="FORMAT", help="auto, json or console (default auto)"
    )
    parser.add_argument("--socket", metavar="FILE", help="control socket (default <db>.sock)")
    parser.add_argument(
        "--shared-socket-dir",
        action="store_true",
        default=None,
        help="start even if other users may replace files in the socket's directory",
    )


def config_from_namespace(args: argparse.Namespace, *, cwd: Path | None = None) -> HostConfig:
    """:func:`config_from_args` over flags parsed by :func:`add_host_arguments`."""
    base = Path.cwd() if cwd is None else cwd
    config = args.config if args.config is not None else find_config(base)
    return config_from_args(
        config=config,
        db=args.db,
        processors=args.processor,
        lease_ttl=args.lease_ttl,
        grace=args.grace,
        log_format=args.log_format,
        socket=args.socket,
        shared_socket_dir=args.shared_socket_dir,
        cwd=base,
    )


def _resolve(base: Path, value: str | os.PathLike[str]) -> str:
    try:
        value = sqlite_target(value)
    except LogOpenError:
        return str(value)  # another backend's target: the db validator refuses it by name
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def _read_toml(file: Path) -> dict[str, Any]:
    source = str(file)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise _invalid(
            source,
            [(None, "the config file does not exist", "create it, or point --config at it")],
        ) from None
    except OSError as exc:
        raise _invalid(
            source,
            [(None, f"the config file could not be read ({exc.strerror})", "check the path")],
        ) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _invalid(
            source,
            [(None, f"the file is not UTF-8 text (byte {exc.start})", "save it as UTF-8")],
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        where = f" at line {line.group(1)}" if line else ""
        raise _invalid(
            source,
            [(None, f"TOML syntax error{where}: {exc}", f"fix the TOML syntax{where}")],
            line=int(line.group(1)) if line else None,
        ) from exc
    # Relative paths in a file mean "next to this file", wherever the host starts.
    for key in ("db", "socket"):
        value = data.get(key)
        if isinstance(value, str) and value and value != ":memory:":
            data[key] = _resolve(file.absolute().parent, value)
    return data


def _processor_flag(index: int, text: str) -> dict[str, Any]:
    # The JSON part starts at the first "{": neither module paths nor stream
    # paths may contain one, so the split is unambiguous.
    head, brace, tail = text.partition("{")
    class_path, at, path = head.strip().partition("@")
    spec: dict[str, Any] = {"class": class_path}
    if at:
        spec["path"] = path
    if brace:
        try:
            kwargs = json.loads(brace + tail)
        except json.JSONDecodeError as exc:
            raise _invalid(
                "command-line flags",
                [
                    (
                        f"processors[{index}].kwargs (--processor #{index + 1})",
                        f"the keyword arguments are not valid JSON ({exc.msg} at column "
                        f"{len(head) + exc.pos + 1})",
                        'write them as a JSON object after the class, e.g. mod:Cls{"limit": 5}',
                    )
                ],
            ) from exc
        if not isinstance(kwargs, dict):
            raise _invalid(
                "command-line flags",
                [
                    (
                        f"processors[{index}].kwargs (--processor #{index + 1})",
                        "the keyword arguments are not a JSON object",
                        'write them as a JSON object, e.g. mod:Cls{"limit": 5}',
                    )
                ],
            )
        spec["kwargs"] = kwargs
    return spec


# ---------------------------------------------------------------------------
# Errors


def _validate(data: dict[str, Any], *, source: str, origins: Mapping[str, str]) -> HostConfig:
    try:
        return HostConfig.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error, origins) for error in exc.errors()]
        raise _invalid(source, problems) from None


def _describe(error: Mapping[str, Any], origins: Mapping[str, str]) -> tuple[str | None, str, str]:
    loc = tuple(error["loc"])
    kind = str(error["type"])
    ctx = error.get("ctx") or {}
    key = str(ctx["key"]) if "key" in ctx else _key(loc)
    problem = str(error["msg"])
    if kind == _OWN_ERROR:
        fix = str(ctx["fix"])
    elif kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        problem = f"unknown key {str(loc[-1])!r}"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        fix = f"{hint}remove it or use one of: {', '.join(allowed)}"
    elif kind == "missing":
        problem = "this required key is missing"
        fix = f"add {loc[-1]} = ..." if loc else "add it"
    elif kind == "literal_error":
        problem = f"{problem} (got {error.get('input')!r})"
        fix = "use one of the values listed"
    else:
        if kind not in ("model_type", "dict_type"):
            problem = f"{problem} (got {_short(error.get('input'))})"
        fix = next(
            (fix for prefix, fix in _TYPE_FIXES if kind.startswith(prefix)),
            "change the value to the kind described",
        )
    for prefix, flag in origins.items():
        if key == prefix or key.startswith((prefix + ".", prefix + "[")):
            key = f"{key} ({flag})"
            break
    return key, problem, fix


_TYPE_FIXES = (
    ("float_", "write a number, e.g. 10 or 2.5"),
    ("int_", "write a whole number, e.g. 10"),
    ("string_", 'write a quoted string, e.g. "text"'),
    ("bool_", "write true or false"),
    ("dict_", "write a table (a [section] or { key = value })"),
    ("model_", "write a table (a [section] or { key = value })"),
    ("list_", "write an array, e.g. [ ... ]"),
    ("tuple_", "write an array, e.g. [[processors]] entries"),
    ("greater_than", "choose a value inside the allowed range"),
    ("less_than", "choose a value inside the allowed range"),
    ("finite_number", "write a finite number"),
    ("path_", "write a file path as a quoted string"),
)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(loc: Sequence[int | str]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _allowed_keys(loc: Sequence[int | str]) -> list[str]:
    model: type[BaseModel] | None = HostConfig
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.serialization_alias)),
            None,
        )
        model = None if field is None else _model_in(field.annotation)
    if model is None:
        return []
    return [field.serialization_alias or name for name, field in model.model_fields.items()]


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _invalid(
    source: str, problems: Sequence[tuple[str | None, str, str]], *, line: int | None = None
) -> InvalidConfig:
    lines = [
        f"{key}: {problem}; fix: {fix}" if key else f"{problem}; fix: {fix}"
        for key, problem, fix in problems
    ]
    if len(lines) == 1:
        message = f"invalid host configuration in {source}: {lines[0]}; nothing was started"
    else:
        listed = "\n".join(f"  - {text}" for text in lines)
        message = (
            f"invalid host configuration in {source} ({len(lines)} problems); nothing was "
            f"started:\n{listed}"
        )
    details: dict[str, Any] = {
        "source": source,
        "key": problems[0][0],
        "errors": [{"key": k, "problem": p, "fix": f} for k, p, f in problems],
    }
    if line is not None:
        details["line"] = line
    return InvalidConfig(message, details=details)


# ---------------------------------------------------------------------------
# Processors


def resolve_processors(config: HostConfig) -> list[ResolvedProcessor]:
    """Import, check and build every processor of ``config``, in order.

    Each class must import, be a class, subclass
    :class:`~streamkit.processor.StreamProcessor` and construct from its
    kwargs; no two processors may share one slug, on one path or on two (see
    :func:`shared_slug`). Every problem found is listed
    in one :class:`InvalidConfig`; nothing is started either way, though the
    modules named have been imported and the processors that could be built
    were built (constructors must not start work).
    """
    base = StreamProcessor
    problems: list[tuple[str | None, str, str]] = []
    resolved: list[ResolvedProcessor] = []
    claimed: dict[str, int] = {}
    for index, spec in enumerate(config.processors):
        key = f"processors[{index}]"
        try:
            cls = _import_class(spec.class_path, base)
            instance = _construct(cls, spec)
            slug = _slug_of(instance, spec)
        except _Refused as refused:
            problems.append((f"{key}.{refused.field}", refused.problem, refused.fix))
            continue
        first = claimed.get(slug)
        if first is not None:
            earlier = config.processors[first]
            problems.append(
                (
                    key,
                    shared_slug(slug, earlier.path, spec.path)
                    + f" (processors[{first}], {earlier.label}, has it)",
                    "give one of them another slug (its contract's slug), or remove one",
                )
            )
            continue
        claimed[slug] = index
        resolved.append(ResolvedProcessor(spec, instance))
    if problems:
        raise _invalid("the processor list", problems)
    return resolved


def shared_slug(slug: str, first_path: str, path: str) -> str:
    """The one rule of slugs in one host, as the refusal states it.

    A processor's slug keys its checkpoint and its lease, and checkpoints are
    kept per slug, not per path: two processors with one slug, on one path or
    on two, would write the same checkpoint row. So a slug runs once per host,
    on one path only.
    """
    where = f"on {first_path!r}" if first_path == path else f"on {first_path!r} and {path!r}"
    return (
        f"processor slug {slug!r} is configured twice, {where}; checkpoints are kept per slug, "
        "so a slug may run on one path only"
    )


class _Refused(Exception):
    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem
        self.fix = fix


def _import_class(class_path: str, base: type) -> type:
    module_name, _, attribute = class_path.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise _Refused(
                "class",
                f"module {module_name!r} could not be found ({exc})",
                "check the spelling, and install the package into this Python environment "
                "or put its directory on PYTHONPATH",
            ) from exc
        raise _Refused(
            "class",
            f"importing module {module_name!r} failed: {exc}",
            "install the missing dependency into this Python environment",
        ) from exc
    except Exception as exc:
        raise _Refused(
            "class",
            f"importing module {module_name!r} raised {type(exc).__name__}: {exc}",
            "fix the error in that module (run `python -c 'import "
            f"{module_name}'` to see the traceback)",
        ) from exc
    walked = module_name
    for part in attribute.split("."):
        if not hasattr(target, part):
            names = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {walked}:{close[0]}? " if close else ""
            raise _Refused(
                "class",
                f"{walked} has no attribute {part!r}",
                f"{hint}name a class defined in {module_name!r}",
            )
        target = getattr(target, part)
        walked = f"{walked}{'.' if ':' in walked else ':'}{part}"
    if not isinstance(target, type):
        kind = "a function" if isinstance(target, types.FunctionType) else type(target).__name__
        raise _Refused(
            "class",
            f"{class_path} is {kind}, not a class",
            "name the StreamProcessor subclass itself, not an instance or a factory",
        )
    if not issubclass(target, base):
        raise _Refused(
            "class",
            f"{class_path} is not a StreamProcessor (its bases are "
            f"{', '.join(b.__qualname__ for b in target.__mro__[1:-1]) or 'object'})",
            "name a subclass of streamkit.processor.StreamProcessor",
        )
    return target


def _construct(cls: type, spec: ProcessorSpec) -> object:
    try:
        return cls(**spec.kwargs)
    except TypeError as exc:
        try:
            signature = f"{cls.__name__}{inspect.signature(cls)}"
        except (TypeError, ValueError):
            signature = f"{cls.__name__}(...)"
        given = ", ".join(sorted(spec.kwargs)) or "none"
        raise _Refused(
            "kwargs",
            f"{spec.class_path} could not be built from kwargs ({given}): {exc}",
            f"pass the keyword arguments {signature} accepts under [processors.kwargs]",
        ) from exc
    except Exception as exc:
        raise _Refused(
            "kwargs",
            f"building {spec.class_path} raised {type(exc).__name__}: {exc}",
            "fix the kwargs (or the constructor) so it builds",
        ) from exc


def _slug_of(instance: object, spec: ProcessorSpec) -> str:
    slug = getattr(getattr(instance, "contract", None), "slug", None)
    if not isinstance(slug, str) or not slug:
        raise _Refused(
            "class",
            f"{spec.class_path} has no contract with a slug",
            "set contract = define_processor_contract(slug=..., ...) on the class",
        )
    return slug
