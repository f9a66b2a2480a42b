"""streamkit.history: a read below a path's start names what was deleted and what archived."""

from __future__ import annotations

from streamkit.history import deleted_ranges, history_truncated


def test_the_deleted_ranges_are_what_no_segment_covers() -> None:
    """Gaps before, between and after the archived ranges, up to the path's start."""
    assert deleted_ranges(10, []) == [(1, 10)]
    assert deleted_ranges(10, [(1, 10)]) == []
    assert deleted_ranges(10, [(1, 4), (8, 10)]) == [(5, 7)]
    assert deleted_ranges(12, [(3, 4), (8, 10)]) == [(1, 2), (5, 7), (11, 12)]


def test_advice_fits_where_the_read_began() -> None:
    """Archived there: include the archive; deleted there, with an archive above: read past
    the deleted range with the archive; deleted up to the start: read after the start."""
    segments = [("a.segment", 1, 4), ("b.segment", 8, 10)]
    archived = history_truncated("/", 0, 12, segments)
    assert "of its events through 12, 5..7, 11..12 were deleted and 1..4, 8..10 are" in str(
        archived
    )
    assert str(archived).endswith(
        "include the archive (streamkit read --include-archive), or read after offset 12"
    )
    middle = history_truncated("/", 5, 12, segments)
    assert str(middle).endswith(
        "offsets 5..7 cannot be read by anyone: read after offset 7 with the archive "
        "(streamkit read --include-archive), or after offset 12"
    )
    last = history_truncated("/", 10, 12, segments)
    assert str(last).endswith("offsets 11..12 cannot be read by anyone: read after offset 12")
    assert last.details["deleted"] == [[5, 7], [11, 12]]


def test_adjacent_segments_read_as_one_archived_range() -> None:
    """Two segments 1..2 and 3..4 are said as 1..4, once."""
    refused = history_truncated("/", 0, 4, [("a.segment", 1, 2), ("b.segment", 3, 4)])
    assert "of its events through 4, 1..4 is archived in 2 segment file(s)" in str(refused)
    assert refused.details["archived"] == [[1, 4]]
