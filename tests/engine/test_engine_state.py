"""The engine's state: payload validation, the guarded reduce, versions, the latch, live state."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from pydantic import BaseModel
from streamkit.testing import reduce_processor, settle
from support.engine import (
    Item,
    Recorder,
    Rig,
    SkippingRecorder,
    Tally,
    item,
    recorder_contract,
)

from streamkit import (
    LIVE_STATE_CHANGED,
    CheckpointTooLarge,
    IdempotencyConflict,
    InvalidEvent,
    PayloadMalformed,
    ProcessorContract,
    ReduceFailed,
    ScannedRange,
    StateNotSerializable,
    StreamEvent,
    StreamProcessor,
    apply_delta,
    define_processor_contract,
)
from streamkit.engine._incident_log import EVERY, IncidentLog
from streamkit.processor import ProcessEventArgs

# -- payloads ---------------------------------------------------------------------------


async def test_reduce_and_effects_see_the_validated_model(rig: Rig) -> None:
    """A declared payload reaches reduce and process_event as its model, coerced and defaulted."""
    seen_by_reduce: list[Any] = []

    class Watching(Recorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            seen_by_reduce.append(event.payload)
            return super().reduce(event, state)

    processor = Watching()
    engine = rig.engine(processor)
    await rig.stream.append({"type": "item.added", "payload": {"n": "7"}})
    await settle()
    assert seen_by_reduce == [Item(n=7)]
    assert processor.payloads == [Item(n=7)]
    assert (await engine.snapshot()).state.total == 7
    # The log keeps what was appended; only the processor's view is normalized.
    assert rig.stream.events[0].payload == {"n": "7"}


async def test_a_malformed_payload_stalls_the_engine_before_it_by_default(rig: Rig) -> None:
    """By default a payload that fails its schema stops the engine before it: nothing past it
    is reduced, delivered or checkpointed, and every read says why."""
    processor = Recorder()
    engine = rig.engine(processor)
    await rig.stream.append(item(1), {"type": "item.added", "payload": {"n": [1]}}, item(2))
    await settle()
    assert processor.delivered == [1]
    assert rig.checkpoint().reduced_through_offset == 1
    assert engine.statistics().stopped_at == 2
    assert engine.statistics().malformed_payloads == 0  # stalled, not skipped
    with pytest.raises(PayloadMalformed, match="stopped before offset 2"):
        await engine.snapshot()


async def test_a_raising_reduce_stalls_the_engine_before_its_event_by_default(rig: Rig) -> None:
    """By default a reduce that raises stops the engine before the event: its effects do not
    run, the state served omits nothing, and the error carries the reduce's traceback."""

    class Fussy(Recorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            if event.payload.n == 13:
                raise ValueError("unlucky")
            return super().reduce(event, state)

    processor = Fussy()
    engine = rig.engine(processor)
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1), item(13), item(2))
        await settle()
    assert processor.delivered == [1]
    assert rig.checkpoint().reduced_through_offset == 1
    assert engine.statistics().stopped_at == 2
    assert engine.statistics().reduce_failures == 0  # stalled, not skipped
    with pytest.raises(ReduceFailed, match="stopped before offset 2") as caught:
        await engine.snapshot()
    assert 'raise ValueError("unlucky")' in caught.value.details["traceback"]
    (entry,) = [e for e in logs if e["event"] == "processor.reduce_failed"]
    assert isinstance(entry["exc_info"], ValueError)  # the log line renders its traceback


async def test_a_malformed_payload_is_skipped_and_reported(rig: Rig) -> None:
    """With skip chosen, a payload that fails its schema is neither reduced nor delivered, and is reported."""
    processor = SkippingRecorder()
    engine = rig.engine(processor)
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1), {"type": "item.added", "payload": {"n": [1]}}, item(2))
        await settle()
    assert processor.delivered == [1, 3]
    assert (await engine.snapshot()).state.total == 3
    (entry,) = [e for e in logs if e["event"] == "processor.payload_malformed"]
    assert (entry["slug"], entry["offset"], entry["type"]) == ("recorder", 2, "item.added")
    assert "n" in entry["error"]
    assert engine.statistics().events_reduced == 2


async def test_a_contract_without_a_catalog_reduces_raw_dicts(rig: Rig) -> None:
    """A hand-built contract with no events catalog hands the reduce the payload dict as stored."""

    class Raw(StreamProcessor[dict[str, Any]]):
        contract: ProcessorContract[dict[str, Any]] = ProcessorContract(
            slug="raw", version="1", initial=lambda: {"count": 0, "last": None}
        )

        def reduce(self, event: StreamEvent, state: dict[str, Any]) -> dict[str, Any]:
            return {"count": state["count"] + 1, "last": event.payload}

    engine = rig.engine(Raw())
    await rig.stream.append({"type": "anything", "payload": {"x": [1, 2]}}, {"type": "other"})
    await settle()
    assert (await engine.snapshot()).state == {"count": 2, "last": {}}
    second = rig.restart(engine, Raw())
    assert (await second.snapshot()).state == {"count": 2, "last": {}}


# -- the guarded reduce ---------------------------------------------------------------------


async def test_a_raising_reduce_keeps_the_state_and_never_wedges(rig: Rig) -> None:
    """With skip chosen, a reduce that raises keeps the previous state, is reported, and the next event folds."""

    class Fussy(SkippingRecorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            if event.payload.n == 13:
                raise ValueError("unlucky")
            return super().reduce(event, state)

    processor = Fussy()
    engine = rig.engine(processor)
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1), item(13), item(2))
        await settle()
    assert (await engine.snapshot()).state.total == 3
    # The event itself was valid, so its effects still ran.
    assert processor.delivered == [1, 2, 3]
    (entry,) = [e for e in logs if e["event"] == "processor.reduce_failed"]
    assert (entry["slug"], entry["offset"], entry["type"]) == ("recorder", 2, "item.added")
    assert "unlucky" in entry["error"]
    assert isinstance(engine.statistics().last_error, ValueError)
    assert engine.statistics().batch_failures == 0


async def test_reduce_processor_matches_the_engine(rig: Rig) -> None:
    """The test harness fold equals the engine's over the same events, malformed ones included."""
    engine = rig.engine(SkippingRecorder())
    await rig.stream.append(item(1), {"type": "item.added", "payload": {}}, item(5), {"type": "x"})
    await settle()
    assert (
        reduce_processor(SkippingRecorder(), rig.stream.events) == (await engine.snapshot()).state
    )


# -- versions ---------------------------------------------------------------------------------


class Doubler(Recorder):
    """Version 2 of the recorder: every item counts double."""

    contract = recorder_contract(version="2", skip=True)

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        if event.type == "item.added":
            return Tally(
                total=state.total + 2 * event.payload.n, offsets=[*state.offsets, event.offset]
            )
        return None


async def test_a_version_bump_re_reduces_without_effects(rig: Rig) -> None:
    """A new version re-reduces the log up to the old cursor (reduce only), then checkpoints."""
    first = rig.engine(SkippingRecorder())
    await rig.stream.append(item(1), {"type": "item.added", "payload": {"n": "x"}})
    await rig.stream.append({"type": "item.added", "payload": {"n": "3"}})
    await settle()
    old_cursor = rig.checkpoint().reduced_through_offset
    doubler = Doubler()
    second = rig.restart(first, doubler)
    snapshot = await second.snapshot()
    assert doubler.calls == []
    assert snapshot.state == Tally(total=8, offsets=[1, 3])
    assert snapshot.state == reduce_processor(Doubler(), rig.stream.events)
    checkpoint = rig.checkpoint()
    assert (checkpoint.reducer_version, checkpoint.reduced_through_offset) == ("2", old_cursor)
    assert Tally.model_validate_json(checkpoint.state_json) == snapshot.state


async def test_a_version_bump_heals_live_clients_with_one_delta(rig: Rig) -> None:
    """After the re-reduce, one delta takes the old projection to the new one."""
    first = rig.engine(Recorder())
    await rig.stream.append(item(1), item(2))
    await settle()
    old_projection = Tally(total=3, offsets=[1, 2]).model_dump(mode="json")
    before = len(rig.deltas())
    second = rig.restart(first, Doubler())
    await second.catch_up_from_log()
    await settle()
    (heal,) = rig.deltas()[before:]
    assert apply_delta(old_projection, heal["patch"]) == {"total": 6, "offsets": [1, 2]}
    rev, projection = await second.live_snapshot()
    assert heal["to"] == rev
    assert projection == Tally(total=6, offsets=[1, 2])


async def test_a_push_queued_behind_the_re_reduce_keeps_its_effects(rig: Rig) -> None:
    """The re-reduce stops at the old cursor, so a push already queued still runs its effects."""
    first = rig.engine(Recorder())
    await rig.stream.append(item(1))
    await settle()
    doubler = Doubler()
    rig.restart(first, doubler)
    (new,) = await rig.stream.append(item(5))
    await settle()
    assert doubler.delivered == [new.offset]
    assert rig.checkpoint().reducer_version == "2"


async def test_an_unreadable_checkpoint_is_re_reduced(rig: Rig) -> None:
    """A stored state that no longer restores (schema changed, version not bumped) is rebuilt."""
    first = rig.engine(Recorder())
    await rig.stream.append(item(4))
    await settle()
    rig.storage.write(
        "recorder",
        reducer_version="1",
        reduced_through_offset=1,
        state_json='{"total": "not a number"}',
    )
    with structlog.testing.capture_logs() as logs:
        second = rig.restart(first, Recorder())
        assert (await second.snapshot()).state == Tally(total=4, offsets=[1])
    assert "processor.checkpoint_unreadable" in [e["event"] for e in logs]


# -- the latch ---------------------------------------------------------------------------------


class Hoarder(StreamProcessor[dict[str, Any]]):
    """Keeps every payload in state: the reduce that outgrows a checkpoint."""

    contract = ProcessorContract(slug="hoarder", version="1", initial=lambda: {"blobs": []})

    def reduce(self, event: StreamEvent, state: dict[str, Any]) -> dict[str, Any]:
        return {"blobs": [*state["blobs"], event.payload["blob"]]}


async def test_a_checkpoint_over_the_ceiling_latches_the_engine(rig: Rig) -> None:
    """CheckpointTooLarge fails the batch, then every later call fails at once with it."""
    engine = rig.engine(Hoarder(), pushed=False)
    blob = "x" * (700 * 1024)
    for _ in range(3):
        await rig.stream.append({"type": "blob", "payload": {"blob": blob}})
    with pytest.raises(CheckpointTooLarge) as caught:
        await engine.catch_up_from_log()
    assert caught.value.code == "REDUCE_CHECKPOINT_TOO_LARGE"
    assert caught.value.retryable is False
    assert engine.latched_error is caught.value
    assert rig.storage.writes == 0
    reads = rig.stream.reads
    events = list(rig.stream.events)
    for attempt in (
        lambda: engine.process_event_batch(events, ScannedRange(0, 3)),
        engine.catch_up_from_log,
        engine.snapshot,
        engine.live_snapshot,
        lambda: engine.wait_until_processed(1),
        engine.revive,
    ):
        with pytest.raises(CheckpointTooLarge):
            await attempt()
    assert rig.stream.reads == reads
    # A new engine tries again (and, with the same processor, meets the same wall).
    fresh = rig.engine(Hoarder(), pushed=False)
    with pytest.raises(CheckpointTooLarge):
        await fresh.snapshot()


async def test_the_latch_rejects_pending_waiters(rig: Rig) -> None:
    """A waiter pending when the latch trips gets the latched error, not a timeout."""
    engine = rig.engine(Hoarder(), pushed=False)
    blob = "y" * (900 * 1024)
    for _ in range(3):
        await rig.stream.append({"type": "blob", "payload": {"blob": blob}})
    with pytest.raises(CheckpointTooLarge):
        await engine.wait_until_processed(3, timeout=5)
    assert engine.statistics().pending_waiters == 0


async def test_a_state_json_cannot_carry_is_refused_and_latched(rig: Rig) -> None:
    """A raw reduce returning a value JSON cannot carry fails with StateNotSerializable, latched."""

    class Sets(StreamProcessor[Any]):
        contract = ProcessorContract(slug="sets", version="1", initial=dict)

        def reduce(self, event: StreamEvent, state: Any) -> Any:
            return {"seen": {event.offset}}

    engine = rig.engine(Sets(), pushed=False)
    await rig.stream.append({"type": "t"})
    with pytest.raises(StateNotSerializable) as caught:
        await engine.catch_up_from_log()
    assert caught.value.code == "REDUCE_STATE_NOT_SERIALIZABLE"
    with pytest.raises(StateNotSerializable):
        await engine.snapshot()
    assert rig.storage.writes == 0


# -- live state -------------------------------------------------------------------------------


async def test_live_state_patches_applied_to_the_seed_reproduce_the_projection(rig: Rig) -> None:
    """A client seeded from live_snapshot and applying each delta holds the projection."""
    engine = rig.engine(Recorder())
    rev, seed = await engine.live_snapshot()
    held = seed.model_dump(mode="json")
    for n in (1, 2, 3):
        await rig.stream.append(item(n))
        await settle()
    for delta in rig.deltas():
        assert delta["key"] == "recorder"
        assert delta["from"] == rev
        held = apply_delta(held, delta["patch"])
        rev = delta["to"]
    final_rev, projection = await engine.live_snapshot()
    assert final_rev == rev
    assert held == projection.model_dump(mode="json") == {"total": 6, "offsets": [1, 3, 5]}


async def test_a_new_incarnation_forces_a_re_seed(rig: Rig) -> None:
    """A new engine's revisions never continue an old client's chain, so the client re-seeds."""
    first = rig.engine(Recorder())
    await rig.stream.append(item(1))
    await settle()
    old_rev, _ = await first.live_snapshot()
    second = rig.restart(first, Recorder())
    new_rev, _ = await second.live_snapshot()
    seen = len(rig.deltas())
    await rig.stream.append(item(2))
    await settle()
    (delta,) = rig.deltas()[seen:]
    assert new_rev != old_rev
    assert delta["from"] == new_rev != old_rev


async def test_the_engine_never_reduces_a_live_state_delta(rig: Rig) -> None:
    """A live-state delta type is never reduced or delivered, even to a "*" processor."""

    class Everything(StreamProcessor[dict[str, Any]]):
        contract = ProcessorContract(slug="all", version="1", initial=lambda: {"types": []})

        def __init__(self) -> None:
            self.calls: list[Any] = []

        def reduce(self, event: StreamEvent, state: dict[str, Any]) -> dict[str, Any]:
            return {"types": [*state["types"], event.type]}

        def process_event(self, args: ProcessEventArgs[dict[str, Any]]) -> None:
            self.calls.append(None if args.event is None else args.event.type)

    processor = Everything()
    engine = rig.engine(processor)
    await rig.stream.append({"type": "a"})
    # A durable one cannot even be appended (the streamkit. namespace is reserved) ...
    with pytest.raises(InvalidEvent, match="reserved"):
        await rig.stream.append({"type": LIVE_STATE_CHANGED, "payload": {"key": "x"}})
    # ... and an ephemeral fake is pushed and still never reduced.
    await rig.stream.append(
        {"type": LIVE_STATE_CHANGED, "payload": {"key": "x"}, "ephemeral": True}
    )
    await settle()
    assert (await engine.snapshot()).state == {"types": ["a"]}
    assert LIVE_STATE_CHANGED not in processor.calls
    assert len(rig.deltas()) >= 2  # the ephemeral fake plus at least one real delta


async def test_a_raising_projection_costs_only_its_notification(rig: Rig) -> None:
    """A projection that raises sends no delta and is reported; state and later deltas go on."""

    class Flaky(Recorder):
        broken = False

        def project_live_state(self, state: Tally) -> Any:
            if self.broken:
                raise RuntimeError("projection broke")
            return {"total": state.total}

    processor = Flaky()
    engine = rig.engine(processor)
    await rig.stream.append(item(1))
    await settle()
    processor.broken = True
    seen = len(rig.deltas())
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(2))
        await settle()
    assert rig.deltas()[seen:] == []
    (entry,) = [e for e in logs if e["event"] == "processor.projection_failed"]
    assert entry["slug"] == "recorder"
    assert "projection broke" in entry["error"]
    assert (await engine.snapshot()).state.total == 3
    processor.broken = False
    await rig.stream.append(item(3))
    await settle()
    assert rig.deltas()[-1]["patch"] == [{"op": "replace", "path": "/total", "value": 6}]


async def test_publish_live_state_sends_runtime_fields(rig: Rig) -> None:
    """A host publishing after a runtime field changed sends one delta with that change."""

    class Runtime(Recorder):
        online = 0

        def project_live_state(self, state: Tally) -> Any:
            return {"total": state.total, "online": self.online}

    processor = Runtime()
    engine = rig.engine(processor)
    engine.publish_live_state()  # before anything loaded: nothing to publish
    await engine.live_snapshot()
    processor.online = 2
    engine.publish_live_state()
    await settle()
    (delta,) = rig.deltas()
    assert delta["patch"] == [{"op": "replace", "path": "/online", "value": 2}]


async def test_persist_happens_before_the_delta(rig: Rig) -> None:
    """When a batch's delta goes out, its checkpoint is already stored."""
    written_at_delta: list[int] = []

    class Sink(BaseModel):
        pass

    original = rig.stream.append

    async def spying_append(*events: Any) -> Any:
        if any(isinstance(e, dict) and e.get("type") == LIVE_STATE_CHANGED for e in events):
            written_at_delta.append(rig.checkpoint().reduced_through_offset)
        return await original(*events)

    rig.stream.append = spying_append  # type: ignore[method-assign]
    rig.engine(Recorder())
    await original(item(1), item(2))
    await settle()
    assert written_at_delta == [2]


def test_define_contract_state_round_trip_is_what_checkpoints_restore() -> None:
    """The checkpointed JSON of a pydantic state restores to an equal state."""
    contract = define_processor_contract(slug="t", version="1", state_schema=Tally)
    state = Tally(total=3, offsets=[1])
    assert contract.state_schema is not None
    assert contract.state_schema.model_validate_json(state.model_dump_json()) == state


# -- live state nobody wants (publish_live) ---------------------------------------------------


class CountingProjection(Recorder):
    """A Recorder that counts its projections."""

    def __init__(self) -> None:
        super().__init__()
        self.projections = 0

    def project_live_state(self, state: Tally) -> Tally:
        self.projections += 1
        return state


async def test_unpublished_batches_project_diff_and_append_nothing(rig: Rig) -> None:
    """With publish_live=False batches never project and send no delta; the state is checkpointed."""
    processor = CountingProjection()
    engine = rig.engine(processor, publish_live=False)
    for n in (1, 2, 3):
        await rig.stream.append(item(n))
        await settle()
    assert processor.projections == 0
    assert rig.deltas() == []
    assert engine.live_behind
    assert rig.checkpoint().reduced_through_offset == 3


async def test_a_snapshot_of_unpublished_live_state_is_the_present(rig: Rig) -> None:
    """live_snapshot projects the present once; a client seeded there follows later deltas."""
    processor = CountingProjection()
    watched = [False]
    engine = rig.engine(processor, publish_live=lambda: watched[0])
    for n in (1, 2):
        await rig.stream.append(item(n))
        await settle()
    watched[0] = True
    rev, seed = await engine.live_snapshot()
    assert processor.projections == 1
    assert not engine.live_behind
    assert seed.model_dump(mode="json") == {"total": 3, "offsets": [1, 2]}
    held = seed.model_dump(mode="json")
    seen = len(rig.deltas())
    await rig.stream.append(item(4))
    await settle()
    (delta,) = [d for d in rig.deltas()[seen:] if d["to"] > rev]
    assert delta["from"] == rev
    assert apply_delta(held, delta["patch"]) == {"total": 7, "offsets": [1, 2, 3]}


async def test_publishing_again_continues_the_chain_from_the_last_revision_sent(rig: Rig) -> None:
    """A client holding the last revision sent before a quiet spell applies the catch-up delta."""
    watched = [True]
    engine = rig.engine(Recorder(), publish_live=lambda: watched[0])
    rev, seed = await engine.live_snapshot()
    held = seed.model_dump(mode="json")
    await rig.stream.append(item(1))
    await settle()
    for delta in rig.deltas():
        held, rev = apply_delta(held, delta["patch"]), delta["to"]
    watched[0] = False
    seen = len(rig.deltas())
    for n in (2, 3):
        await rig.stream.append(item(n))
        await settle()
    assert len(rig.deltas()) == seen
    watched[0] = True
    await rig.stream.append(item(4))
    await settle()
    (delta,) = rig.deltas()[seen:]
    assert delta["from"] == rev
    held = apply_delta(held, delta["patch"])
    assert held == (await engine.live_snapshot()).state.model_dump(mode="json")
    assert held["total"] == 10
    assert len(held["offsets"]) == 4


async def test_a_publish_predicate_that_raises_publishes(rig: Rig) -> None:
    """A raising publish_live callable is reported and taken as True: deltas still go out."""

    def broken() -> bool:
        raise RuntimeError("watcher registry gone")

    with structlog.testing.capture_logs() as logs:
        engine = rig.engine(Recorder(), publish_live=broken)
        await rig.stream.append(item(1))
        await settle()
    assert [d["to"] - d["from"] for d in rig.deltas()] == [1]
    assert any(e["event"] == "processor.publish_live_failed" for e in logs)
    assert not engine.live_behind


async def test_the_default_engine_publishes_every_batch(rig: Rig) -> None:
    """Without publish_live the engine publishes after every batch, as it always did."""
    processor = CountingProjection()
    rig.engine(processor)
    for n in (1, 2):
        await rig.stream.append(item(n))
        await settle()
    assert len(rig.deltas()) == 2
    assert processor.projections == 3  # the seed at load, then one per batch


def test_skipped_payloads_are_logged_once_per_kind_per_interval() -> None:
    """Under "skip", a thousand malformed payloads of one kind are one log line (the first,
    with its traceback) until the interval passes; the next line says how many since."""
    now = [0.0]
    lines: list[dict[str, Any]] = []
    incidents = IncidentLog(
        lambda exc, **fields: lines.append({"exc": exc, **fields}), clock=lambda: now[0]
    )
    for offset in range(1, 1001):
        incidents.skipped(("malformed", "order", 1), offset, ValueError("bad"), type="order")
    incidents.skipped(("malformed", "order", 2), 1001, ValueError("bad"), type="order")
    assert [(line["offset"], line["skipped"]) for line in lines] == [(1, 1), (1001, 1)]
    now[0] = EVERY
    incidents.skipped(("malformed", "order", 1), 1002, ValueError("bad"), type="order")
    assert (lines[-1]["skipped"], lines[-1]["first_offsets"]) == (1000, [2, 3, 4, 5, 6])


async def test_a_skipping_engine_logs_a_thousand_malformed_payloads_as_one_line(
    rig: Rig,
) -> None:
    """The engine's own fold: every skipped payload counted in statistics, one line logged."""
    engine = rig.engine(SkippingRecorder())
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(
            *({"type": "item.added", "payload": {"n": "x"}} for _ in range(1000))
        )
        await engine.wait_until_processed(1000)
    assert engine.statistics().malformed_payloads == 1000
    (line,) = [e for e in logs if e["event"] == "processor.payload_malformed"]
    assert (line["offset"], line["skipped"], line["type"]) == (1, 1, "item.added")


async def test_failures_of_effects_and_background_work_are_logged_with_their_exception(
    rig: Rig,
) -> None:
    """An effect's append refused and a background attempt that raised: each one log line
    carrying the exception itself (the host's log renders its traceback)."""

    async def attempt() -> None:
        raise ConnectionError("smtp down")

    def on_event(args: ProcessEventArgs[Tally]) -> None:
        event = args.event
        if event is not None:
            args.run_in_background(attempt)
            # One key, two bodies: the second event's effect is refused (a conflict).
            args.append(
                {"type": "item.echoed", "payload": {"n": event.offset}, "idempotency_key": "k"}
            )

    engine = rig.engine(Recorder(on_event))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1), item(2))
        await engine.wait_until_processed(2)
        await settle(0.05)
    failed = {e["event"]: e for e in logs if e.get("exc_info") is not None}
    assert isinstance(failed["processor.background_failed"]["exc_info"], ConnectionError)
    assert isinstance(failed["processor.append_failed"]["exc_info"], IdempotencyConflict)
