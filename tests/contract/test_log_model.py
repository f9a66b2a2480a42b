"""The log's offset and idempotency rules against a simple model, under random schedules.

It runs over every backend of ``support.backends``. Two writers share one
log: A stays open (and is sometimes reopened), B opens,
appends and closes within one step, as another process would. The model
predicts every offset exactly, except the first one B takes while A holds an
ephemeral block that B must skip: that one need only be above everything
handed out before (a hole, by design).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.backends import BACKENDS, Backend

from streamkit import IdempotencyConflict, OffsetConflict, StreamEvent
from streamkit.log import Log

PATHS = ("/", "/b")

item = st.tuples(
    st.sampled_from(["durable", "durable", "ephemeral"]),
    st.integers(0, 5),
    st.booleans(),  # with a fresh idempotency key
    st.booleans(),  # with the right offset precondition
)


class LogModel(RuleBasedStateMachine):
    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.target = self.backend.fresh()
        self.loop = asyncio.new_event_loop()
        self.a: Log = self.target.open(**self.target.backend.fast)
        self.durable: dict[str, list[tuple[int, str, dict[str, Any], str | None]]] = {
            p: [] for p in PATHS
        }
        self.handed: dict[str, int] = dict.fromkeys(PATHS, 0)
        self.keys: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {p: {} for p in PATHS}
        self.a_block: dict[str, bool] = dict.fromkeys(PATHS, False)
        self.next_key = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.a.close()
        self.loop.close()
        self.target.remove()

    def _events(
        self, spec: list[tuple[str, int, bool, bool]], path: str, exact: bool
    ) -> tuple[list[dict[str, Any]], list[str | None]]:
        events: list[dict[str, Any]] = []
        keys: list[str | None] = []
        predicted = self.handed[path]
        for kind, n, keyed, pinned in spec:
            predicted += 1
            event: dict[str, Any] = {"type": kind, "payload": {"n": n}}
            key = None
            if kind == "ephemeral":
                event["ephemeral"] = True
            elif keyed:
                key = f"k{self.next_key}"
                self.next_key += 1
                event["idempotency_key"] = key
            if pinned and exact:
                event["offset"] = predicted
            events.append(event)
            keys.append(key)
        return events, keys

    def _record(
        self, path: str, got: list[StreamEvent], keys: list[str | None], exact: bool
    ) -> None:
        for i, (event, key) in enumerate(zip(got, keys, strict=True)):
            if exact or i > 0:
                assert event.offset == self.handed[path] + 1, (event, self.handed[path])
            else:
                assert event.offset > self.handed[path]
            self.handed[path] = event.offset
            if not event.ephemeral:
                self.durable[path].append((event.offset, event.type, event.payload, key))
                if key is not None:
                    self.keys[path][key] = (event.offset, event.payload)

    @rule(path=st.sampled_from(PATHS), spec=st.lists(item, min_size=1, max_size=4))
    def a_appends(self, path: str, spec: list[tuple[str, int, bool, bool]]) -> None:
        events, keys = self._events(spec, path, exact=True)
        got = self.run(self.a.stream(path).append(*events))
        self._record(path, got, keys, exact=True)
        if any(e.ephemeral for e in got):
            self.a_block[path] = True

    @rule(path=st.sampled_from(PATHS), spec=st.lists(item, min_size=1, max_size=3))
    def b_appends(self, path: str, spec: list[tuple[str, int, bool, bool]]) -> None:
        exact = not self.a_block[path]
        events, keys = self._events(spec, path, exact=exact)

        async def append() -> list[StreamEvent]:
            async with self.target.open(**self.target.backend.fast) as b:
                return await b.stream(path).append(*events)

        got = self.run(append())
        self._record(path, got, keys, exact=exact)
        self.a_block[path] = False  # B landed above A's block: its rest is a hole now

    @rule()
    def a_reopens(self) -> None:
        self.run(self.a.aclose())
        self.a = self.target.open(**self.target.backend.fast)
        self.a_block = dict.fromkeys(PATHS, False)

    @precondition(lambda self: any(self.keys.values()))
    @rule(data=st.data(), use_b=st.booleans(), pin=st.booleans())
    def retry_a_key(self, data: st.DataObject, use_b: bool, pin: bool) -> None:
        path = data.draw(st.sampled_from([p for p in PATHS if self.keys[p]]))
        key = data.draw(st.sampled_from(sorted(self.keys[path])))
        offset, payload = self.keys[path][key]
        event: dict[str, Any] = {"type": "durable", "payload": payload, "idempotency_key": key}
        if pin:
            event["offset"] = offset

        async def append() -> list[StreamEvent]:
            if not use_b:
                return await self.a.stream(path).append(event)
            async with self.target.open(**self.target.backend.fast) as b:
                return await b.stream(path).append(event)

        (got,) = self.run(append())
        assert (got.offset, got.payload, got.idempotency_key) == (offset, payload, key)

    @precondition(lambda self: any(self.keys.values()))
    @rule(data=st.data(), wrong_offset=st.booleans())
    def conflicting_key_is_refused(self, data: st.DataObject, wrong_offset: bool) -> None:
        path = data.draw(st.sampled_from([p for p in PATHS if self.keys[p]]))
        key = data.draw(st.sampled_from(sorted(self.keys[path])))
        offset, payload = self.keys[path][key]
        if wrong_offset:
            event = {"type": "durable", "payload": payload, "idempotency_key": key}
            event["offset"] = offset + 1
            expected: type[Exception] = OffsetConflict
        else:
            event = {"type": "durable", "payload": {"other": True}, "idempotency_key": key}
            expected = IdempotencyConflict
        with pytest.raises(expected):
            self.run(self.a.stream(path).append({"type": "durable"}, event))

    @rule(path=st.sampled_from(PATHS), ahead=st.integers(-3, 3).filter(lambda d: d != 0))
    def wrong_precondition_is_refused(self, path: str, ahead: int) -> None:
        wrong = max(1, self.handed[path] + 1 + ahead)
        if wrong == self.handed[path] + 1:
            wrong += 1
        with pytest.raises(OffsetConflict):
            self.run(
                self.a.stream(path).append(
                    {"type": "durable"}, {"type": "durable", "offset": wrong + 1}
                )
            )

    @invariant()
    def log_matches_model(self) -> None:
        for path in PATHS:
            page = self.run(self.a.stream(path).read(0, 10_000))
            got = [(e.offset, e.type, e.payload, e.idempotency_key) for e in page.events]
            assert got == self.durable[path]
            head = self.durable[path][-1][0] if self.durable[path] else 0
            assert self.run(self.a.stream(path).head()) == head


MODEL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# One test case per backend: the same model, every storage engine.
def _case_for(backend: Backend) -> type:
    case = type(f"LogModel_{backend.name}", (LogModel,), {"backend": backend}).TestCase
    case.settings = MODEL_SETTINGS
    return case


globals().update({f"TestLogModel_{name}": _case_for(b) for name, b in BACKENDS.items()})
