"""What a processor's state needs from the log: ``retain_from``, stored with every checkpoint.

Retention keeps every event at or after the least of each processor's
cursor + 1 and its state's ``retain_from`` (docs/retention.md). The engine
asks the processor at each checkpoint write, on the state being written, and
a wrong answer stops the processor rather than let history go it needs.
"""

from __future__ import annotations

import pytest
from support.engine import Recorder, Rig, Tally, item

from streamkit import RetainFromInvalid
from streamkit.processor import retain_of


class Oldest(Recorder):
    """Needs the log from the first offset it folded an odd amount at (until an even one)."""

    def retain_from(self, state: Tally) -> int | None:
        odd = [o for o in state.offsets if o % 2]
        return odd[0] if odd else None


async def test_each_checkpoint_stores_what_its_state_needs(rig: Rig) -> None:
    """The stored retain_from is the state's own answer at every write, None included."""
    engine = rig.engine(Oldest(), pushed=False)
    await rig.stream.append(item(2), item(3))
    await engine.catch_up_from_log()
    stored = rig.checkpoint()
    assert (stored.reduced_through_offset, stored.retain_from) == (2, 1)


async def test_the_default_says_nothing_and_is_never_called(rig: Rig) -> None:
    """A processor that does not override it stores None, and costs no call."""
    assert retain_of(Recorder()) is None
    assert retain_of(Oldest()) is not None
    engine = rig.engine(Recorder(), pushed=False)
    await rig.stream.append(item(1))
    await engine.catch_up_from_log()
    assert rig.checkpoint().retain_from is None


@pytest.mark.parametrize("answer", [-1, True, "4", 2.5, RuntimeError("boom")])
async def test_a_wrong_answer_latches_the_engine_and_writes_nothing(
    rig: Rig, answer: object
) -> None:
    """Not None or an int >= 0, or raising: RetainFromInvalid, latched, the checkpoint unmoved."""

    class Wrong(Recorder):
        def retain_from(self, state: Tally) -> int | None:
            if isinstance(answer, BaseException):
                raise answer
            return answer  # type: ignore[return-value]

    engine = rig.engine(Wrong(), pushed=False)
    await rig.stream.append(item(1))
    with pytest.raises(RetainFromInvalid) as caught:
        await engine.catch_up_from_log()
    assert caught.value.code == "RETAIN_FROM_INVALID"
    assert "the checkpoint was not written" in caught.value.message
    assert not caught.value.retryable
    assert rig.checkpoint() is None
    with pytest.raises(RetainFromInvalid):
        await engine.snapshot()  # latched: it fails at once until a new engine is built
