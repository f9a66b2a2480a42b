"""The HTTP endpoints: events, processors, health and metrics, each a thin layer over the host.

Every endpoint calls the same host method the control socket does, so a
rule (what an append takes, what a skip refuses) lives in one place and
HTTP only translates: query parameters and headers in, JSON (or SSE, or
the Prometheus text) out, and any :class:`~streamkit.errors.StreamkitError`
as ``application/problem+json`` (:mod:`._problems`). Nothing here writes
unless the host's method does, and a refusal writes nothing.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.errors import (
    InvalidRequest,
    MalformedRequest,
    NotFound,
    SlowConsumer,
    StreamkitError,
)
from streamkit.events import MAX_OFFSET, StreamEvent, appended_to_dicts, replayed_offsets
from streamkit.host import parse_created_at
from streamkit.lifting import as_read_by
from streamkit.log import after_offset_for, timestamp_param, type_matcher
from streamkit.web._body import json_body
from streamkit.web._health import assess, readiness
from streamkit.web._metrics import CONTENT_TYPE_LATEST, LATENCY_BUCKETS, exposition
from streamkit.web._plugins import plugin_gauges
from streamkit.web._problems import described
from streamkit.web._sse import SSE_TYPE, LiveStreams, frame, with_heartbeat

if TYPE_CHECKING:
    from streamkit.config import HttpSettings
    from streamkit.host import ProcessorHost, ProcessorRunner

__all__ = ["Endpoints"]

# ASCII digits only, at most 19 (an offset fits 63 bits): \d and str.isdigit take
# '²' and other digits int() refuses, and int() refuses past 4,300 digits.
_IF_MATCH = re.compile(r'\A\s*(?:W/)?"?([0-9]{1,19})"?\s*\Z', re.ASCII)
_WHOLE = re.compile(r"[0-9]{1,19}", re.ASCII)
_COMPACT = (",", ":")


def _json(value: Any) -> str:
    return json.dumps(value, separators=_COMPACT, ensure_ascii=False)


class Endpoints:
    """The handlers, bound to one host and its HTTP settings."""

    def __init__(
        self, host: ProcessorHost, settings: HttpSettings, streams: LiveStreams | None = None
    ) -> None:
        self._host = host
        self._settings = settings
        self._streams = LiveStreams() if streams is None else streams
        # The latest seed frame of each watched processor, by (path, slug): (rev, frame).
        self._seeds: dict[tuple[str, str], tuple[int, bytes]] = {}

    def _sse(self, source: AsyncIterator[bytes]) -> StreamingResponse:
        return StreamingResponse(
            with_heartbeat(source, streams=self._streams),
            media_type=SSE_TYPE,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # -- events ---------------------------------------------------------------------------

    async def append(self, request: Request) -> Response:
        """``POST /v1/events?path=/``: one event object or a list; 201 with the committed events."""
        path = request.query_params.get("path", "/")
        body = await json_body(
            request, self._settings.max_request_bytes, self._settings.body_timeout
        )
        events = body if isinstance(body, list) else [body]
        if not events or not all(isinstance(e, dict) for e in events):
            raise InvalidRequest(
                "the body must be one event object or a non-empty list of them; nothing was "
                "written",
                details={"got": type(body).__name__},
            )
        key = _utf8_header(request, "idempotency-key")
        if key is not None:
            if isinstance(body, list):
                raise InvalidRequest(
                    "Idempotency-Key names one event, and the body is a list; give each event "
                    "its own idempotency_key instead; nothing was written",
                    details={"idempotency_key": key[:200]},
                )
            given = body.get("idempotency_key")
            if given is not None and given != key:
                raise InvalidRequest(
                    f"the Idempotency-Key header ({key!r}) and the event's idempotency_key "
                    f"({given!r}) differ; send one, or both the same; nothing was written",
                    details={"header": key[:200], "body": str(given)[:200]},
                )
            events = [{**body, "idempotency_key": key}]
        expect_head = _if_match(request.headers.get("if-match"))
        # Before the append: a window that cannot be read refuses with nothing written.
        kept_for = await self._host.keys_kept_for(path, events)
        committed = await self._host.append(path, events, expect_head=expect_head)
        # 201 when anything new was committed; 200 when every event was an idempotent
        # hit (a retry of a call that landed), each of those marked "replayed".
        replayed = replayed_offsets(committed)
        fresh = any(event.offset not in replayed for event in committed)
        return JSONResponse(
            {"events": appended_to_dicts(committed, kept_for)}, status_code=201 if fresh else 200
        )

    async def events(self, request: Request) -> Response:
        """``GET /v1/events``: a page with its proof, or (``Accept: text/event-stream``) a follow."""
        params = request.query_params
        path = params.get("path", "/")
        after = _int_param(params.get("after"), "after", 0)
        types = params.getlist("type") or None
        shown = self._shown_as(params.get("as"), path)
        if SSE_TYPE in request.headers.get("accept", ""):
            resume = request.headers.get("last-event-id")
            if resume is not None:
                after = _int_param(resume, "Last-Event-ID", after)
            await self._followable(path, after)
            matches = None if types is None else type_matcher(types)
            return self._sse(self._follow(path, after, matches, shown))
        limit = _int_param(params.get("limit"), "limit", 500)
        since, until = params.get("since"), params.get("until")
        if since:
            stamp = timestamp_param(since, "since")
            stream = self._host.log.stream(path) if self._host.log is not None else None
            if stream is not None:
                after = max(after, await after_offset_for(stream.read, await stream.head(), stamp))
        page = await self._host.read(path, after, limit, types)
        events, through, at_head = page.events, page.scanned_through_offset, page.at_head
        until_reached = False
        if until:
            end = timestamp_param(until, "until")
            kept = [event for event in events if event.created_at <= end]
            if len(kept) < len(events):
                # Stamps follow offsets: the first event past ``until`` ends the range.
                until_reached = True
                events = kept
                through = kept[-1].offset if kept else after
                at_head = False
        return JSONResponse(
            {
                "events": [shown(event) for event in events],
                "scanned_through_offset": through,
                "at_head": at_head,
                "until_reached": until_reached,
            }
        )

    async def event(self, request: Request) -> Response:
        """``GET /v1/events/{offset}?path=``: one durable event, and which processors passed it."""
        path = request.query_params.get("path", "/")
        offset = _int_param(request.path_params["offset"], "offset", 0)
        event = await self._host.event(path, offset)
        status = await self._host.status()
        processors = [
            {
                "slug": row["slug"],
                "cursor": row.get("cursor"),
                "passed": row.get("cursor") is not None and row["cursor"] >= offset,
                "host": row.get("host"),
            }
            for row in status["processors"]
            if row.get("path") == path
        ]
        return JSONResponse({"event": event.to_dict(), "processors": processors})

    async def paths(self, request: Request) -> Response:
        """``GET /v1/paths``: every stream path with a durable event, and its head."""
        heads = await self._host.stream_heads()
        return JSONResponse({"paths": [{"path": path, "head": head} for path, head in heads]})

    async def hosts(self, request: Request) -> Response:
        """``GET /v1/hosts``: the hosts beating on this log and what each runs."""
        return JSONResponse({"hosts": await self._host.hosts()})

    async def _followable(self, path: str, after: int) -> None:
        """Refuse, before the 200, a follow that could only end or wait in silence.

        From past the durable head: an event's id is a durable offset, so a
        client resuming past the head has an id this log never gave (another
        log's, or one rewound): it would wait in silence while the events it
        missed arrive below its cursor. From below the path's start (history
        retention took): HISTORY_TRUNCATED, as the plain read answers, rather
        than a stream that opens and ends (an EventSource would reconnect to
        it for ever).
        """
        log = self._host.log
        if log is None:
            return
        await self._host.read(path, after, 1, None)  # HISTORY_TRUNCATED below the start
        if after == 0:
            return
        head = await log.stream(path).head()
        if after > head:
            raise InvalidRequest(
                f"cannot follow {path!r} from offset {after}: its durable head is {head} (an "
                "event id past it was never given by this log); resume from an id you received, "
                f"or from {head}; nothing was read",
                details={"path": path, "after": after, "head": head},
            )

    def _shown_as(self, slug: str | None, path: str) -> Callable[[StreamEvent], dict[str, Any]]:
        """How an event is shown: as stored, or (``as=<slug>``) as that processor reads it now.

        A lifted event carries ``"upcast": {"from_type", "from_version"}``; one the
        processor's code cannot read comes as stored with ``"upcast": {"unreadable": why}``.
        """
        if slug is None:
            return StreamEvent.to_dict
        contract = self._host.runner(slug, path).processor.contract

        def shown(event: StreamEvent) -> dict[str, Any]:
            read, note = as_read_by(contract, event)
            data = read.to_dict()
            if note is not None:
                data["upcast"] = note
            return data

        return shown

    async def _follow(
        self,
        path: str,
        after: int,
        matches: Callable[[str], bool] | None,
        shown: Callable[[StreamEvent], dict[str, Any]] = StreamEvent.to_dict,
    ) -> AsyncIterator[bytes]:
        # A durable event's id is its offset, so Last-Event-ID resumes after it; an
        # ephemeral has none (the client's last id stays the last durable one).
        follow = self._host.follow(path, after)
        try:
            async for event in follow:
                if matches is not None and not matches(event.type):
                    continue
                data = _json(shown(event))
                yield frame(data, event="event", id=None if event.ephemeral else str(event.offset))
        except SlowConsumer as exc:  # the SSE form of the same refusal: resume after it
            yield frame(_json(exc.to_dict()), event="error")
        finally:
            closer = getattr(follow, "aclose", None)
            if closer is not None:
                await closer()

    # -- processors -----------------------------------------------------------------------

    async def processors(self, request: Request) -> Response:
        """``GET /v1/processors``: what ``streamkit status --json`` shows."""
        return JSONResponse(await self._host.status())

    async def processor(self, request: Request) -> Response:
        """``GET /v1/processors/{slug}``: ``{offset, rev, state, ...}``."""
        runner = self._runner(request)
        return JSONResponse(await self._host.snapshot(runner.slug, runner.path))

    async def processed(self, request: Request) -> Response:
        """``GET /v1/processors/{slug}/processed?offset=N``: answers once the processor passed N.

        Read-your-writes for a request/response flow: append, then wait here
        until the processor has processed (and checkpointed) the offset the
        append returned. ``timeout`` (seconds, default 10, at most 60): past
        it the answer is a 504 ``PROCESSOR_TIMEOUT`` problem naming the cursor.
        """
        runner = self._runner(request)
        params = request.query_params
        offset = _int_param(params.get("offset"), "offset", 0)
        timeout = _seconds_param(params.get("timeout"), "timeout", 10.0, high=60.0)
        await self._host.wait_until_processed(runner.slug, offset, timeout, runner.path)
        return JSONResponse(
            {"slug": runner.slug, "path": runner.path, "offset": offset, "cursor": runner.cursor}
        )

    async def live(self, request: Request) -> Response:
        """``GET /v1/processors/{slug}/live``: SSE, a ``seed`` then ``delta`` events."""
        runner = self._runner(request)
        if runner.engine is None:
            raise InvalidRequest(
                f"processor {runner.slug!r} is not running in this host (another host holds "
                "its lease); watch it through that host; nothing was done",
                details={"slug": runner.slug, "path": runner.path},
            )
        return self._sse(self._live(runner))

    async def _live(self, runner: ProcessorRunner) -> AsyncIterator[bytes]:
        watch = self._host.watch(runner.slug, runner.path)
        try:
            async for message in watch:
                if message.get("kind") == "seed":
                    yield self._seed_frame(runner, message)
                else:
                    data = {"from": message["from"], "to": message["to"], "patch": message["patch"]}
                    yield frame(_json(data), event="delta", id=str(message["to"]))
        except StreamkitError as exc:
            yield frame(_json(exc.to_dict()), event="error")
        finally:
            closer = getattr(watch, "aclose", None)
            if closer is not None:
                await closer()

    def _seed_frame(self, runner: ProcessorRunner, message: dict[str, Any]) -> bytes:
        """The seed's frame, built once per revision and shared by every watcher of it.

        A seed carries the whole live state: built per watcher, N watchers of a
        20 MB view (slow ones hold theirs while they read) would cost N copies.
        """
        key = (runner.path, runner.slug)
        rev = message["rev"]
        cached = self._seeds.get(key)
        if cached is not None and cached[0] == rev:
            return cached[1]
        built = frame(_json({"rev": rev, "state": message["state"]}), event="seed", id=str(rev))
        if SPEED_TRICKS:  # the cache is a speed trick: off under STREAMKIT_PLAIN=1
            self._seeds[key] = (rev, built)
        return built

    async def skip(self, request: Request) -> Response:
        """``POST /v1/processors/{slug}/skip``: ``{offset, reason[, by]}``; 201 with the skip event."""
        runner = self._runner(request)
        body = await json_body(
            request, self._settings.max_request_bytes, self._settings.body_timeout
        )
        if not isinstance(body, dict):
            raise InvalidRequest(
                'the body must be {"offset": N, "reason": "..."}; nothing was written',
                details={"got": type(body).__name__},
            )
        offset, reason = body.get("offset"), body.get("reason")
        by = body.get("by", "http")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise InvalidRequest(
                f"offset must be the positive offset of the event to skip, got {offset!r}; "
                "nothing was written",
                details={"offset": repr(offset)[:100]},
            )
        if not isinstance(reason, str) or not reason.strip() or not isinstance(by, str):
            raise InvalidRequest(
                "reason (why the event is skipped, for the record) must be a non-empty string, "
                "and by a string; nothing was written",
                details={},
            )
        ahead = body.get("ahead", False)
        if not isinstance(ahead, bool):
            raise InvalidRequest(
                f"ahead must be true or false, got {ahead!r}; nothing was written",
                details={"ahead": repr(ahead)[:100]},
            )
        event = await self._host.skip(
            runner.slug, offset, by=by, reason=reason, path=runner.path, ahead=ahead
        )
        return JSONResponse({"event": event.to_dict()}, status_code=201)

    async def versions(self, request: Request) -> Response:
        """``GET /v1/processors/{slug}/versions``: every version side by side (rows, states,
        differences, each host's counts): what to compare before a manual cutover."""
        runner = self._runner(request)
        return JSONResponse(await self._host.versions(runner.slug, runner.path))

    async def cutover(self, request: Request) -> Response:
        """``POST /v1/processors/{slug}/cutover`` (``{"within": seconds}`` optional): cut the
        version this host built in the shadow over now; 200 once committed."""
        runner = self._runner(request)
        bodiless = request.headers.get("content-length") in (None, "0") and (
            "content-type" not in request.headers
        )
        body = (
            {}
            if bodiless
            else await json_body(
                request, self._settings.max_request_bytes, self._settings.body_timeout
            )
        )
        within = body.get("within", 60.0) if isinstance(body, dict) else None
        if (
            isinstance(within, bool)
            or not isinstance(within, int | float)
            or not 0 < within <= 3600
        ):
            raise InvalidRequest(
                'the body must be {} or {"within": seconds (0 to 3600)}; nothing was cut over',
                details={"got": repr(body)[:100]},
            )
        done = await self._host.cut_over(runner.slug, runner.path, timeout=float(within))
        return JSONResponse(done)

    async def rollback(self, request: Request) -> Response:
        """``POST /v1/processors/{slug}/rollback`` ``{"to": version}``: make a replaced version
        serve again (hosts running its code build it and cut back over)."""
        runner = self._runner(request)
        body = await json_body(
            request, self._settings.max_request_bytes, self._settings.body_timeout
        )
        to = body.get("to") if isinstance(body, dict) else None
        if not isinstance(to, str) or not to:
            raise InvalidRequest(
                'the body must be {"to": "<version>"}, the retired version to serve again; '
                "nothing was changed",
                details={"got": repr(body)[:100]},
            )
        return JSONResponse(await self._host.rollback(runner.slug, to, runner.path))

    def _runner(self, request: Request) -> ProcessorRunner:
        slug = request.path_params["slug"]
        path = request.query_params.get("path")
        found = [
            r for r in self._host.runners if r.slug == slug and (path is None or r.path == path)
        ]
        if not found:
            known = ", ".join(f"{r.slug}@{r.path}" for r in self._host.runners) or "none"
            raise NotFound(
                f"processor {slug!r} is not run by this host (it runs: {known}); nothing was done",
                details={"slug": slug, "path": path},
            )
        if len(found) > 1:
            raise InvalidRequest(
                f"processor {slug!r} runs on several paths here; name one with ?path=; "
                "nothing was done",
                details={"slug": slug, "paths": [r.path for r in found]},
            )
        return found[0]

    async def problem_type(self, request: Request) -> Response:
        """``GET /problems/{code}``: what a problem's ``type`` names (its code, status, meaning)."""
        found = described(request.path_params["code"])
        if found is None:
            raise NotFound(
                f"there is no problem type {request.path_params['code']!r}; nothing was done",
                details={"code": request.path_params["code"]},
            )
        return JSONResponse(found)

    # -- health and metrics ---------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: 200, or 503 with the reasons (:mod:`._health`)."""
        host = self._host
        status = await host.status()
        log = host.log
        health = assess(
            status,
            None if log is None else log.follow_age(),
            stuck_after=self._settings.stuck_after,
            follow_stale_after=self._settings.follow_stale_after,
        )
        return JSONResponse(
            health.to_dict(),
            status_code=200 if health.healthy else 503,
            headers={"Cache-Control": "no-store"},
        )

    async def readyz(self, request: Request) -> Response:
        """``GET /readyz``: 200 when every processor run here serves current state, else 503."""
        ready, body = readiness(await self._host.status())
        return JSONResponse(
            body, status_code=200 if ready else 503, headers={"Cache-Control": "no-store"}
        )

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: the Prometheus text format (:mod:`._metrics`)."""
        host = self._host
        log = host.log
        status = await host.status()
        lag_seconds: dict[tuple[str, str], float] = {}
        now = time.time()
        for row in status.get("processors", []):
            if row.get("lag") and row.get("cursor") is not None:
                try:
                    page = await host.read(row["path"], row["cursor"], 1)
                except StreamkitError:
                    continue
                stamp = parse_created_at(page.events[0].created_at) if page.events else None
                if stamp is not None:
                    lag_seconds[(row["slug"], row["path"])] = max(0.0, now - stamp)
        histograms = {}
        for runner in host.runners:
            latency = runner.metrics.latency
            histograms[(runner.slug, runner.path)] = (
                latency.cumulative(LATENCY_BUCKETS),
                latency.count,
                latency.sum,
            )
        text = exposition(
            status,
            follow_age=None if log is None else log.follow_age(),
            log_stats=None if log is None else log.stats,
            lag_seconds=lag_seconds,
            histograms=histograms,
            gauges=await plugin_gauges(host),
        )
        return Response(text, media_type=CONTENT_TYPE_LATEST)


def _utf8_header(request: Request, name: str) -> str | None:
    """A header's value read as UTF-8, as every other transport reads a key.

    HTTP carries header bytes; Starlette hands them over as Latin-1, which
    would make ``café`` over HTTP a different key from ``café`` through the
    socket or the CLI.
    """
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedRequest(
            f"the {name} header is not UTF-8 ({exc.reason} at byte {exc.start}); nothing was "
            "written",
            details={"header": name},
        ) from exc


def _if_match(value: str | None) -> int | None:
    """The ``expect_head`` an ``If-Match: "N"`` header asks for (None without one)."""
    if value is None:
        return None
    match = _IF_MATCH.match(value)
    if match is None or int(match.group(1)) > MAX_OFFSET:
        raise InvalidRequest(
            f'If-Match must be the head the append expects, as "N" (e.g. "41"), got {value!r}; '
            "nothing was written",
            details={"if_match": value[:100]},
        )
    return int(match.group(1))


def _int_param(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    if _WHOLE.fullmatch(value) is None or int(value) > MAX_OFFSET:
        raise InvalidRequest(
            f"{name} must be a whole number from 0 to {MAX_OFFSET}, got {value[:40]!r}; "
            "nothing was read",
            details={name: value[:100]},
        )
    return int(value)


def _seconds_param(value: str | None, name: str, default: float, *, high: float) -> float:
    if value is None or value == "":
        return default
    try:
        seconds = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= high:  # (NaN fails both)
        raise InvalidRequest(
            f"{name} must be a number of seconds above 0 and at most {high:g}, got "
            f"{value[:40]!r}; nothing was done",
            details={name: value[:100]},
        )
    return seconds
