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
state, and skip events: the verbs of :mod:`._verbs`, which HTTP serves too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from streamkit._targets import own_socket, served_name, shown_target
from streamkit.backends import host_store, open_log
from streamkit.config import HostConfig, resolve_processors, shared_slug
from streamkit.control._server import ControlServer
from streamkit.control._socket import check_private_directory, check_socket_path
from streamkit.engine._strays import CANCEL_WAIT
from streamkit.errors import (
    ControlSocketInUse,
    InvalidConfig,
    LeaseLost,
    StreamkitError,
)
from streamkit.host._acquire import LeaseAcquirer
from streamkit.host._alarm import Alarm
from streamkit.host._control import HostControlHandler
from streamkit.host._lease_keeper import HeldLease, LeaseKeeper
from streamkit.host._pacer import Pacer
from streamkit.host._path_watch import PathWatch
from streamkit.host._recorded_skips import obey_recorded_skips
from streamkit.host._runner import ProcessorRunner
from streamkit.host._verbs import HostVerbs
from streamkit.host._watch import Subscription
from streamkit.log._log import Log
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

REPEAT_SIGNAL_WINDOW = 0.5
"""Seconds after the first stop signal within which another is the same request.

``timeout`` sends its child SIGTERM twice (to the child, then to its process
group); a Ctrl-C reaches a wrapper and its child alike. Read as "exit at once",
such an echo would skip the lease release and leave the next host waiting a
full ttl, so only a signal after this window forces the exit.
"""


@dataclass(frozen=True, slots=True)
class _Entry:
    processor: StreamProcessor[Any]
    path: str
    label: str


class ProcessorHost(HostVerbs):
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
        entries: list[_Entry] = []
        if processors is None:
            for resolved in resolve_processors(config):
                entries.append(_Entry(resolved.processor, resolved.spec.path, resolved.spec.label))
        else:
            for item in processors:
                path, processor = item if isinstance(item, tuple) else ("/", item)
                entries.append(_Entry(processor, path, type(processor).__name__))
        _check_entries(entries)
        self._entries = entries
        self.log: Log | None = None
        self.store: HostStore | None = None
        self.runners: list[ProcessorRunner] = []
        self._alarm: Alarm | None = None
        self.pacer: Pacer | None = None
        """The host's clients-first pacer (None before start, or at ``processor_share = 1``)."""
        self._keeper: LeaseKeeper | None = None
        self._acquirer: LeaseAcquirer | None = None
        self._lease_tasks: set[asyncio.Task[None]] = set()
        self._handing_off: set[ProcessorRunner] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: dict[str, PathWatch] = {}
        self._control: ControlServer | None = None
        self.socket_path: Path | None = None
        """The control socket this host serves (None until it listens, or without one)."""
        self._started_at: float | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._stop_requested: asyncio.Event | None = None
        self._first_signal_at: float | None = None

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
        )
        self.log = log
        try:
            store = self.store = host_store(log)
            await store.prepare()
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
                            else functools.partial(self.watching, entry.path, slug)
                        ),
                        pacer=pacer,
                    )
                )
            loop = asyncio.get_running_loop()
            # HostConfig refuses ":memory:", so the keeper can always reach the file.
            self._keeper = LeaseKeeper(
                store.lease_renewer(min(5.0, config.lease.heartbeat_interval)),
                interval=config.lease.heartbeat_interval,
                ttl=config.lease.ttl,
                clock=self.clock,
                loop=loop,
            )
            self._keeper.start()
            self._acquirer = LeaseAcquirer(
                log=log,
                store=store,
                owner=self.owner,
                clock=self.clock,
                ttl=config.lease.ttl,
                on_acquired=self._acquired,
                on_hand_off=self._hand_off,
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
        watches, self._watches = self._watches, {}
        await asyncio.gather(*(watch.close() for watch in watches.values()))
        await asyncio.gather(*(runner.stop(grace) for runner in self.runners))
        if self._lease_tasks:  # hand-offs and losses in progress end with their runners
            await asyncio.gather(*self._lease_tasks, return_exceptions=True)
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            # After the runners (their last batches needed the leases kept), before
            # the releases (a renewal must not race them).
            await asyncio.to_thread(keeper.stop)
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
        for runner in self.runners:
            lease = runner.lease
            if lease is None:
                continue
            try:
                if await self._require_store().release(lease):
                    _log.info("lease.released", slug=runner.slug, path=runner.path)
            except StreamkitError as exc:
                _log.warning("lease.release_failed", slug=runner.slug, error=exc.message)
            runner.held = None
        await log.aclose()

    async def run(self) -> None:
        """The daemon's main: start, serve until SIGTERM/SIGINT, then stop.

        The first signal stops cleanly (see :meth:`stop`); a signal within
        :data:`REPEAT_SIGNAL_WINDOW` seconds of it is the same request; a later
        one exits the process at once (the log keeps every committed write).
        Work that ignores its cancel (a handler that catches
        ``CancelledError``) does not hold the exit: once the stop is done (the
        leases released, the log closed), the process exits with it still
        running, naming it (``host.exit_forced``).
        """
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self.start()
            await self._stop_requested.wait()
        finally:
            await self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        await _exit_past_strays()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (as SIGTERM does)."""
        if self._stop_requested is not None:
            self._stop_requested.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
            _log.info("host.signal", signal=sig.name)
            self.request_stop()
        elif now - self._first_signal_at < REPEAT_SIGNAL_WINDOW:
            _log.info(
                "host.signal_repeated",
                signal=sig.name,
                detail=f"within {REPEAT_SIGNAL_WINDOW} s of the first: the same stop, still clean",
            )
        else:
            _log.warning("host.exit_now", signal=sig.name)
            os._exit(128 + int(sig))

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
        assert self._acquirer is not None  # built by start()
        await self._acquirer.beat_all(self.runners, lambda: self._stopping)
        await obey_recorded_skips(self._require_log(), self._require_store(), self.runners)

    def _acquired(self, runner: ProcessorRunner, held: HeldLease) -> None:
        runner.start_engine(held)
        if self._keeper is not None and runner.held is held:
            self._keeper.hold(held, functools.partial(self._lost_by_keeper, runner, held))
        if self._alarm is not None:
            self._alarm.changed()

    def _hand_off(self, runner: ProcessorRunner) -> None:
        """Give ``runner``'s processor to the host it is placed on (see ``_acquire``)."""
        if runner in self._handing_off or self._stopping:
            return
        self._handing_off.add(runner)
        task = asyncio.get_running_loop().create_task(self._release_to_another(runner))
        self._lease_tasks.add(task)
        task.add_done_callback(self._lease_tasks.discard)

    async def _release_to_another(self, runner: ProcessorRunner) -> None:
        try:
            # Background work gets part of the ttl: the lease is renewed meanwhile.
            grace = min(self.config.shutdown_grace, self.config.lease.ttl / 2)
            held = await runner.hand_off(grace)
            if held is not None and await self._require_store().release(held.lease):
                _log.info("lease.released", slug=runner.slug, path=runner.path, handed_off=True)
        except StreamkitError as exc:
            # Kept or lost, the lease stays the arbiter: the other host takes it when free.
            _log.warning("lease.hand_off_failed", slug=runner.slug, error=exc.message)
        finally:
            self._handing_off.discard(runner)

    def _lost_by_keeper(self, runner: ProcessorRunner, held: HeldLease, error: LeaseLost) -> None:
        # On the loop, called by the keeper thread: stop the engine if it still
        # runs under this very lease (the runner may have moved on already).
        if runner.held is held:
            task = asyncio.get_running_loop().create_task(runner.lose_lease(error))
            self._lease_tasks.add(task)
            task.add_done_callback(self._lease_tasks.discard)

    def _lease_gone(self, held: HeldLease) -> None:
        if self._keeper is not None:
            self._keeper.drop(held)

    # -- watchers ------------------------------------------------------------------------

    def subscribe(self, path: str, key: str) -> Subscription:
        """A mailbox of ``key``'s live-state deltas on ``path`` from now on (see :class:`Subscription`).

        Close it with :meth:`unsubscribe`.
        """
        subscription = Subscription(path, key, self.config.limits.subscriber_bytes)
        watch = self._watches.get(path)
        if watch is None:
            watch = self._watches[path] = PathWatch(self._require_log(), path)
        watch.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``."""
        watch = self._watches.get(subscription.path)
        if watch is not None:
            watch.discard(subscription)

    def watching(self, path: str, key: str) -> bool:
        """Whether a client here watches ``key``'s live state on ``path`` (its batches publish then)."""
        watch = self._watches.get(path)
        return watch is not None and watch.watches(key)


def _check_entries(entries: Sequence[_Entry]) -> None:
    seen: dict[str, str] = {}
    for entry in entries:
        slug = entry.processor.contract.slug
        if slug in seen:
            raise InvalidConfig(
                shared_slug(slug, seen[slug], entry.path)
                + "; give one of them another slug; nothing was started",
                details={"slug": slug, "paths": [seen[slug], entry.path]},
            )
        seen[slug] = entry.path


async def _exit_past_strays() -> None:
    """Cancel what still runs after a stop; exit the process now if some of it will not end.

    ``asyncio.run`` waits for every task it cancels at the end, so one that
    catches ``CancelledError`` would keep a stopped host's process alive for
    ever. The stop released the leases and closed the log first, so exiting
    past it loses nothing.
    """
    current = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    if not left:
        return
    _, still = await asyncio.wait(left, timeout=CANCEL_WAIT)
    if not still:
        return
    _log.warning(
        "host.exit_forced",
        running=sorted(task.get_name() for task in still),
        detail=f"still running {CANCEL_WAIT} s after their cancel (they catch CancelledError); "
        "the host stopped cleanly (leases released, log closed) and exits without them",
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
