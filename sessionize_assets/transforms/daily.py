"""SPEC §9's two small tables as aggregations of the big ones, in Arrow on the driver:
`daily_sessions` from `sessions`, `arrivals` from `events`.

Both read a few columns of the dates a run changed and write a few rows a date, so they need
no Spark job. Every figure is a whole count, except the duration, which is summed exactly: in
whole microseconds (what a session's timestamps hold), divided once. A float sum would depend
on the order of the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

# The `channel` of the row that holds a date's sessions of every channel together.
ALL_CHANNELS = "(all)"
# The `sessions` columns the daily figures are computed from.
DAILY_SOURCE_COLUMNS = (
    "session_date",
    "channel",
    "stitched_user_id",
    "is_engaged",
    "conversions",
    "page_views",
    "duration_seconds",
    "is_quarantined",
)
DAILY_FIGURES = (
    "sessions",
    "users",
    "engaged_sessions",
    "converting_sessions",
    "page_views",
    "conversions",
    "duration_seconds",
    "quarantined_sessions",
)
MICROS = 1_000_000


def daily_figures(sessions: pa.Table, *, statuses: Mapping[date, tuple[str, float]]) -> pa.Table:
    """One row per (session date, channel) with a session, and one per date for `(all)`, with
    the figures of SPEC §9 and each date's (status, expected completeness) from `statuses`
    (which must hold every date of `sessions`). Sorted by date, then channel."""
    flags = pa.table(
        {
            "session_date": sessions["session_date"],
            "channel": sessions["channel"],
            "stitched_user_id": sessions["stitched_user_id"],
            "engaged": _count(pc.equal(sessions["is_engaged"], True)),
            "converting": _count(pc.greater_equal(sessions["conversions"], 1)),
            "page_views": sessions["page_views"],
            "conversions": sessions["conversions"],
            "micros": pc.cast(
                pc.round(pc.multiply(sessions["duration_seconds"], float(MICROS))), pa.int64()
            ),
            "quarantined": _count(pc.equal(sessions["is_quarantined"], True)),
        }
    )
    aggregations = [
        ("session_date", "count", pc.CountOptions(mode="all")),
        ("stitched_user_id", "count_distinct"),
        ("engaged", "sum"),
        ("converting", "sum"),
        ("page_views", "sum"),
        ("conversions", "sum"),
        ("micros", "sum"),
        ("quarantined", "sum"),
    ]
    by_channel = flags.group_by(["session_date", "channel"], use_threads=False).aggregate(
        aggregations
    )
    everything = flags.group_by(["session_date"], use_threads=False).aggregate(aggregations)
    everything = everything.append_column(
        "channel", pa.array([ALL_CHANNELS] * everything.num_rows, pa.string())
    )
    rows = pa.concat_tables(
        [_named(by_channel), _named(everything.select(by_channel.column_names))]
    )
    days = rows["session_date"].to_pylist()
    missing = sorted(set(days) - set(statuses))
    if missing:
        raise ValueError(f"no status for session dates {[str(d) for d in missing[:5]]}")
    rows = rows.append_column(
        "status", pa.array([statuses[day][0] for day in days], pa.string())
    ).append_column(
        "expected_completeness", pa.array([statuses[day][1] for day in days], pa.float64())
    )
    return rows.sort_by([("session_date", "ascending"), ("channel", "ascending")])


def _count(condition: pa.ChunkedArray) -> pa.ChunkedArray:
    """1 where `condition` holds, else 0 (null counts as not)."""
    return pc.cast(pc.fill_null(condition, False), pa.int64())


def _named(aggregated: pa.Table) -> pa.Table:
    """The aggregation's columns under SPEC §9's names, the duration in seconds."""
    return pa.table(
        {
            "session_date": aggregated["session_date"],
            "channel": aggregated["channel"],
            "sessions": aggregated["session_date_count"],
            "users": aggregated["stitched_user_id_count_distinct"],
            "engaged_sessions": aggregated["engaged_sum"],
            "converting_sessions": aggregated["converting_sum"],
            "page_views": aggregated["page_views_sum"],
            "conversions": aggregated["conversions_sum"],
            "duration_seconds": pc.divide(
                pc.cast(aggregated["micros_sum"], pa.float64()), float(MICROS)
            ),
            "quarantined_sessions": aggregated["quarantined_sum"],
        }
    )


def arrival_counts(events: pa.Table) -> pa.Table:
    """`arrivals`' rows: per event date and lag (`received_date - event_date`, days), the
    accepted events of `events` (its `event_date` and `received_date` columns), sorted."""
    lags = pc.days_between(events["event_date"], events["received_date"])
    counted = (
        pa.table({"event_date": events["event_date"], "lag_days": pc.cast(lags, pa.int32())})
        .group_by(["event_date", "lag_days"], use_threads=False)
        .aggregate([("lag_days", "count", pc.CountOptions(mode="all"))])
    )
    return pa.table(
        {
            "event_date": counted["event_date"],
            "lag_days": counted["lag_days"],
            "events": counted["lag_days_count"],
        }
    ).sort_by([("event_date", "ascending"), ("lag_days", "ascending")])
