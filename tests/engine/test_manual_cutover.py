"""A manual cutover: the new version, built, follows the serving one until an operator cuts over.

With ``cutover="manual"`` (the contract's, or the engine's ``cutover=``
override the host's config gives) a version built in the shadow does not
take over at the serving cursor: it holds there, reducing what the serving
version processes meanwhile, and says so (``awaiting_cutover`` in its
rebuild progress, one ``processor.cutover.waiting`` log line). ``cut_over()``
then makes the same fenced cutover as the automatic one and answers its
offset; asked during the build, the cutover follows as soon as it is built.
"""

from __future__ import annotations

import pytest
import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, Tally, item, recorder_contract
from support.waits import until

from streamkit import StreamEvent
from streamkit.engine import _shadow
from streamkit.errors import InvalidRequest


class ManualDoubler(Recorder):
    """Version 2 of the recorder, cut over by hand: every item counts double."""

    contract = recorder_contract(version="2")

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        return Tally(
            total=state.total + 2 * event.payload.n, offsets=[*state.offsets, event.offset]
        )


@pytest.fixture(autouse=True)
def quick_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shadow, "FOLLOW_EVERY", 0.02)


async def test_a_built_version_follows_the_serving_one_until_an_operator_cuts_over(
    rig: Rig,
) -> None:
    first = rig.engine(Recorder())
    await rig.stream.append(*(item(1) for _ in range(20)))
    await settle()

    doubler = ManualDoubler()
    second = rig.engine(doubler, pushed=False, cutover="manual")
    with structlog.testing.capture_logs() as logs:
        building = second.catch_up_from_log()
        await until(lambda: (second.statistics().rebuild or {}).get("awaiting_cutover"))
    assert [e["event"] for e in logs if e["event"] == "processor.cutover.waiting"] == [
        "processor.cutover.waiting"
    ]
    assert rig.checkpoint().reducer_version == "1"  # version 1 serves meanwhile

    # Version 1 goes on serving; the built version follows its cursor.
    await rig.stream.append(*(item(1) for _ in range(5)))
    await settle()
    served = rig.checkpoint().reduced_through_offset
    await until(lambda: (second.statistics().rebuild or {}).get("through") == served)
    assert not building.done()
    assert doubler.delivered == []

    rig.stream.engines.remove(first)  # version 1's host is fenced by the cutover in a host
    cut = await second.cut_over()
    await building
    assert cut == served
    assert (rig.checkpoint().reducer_version, rig.checkpoint().cutover_offset) == ("2", cut)
    assert (await second.snapshot()).state.total == 50
    assert second.statistics().rebuild is None
    with pytest.raises(InvalidRequest, match="serves already"):
        await second.cut_over()

    rig.stream.engines.append(second)
    [later] = await rig.stream.append(item(1))
    await settle()
    assert doubler.delivered == [later.offset]  # effects for events after the cutover only


async def test_a_cutover_asked_for_during_the_build_follows_once_it_is_built(rig: Rig) -> None:
    first = rig.engine(Recorder())
    await rig.stream.append(*(item(1) for _ in range(10)))
    await settle()
    rig.stream.engines.remove(first)
    second = rig.engine(ManualDoubler(), pushed=False, cutover="manual")
    cut = await second.cut_over()  # the build starts here and cuts over when done
    assert cut == rig.checkpoint().reduced_through_offset
    assert rig.checkpoint().reducer_version == "2"


async def test_an_automatic_cutover_is_not_asked_for(rig: Rig) -> None:
    first = rig.engine(Recorder())
    await rig.stream.append(item(1))
    await settle()
    with pytest.raises(InvalidRequest, match="automatic") as refused:
        await first.cut_over()
    assert refused.value.details["reason"] == "automatic"


def test_the_contract_may_ask_for_a_manual_cutover() -> None:
    from streamkit import define_processor_contract
    from streamkit.errors import InvalidContract

    contract = define_processor_contract(
        slug="s", version="2", state_schema=Tally, cutover="manual"
    )
    assert contract.cutover == "manual"
    with pytest.raises(InvalidContract, match="cutover must be"):
        define_processor_contract(slug="s", version="2", state_schema=Tally, cutover="later")  # type: ignore[arg-type]
