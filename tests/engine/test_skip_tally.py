"""What a version skipped is counted once, kept with its checkpoint, and weighed at a cutover.

A processor that chose ``skip`` moves past a malformed payload or an event
its reduce raises on; each is counted in its version's tally, written in the
transaction of the next checkpoint (:mod:`streamkit.engine._skip_tally`). A
restarted engine goes on from the kept tally, never counting an event
twice. A version built in the shadow that skipped more events than the
version it replaces holds its automatic cutover for an operator; one that
skipped no more cuts over by itself.
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from streamkit.testing import settle
from support.engine import Rig, SkippingRecorder, Tally, item, recorder_contract
from support.waits import until

from streamkit import EventDefinition, StreamEvent, define_processor_contract
from streamkit.engine import SkipTally, _shadow


class PickyV2(SkippingRecorder):
    """Version 2, skipping: its reduce raises on every odd item."""

    contract = recorder_contract(version="2", skip=True)

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        if event.type == "item.added" and event.payload.n % 2:
            raise ValueError(f"odd item {event.payload.n}")
        return super().reduce(event, state)


class SameV2(SkippingRecorder):
    """Version 2, skipping exactly what version 1 skipped (a malformed payload)."""

    contract = recorder_contract(version="2", skip=True)


def malformed() -> dict[str, object]:
    return {"type": "item.added", "payload": {"n": "not a number"}}


@pytest.fixture(autouse=True)
def quick_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shadow, "FOLLOW_EVERY", 0.02)


async def test_a_skip_is_kept_with_the_checkpoint_and_a_restart_goes_on_counting(
    rig: Rig,
) -> None:
    first = rig.engine(SkippingRecorder())
    await rig.stream.append(item(1), malformed(), item(2))
    await settle()
    assert first.statistics().malformed_payloads == 1
    (kept,) = rig.storage.incidents("recorder").values()
    assert json.loads(kept)["malformed_by_type"] == [
        {"type": "item.added", "version": 1, "count": 1, "first_offsets": [2]}
    ]

    again = rig.restart(first, SkippingRecorder())
    await again.catch_up_from_log()
    stats = again.statistics()
    assert (stats.malformed_payloads, stats.last_malformed["offset"]) == (1, 2)  # type: ignore[index]
    await rig.stream.append(malformed())
    await settle()
    assert again.statistics().malformed_payloads == 2


def test_an_event_folded_again_is_not_counted_again() -> None:
    """A retried batch or a replayed stretch folds the same events: counted once."""
    tally = SkipTally()
    for _ in range(2):
        tally.malformed_payload(5, "item.added", 1, {"offset": 5})
        tally.reduce_failure(7, "item.added", {"offset": 7})
        tally.drop(8)
    assert (tally.malformed, tally.reduce_failures, tally.dropped, tally.changes) == (1, 1, 1, 3)
    restored = SkipTally()
    restored.restore(tally.record())
    restored.reduce_failure(7, "item.added", {"offset": 7})
    assert restored.record() == tally.record()


async def test_a_version_that_skipped_more_than_the_serving_one_holds_its_cutover(
    rig: Rig,
) -> None:
    first = rig.engine(SkippingRecorder())
    await rig.stream.append(*(item(n) for n in range(1, 11)))
    await settle()
    served = rig.checkpoint().reduced_through_offset

    second = rig.engine(PickyV2(), pushed=False)
    building = second.catch_up_from_log()
    await until(lambda: (second.statistics().rebuild or {}).get("awaiting_cutover"))
    held = (second.statistics().rebuild or {})["cutover_held"]
    assert "version 2 skipped 5 event(s)" in held
    assert "5 'item.added' event(s) its reduce raised on from offset 1" in held
    assert "where version 1 skipped 0" in held
    assert rig.checkpoint().reducer_version == "1"

    rig.stream.engines.remove(first)
    assert await second.cut_over() == served  # an operator may still decide it
    await building
    assert rig.checkpoint().reducer_version == "2"
    kept = {v: json.loads(r) for v, r in rig.storage.incidents("recorder").items()}
    assert kept["2"]["reduce_failures"] == 5


async def test_a_version_that_skipped_what_the_serving_one_skipped_cuts_over_by_itself(
    rig: Rig,
) -> None:
    first = rig.engine(SkippingRecorder())
    await rig.stream.append(item(1), malformed(), item(2))
    await settle()
    second = rig.restart(first, SameV2())
    await second.catch_up_from_log()
    assert rig.checkpoint().reducer_version == "2"
    assert second.statistics().rebuild is None


class Renamed(BaseModel):
    """``n`` renamed and a required field added, under the same definition version."""

    count: int
    sku: str


class RenamedV2(SkippingRecorder):
    """Version 2, skipping, whose model no longer reads a single stored item."""

    contract = define_processor_contract(
        slug="recorder",
        version="2",
        description="counts items under a model that reads none of them",
        state_schema=Tally,
        events={"item.added": EventDefinition(description="an item", payload_schema=Renamed)},
        consumes=["item.added"],
        on_malformed="skip",
    )

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        return Tally(total=state.total + event.payload.count, offsets=[*state.offsets])


async def test_a_model_that_reads_none_of_the_stored_payloads_never_cuts_over_by_itself(
    rig: Rig,
) -> None:
    """The attack of issue 54: a field renamed, a required one added, skip chosen. The
    build skips all 20 items as malformed and waits, with the reason, for an operator."""
    rig.engine(SkippingRecorder())
    await rig.stream.append(*(item(n) for n in range(20)))
    await settle()
    second = rig.engine(RenamedV2(), pushed=False)
    second.catch_up_from_log()
    await until(lambda: (second.statistics().rebuild or {}).get("awaiting_cutover"))
    held = (second.statistics().rebuild or {})["cutover_held"]
    assert "20 malformed 'item.added' v1 payload(s) from offset 1" in held
    assert second.statistics().malformed_payloads == 20
    assert rig.checkpoint().reducer_version == "1"
