"""The processor host: runs processors over a log file as a daemon (``streamkit host``).

A :class:`ProcessorHost` opens the log, and for each processor it is given
takes the processor's lease, builds a :class:`~streamkit.engine.ProcessorEngine`
over the real SQLite stream (``fed_by_pushes=True``), catches it up from its
checkpoint, then feeds it every commit of its stream path through a follower
of its own, one bounded queue per processor (the host's own appends arrive at
once, other processes' within milliseconds).

Guarantees:

- One processor runs in one host at a time: a lease per (path, slug), renewed
  by a heartbeat on a thread of its own (a batch that holds the event loop
  past the ttl does not lose it). Taking one over is the rule of
  :mod:`streamkit.host._acquire`: no wall clock, fast or slow, can steal a
  live lease or pin a dead one.
- Every checkpoint write AND every durable append an engine makes is fenced
  by the lease generation inside its own transaction, so a host that lost
  its lease writes nothing (:class:`~streamkit.errors.LeaseLost`). A host that
  learns it lost a lease (from its keeper, a fence, or its own clock: it
  trusts a lease for one ttl after the last renewal began) cancels that
  engine's batch in flight and starts no further effect of it.
- Claims (the engine's "revive me by then") are kept in the log's claims
  table, never as events; the alarm revives due processors, including the
  claims a dead host left behind.
- No crash loop: failing work is retried with capped exponential backoff; a
  processor that keeps failing is reported stalled and can be moved past one
  event with :meth:`ProcessorHost.skip` (a durable ``streamkit.event-skipped``
  event records who and why, with its record in the same transaction; hosts
  obey the records, so a skip event without one is not obeyed, and a skip
  recorded by another process is obeyed at the next heartbeat).
- :meth:`ProcessorHost.stop` finishes the batch in flight, gives background
  work a grace period, releases the leases and closes the database. A kill -9
  loses nothing durable: checkpoints never run ahead of their events, and the
  next start catches up from them.

The control socket (see :mod:`streamkit.control`) lets other processes append
(durable and ephemeral), read, follow, ask for status and snapshots, watch live
state, and skip events: the host's verbs, which HTTP serves too. Each verb is
one method, so the socket's handler (:mod:`._control`) and the HTTP routes
(``streamkit.web``) translate to it and keep no rule of their own: a refusal
raised by a verb is the refusal both send, and writes nothing.

The host is a coordinator of parts, each owning its state: a runner per
processor (:mod:`._runner`), its leases (:mod:`._leasing`), the feeds of
its live-state watchers (:mod:`._watch_feeds`), the alarm, the pacer and the
control server. The host itself keeps its lifecycle and its verbs: the
clients' view of it is one class. It stays whole past 600 lines for that
reason: what is left here is the verbs every client reaches (one method
each, most a few lines over a part) and the start and stop that order the
parts; cutting the verbs away would leave a class whose methods live in
another module, the mixin halves this codebase does not build.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from streamkit._targets import own_socket, served_name, shown_target
from streamkit.backends import host_store, open_log
from streamkit.checkpoint import check_rollback, shown_snapshot
from streamkit.config import HostConfig
from streamkit.control import ControlServer, check_private_directory, check_socket_path
from streamkit.errors import (
    ControlSocketInUse,
    InvalidRequest,
    NotFound,
    SlowConsumer,
    StreamkitError,
    did_you_mean,
)
from streamkit.events import EventInput, ReadPage, StreamEvent
from streamkit.host._alarm import Alarm
from streamkit.host._control import HostControlHandler
from streamkit.host._entries import Entry, host_entries
from streamkit.host._foreground import Foreground
from streamkit.host._history_check import check_new_processors
from streamkit.host._lease_keeper import HeldLease
from streamkit.host._leasing import HostLeases
from streamkit.host._live_watch import Subscription, jsonable, watch_messages
from streamkit.host._pacer import Pacer, PacerStats
from streamkit.host._recorded_skips import obey_recorded_skips
from streamkit.host._runner import ProcessorRunner
from streamkit.host._schema_check import start_check
from streamkit.host._signals import StopSignals, exit_past_strays
from streamkit.host._status import processor_rows, retention_rows
from streamkit.host._versions import compare_versions
from streamkit.host._watch_feeds import WatchFeeds
from streamkit.live_state import LiveSnapshot
from streamkit.log import Log, read_matching, type_matcher
from streamkit.processor import StreamProcessor
from streamkit.protocols import Clock, HostStore

__all__ = ["HostService", "ProcessorHost"]


class HostService(Protocol):
    """Something a host starts after its own parts and closes before them (the HTTP server).

    ``start`` runs near the end of :meth:`ProcessorHost.start` (before the
    control socket answers), on the host's loop; a start that raises fails
    the host's start (everything is torn down again). ``close`` runs first in
    the host's stop; what it raises is logged.
    """

    async def start(self, host: ProcessorHost) -> None:
        """Begin serving ``host``."""
        ...

    async def close(self) -> None:
        """Stop serving; idempotent."""
        ...

    def access(self) -> dict[str, str] | None:
        """How the host's owner calls this service (``{url, token, ...}``), None if not served.

        Handed out by the control socket's ``http`` op, to its owner alone.
        """
        ...


_log = structlog.get_logger("streamkit.host")


class ProcessorHost:
    """Runs processors over one log file; see the module docstring.

    ``processors`` overrides the config's list: each item is a processor (run on
    ``/``) or a ``(path, processor)`` pair. ``serve_control=False`` runs without
    the control socket (embedding the host in another program). ``owner`` names
    this host in leases (default: host name, pid and a random token).

    Use ``async with ProcessorHost(config) as host:`` or ``await host.start()``
    then ``await host.stop()``; :meth:`run` is the daemon's main (signals).
    """

    def __init__(
        self,
        config: HostConfig,
        *,
        processors: Iterable[StreamProcessor[Any] | tuple[str, StreamProcessor[Any]]] | None = None,
        clock: Clock = time.time,
        owner: str | None = None,
        serve_control: bool = True,
        services: Sequence[HostService] = (),
    ) -> None:
        self.config = config
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.served_db = served_name(config.db)
        """The log this host serves, in one spelling (what ``hello`` tells clients)."""
        self._serve_control = serve_control
        self._services = tuple(services)
        self._services_started: list[HostService] = []
        entries = host_entries(config, processors)
        self._entries: list[Entry] = entries
        self.log: Log | None = None
        self.store: HostStore | None = None
        self.runners: list[ProcessorRunner] = []
        self._alarm: Alarm | None = None
        self.pacer: Pacer | None = None
        """The host's clients-first pacer (None before start, or at ``processor_share = 1``)."""
        self.foreground = Foreground(config.rebuild_share)
        """What its rebuilds in the shadow give way to (``rebuild_share``)."""
        self._leases: HostLeases | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watch_feeds = WatchFeeds(self._require_log, config.limits.subscriber_bytes)
        self._control: ControlServer | None = None
        self.socket_path: Path | None = None
        """The control socket this host serves (None until it listens, or without one)."""
        self._started_at: float | None = None
        self._schema_checks: dict[tuple[str, str], dict[str, Any]] = {}
        """Per (path, slug), what the data check at start found (none under schema_check=off)."""
        self._stopping = False
        self._stopped = asyncio.Event()
        self._signals: StopSignals | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> ProcessorHost:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the log, take the leases that are free, catch up, follow, serve the socket."""
        config = self.config
        started = time.perf_counter()
        self._started_at = self.clock()
        if self._serve_control:
            # Before the log is opened: a refused start creates nothing.
            check_private_directory(
                config.socket_path.parent, allow_shared=config.shared_socket_dir
            )
            check_socket_path(config.socket_path)
        log = open_log(
            config.db,
            synchronous=config.synchronous,
            clock=self.clock,
            follower_bytes=config.limits.subscriber_bytes,
            # Producers are refused at the door: an append of a type these processors
            # read must fit their definitions (HTTP, the socket, the CLI through it).
            contracts=[entry.processor.contract for entry in self._entries],
            unversioned=config.schema_settings.unversioned,
        )
        self.log = log
        try:
            store = self.store = host_store(log)
            await store.prepare()
            self._schema_checks = await start_check(
                log,
                store,
                [(e.processor, e.path, e.on_malformed) for e in self._entries],
                config.schema_check,
                config.schema_settings.sample,
            )
            await check_new_processors(
                store,
                [(e.processor.contract.slug, e.path, e.starts_from) for e in self._entries],
                self.clock(),
            )
            skips = await store.load_skips()
            self._alarm = Alarm(self.runners, clock=self.clock)
            pacer = self.pacer = (
                Pacer(config.processor_share, log) if config.processor_share < 1 else None
            )
            for entry in self._entries:
                slug = entry.processor.contract.slug
                self.runners.append(
                    ProcessorRunner(
                        entry.processor,
                        path=entry.path,
                        label=entry.label,
                        on_malformed=entry.on_malformed,
                        on_reduce_error=entry.on_reduce_error,
                        cutover=entry.cutover,
                        start=entry.starts_from,
                        log=log,
                        store=store,
                        retry=config.retry,
                        clock=self.clock,
                        skipped=set(skips.get((entry.path, slug), {})),
                        on_claim=self._alarm.changed,
                        on_lease_gone=self._lease_gone,
                        publish_live=(
                            True
                            if config.live_state == "always"
                            else functools.partial(self._watch_feeds.watching, entry.path, slug)
                        ),
                        pacer=pacer,
                        foreground=self.foreground,
                    )
                )
            loop = asyncio.get_running_loop()
            self._leases = HostLeases(
                config=config,
                log=log,
                store=store,
                owner=self.owner,
                clock=self.clock,
                runners=self.runners,
                changed=self._alarm.changed,
                served_after_cutover=lambda runner: self._watch_feeds.reseed(
                    runner.path, runner.slug
                ),
                stopping=lambda: self._stopping,
            )
            await self._heartbeat_once()
            self._tasks.append(loop.create_task(self._heartbeat()))
            self._tasks.append(loop.create_task(self._alarm.run()))
            # Services first: one that cannot start (a port taken) fails the start
            # before the socket tells clients this host is up.
            for service in self._services:
                await service.start(self)
                self._services_started.append(service)
            if self._serve_control:
                await self._serve_socket(log)
        except BaseException:
            await self._teardown(grace=0.0)
            raise
        _log.info(
            "host.started",
            db=shown_target(config.db),
            socket=None if self.socket_path is None else str(self.socket_path),
            owner=self.owner,
            processors=[f"{r.slug}@{r.path}" for r in self.runners],
            running=[r.slug for r in self.runners if r.engine is not None],
            seconds=round(time.perf_counter() - started, 3),
        )

    async def _serve_socket(self, log: Log) -> None:
        config = self.config
        path = config.socket_path
        self._control = ControlServer(path, HostControlHandler(self))
        try:
            await self._control.start()
        except ControlSocketInUse:
            if config.socket is not None:
                raise  # a socket of its own was asked for: it must be that one
            # Another host serves the default socket: a standby needs no flag, it
            # takes a socket of its own beside it, found through the registry.
            path = Path(own_socket(config.db, self.owner))
            self._control = ControlServer(path, HostControlHandler(self))
            await self._control.start()
            _log.info(
                "host.default_socket_taken", default=str(config.socket_path), socket=str(path)
            )
        self.socket_path = path
        await self._require_store().register(self.owner, str(path), os.getpid(), self.clock())

    def http_access(self) -> list[dict[str, str]]:
        """What each started service tells its owner to call it by (see :meth:`HostService.access`)."""
        return [
            access for service in self._services_started if (access := service.access()) is not None
        ]

    async def stop(self, grace: float | None = None) -> None:
        """Finish in-flight batches, settle background work, release leases, close. Idempotent."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.config.shutdown_grace if grace is None else grace
        _log.info("host.stopping", grace=grace)
        try:
            await self._teardown(grace)
        finally:
            self._stopped.set()
        _log.info("host.stopped")

    async def _teardown(self, grace: float) -> None:
        services, self._services_started = self._services_started, []
        for service in reversed(services):
            try:
                await service.close()
            except Exception as exc:  # a service's failure must not keep the leases held
                _log.warning("host.service_close_failed", service=repr(service), error=repr(exc))
        if self._control is not None:
            await self._control.close()
            self._control = None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._watch_feeds.close()
        await asyncio.gather(*(runner.stop(grace) for runner in self.runners))
        leases = self._leases
        if leases is not None:
            # After the runners (their last batches needed the leases kept), before
            # the releases (a renewal must not race them).
            await leases.stop()
        log = self.log
        if log is None:
            return
        if self.store is not None:
            # Out of the registry before the leases go: the other hosts then place the
            # processors among themselves, not on this host any more.
            try:
                await self.store.deregister(self.owner)
            except StreamkitError as exc:
                _log.warning("host.deregister_failed", error=exc.message)
        if leases is not None:
            await leases.release_all()
        await log.aclose()

    async def run(self) -> None:
        """The daemon's main: start, serve until SIGTERM/SIGINT, then stop (see :mod:`._signals`).

        The first signal stops cleanly (see :meth:`stop`); a signal within
        ``REPEAT_SIGNAL_WINDOW`` seconds of it is the same request; a later
        one exits the process at once (the log keeps every committed write).
        Work that ignores its cancel (a handler that catches
        ``CancelledError``) does not hold the exit: once the stop is done (the
        leases released, the log closed), the process exits with it still
        running, naming it (``host.exit_forced``).
        """
        signals = self._signals = StopSignals(asyncio.get_running_loop())
        try:
            await self.start()
            await signals.wait()
        finally:
            await self.stop()
            signals.remove()
        await exit_past_strays()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (as SIGTERM does)."""
        if self._signals is not None:
            self._signals.request()

    # -- leases --------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = self.config.lease.heartbeat_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat_once()
            except Exception as exc:
                # A task that died here would leave the host beating never again: it
                # would take no lease and hand none off, silently. Log, beat on.
                _log.error("host.heartbeat_failed", error=repr(exc), exc_info=exc)

    async def _heartbeat_once(self) -> None:
        assert self._leases is not None  # built by start()
        await self._leases.beat()
        await obey_recorded_skips(self._require_log(), self._require_store(), self.runners)

    def _lease_gone(self, held: HeldLease) -> None:
        if self._leases is not None:
            self._leases.gone(held)

    # -- watchers ------------------------------------------------------------------------

    def subscribe(self, path: str, key: str) -> Subscription:
        """A mailbox of ``key``'s live-state deltas on ``path`` from now on (see :class:`Subscription`).

        Close it with :meth:`unsubscribe`.
        """
        return self._watch_feeds.subscribe(path, key)

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``."""
        self._watch_feeds.unsubscribe(subscription)

    def watching(self, path: str, key: str) -> bool:
        """Whether a client here watches ``key``'s live state on ``path`` (its batches publish then)."""
        return self._watch_feeds.watching(path, key)

    # -- the verbs clients reach through the socket and HTTP ------------------------------

    def runner(self, slug: str, path: str | None = None) -> ProcessorRunner:
        """The runner of ``slug`` (on ``path`` if given); InvalidRequest if there is none."""
        found = [r for r in self.runners if r.slug == slug and (path is None or r.path == path)]
        if len(found) != 1:
            known = ", ".join(f"{r.slug}@{r.path}" for r in self.runners) or "none"
            why = (
                f"is not run by this host ({did_you_mean(slug, (r.slug for r in self.runners))}"
                f"this host runs: {known})"
                if not found
                else f"runs on several paths; name one (this host runs: {known})"
            )
            raise InvalidRequest(
                f"processor {slug!r} {why}; nothing was done",
                details={"slug": slug, "path": path},
            )
        return found[0]

    async def append(
        self,
        path: str,
        events: Sequence[EventInput | Mapping[str, Any]],
        *,
        expect_head: int | None = None,
    ) -> list[StreamEvent]:
        """Append to a stream of the host's log (ephemerals reach this host's subscribers).

        ``expect_head`` as in :meth:`streamkit.log.Stream.append`.
        """
        return await self._require_log().stream(path).append(*events, expect_head=expect_head)

    async def keys_kept_for(
        self, path: str, events: Sequence[EventInput | Mapping[str, Any]]
    ) -> float | None:
        """How long the keys of an append of ``events`` to ``path`` answer once their
        events are taken: the path's key window in seconds, None for forever.

        Asked before the append, so a window that cannot be read refuses the call
        with nothing written: asked after, it turned a committed append into an
        error answer. Read only when an event has a key, so an unkeyed append
        pays nothing.
        """
        if self.store is None or not any(_keyed(event) for event in events):
            return None
        window = await self.store.retention.key_window(path)
        return None if window is None else window.keep_for

    async def read(
        self,
        path: str,
        after_offset: int = 0,
        limit: int = 500,
        types: Sequence[str] | None = None,
    ) -> ReadPage:
        """Read durable events of a stream of the host's log, of ``types`` only if given.

        With ``types`` (exact types, or prefixes ending in ``*``) the page holds
        the matching events and its proof covers what was looked at (see
        :func:`streamkit.log._types.read_matching`).
        """
        stream = self._require_log().stream(path)
        if types is None:
            return await stream.read(after_offset, limit)
        return await read_matching(stream.read, after_offset, limit, type_matcher(types))

    async def event(self, path: str, offset: int) -> StreamEvent:
        """The durable event at ``offset`` of ``path``; :class:`NotFound` if there is none."""
        page = await self._require_log().stream(path).read(max(0, offset - 1), 1)
        if not page.events or page.events[0].offset != offset:
            raise NotFound(
                f"no durable event at offset {offset} of {path!r} (an ephemeral's offset, or "
                "past the head); nothing was read",
                details={"path": path, "offset": offset},
            )
        return page.events[0]

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path of the log with a durable event, and its head."""
        return await self._require_store().stream_heads()

    async def hosts(self) -> list[dict[str, Any]]:
        """The hosts beating on this log now and the processors each runs (the registry)."""
        live = await self._require_store().live_hosts(self.clock(), self.config.lease.ttl)
        return [
            {"owner": owner, "processors": sorted(processors), "here": owner == self.owner}
            for owner, processors in sorted(live.items())
        ]

    async def follow(self, path: str, after_offset: int = 0) -> AsyncIterator[StreamEvent]:
        """Every event of ``path`` after ``after_offset``, then each commit as it lands.

        A client that reads slower than its byte budget
        (``limits.subscriber_bytes``) loses what the host buffered for it:
        the follow ends with :class:`~streamkit.errors.SlowConsumer`, whose
        ``resume_after`` is the last durable offset yielded (durable events
        are intact; skipped ephemerals are gone).
        """
        follower = self._require_log().stream(path).follow(after_offset)
        sent = after_offset
        try:
            async for events, _ in follower:
                if follower.overflows:
                    raise SlowConsumer(
                        f"the follower of {path!r} fell more than its byte budget behind and "
                        f"the host dropped what it held for it (ephemerals in it are gone); "
                        f"durable events are intact: follow again after offset {sent}",
                        details={"path": path, "resume_after": sent},
                    )
                for event in events:
                    if not event.ephemeral:
                        sent = event.offset
                    yield event
        finally:
            closer = getattr(follower, "aclose", None)
            if closer is not None:
                await closer()

    async def snapshot(self, slug: str, path: str | None = None) -> dict[str, Any]:
        """``{offset, state, version, source}``: live from the engine here, else the checkpoint.

        From the engine it also carries ``rev`` and ``live`` (the live-state
        revision and projection), so a watcher can re-seed from it and apply
        the deltas after ``rev``. ``offset`` is never past the durable head
        (as status shows the cursor). While a new version builds in the
        shadow here, it is the serving version's checkpoint, with ``stale``
        true and ``building_version`` the version being built.
        """
        runner = self.runner(slug, path)
        stream = self._require_log().stream(runner.path)
        engine = runner.engine
        if engine is not None and engine.in_shadow():
            # The new version is still being built: the serving version's last
            # checkpoint is the state there is, and it says so.
            stored = await self._require_store().stored_snapshot(slug)
            stored["stale"] = True
            stored["building_version"] = runner.version
            return shown_snapshot(stored, await stream.head())
        if engine is not None:
            offset, state = await engine.snapshot()
            # Caught up by the line above, this reads no log and awaits nothing: the
            # revision belongs to the very state returned.
            rev, projection = await engine.live_snapshot()
            snapshot = {
                "offset": offset,
                "state": jsonable(state),
                "rev": rev,
                "live": jsonable(projection),
                "version": runner.version,
                "source": "engine",
            }
            # The head after the snapshot: a durable event the engine reduced is below it.
            return shown_snapshot(snapshot, await stream.head())

        stored = await self._require_store().stored_snapshot(slug)
        contract = runner.processor.contract
        if stored.get("state") is not None and stored.get("version") == contract.version:
            # A checkpoint leaves out fields at their defaults (compact_state): a reader
            # of the snapshot gets the whole state, as from the engine.
            stored["state"] = contract.restored_json(stored["state"])
        return shown_snapshot(stored, await stream.head())

    async def live_snapshot(self, slug: str, path: str | None = None) -> LiveSnapshot:
        """``(rev, projection)`` of a processor this host runs (the watch seed).

        While a new version builds in the shadow here, the seed is the serving
        version's last checkpointed state at revision 0 (stale, as
        :meth:`snapshot` says), never the partial state being built. A seed
        asked for while a cutover swaps the engine comes from the new one.
        """
        runner = self.runner(slug, path)
        # Set once an engine was swapped under a seed: the one whose work was cancelled.
        swapped = None
        while True:
            # Between the engine built in the shadow and the one serving after the cutover,
            # or after an engine was stopped under this seed: wait (a lease ttl at most)
            # for the next one.
            engine = await runner.next_engine(
                self.config.lease.ttl, than=swapped, patient=swapped is not None
            )
            if engine is None:
                break
            if runner.builds_in_shadow(engine):
                stored = await self._require_store().stored_snapshot(slug)
                return LiveSnapshot(0, stored.get("state"))
            try:
                return await engine.live_snapshot()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # Not ours: the engine's work was cancelled under it (a cutover or a
                # lost lease). Seed from the engine that runs the processor next.
                if swapped is not None:
                    break
                swapped = engine
        raise InvalidRequest(
            f"processor {slug!r} is not running in this host (another host holds its "
            "lease); watch it through that host's socket; nothing was done",
            details={"slug": slug, "path": runner.path},
        )

    async def watch(self, slug: str, path: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield ``{"kind": "seed", rev, state}`` then ``{"kind": "delta", from, to, patch}``.

        A gap in the revision chain (a lost delta, a ``patch: null``, a watcher
        that fell behind) yields a fresh seed.
        """
        runner = self.runner(slug, path)
        subscription = self.subscribe(runner.path, slug)
        try:
            async for message in watch_messages(
                subscription, lambda: self.live_snapshot(slug, runner.path)
            ):
                yield message
        finally:
            self.unsubscribe(subscription)

    async def cut_over(
        self,
        slug: str,
        path: str | None = None,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - the verb's own deadline
    ) -> dict[str, Any]:
        """Cut the version of ``slug`` this host builds in the shadow over now (manual cutover).

        Answers ``{slug, path, version, from_version, offset}`` once the cutover
        committed (the same fenced cutover as an automatic one). Refused with
        :class:`~streamkit.errors.InvalidRequest` (``details.reason``
        ``not_building_here``) when this host builds no version of it in the
        shadow: another host may, or its version serves already.
        """
        runner = self.runner(slug, path)
        engine = runner.engine
        if engine is None or not runner.role.shadow:
            serving = runner.role.serving_version
            where = (
                f"version {runner.version} serves already"
                if engine is not None
                else "this host does not hold its shadow lease (another host builds it, or "
                "none does)"
            )
            raise InvalidRequest(
                f"processor {slug!r}: no version of it is built in the shadow here ({where}); "
                "nothing was cut over; ask the host whose status shows it rebuilding",
                details={
                    "slug": slug,
                    "path": runner.path,
                    "reason": "not_building_here",
                    "serving_version": serving,
                },
            )
        replacing = runner.role.serving_version
        offset = await engine.cut_over(timeout)
        return {
            "slug": slug,
            "path": runner.path,
            "version": runner.version,
            "from_version": replacing,
            "offset": offset,
        }

    async def versions(self, slug: str, path: str | None = None) -> dict[str, Any]:
        """``slug``'s versions side by side: rows, states, differences, each host's counts.

        What to compare before a manual cutover (see :mod:`._versions`).
        """
        runner = self.runner(slug, path)
        status = await self.status()
        here = next(
            row
            for row in status["processors"]
            if row["slug"] == runner.slug and row["path"] == runner.path
        )
        return await compare_versions(
            self._require_store(),
            runner,
            here,
            db=str(self.config.db),
            served_db=self.served_db,
            owner=self.owner,
        )

    async def rollback(self, slug: str, to: str, path: str | None = None) -> dict[str, Any]:
        """Lift the retirement of ``slug``'s version ``to`` (``streamkit processor rollback``).

        Hosts running that version's code then build it from its kept row up
        to the serving cursor and cut back over, fenced. Refused (nothing
        changed) unless ``to`` is a retired version (see
        :func:`~streamkit.checkpoint.check_rollback`).
        """
        runner = self.runner(slug, path)
        store = self._require_store()
        serving, own = await store.version_rows(runner.slug, to)
        check_rollback(runner.slug, to, serving, own)
        await store.reinstate(runner.slug, to)
        assert serving is not None  # a retired version was replaced by a serving one
        return {"slug": runner.slug, "version": to, "serving_version": serving.reducer_version}

    async def skip(
        self,
        slug: str,
        offset: int,
        *,
        by: str,
        reason: str,
        path: str | None = None,
        ahead: bool = False,
    ) -> StreamEvent:
        """Move ``slug`` past the event at ``offset``; the decision is a durable skip event.

        Refused (nothing written) for an offset other than the one the processor is
        stalled at here (or, when it is not stalled, its next event), unless ``ahead``.
        """
        runner = self.runner(slug, path)
        failures = runner.failures
        event = await self._require_store().record_skip(
            runner.path,
            slug,
            offset,
            by=by,
            reason=reason,
            ahead=ahead,
            stalled_at=failures.stalled_at if failures.stalled else None,
        )
        runner.skip(offset, by=by, recorded_at=event.offset, reason=reason)
        return event

    async def status(self) -> dict[str, Any]:
        """The host and each processor: cursor, head, lag, lease, claim, stalled, rates."""
        database, processors = await processor_rows(
            self._require_log(), self._require_store(), self.runners
        )
        leases = self._leases
        for runner, row in zip(self.runners, processors, strict=True):
            row["schema_check"] = self._schema_checks.get((row["path"], row["slug"]))
            row["unserved"] = None if leases is None else leases.unserved(runner)
        started = self._started_at
        return {
            "database": database,
            "host": {
                "owner": self.owner,
                "pid": os.getpid(),
                "db": shown_target(self.config.db),
                "socket": None if self.socket_path is None else str(self.socket_path),
                "uptime": None if started is None else round(self.clock() - started, 3),
                "clients_first": self._clients_first(),
                "serving_first": self._serving_first(),
                # Sessions of frozen hosts its writer ended (PostgreSQL, docs/postgres.md).
                "frozen_sessions_ended": (
                    0 if self.log is None else self.log.stats.frozen_sessions_ended
                ),
            },
            "processors": processors,
            # What each path's history must keep, and who holds it (docs/retention.md).
            "retention": await retention_rows(self._require_store(), self.clock()),
            "retention_job": (
                None
                if self._leases is None or self._leases.retention is None
                else self._leases.retention.to_dict()
            ),
        }

    def _clients_first(self) -> dict[str, Any]:
        """What favouring clients cost the processors so far (docs/host.md, "Clients first")."""
        paced = PacerStats(0, 0.0) if self.pacer is None else self.pacer.statistics()
        return {
            "pauses": paced.pauses,
            "paused_seconds": round(paced.paused_seconds, 6),
            "held_writes": 0 if self.log is None else self.log.held_writes,
        }

    def _serving_first(self) -> dict[str, Any]:
        """What this host's rebuilds gave way to its serving processors (docs/rebuilds.md)."""
        given = self.foreground.statistics()
        return {
            "share": self.config.rebuild_share,
            "waits": given.waits,
            "waited_seconds": round(given.waited_seconds, 6),
        }

    async def wait_until_processed(
        self,
        slug: str,
        offset: int,
        timeout: float = 10.0,  # noqa: ASYNC109 - the engine's verb, with its timeout
        path: str | None = None,
    ) -> None:
        """Wait until ``slug`` (running here) has processed through ``offset``."""
        runner = self.runner(slug, path)
        deadline = time.monotonic() + timeout
        engine = await runner.next_engine(timeout)
        if engine is None:
            raise InvalidRequest(
                f"processor {slug!r} is not running in this host; nothing to wait for",
                details={"slug": slug},
            )
        await engine.wait_until_processed(offset, max(0.0, deadline - time.monotonic()))

    def _require_log(self) -> Log:
        if self.log is None:
            raise InvalidRequest("the host is not started; call start() first")
        return self.log

    def _require_store(self) -> HostStore:
        if self.store is None:
            raise InvalidRequest("the host is not started; call start() first")
        return self.store


def _keyed(event: EventInput | Mapping[str, Any]) -> bool:
    if isinstance(event, Mapping):
        return event.get("idempotency_key") is not None
    return getattr(event, "idempotency_key", None) is not None
