"""Where a host's settings come from: streamkit.toml and the command line, merged and checked.

The flags override the file key by key; any ``--processor`` replaces the
file's whole list. Relative paths in the file resolve against its directory,
relative flags against the current one. Every pydantic refusal becomes a line
``key: problem; fix: ...`` of one :class:`~streamkit.errors.InvalidConfig`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from streamkit._targets import sqlite_target
from streamkit.config._settings import (
    _OWN_ERROR,
    DEFAULT_CONFIG_NAME,
    HostConfig,
)
from streamkit.errors import InvalidConfig, LogOpenError, did_you_mean

__all__ = [
    "add_host_arguments",
    "config_from_args",
    "config_from_namespace",
    "find_config",
    "invalid",
    "load_config",
]


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
    http: str | None = None,
    http_token_file: str | os.PathLike[str] | None = None,
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
    if http is not None or http_token_file is not None:
        table = data.get("http")
        table = {"listen": table} if isinstance(table, str) else dict(table or {})
        if http is not None:
            table["listen"] = http
            origins["http.listen"] = "--http"
        if http_token_file is not None:
            table["token_file"] = str(_path_from(base, http_token_file))
            origins["http.token_file"] = "--http-token-file"
        data["http"] = table
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
        raise invalid(
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
    parser.add_argument(
        "--db", metavar="FILE", help="the log: a SQLite file or a postgresql:// URL"
    )
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
        "--http",
        metavar="HOST:PORT",
        help="serve HTTP there too (the web extra), e.g. 127.0.0.1:8700",
    )
    parser.add_argument(
        "--http-token-file",
        metavar="FILE",
        help="a file holding the bearer token HTTP requests must carry (required off loopback)",
    )
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
        http=args.http,
        http_token_file=args.http_token_file,
        cwd=base,
    )


def _path_from(base: Path, value: str | os.PathLike[str]) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


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
        raise invalid(
            source,
            [(None, "the config file does not exist", "create it, or point --config at it")],
        ) from None
    except OSError as exc:
        raise invalid(
            source,
            [(None, f"the config file could not be read ({exc.strerror})", "check the path")],
        ) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise invalid(
            source,
            [(None, f"the file is not UTF-8 text (byte {exc.start})", "save it as UTF-8")],
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        where = f" at line {line.group(1)}" if line else ""
        raise invalid(
            source,
            [(None, f"TOML syntax error{where}: {exc}", f"fix the TOML syntax{where}")],
            line=int(line.group(1)) if line else None,
        ) from exc
    # Relative paths in a file mean "next to this file", wherever the host starts.
    for key in ("db", "socket"):
        value = data.get(key)
        if isinstance(value, str) and value and value != ":memory:":
            data[key] = _resolve(file.absolute().parent, value)
    policies = data.get("retention")
    if isinstance(policies, list):
        for policy in policies:
            archive = policy.get("archive") if isinstance(policy, dict) else None
            if isinstance(archive, str) and archive:
                policy["archive"] = str(_path_from(file.absolute().parent, archive))
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
            raise invalid(
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
            raise invalid(
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
        raise invalid(source, problems) from None


def _describe(error: Mapping[str, Any], origins: Mapping[str, str]) -> tuple[str | None, str, str]:
    loc = tuple(error["loc"])
    kind = str(error["type"])
    ctx = error.get("ctx") or {}
    # A model validator names its key within its own table: prefixed by where the table is.
    key = _key((*loc, ctx["key"])) if "key" in ctx else _key(loc)
    problem = str(error["msg"])
    if kind == _OWN_ERROR:
        fix = str(ctx["fix"])
    elif kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        problem = f"unknown key {str(loc[-1])!r}"
        fix = f"{did_you_mean(str(loc[-1]), allowed)}remove it or use one of: {', '.join(allowed)}"
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


def invalid(
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
