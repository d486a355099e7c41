"""Partition ranges: contiguous runs of days, and the lifecycle's range."""

from __future__ import annotations

from datetime import date

import pytest

from sessionize_assets.partitions import contiguous_ranges, lifecycle_range


@pytest.mark.parametrize(
    ("days", "max_days", "expected"),
    [
        ([], 5, []),
        ([1, 2, 3], 5, [(1, 3)]),
        ([1, 3, 9], 5, [(1, 3), (9, 9)]),
        ([1, 2, 3, 4, 5, 6], 3, [(1, 3), (4, 6)]),
        ([5, 1, 5], 1, [(1, 1), (5, 5)]),
    ],
)
def test_contiguous_ranges(days, max_days, expected):
    as_dates = [date(2026, 1, d) for d in days]
    got = contiguous_ranges(as_dates, max_days=max_days)
    assert [(a.day, b.day) for a, b in got] == [(a, b) for a, b in expected]


def test_contiguous_ranges_without_bridging_gaps_break_at_a_missing_day():
    as_dates = [date(2026, 1, d) for d in (1, 2, 3, 5, 6, 7, 8)]
    got = contiguous_ranges(as_dates, max_days=3, bridge_gaps=False)
    assert [(a.day, b.day) for a, b in got] == [(1, 3), (5, 7), (8, 8)]


@pytest.mark.parametrize(
    ("reported", "through", "latest", "failed_from", "expected"),
    [
        ([], None, None, None, None),  # nothing ingested yet
        ([], None, 3, None, (1, 3)),  # first run: from the start date
        ([], 3, 3, None, None),  # up to date
        ([], 3, 5, None, (4, 5)),  # new days only
        ([9], 5, 5, None, None),  # a change past the latest batch waits for that batch
        # Sessions from the 2nd materialized again: the run corrects what changed and reports
        # every day from the 2nd, so that none is left unsynced.
        ([2, 9], 5, 5, None, (2, 5)),
        ([4], 3, 5, None, (4, 5)),  # ... with the days not computed yet
        ([2], 3, 5, None, (2, 5)),
        ([], 5, 5, 3, (3, 5)),  # a failed run's days are reported again
        ([2], 3, 5, 1, (1, 5)),
    ],
)
def test_lifecycle_range(reported, through, latest, failed_from, expected):
    def day(n):
        return None if n is None else date(2026, 1, n)

    got = lifecycle_range(
        sessions_reported=[day(n) for n in reported],
        through=day(through),
        latest=day(latest),
        start=day(1),
        failed_from=day(failed_from),
    )
    assert got == (None if expected is None else (day(expected[0]), day(expected[1])))
