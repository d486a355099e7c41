"""What the manifests say is behind: read from the bookkeeping rows, whatever runs did."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENTS_MANIFEST, SESSIONS_MANIFEST
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline.manifests import (
    event_date_loads,
    event_dates_behind,
    record_absorbed,
    session_date_loads,
    session_dates_behind,
)

DAY = date(2026, 1, 10)


def _events_manifest(held: dict[tuple[date, date], int | None]) -> pa.Table:
    """events_manifest rows: an (event date, received date) input, in its event date's
    partition, -> the events version holding it."""
    rows = [
        {
            "partition_date": event_date,
            "event_date": event_date,
            "received_date": received_date,
            "ingest_version": 1,
            "run_id": "r",
            "processed_at": datetime(2026, 1, 10),
            "events_version": version,
        }
        for (event_date, received_date), version in held.items()
    ]
    return pa.Table.from_pylist(rows, schema=to_arrow_schema(EVENTS_MANIFEST.schema))


def _sessions_manifest(absorbed: dict[date, int]) -> pa.Table:
    rows = [
        {
            "partition_date": day,
            "events_version": version,
            "definition": "d",
            "run_id": "r",
            "processed_at": datetime(2026, 1, 10),
        }
        for day, version in absorbed.items()
    ]
    return pa.Table.from_pylist(rows, schema=to_arrow_schema(SESSIONS_MANIFEST.schema))


def test_a_session_date_is_behind_when_its_window_holds_a_newer_events_version(settings):
    window = session_dates_for([DAY], settings)  # the session dates DAY's events decide
    assert len(window) > 1 and DAY in window
    up_to_date = dict.fromkeys(window, 7)

    assert (
        session_dates_behind(
            _events_manifest({(DAY, DAY): 7}), _sessions_manifest(up_to_date), settings=settings
        )
        == {}
    )
    # DAY's events moved on to version 9 (a run of sessions failed, or died, after that).
    assert session_dates_behind(
        _events_manifest({(DAY, DAY): 9}), _sessions_manifest(up_to_date), settings=settings
    ) == dict.fromkeys(window, 9)
    # Only the dates that absorbed less than 9 are behind; one never computed is too.
    absorbed = {**up_to_date, window[0]: 9}
    del absorbed[window[-1]]
    assert session_dates_behind(
        _events_manifest({(DAY, DAY): 9}), _sessions_manifest(absorbed), settings=settings
    ) == dict.fromkeys(window[1:], 9)


def test_events_manifest_rows_without_a_version_ask_only_for_dates_never_computed(settings):
    later = DAY + timedelta(days=20)
    computed = dict.fromkeys(session_dates_for([DAY], settings), 3)
    behind = session_dates_behind(
        _events_manifest({(DAY, DAY): None, (later, later): None}),
        _sessions_manifest(computed),
        settings=settings,
    )
    assert behind == dict.fromkeys(session_dates_for([later], settings), -1)


def _day(n: int) -> date:
    return DAY + timedelta(days=n)


def _index(events: dict[tuple[int, int], int]) -> pa.Table:
    """batch_event_dates rows: (event day, received day) -> accepted events, at version 1."""
    rows = [
        {"received_date": _day(r), "event_date": _day(e), "events": n, "ingest_version": 1}
        for (e, r), n in events.items()
    ]
    return pa.Table.from_pylist(rows, schema=to_arrow_schema(BATCH_EVENT_DATES.schema))


def _absorbed(inputs: dict[tuple[int, int], int]) -> pa.Table:
    """events_manifest rows: (event day, received day) -> the events version holding it."""
    return _events_manifest({(_day(e), _day(r)): version for (e, r), version in inputs.items()})


# Three whole days of 1,000 events each, received on their day, and a batch received on day 3
# with 20 late events for day 0 and 10 for day 1.
THREE_DAYS = {(0, 0): 1_000, (1, 1): 1_000, (2, 2): 1_000, (0, 3): 20, (1, 3): 10}


def test_an_event_date_weighs_the_events_its_run_reads_in_typical_days():
    index = _index(THREE_DAYS)
    absorbed = _absorbed({(0, 0): 5, (1, 1): 5, (2, 2): 5})
    plans = event_dates_behind(index, absorbed)
    assert sorted(plans) == [_day(0), _day(1)]
    # The typical day is the median day: 1,010 events (days hold 1,020, 1,010 and 1,000).
    assert event_date_loads(index, plans) == {_day(0): 20 / 1_010, _day(1): 10 / 1_010}

    # A batch that changed (re-delivered) recomputes its dates: every input is read again.
    changed = absorbed.set_column(3, "ingest_version", pa.array([1, 1, 0]))
    plans = event_dates_behind(index, changed)
    assert event_date_loads(index, plans)[_day(2)] == 1_000 / 1_010


def test_a_session_date_weighs_the_events_of_its_date_it_has_not_absorbed():
    index = _index(THREE_DAYS)
    # The late batch is in events at version 6; the sessions of day 0 absorbed version 6,
    # day 1's version 5; day 2 was never computed.
    absorbed = _absorbed({(0, 0): 5, (1, 1): 5, (2, 2): 5, (0, 3): 6, (1, 3): 6})
    loads = session_date_loads(index, absorbed, _sessions_manifest({_day(0): 6, _day(1): 5}))
    assert loads == {_day(1): 10 / 1_010, _day(2): 1_000 / 1_010}


def test_an_input_keeps_its_version_until_its_date_is_written_whole(store, settings):
    def versions() -> dict[int, int]:
        rows = store.read_arrow(EVENTS_MANIFEST, partitions=[_day(0)]).to_pylist()
        return {(row["received_date"] - DAY).days: row["events_version"] for row in rows}

    def absorb(inputs: dict[int, int], version: int) -> None:
        absorbed = {_day(0): {(_day(0), _day(r)): ingest for r, ingest in inputs.items()}}
        record_absorbed(store, absorbed=absorbed, events_version=version, run_id="r")

    absorb({0: 1}, 5)
    absorb({0: 1, 3: 2}, 7)  # a late batch: the day's first batch was absorbed at 5
    assert versions() == {0: 5, 3: 7}
    index = _index({(0, 0): 1_000, (0, 3): 20})
    manifest = store.read_arrow(EVENTS_MANIFEST)
    assert session_date_loads(index, manifest, _sessions_manifest({_day(0): 5})) == {
        _day(0): 20 / 1_020
    }
    # The date is behind as a whole on its newest version.
    behind = session_dates_behind(manifest, _sessions_manifest({_day(0): 5}), settings=settings)
    assert behind[_day(0)] == 7

    absorb({0: 4, 3: 2}, 9)  # the first batch re-delivered: the date is recomputed whole
    assert versions() == {0: 9, 3: 9}
    absorb({0: 4, 3: 2, 5: 3}, 10)
    assert versions() == {0: 9, 3: 9, 5: 10}
    # The same inputs recorded again: the date was written again whole (a copy of one of its
    # ids moved to another date), so every input is held by that version.
    absorb({0: 4, 3: 2, 5: 3}, 12)
    assert versions() == {0: 12, 3: 12, 5: 12}
