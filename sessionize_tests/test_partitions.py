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
    ("loads", "expected"),
    [
        # A backlog of whole days: cut every max_days days, as without loads.
        ({d: 1.0 for d in range(1, 8)}, [(1, 3), (4, 6), (7, 7)]),
        # Late events on every date, a few hundredths of a day each: one range.
        ({d: 0.02 for d in range(1, 31)}, [(1, 30)]),
        # A heavy day stands alone; the light days after it go on together.
        ({1: 0.5, 2: 5.0, 3: 0.5, 4: 0.5}, [(1, 1), (2, 2), (3, 4)]),
        # A gap of max_days days or more is not bridged, however light the days.
        ({1: 0.1, 5: 0.1, 6: 0.1}, [(1, 1), (5, 6)]),
    ],
)
def test_contiguous_ranges_count_days_worth_of_events(loads, expected):
    days = [date(2026, 1, d) for d in loads]
    weights = {date(2026, 1, d): load for d, load in loads.items()}
    got = contiguous_ranges(days, max_days=3, loads=weights)
    assert [(a.day, b.day) for a, b in got] == expected


def test_a_day_without_a_load_weighs_nothing():
    days = [date(2026, 1, d) for d in (1, 2, 3, 4, 5)]
    got = contiguous_ranges(days, max_days=2, loads={date(2026, 1, 1): 2.0})
    assert [(a.day, b.day) for a, b in got] == [(1, 5)]


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
