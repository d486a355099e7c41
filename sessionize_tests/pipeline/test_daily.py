"""The summary tables kept exact (SPEC §9): what is behind, and what an update writes, on a
lake written row by row. All of it runs on the driver: the store's Spark session may not start."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import (
    ARRIVALS,
    DAILY_SESSIONS,
    EVENTS,
    LANDING_BATCHES,
    SESSIONS,
)
from sessionize_assets.pipeline.daily import (
    daily_behind,
    sources_behind,
    update_arrivals,
    update_daily,
)
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.completeness import COMPLETE, PROVISIONAL

START = date(2026, 1, 1)
NOON = datetime(2026, 1, 1, 12, tzinfo=UTC)
SETTINGS = Settings(lateness_horizon_days=3, lateness_window_days=2, completeness_target=0.5)


def day(n: int) -> date:
    return START + timedelta(days=n)


def _no_spark():
    raise AssertionError("the summaries are kept on the driver: no Spark session")


@pytest.fixture
def lake(tmp_path: Path) -> EmbeddedDeltaStore:
    return EmbeddedDeltaStore(
        spark=_no_spark, lake=Location.of(tmp_path / "lake"), driver_write_bytes=1 << 20
    )


def put(store: EmbeddedDeltaStore, spec: TableSpec, rows: list[dict], *, dates: list) -> None:
    """Make the partitions `dates` of `spec` hold exactly `rows` (missing columns null)."""
    schema = to_arrow_schema(spec.schema)
    table = pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows], schema)
    store.replace_partitions_arrow(spec, table, partitions=dates)


def ingested(store, *days: date) -> None:
    put(
        store,
        LANDING_BATCHES,
        [
            {
                "received_date": d,
                "fingerprint": "-",
                "files": "[]",
                "ingest_version": 0,
                "ingested_at": NOON,
            }
            for d in days
        ],
        dates=list(days),
    )


def events(store, on: date, received: list[date]) -> None:
    rows = [
        {
            "event_id": f"{on}-{i}",
            "user_id": "u",
            "event_ts": NOON,
            "event_date": on,
            "received_at": NOON,
            "received_date": r,
            "source_file": "f",
        }
        for i, r in enumerate(received)
    ]
    put(store, EVENTS, rows, dates=[on])


def sessions(store, on: date, users: list[str], *, channel: str = "Direct") -> None:
    rows = [
        {
            "session_id": f"{on}-{i}",
            "user_id": user,
            "session_date": on,
            "session_start": NOON,
            "session_end": NOON,
            "duration_seconds": 0.5,
            "event_count": 1,
            "session_number": 1,
            "is_quarantined": False,
            "page_views": 1,
            "conversions": 0,
            "channel": channel,
            "is_engaged": False,
            "stitched_user_id": user,
        }
        for i, user in enumerate(users)
    ]
    put(store, SESSIONS, rows, dates=[on])


def test_arrivals_follow_the_events_files(lake):
    events(lake, day(0), [day(0), day(0), day(2)])
    events(lake, day(1), [day(1)])
    assert update_arrivals(lake, run_id="r1") == {day(0): {0: 2, 2: 1}, day(1): {0: 1}}
    assert sources_behind(lake, ARRIVALS).dates == []
    assert update_arrivals(lake, run_id="r2") == {}  # nothing changed: nothing counted
    events(lake, day(1), [day(1), day(4)])  # a late event: day 1's files change
    assert update_arrivals(lake, run_id="r3") == {day(1): {0: 1, 3: 1}}
    put(lake, EVENTS, [], dates=[day(0)])  # every event of day 0 erased
    assert update_arrivals(lake, run_id="r4") == {day(0): {}}
    assert lake.read_arrow(ARRIVALS).to_pylist() == [
        {"event_date": day(1), "lag_days": 0, "events": 1},
        {"event_date": day(1), "lag_days": 3, "events": 1},
    ]
    assert sources_behind(lake, ARRIVALS).dates == []


def test_daily_sessions_follow_their_sessions_and_the_status(lake):
    # Day 1's two events: one on time, one a day late. H = 3, W = 2, q = 0.5.
    events(lake, day(1), [day(1), day(2)])
    ingested(lake, day(1), day(2))
    update_arrivals(lake, run_id="r0")
    sessions(lake, day(1), ["a", "b", "a"])
    first = update_daily(lake, settings=SETTINGS, run_id="r1")
    # R = day 2: no date is H = 3 days old yet, so g = H and every date is provisional.
    assert (first.recomputed, first.restated, first.grace.days) == ([day(1)], [], 3)
    (row,) = (
        lake.read_arrow(DAILY_SESSIONS).filter(pa.compute.field("channel") == "(all)").to_pylist()
    )
    assert (row["sessions"], row["users"], row["status"], row["expected_completeness"]) == (
        3,
        2,
        PROVISIONAL,
        1.0,
    )
    assert daily_behind(lake, SETTINGS).dates == []

    # R moves to day 4 with no new event: day 1 (3 days old) is a reference date, half its
    # events on time (F(0) = 0.5 >= q): g = 0, and day 1 turns complete with its figures kept.
    ingested(lake, day(3), day(4))
    behind = daily_behind(lake, SETTINGS)
    assert (behind.figures.dates, sorted(behind.status)) == ([], [day(1)])
    second = update_daily(lake, settings=SETTINGS, run_id="r2")
    assert (second.recomputed, second.restated, second.grace.days) == ([], [day(1)], 0)
    rows = lake.read_arrow(DAILY_SESSIONS).to_pylist()
    assert {
        (r["channel"], r["sessions"], r["status"], r["expected_completeness"]) for r in rows
    } == {
        ("(all)", 3, COMPLETE, 1.0),  # F(R - day 1) = F(3) = 1.0
        ("Direct", 3, COMPLETE, 1.0),
    }

    # Stitching relabels a session (its file is rewritten): the date is aggregated again.
    sessions(lake, day(1), ["a", "b", "b"], channel="Email")
    third = update_daily(lake, settings=SETTINGS, run_id="r3")
    assert (third.recomputed, third.restated) == ([day(1)], [])
    assert {r["channel"] for r in lake.read_arrow(DAILY_SESSIONS).to_pylist()} == {"(all)", "Email"}

    # An erasure empties the date: its rows go too.
    put(lake, SESSIONS, [], dates=[day(1)])
    assert update_daily(lake, settings=SETTINGS, run_id="r4").recomputed == [day(1)]
    assert lake.read_arrow(DAILY_SESSIONS).num_rows == 0
    assert daily_behind(lake, SETTINGS).dates == []


def test_rows_committed_without_their_manifest_are_counted_again(lake):
    """A run that died between the table's commit and the manifest's left the date behind:
    the manifest, not what the table holds, says so."""
    sessions(lake, day(0), ["a"])
    ingested(lake, day(0))
    update_daily(lake, settings=SETTINGS, run_id="r1")
    sessions(lake, day(0), ["a", "b"])
    # Whatever the dead run committed to the table, the manifest still has the old files.
    put(lake, DAILY_SESSIONS, [], dates=[day(0)])
    assert daily_behind(lake, SETTINGS).figures.dates == [day(0)]
    assert update_daily(lake, settings=SETTINGS, run_id="r2").recomputed == [day(0)]
    assert {r["users"] for r in lake.read_arrow(DAILY_SESSIONS).to_pylist()} == {2}
