"""Reading some event types only: patterns, and a filtered page's proof."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamkit import InvalidRequest, open_log
from streamkit.log import _types
from streamkit.log._types import read_matching, type_matcher


def test_a_pattern_is_an_exact_type_or_a_prefix_ending_in_a_star() -> None:
    """order.placed matches itself; order.* its family; * everything."""
    exact = type_matcher(["order.placed"])
    assert exact("order.placed")
    assert not exact("order.placed.v2")
    family = type_matcher(["order.*", "user.joined"])
    assert family("order.shipped")
    assert family("user.joined")
    assert not family("user.left")
    assert type_matcher(["*"])("anything")


@pytest.mark.parametrize("patterns", [[], ["a*b"], [" "], ["x" * 300], ["*"] * 51])
def test_a_bad_type_filter_is_a_coded_refusal(patterns: list[str]) -> None:
    """No patterns, a star inside, blank, too long, too many: INVALID_REQUEST, nothing read."""
    with pytest.raises(InvalidRequest, match="nothing was read"):
        type_matcher(patterns)


async def test_a_filtered_page_proves_what_it_looked_at(tmp_path: Path) -> None:
    """Matches up to the limit; scanned_through_offset is where the next read starts; no gaps."""
    async with open_log(tmp_path / "t.db") as log:
        stream = log.stream("/")
        await stream.append(
            *({"type": "order.placed" if n % 3 == 0 else "noise"} for n in range(30))
        )
        wanted = type_matcher(["order.*"])
        page = await read_matching(stream.read, 0, 4, wanted)
        assert [e.offset for e in page.events] == [1, 4, 7, 10]
        assert (page.scanned_through_offset, page.at_head) == (10, False)
        rest = await read_matching(stream.read, page.scanned_through_offset, 100, wanted)
        assert [e.offset for e in rest.events] == list(range(13, 31, 3))
        assert (rest.scanned_through_offset, rest.at_head) == (30, True)
        last = await read_matching(stream.read, 27, 1, wanted)
        assert [e.offset for e in last.events] == [28]
        assert (last.scanned_through_offset, last.at_head) == (28, False)


async def test_a_rare_type_costs_a_bounded_scan_per_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_SCANNED events looked at, the read returns what it has and where it got to."""
    monkeypatch.setattr(_types, "MAX_SCANNED", 50)
    async with open_log(tmp_path / "t.db") as log:
        stream = log.stream("/")
        await stream.append(*({"type": "noise"} for _ in range(120)), {"type": "rare"})
        wanted = type_matcher(["rare"])
        after, pages = 0, 0
        while True:
            page = await read_matching(stream.read, after, 10, wanted)
            pages += 1
            if page.events:
                break
            assert not page.at_head
            after = page.scanned_through_offset
        assert [e.offset for e in page.events] == [121]
        assert pages == 3
