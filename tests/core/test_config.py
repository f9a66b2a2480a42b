"""The host configuration: the TOML file, the flags, and every refusal at start."""

from __future__ import annotations

import argparse
import io
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamkit.config import (
    MAX_SOCKET_PATH_BYTES,
    HostConfig,
    LeaseSettings,
    ProcessorSpec,
    RetrySettings,
    add_host_arguments,
    config_from_args,
    config_from_namespace,
    load_config,
    resolve_processors,
)
from streamkit.errors import InvalidConfig

PROCESSORS = """
from pydantic import BaseModel

from streamkit.contract import define_processor_contract
from streamkit.processor import StreamProcessor


class State(BaseModel):
    count: int = 0


class BoardState(BaseModel):
    cards: int = 0


class Board(StreamProcessor[State]):
    contract = define_processor_contract(slug="board", version="1", state_schema=State)

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit


class BoardTwin(StreamProcessor[State]):
    contract = define_processor_contract(slug="board", version="2", state_schema=State)


class Tasks(StreamProcessor[State]):
    contract = define_processor_contract(slug="tasks", version="1", state_schema=State)


class Exploding(StreamProcessor[State]):
    contract = define_processor_contract(slug="exploding", version="1", state_schema=State)

    def __init__(self) -> None:
        raise RuntimeError("cannot reach the mail server")


class NoContract(StreamProcessor[State]):
    pass


class Plain:
    contract = Board.contract


class Outer:
    class Inner(StreamProcessor[State]):
        contract = define_processor_contract(slug="inner", version="1", state_schema=State)


def make_board() -> Board:
    return Board()


board_instance = Board()
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write modules under unique names on sys.path; forget them afterwards."""
    root = tmp_path / "mods"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    written: list[str] = []

    def write(source: str) -> str:
        name = f"skcfg_{uuid.uuid4().hex[:12]}"
        (root / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def procs(module: Callable[[str], str]) -> str:
    return module(PROCESSORS)


def write_toml(directory: Path, text: str) -> Path:
    path = directory / "streamkit.toml"
    path.write_text(textwrap.dedent(text))
    return path


def refusal(call: Callable[[], object]) -> InvalidConfig:
    with pytest.raises(InvalidConfig) as caught:
        call()
    error = caught.value
    assert error.code == "INVALID_CONFIG"
    assert isinstance(error, ValueError)
    assert "nothing was started" in str(error)
    return error


def keys(error: InvalidConfig) -> list[str | None]:
    return [problem["key"] for problem in error.details["errors"]]


# ---------------------------------------------------------------------------
# The file


def test_full_file_round_trips(tmp_path: Path, procs: str) -> None:
    """Every documented key loads, relative paths resolve beside the file, and a dump re-validates."""
    path = write_toml(
        tmp_path,
        f"""
        db = "data/app.db"
        socket = "app.sock"
        log_format = "json"
        synchronous = "NORMAL"
        shutdown_grace = 4.5

        [lease]
        ttl = 6
        heartbeat = 1.5

        [retry]
        initial_delay = 0.25
        max_delay = 8
        stall_after = 3

        [[processors]]
        class = "{procs}:Board"
        path = "/orders"
        name = "orders-board"
        [processors.kwargs]
        limit = 50

        [[processors]]
        class = "{procs}:Tasks"
        """,
    )
    config = load_config(path)
    assert config.db == tmp_path / "data" / "app.db"
    assert config.socket_path == tmp_path / "app.sock"
    assert config.log_format == "json"
    assert config.synchronous == "NORMAL"
    assert config.shutdown_grace == 4.5
    assert config.lease == LeaseSettings(ttl=6, heartbeat=1.5)
    assert config.retry == RetrySettings(initial_delay=0.25, max_delay=8, stall_after=3)
    assert config.processors == (
        ProcessorSpec(
            class_path=f"{procs}:Board", path="/orders", name="orders-board", kwargs={"limit": 50}
        ),
        ProcessorSpec(class_path=f"{procs}:Tasks"),
    )
    assert config.processors[0].label == "orders-board"
    assert config.processors[1].label == f"{procs}:Tasks"
    dumped = config.model_dump(by_alias=True)
    assert dumped["processors"][0]["class"] == f"{procs}:Board"
    assert HostConfig.model_validate(dumped) == config


def test_minimal_file_takes_defaults(tmp_path: Path) -> None:
    """A file with only db gets the documented defaults, the socket beside the db included."""
    config = load_config(write_toml(tmp_path, 'db = "app.db"'))
    assert config.db == tmp_path / "app.db"
    assert config.socket is None
    assert config.socket_path == tmp_path / "app.db.sock"
    assert config.processors == ()
    assert config.lease.ttl == 10
    assert config.lease.heartbeat_interval == pytest.approx(10 / 3)
    assert config.shutdown_grace == 10
    assert config.log_format == "auto"
    assert config.synchronous == "FULL"
    assert config.retry == RetrySettings(initial_delay=0.5, max_delay=30, stall_after=10)


def test_config_is_frozen(tmp_path: Path) -> None:
    """A validated config cannot be changed after the checks ran."""
    config = load_config(write_toml(tmp_path, 'db = "app.db"'))
    with pytest.raises(ValueError, match="frozen"):
        config.shutdown_grace = 1  # type: ignore[misc]


def test_unknown_top_level_key_is_refused_with_suggestion(tmp_path: Path) -> None:
    """A misspelt top-level key is named, with the closest known key and the known keys."""
    path = write_toml(tmp_path, 'db = "app.db"\nlog_fromat = "json"\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["log_fromat"]
    message = str(error)
    assert str(path) in message
    assert "unknown key 'log_fromat'" in message
    assert "did you mean 'log_format'?" in message
    assert "shutdown_grace" in message


def test_unknown_key_inside_processor_is_refused(tmp_path: Path) -> None:
    """An unknown key in a [[processors]] entry is named with its index and the entry's keys."""
    path = write_toml(
        tmp_path,
        """
        db = "app.db"
        [[processors]]
        class = "a:B"
        [[processors]]
        class = "a:C"
        pth = "/x"
        """,
    )
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["processors[1].pth"]
    assert "did you mean 'path'?" in str(error)
    assert "class, path, kwargs, name" in str(error)


def test_unknown_key_in_lease_section_is_refused(tmp_path: Path) -> None:
    """An unknown key under [lease] is named as lease.<key>."""
    path = write_toml(tmp_path, 'db = "app.db"\n[lease]\nttl_seconds = 5\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["lease.ttl_seconds"]
    assert "ttl, heartbeat" in str(error)


def test_bad_toml_syntax_names_the_line(tmp_path: Path) -> None:
    """A TOML syntax error is refused with the line it is on."""
    path = write_toml(tmp_path, 'db = "app.db"\n\n[lease\nttl = 5\n')
    error = refusal(lambda: load_config(path))
    assert error.details["line"] == 3
    assert "TOML syntax error at line 3" in str(error)
    assert "fix the TOML syntax at line 3" in str(error)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    """A config path that does not exist is refused, not treated as empty."""
    error = refusal(lambda: load_config(tmp_path / "nope.toml"))
    assert "does not exist" in str(error)


def test_missing_db_is_refused(tmp_path: Path) -> None:
    """A file without db is refused, naming the key."""
    error = refusal(lambda: load_config(write_toml(tmp_path, "shutdown_grace = 1\n")))
    assert keys(error) == ["db"]
    assert "add db = ..." in str(error)


def test_memory_db_is_refused(tmp_path: Path) -> None:
    """An in-memory database cannot be shared by a host, so it is refused."""
    error = refusal(lambda: load_config(write_toml(tmp_path, 'db = ":memory:"\n')))
    assert keys(error) == ["db"]


def test_wrong_value_types_are_named(tmp_path: Path) -> None:
    """Values of the wrong kind are refused per key, every problem listed at once."""
    path = write_toml(
        tmp_path,
        """
        db = "app.db"
        shutdown_grace = "soon"
        log_format = "xml"
        processors = [{ class = "a:B", kwargs = 3 }]
        """,
    )
    error = refusal(lambda: load_config(path))
    assert sorted(keys(error)) == ["log_format", "processors[0].kwargs", "shutdown_grace"]
    assert "'soon'" in str(error)
    assert "'xml'" in str(error)
    assert "(3 problems)" in str(error)


def test_bad_stream_path_is_refused(tmp_path: Path) -> None:
    """A processor path that is not '/' or '/a/b' is refused under its key."""
    path = write_toml(tmp_path, 'db = "app.db"\n[[processors]]\nclass = "a:B"\npath = "orders"\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["processors[0].path"]
    assert "'orders' is not a stream path" in str(error)


def test_class_path_without_colon_is_refused(tmp_path: Path) -> None:
    """A class given as a dotted name without ':' is refused with the expected shape."""
    path = write_toml(tmp_path, 'db = "app.db"\n[[processors]]\nclass = "pkg.mod.Board"\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["processors[0].class"]
    assert "package.module:ClassName" in str(error)


@pytest.mark.parametrize(("heartbeat", "ttl"), [(10, 10), (12, 10), (3, 2)])
def test_heartbeat_not_below_ttl_is_refused(tmp_path: Path, heartbeat: float, ttl: float) -> None:
    """A heartbeat at or above the ttl is refused on lease.heartbeat."""
    path = write_toml(tmp_path, f'db = "app.db"\n[lease]\nttl = {ttl}\nheartbeat = {heartbeat}\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["lease.heartbeat"]
    assert "not shorter than the lease ttl" in str(error)


def test_duplicate_processor_names_are_refused(tmp_path: Path) -> None:
    """Two processors with one name are refused on the second one's name."""
    path = write_toml(
        tmp_path,
        """
        db = "app.db"
        [[processors]]
        class = "a:B"
        name = "x"
        [[processors]]
        class = "a:C"
        name = "x"
        """,
    )
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["processors[1].name"]
    assert "already used by processors[0]" in str(error)


def test_too_long_default_socket_path_is_refused(tmp_path: Path) -> None:
    """A db path so long that '<db>.sock' cannot be bound is refused, suggesting socket = ..."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    error = refusal(lambda: config_from_args(db=str(deep / "app.db")))
    assert keys(error) == ["socket"]
    message = str(error)
    assert f"over the {MAX_SOCKET_PATH_BYTES} bytes" in message
    assert 'socket = "/tmp/myapp.sock"' in message
    assert "--socket" in message


def test_long_db_with_short_socket_is_accepted(tmp_path: Path) -> None:
    """A long db path is fine when the socket is set to a short path."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    config = config_from_args(db=str(deep / "app.db"), socket="/tmp/sk.sock")
    assert config.socket_path == Path("/tmp/sk.sock")


def test_too_long_explicit_socket_is_refused(tmp_path: Path) -> None:
    """An explicit socket path past the limit is refused on the socket key (from its flag)."""
    error = refusal(lambda: config_from_args(db=str(tmp_path / "a.db"), socket="/tmp/" + "s" * 120))
    assert keys(error) == ["socket (--socket)"]


def test_retry_backoff_doubles_to_the_cap() -> None:
    """delay() doubles from initial_delay and stops at max_delay."""
    retry = RetrySettings(initial_delay=0.5, max_delay=3.0)
    assert [retry.delay(n) for n in range(0, 6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert retry.delay(10_000) == 3.0


def test_retry_max_below_initial_is_refused(tmp_path: Path) -> None:
    """A max_delay below initial_delay is refused on retry.max_delay."""
    path = write_toml(tmp_path, 'db = "app.db"\n[retry]\ninitial_delay = 5\nmax_delay = 1\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["retry.max_delay"]


def test_auto_log_format_follows_the_terminal(tmp_path: Path) -> None:
    """log_format auto means console on a TTY and JSON otherwise; explicit values win."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    auto = config_from_args(db=str(tmp_path / "a.db"))
    assert auto.resolved_log_format(io.StringIO()) == "json"
    assert auto.resolved_log_format(Tty()) == "console"
    forced = config_from_args(db=str(tmp_path / "a.db"), log_format="json")
    assert forced.resolved_log_format(Tty()) == "json"


# ---------------------------------------------------------------------------
# Flags


def test_flags_override_file_key_by_key(tmp_path: Path, procs: str) -> None:
    """Each flag replaces its key; the rest of the file stands; flag paths resolve against cwd."""
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    path = write_toml(
        conf_dir,
        f"""
        db = "file.db"
        log_format = "console"
        shutdown_grace = 1
        [lease]
        ttl = 30
        heartbeat = 2
        [[processors]]
        class = "{procs}:Board"
        """,
    )
    config = config_from_args(
        config=path, db="flag.db", lease_ttl="12", grace="7", log_format="json", cwd=work
    )
    assert config.db == work / "flag.db"
    assert config.lease == LeaseSettings(ttl=12, heartbeat=2)
    assert config.shutdown_grace == 7
    assert config.log_format == "json"
    assert [spec.class_path for spec in config.processors] == [f"{procs}:Board"]

    untouched = config_from_args(config=path, cwd=work)
    assert untouched.db == conf_dir / "file.db"
    assert untouched.lease.ttl == 30


def test_processor_flags_replace_the_file_list(tmp_path: Path, procs: str) -> None:
    """Any --processor replaces the file's list; @path and JSON kwargs are parsed."""
    path = write_toml(tmp_path, f'db = "app.db"\n[[processors]]\nclass = "{procs}:Tasks"\n')
    config = config_from_args(
        config=path,
        processors=[f"{procs}:Board", f'{procs}:Board@/orders{{"limit": 5}}'],
        cwd=tmp_path,
    )
    assert config.processors == (
        ProcessorSpec(class_path=f"{procs}:Board"),
        ProcessorSpec(class_path=f"{procs}:Board", path="/orders", kwargs={"limit": 5}),
    )


def test_processor_flag_with_bad_json_kwargs_is_refused(tmp_path: Path) -> None:
    """Malformed kwargs JSON in --processor is refused naming the flag."""
    error = refusal(
        lambda: config_from_args(db=str(tmp_path / "a.db"), processors=["a:B@/x{limit: 5}"])
    )
    assert keys(error) == ["processors[0].kwargs (--processor #1)"]
    assert "not valid JSON" in str(error)


def test_processor_flag_with_bad_path_names_the_flag(tmp_path: Path) -> None:
    """A bad path in the second --processor is refused under that flag's key."""
    error = refusal(
        lambda: config_from_args(db=str(tmp_path / "a.db"), processors=["a:B", "a:C@orders"])
    )
    assert keys(error) == ["processors[1].path (--processor #2)"]


def test_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    """A flag value of the wrong kind is refused under its key and flag."""
    error = refusal(lambda: config_from_args(db=str(tmp_path / "a.db"), lease_ttl="soon"))
    assert keys(error) == ["lease.ttl (--lease-ttl)"]


def test_flags_without_db_are_refused() -> None:
    """Neither a file nor --db naming a database is refused with both ways out."""
    error = refusal(lambda: config_from_args(processors=["a:B"]))
    assert keys(error) == ["db"]
    assert "--db" in str(error)
    assert "streamkit.toml" in str(error)


def test_parser_and_namespace_find_streamkit_toml(tmp_path: Path) -> None:
    """add_host_arguments + config_from_namespace pick up ./streamkit.toml unless --config is given."""
    write_toml(tmp_path, 'db = "found.db"\nshutdown_grace = 3\n')
    parser = argparse.ArgumentParser()
    add_host_arguments(parser)
    found = config_from_namespace(parser.parse_args(["--grace", "2"]), cwd=tmp_path)
    assert found.db == tmp_path / "found.db"
    assert found.shutdown_grace == 2

    other = tmp_path / "other.toml"
    other.write_text('db = "other.db"\n')
    chosen = config_from_namespace(parser.parse_args(["--config", str(other)]), cwd=tmp_path)
    assert chosen.db == tmp_path / "other.db"

    empty = tmp_path / "empty"
    empty.mkdir()
    flags = parser.parse_args(["--db", "x.db", "--processor", "a:B", "--processor", "a:C@/c"])
    only_flags = config_from_namespace(flags, cwd=empty)
    assert only_flags.db == empty / "x.db"
    assert [(s.class_path, s.path) for s in only_flags.processors] == [("a:B", "/"), ("a:C", "/c")]


# ---------------------------------------------------------------------------
# Processors


def test_resolve_builds_each_processor_with_its_kwargs(tmp_path: Path, procs: str) -> None:
    """resolve_processors imports, builds with kwargs and pairs each spec with its instance."""
    config = config_from_args(
        db=str(tmp_path / "a.db"),
        processors=[f'{procs}:Board{{"limit": 3}}', f"{procs}:Tasks@/t", f"{procs}:Outer.Inner"],
    )
    resolved = resolve_processors(config)
    assert [r.spec for r in resolved] == list(config.processors)
    assert [r.slug for r in resolved] == ["board", "tasks", "inner"]
    spec, board = resolved[0]
    assert spec.kwargs == {"limit": 3}
    assert board.limit == 3
    assert type(board).__name__ == "Board"


def test_same_slug_on_two_paths_is_refused_as_the_host_refuses_it(
    tmp_path: Path, procs: str
) -> None:
    """Checkpoints are per slug: one slug on two paths is refused by the config as by the host."""
    config = config_from_args(
        db=str(tmp_path / "a.db"), processors=[f"{procs}:Board@/a", f"{procs}:BoardTwin@/b"]
    )
    error = refusal(lambda: resolve_processors(config))
    assert keys(error) == ["processors[1]"]
    assert "slug 'board' is configured twice, on '/a' and '/b'" in str(error)
    assert "may run on one path only" in str(error)


def test_same_slug_on_one_path_is_refused(tmp_path: Path, procs: str) -> None:
    """Two processors with one slug on one path are refused, naming both entries."""
    config = config_from_args(
        db=str(tmp_path / "a.db"),
        processors=[f"{procs}:Board@/a", f"{procs}:Tasks@/a", f"{procs}:BoardTwin@/a"],
    )
    error = refusal(lambda: resolve_processors(config))
    assert keys(error) == ["processors[2]"]
    assert "slug 'board' is configured twice, on '/a'; checkpoints are kept per slug" in str(error)
    assert "(processors[0]" in str(error)


@pytest.mark.parametrize(
    ("target", "field", "expected"),
    [
        ("no_such_module_here:Board", "class", "module 'no_such_module_here' could not be found"),
        ("{procs}:Bord", "class", "did you mean {procs}:Board?"),
        # A processor is suggested, not the state model whose name is closer:
        ("{procs}:BoardStat", "class", "did you mean {procs}:Board?"),
        ("{procs}:Outer.Innr", "class", "has no attribute 'Innr'"),
        ("{procs}:make_board", "class", "is a function, not a class"),
        ("{procs}:board_instance", "class", "is Board, not a class"),
        ("{procs}:Plain", "class", "is not a StreamProcessor"),
        ("{procs}:NoContract", "class", "has no contract with a slug"),
        ('{procs}:Board{"limt": 3}', "kwargs", "unexpected keyword argument 'limt'"),
        ("{procs}:Exploding", "kwargs", "cannot reach the mail server"),
    ],
)
def test_each_unusable_processor_is_refused(
    tmp_path: Path, procs: str, target: str, field: str, expected: str
) -> None:
    """Each way a processor cannot be used is refused under its key with the problem named."""
    config = config_from_args(
        db=str(tmp_path / "a.db"),
        processors=[f"{procs}:Tasks", target.replace("{procs}", procs)],
    )
    error = refusal(lambda: resolve_processors(config))
    assert keys(error) == [f"processors[1].{field}"]
    assert expected.replace("{procs}", procs) in str(error)
    assert "fix:" in str(error)


def test_bad_kwargs_message_shows_the_signature(tmp_path: Path, procs: str) -> None:
    """A kwargs mismatch names the kwargs given and the constructor's signature."""
    config = config_from_args(db=str(tmp_path / "a.db"), processors=[f'{procs}:Board{{"size": 1}}'])
    error = refusal(lambda: resolve_processors(config))
    assert "kwargs (size)" in str(error)
    assert "Board(limit: int = 10)" in str(error)


def test_module_failing_on_import_is_refused(tmp_path: Path, module: Callable[[str], str]) -> None:
    """A module that raises while importing is refused with the exception named."""
    broken = module("raise ImportError('needs a configured cluster')\n")
    missing_dep = module("import no_such_dependency_xyz\n")
    config = config_from_args(
        db=str(tmp_path / "a.db"), processors=[f"{broken}:A", f"{missing_dep}:B"]
    )
    error = refusal(lambda: resolve_processors(config))
    assert keys(error) == ["processors[0].class", "processors[1].class"]
    assert "ImportError: needs a configured cluster" in str(error)
    assert "no_such_dependency_xyz" in str(error)
    assert "install the missing dependency" in str(error)


def test_every_processor_problem_is_listed_at_once(tmp_path: Path, procs: str) -> None:
    """Several bad processors are all reported in one refusal."""
    config = config_from_args(
        db=str(tmp_path / "a.db"),
        processors=[f"{procs}:Plain", f"{procs}:Board", "nope_mod_zz:X", f"{procs}:BoardTwin"],
    )
    error = refusal(lambda: resolve_processors(config))
    assert keys(error) == ["processors[0].class", "processors[2].class", "processors[3]"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('db = "a.db"\n[lease]\nttl = true\n', "lease.ttl"),
        ('db = "a.db"\nshutdown_grace = false\n', "shutdown_grace"),
        ('db = "a.db"\n[limits]\nsubscriber_bytes = true\n', "limits.subscriber_bytes"),
    ],
)
def test_a_boolean_is_not_a_number(tmp_path: Path, text: str, key: str) -> None:
    """`ttl = true` is refused naming the key, instead of being read as 1 second."""
    path = tmp_path / "streamkit.toml"
    path.write_text(text)
    error = refusal(lambda: load_config(path))
    assert keys(error) == [key]
    assert "is a boolean, not a number" in str(error)


@pytest.mark.parametrize("share", ["0", "-0.5", "1.5", "nan", "true"])
def test_a_processor_share_outside_zero_to_one_is_refused(tmp_path: Path, share: str) -> None:
    """``processor_share`` is a fraction of the time: above 0, at most 1."""
    error = refusal(
        lambda: load_config(write_toml(tmp_path, f'db = "app.db"\nprocessor_share = {share}\n'))
    )
    assert keys(error) == ["processor_share"]


def test_processor_share_defaults_to_a_fifth_and_one_turns_pacing_off(tmp_path: Path) -> None:
    assert load_config(write_toml(tmp_path, 'db = "app.db"\n')).processor_share == 0.2
    path = write_toml(tmp_path, 'db = "app.db"\nprocessor_share = 1\n')
    assert load_config(path).processor_share == 1.0


def test_a_shutdown_grace_past_an_hour_is_refused(tmp_path: Path) -> None:
    """1e308 s is no grace a stop can keep: refused with the key named, like NaN and -1."""
    for bad in ("1e308", "3601", "-1", "nan"):
        text = f'db = "a.db"\nshutdown_grace = {bad}\n'
        error = refusal(lambda text=text: load_config(write_toml(tmp_path, text)))
        assert keys(error) == ["shutdown_grace"], bad


# ---------------------------------------------------------------------------
# Retention policies


def test_retention_policies_read_durations_and_archive_next_to_the_file(tmp_path: Path) -> None:
    """keep_for as text or seconds; a relative archive directory resolves beside the file."""
    path = write_toml(
        tmp_path,
        """
        db = "app.db"
        retention_interval = 60
        [[retention]]
        path = "/orders"
        keep_for = "90d"
        archive = "archive/orders"
        [[retention]]
        path = "/audit"
        keep_for = 45
        keep_last = 1000
        delete = true
        chunk = 500
        """,
    )
    config = load_config(path)
    orders, audit = config.retention
    assert (orders.path, orders.keep_for, orders.keep_last) == ("/orders", 90 * 86400.0, None)
    assert (orders.mode, orders.archive, orders.chunk) == (
        "archive",
        tmp_path / "archive" / "orders",
        2_000,
    )
    assert (audit.keep_for, audit.keep_last, audit.mode, audit.chunk) == (45.0, 1000, "delete", 500)
    assert config.retention_interval == 60.0


@pytest.mark.parametrize(
    ("table", "key", "said"),
    [
        ('path = "/"\ndelete = true', "retention[0].keep_for", "neither how long nor how much"),
        ('path = "/"\nkeep_last = 5', "retention[0].archive", "must either archive or delete"),
        (
            'path = "/"\nkeep_last = 5\ndelete = true\narchive = "a"',
            "retention[0].archive",
            "must either archive or delete",
        ),
        (
            'path = "/"\nkeep_for = "3 fortnights"\ndelete = true',
            "retention[0].keep_for",
            "not a duration",
        ),
        (
            'path = "/"\nkeep_last = -1\ndelete = true',
            "retention[0].keep_last",
            "greater than or equal to 0",
        ),
        ('path = "orders"\nkeep_last = 1\ndelete = true', "retention[0].path", "not a stream path"),
        ('path = "/"\nkeep_last = 1\ndelete = true\nevery = 5', "retention[0].every", "every"),
    ],
)
def test_a_retention_policy_that_says_too_little_or_too_much_is_refused(
    tmp_path: Path, table: str, key: str, said: str
) -> None:
    path = write_toml(tmp_path, f'db = "app.db"\n[[retention]]\n{table}\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == [key]
    assert said in str(error)


def test_two_policies_of_one_path_are_refused(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'db = "app.db"\n[[retention]]\npath = "/"\nkeep_last = 1\ndelete = true\n'
        '[[retention]]\npath = "/"\nkeep_last = 2\ndelete = true\n',
    )
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["retention[1].path"]
    assert "already has a policy in retention[0]" in str(error)


def test_a_processor_may_declare_where_it_starts_and_nothing_else(tmp_path: Path) -> None:
    """start = "beginning" | "start" | "head" in a [[processors]] table; anything else refused."""
    path = write_toml(tmp_path, 'db = "app.db"\n[[processors]]\nclass = "a:B"\nstart = "head"\n')
    assert load_config(path).processors[0].start == "head"
    path = write_toml(tmp_path, 'db = "app.db"\n[[processors]]\nclass = "a:B"\nstart = "now"\n')
    error = refusal(lambda: load_config(path))
    assert keys(error) == ["processors[0].start"]
    assert "'beginning', 'start' or 'head'" in str(error)
