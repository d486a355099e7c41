"""The diff of a sessions run on the driver equals Spark's, and so does its summary."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.pipeline.corrections import (
    DIFF_ROWS_SCHEMA,
    diff_session_rows,
    diff_sessions,
)
from sessionize_assets.pipeline.sessions_diff import EventsRead, summarise, summarise_rows

START = datetime(2026, 1, 4, 9)
# A session id is a hash of its user and start: its user and date come with it.
_KEYS = {
    "s1": ("u", date(2026, 1, 4)),
    "s2": ("u", date(2026, 1, 5)),
    "s3": ("v", date(2026, 1, 4)),
}
_SESSION = st.fixed_dictionaries(
    {
        # Few ids: old and new rows share ids, and old ones repeat (writers that raced), with
        # a few columns to differ on.
        "session_id": st.sampled_from(list(_KEYS)),
        "minutes": st.sampled_from([5, 30]),
        "is_quarantined": st.booleans(),
        "utm_source": st.sampled_from([None, "ads"]),
        "stitched_user_id": st.sampled_from(["u", "person"]),
    }
)
_BASE = {name: None for name in SESSIONS.schema.fieldNames()}


def _rows(drawn: list[dict]) -> pa.Table:
    rows = []
    for session in drawn:
        minutes = session.pop("minutes")
        user, day = _KEYS[session["session_id"]]
        rows.append(
            {
                **_BASE,
                **session,
                "user_id": user,
                "session_date": day,
                "event_count": 1,
                "session_start": START,
                "session_end": START + timedelta(minutes=minutes),
                "duration_seconds": minutes * 60.0,
                "session_number": 1,
                "page_views": 0,
                "conversions": 0,
                "is_engaged": minutes > 10,
            }
        )
    return pa.Table.from_pylist(rows, schema=to_arrow_schema(SESSIONS.schema))


@examples(
    max_examples=20,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    old=st.lists(_SESSION, max_size=6),
    new=st.lists(_SESSION, max_size=4, unique_by=lambda session: session["session_id"]),
)
def test_the_diff_of_rows_on_the_driver_equals_sparks(spark, old, new):
    """Changed, added, removed and repeated sessions; the label stitching gives is not a
    change. The per-date summary and the changed pairs agree too."""
    old_rows, new_rows = _rows(old), _rows(new)
    in_spark = diff_sessions(spark.createDataFrame(old_rows), spark.createDataFrame(new_rows))
    on_driver = diff_session_rows(old_rows, new_rows)
    assert on_driver.schema == DIFF_ROWS_SCHEMA
    assert sorted(map(_naive, on_driver.to_pylist()), key=repr) == sorted(
        (row.asDict() for row in in_spark.collect()), key=repr
    )
    read = EventsRead(events=7, users=2)
    flagged = sum(1 for row in new_rows.to_pylist() if row["is_quarantined"])
    expected = summarise(in_spark, events=read, sessions=spark.createDataFrame(new_rows))
    got = summarise_rows(on_driver, events=read, flagged=flagged)
    assert got.changes == expected.changes
    assert got.changed_pairs == sorted(expected.changed_pairs or [])
    assert (got.flagged, got.events_read, got.users_read) == (expected.flagged, 7, 2)


def _naive(row: dict) -> dict:
    """Arrow's UTC times as Spark collects them in its UTC session."""
    return {
        name: value.replace(tzinfo=None) if isinstance(value, datetime) else value
        for name, value in row.items()
    }
