"""What the manifests say is behind: read from the bookkeeping rows, whatever runs did."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.tables import EVENTS_MANIFEST, SESSIONS_MANIFEST
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline.manifests import session_dates_behind

DAY = date(2026, 1, 10)


def _events_manifest(held: dict[date, int | None]) -> pa.Table:
    rows = [
        {
            "partition_date": day,
            "event_date": day,
            "received_date": day,
            "ingest_version": 1,
            "run_id": "r",
            "processed_at": datetime(2026, 1, 10),
            "events_version": version,
        }
        for day, version in held.items()
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
            _events_manifest({DAY: 7}), _sessions_manifest(up_to_date), settings=settings
        )
        == {}
    )
    # DAY's events moved on to version 9 (a run of sessions failed, or died, after that).
    assert session_dates_behind(
        _events_manifest({DAY: 9}), _sessions_manifest(up_to_date), settings=settings
    ) == dict.fromkeys(window, 9)
    # Only the dates that absorbed less than 9 are behind; one never computed is too.
    absorbed = {**up_to_date, window[0]: 9}
    del absorbed[window[-1]]
    assert session_dates_behind(
        _events_manifest({DAY: 9}), _sessions_manifest(absorbed), settings=settings
    ) == dict.fromkeys(window[1:], 9)


def test_events_manifest_rows_without_a_version_ask_only_for_dates_never_computed(settings):
    later = DAY + timedelta(days=20)
    computed = dict.fromkeys(session_dates_for([DAY], settings), 3)
    behind = session_dates_behind(
        _events_manifest({DAY: None, later: None}), _sessions_manifest(computed), settings=settings
    )
    assert behind == dict.fromkeys(session_dates_for([later], settings), -1)
