"""The host's configuration: one typed, validated settings object, from a file and flags.

``streamkit host`` reads a ``streamkit.toml`` (stdlib :mod:`tomllib`) and/or
command-line flags into one frozen :class:`HostConfig`. Everything is checked
before anything starts: a refused configuration raises
:class:`~streamkit.errors.InvalidConfig` naming each offending key (as
``processors[1].class``), what is wrong with it, and the fix; no database is
opened, no socket is created, no processor is built.

The file (every key but ``db`` is optional; relative ``db`` and ``socket``
paths are resolved against the directory holding the file)::

    db = "app.db"                  # the log: a SQLite file or a postgresql:// URL
    socket = "/tmp/app.sock"       # control socket; default: "<db>.sock" beside the db
    shared_socket_dir = false      # allow a socket directory other users may write (see host.md)
    log_format = "auto"            # "auto" (JSON unless stderr is a TTY), "json", "console"
    synchronous = "FULL"           # SQLite PRAGMA synchronous: "FULL" or "NORMAL"
    live_state = "watched"         # publish live-state deltas "watched" (only while a client watches) or "always"
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
    start = "beginning"            # where it starts the first time: "beginning", "start", "head"
    [processors.kwargs]            # keyword arguments for the class (default none)
    limit = 50

    retention_interval = 600       # seconds between two runs of the retention policies

    [[retention]]                  # run by the host holding the retention lease (docs/retention.md)
    path = "/orders"
    keep_for = "90d"               # events younger than this stay ("45s", "30m", "12h", "2w", or seconds)
    keep_last = 1000000            # so do the newest offsets (a policy sets one or both)
    archive = "archive/orders"     # segment files here (relative: next to this file), or delete = true
    chunk = 2000                   # events per transaction

    [[schedules]]                  # read by `streamkit schedules sync` at deploy, not by the host
    name = "nightly-report"
    cron = "0 3 * * *"
    tz = "Europe/Berlin"
    task = "reports.nightly"

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

from streamkit.config._processors import resolve_processors, shared_slug
from streamkit.config._settings import (
    DEFAULT_CONFIG_NAME,
    HostConfig,
    HttpSettings,
    LeaseSettings,
    LimitSettings,
    ProcessorSpec,
    ResolvedProcessor,
    RetentionPolicy,
    RetrySettings,
    seconds_of,
)
from streamkit.config._sources import (
    add_host_arguments,
    config_from_args,
    config_from_namespace,
    find_config,
    load_config,
)
from streamkit.control import MAX_SOCKET_PATH_BYTES

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "MAX_SOCKET_PATH_BYTES",
    "HostConfig",
    "HttpSettings",
    "LeaseSettings",
    "LimitSettings",
    "ProcessorSpec",
    "ResolvedProcessor",
    "RetentionPolicy",
    "RetrySettings",
    "add_host_arguments",
    "config_from_args",
    "config_from_namespace",
    "find_config",
    "load_config",
    "resolve_processors",
    "seconds_of",
    "shared_slug",
]
