"""The lake's closing lines (`sessionize replay`, `sessionize rebuild`): true to the tables."""

from __future__ import annotations

import re

from pyspark.sql import functions as F

from sessionize_assets.lake.summary import describe_lake
from sessionize_assets.lake.tables import SESSIONS
from sessionize_tests import driver
from sessionize_tests.harness import day

PAGE = {"type": "page", "properties": {"url": "https://shop.example/"}}
SEARCH = {
    "type": "page",
    "properties": {"url": "https://shop.example/", "referrer": "https://www.google.com/"},
}
CHANNEL_LINE = re.compile(r"^    (.+?)\s+([\d,]+)\s+\d+%, (\d+)% engaged$")


def _by_channel(lines: list[str]) -> dict[str, tuple[int, str]]:
    """The sessions and the engaged share of each channel line of `describe_lake`."""
    at = next(i for i, line in enumerate(lines) if line.startswith("  sessions by channel ("))
    found = {}
    for line in lines[at + 1 :]:
        match = CHANNEL_LINE.match(line)
        assert match, line
        found[match[1]] = (int(match[2].replace(",", "")), f"{match[3]}%")
    return found


def _truth(pipeline) -> dict[str, tuple[int, str]]:
    rows = (
        pipeline.store.read(SESSIONS)
        .groupBy("channel")
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("is_engaged").cast("int")).alias("e"))
        .collect()
    )
    return {r.channel or "(none)": (r.n, f"{(r.e or 0) / r.n:.0%}") for r in rows}


def test_the_sessions_by_channel_equal_the_sessions_whether_the_daily_figures_are_current_or_not(
    pipeline, monkeypatch
):
    """Summed from `daily_sessions` where it counted the sessions there now, counted from
    `sessions` on the dates behind it (a batch whose summaries have not run yet): either way,
    the lines equal the sessions table."""
    pipeline.land(
        day(0),
        [
            ("a1", "ann", "2026-01-10 09:00", PAGE),
            ("a2", "ann", "2026-01-10 09:01", PAGE),
            ("b1", "bob", "2026-01-10 10:00", SEARCH),
            ("c1", "cy", "2026-01-10 11:00"),
        ],
    )
    pipeline.process(day(0))
    current = describe_lake(pipeline.store, lake=pipeline.settings.lake)
    assert _by_channel(current) == _truth(pipeline)

    # Day 1's batch extends ann's and bob's sessions of day 0 and adds one, its summaries not
    # run: both dates are behind `daily_sessions`.
    monkeypatch.setattr(driver, "summarise", lambda *args, **kwargs: None)
    pipeline.land(
        day(1),
        [
            ("b2", "bob", "2026-01-10 10:05", PAGE),
            ("c2", "cy", "2026-01-10 11:20", SEARCH),
            ("d1", "dee", "2026-01-11 08:00", SEARCH),
        ],
    )
    pipeline.process(day(1))
    behind = describe_lake(pipeline.store, lake=pipeline.settings.lake)
    assert _by_channel(behind) == _truth(pipeline)
    assert _by_channel(behind) != _by_channel(current)
