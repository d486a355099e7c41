"""SPEC §3 on the driver: the sessions of Arrow rows equal Spark's pass, column for column."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from sessionize_assets.lake.tables import EVENTS, SESSION_QUARANTINE, SESSIONS
from sessionize_assets.transforms.attributes import UTM_FIELDS
from sessionize_assets.transforms.identities import stitch, stitch_rows
from sessionize_assets.transforms.sessions import (
    SESSION_EVENT_COLUMNS,
    sessions_with_quarantine,
    split_quarantine,
)
from sessionize_assets.transforms.sessions_rows import (
    SESSIONS_ROWS_SCHEMA,
    sessions_with_quarantine_rows,
    split_quarantine_rows,
)

START = datetime(2026, 1, 4, 21)
GAP = timedelta(minutes=30)
MAX_LENGTH = timedelta(hours=1)
CONVERSIONS = ("Order Completed", "Signed Up")
EVENT_SCHEMA = to_arrow_schema(StructType([EVENTS.schema[name] for name in SESSION_EVENT_COLUMNS]))

_TEXT = st.sampled_from([None, "", "a", "B", "https://shop.example/p?utm_source=x"])
_CAMPAIGN = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {name: st.sampled_from([None, "ads", "CPC", "Email"]) for name in UTM_FIELDS}
    ),
)
_EVENT = st.fixed_dictionaries(
    {
        "user_id": st.sampled_from(["u", "v"]),
        # Minutes on a grid that hits the gap and the cap exactly, with microseconds (ties
        # in time are broken by the event id): mostly four hours across midnight, where
        # chains run past the cap, else two days.
        "minute": st.one_of(st.integers(0, 48), st.integers(0, 576)).map(lambda m: m * 5),
        "micros": st.sampled_from([0, 0, 1, 999_999]),
        "event_id": st.text("abcAB9é", min_size=1, max_size=3),
        "event_type": st.sampled_from(["page", "screen", "track", "identify", None]),
        "event_name": st.sampled_from([None, "Order Completed", "Signed Up", "Tapped"]),
        "page_url": _TEXT,
        "page_path": _TEXT,
        "page_referrer": _TEXT,
        "page_host": st.sampled_from([None, "shop.example", "google.com"]),
        "referrer_host": st.sampled_from([None, "shop.example", "google.com", "t.co", "x.org"]),
        "campaign": _CAMPAIGN,
        "url_campaign": _CAMPAIGN,
        "device_type": st.sampled_from([None, "ios", "web"]),
        "os_name": st.sampled_from([None, "iOS"]),
    }
)


def _events(drawn: list[dict]) -> pa.Table:
    rows, seen = [], set()
    for event in drawn:
        if event["event_id"] in seen:  # ids are unique in `events`
            continue
        seen.add(event["event_id"])
        at = START + timedelta(minutes=event.pop("minute"), microseconds=event.pop("micros"))
        rows.append({**event, "event_ts": at, "event_date": at.date()})
    return pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)


# Spark's pass takes a second or two an example.
@examples(
    max_examples=20,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    drawn=st.lists(_EVENT, min_size=20, max_size=60),
    dates=st.sampled_from([None, [date(2026, 1, 4)], [date(2026, 1, 5), date(2026, 1, 6)]]),
    gap=st.sampled_from([GAP, timedelta(minutes=10)]),
)
def test_the_sessions_of_rows_on_the_driver_equal_sparks(spark, drawn, dates, gap):
    """Chains, the cap and quarantine, the attributes, the channel, the session id and
    number, the dates kept, the label stitching gives and the split into the two tables: the
    driver gives Spark's rows, with its types."""
    events = _events(drawn)
    options = {
        "gap": gap,
        "max_length": MAX_LENGTH,
        "conversion_events": CONVERSIONS,
        "session_dates": dates,
    }
    in_spark = sessions_with_quarantine(spark.createDataFrame(events), **options)
    on_driver = sessions_with_quarantine_rows(events, **options)
    assert on_driver.schema == SESSIONS_ROWS_SCHEMA
    # The same columns and types (Spark's plan also knows some are never null).
    assert in_spark.schema.simpleString() == from_arrow_schema(on_driver.schema).simpleString()
    # Stitched (the device `u` signed in as `person`) and split, as a run commits them.
    identities = pa.table({"anonymous_id": ["u"], "user_id": ["person"]})
    sessions, quarantine = split_quarantine(stitch(in_spark, spark.createDataFrame(identities)))
    sessions_rows, quarantine_rows = split_quarantine_rows(stitch_rows(on_driver, identities))
    for table, frame in ((SESSIONS, sessions), (SESSION_QUARANTINE, quarantine)):
        assert frame.schema.fieldNames() == table.schema.fieldNames()
    assert sessions_rows.schema == to_arrow_schema(SESSIONS.schema)
    assert quarantine_rows.schema == to_arrow_schema(SESSION_QUARANTINE.schema)
    for rows, frame in ((sessions_rows, sessions), (quarantine_rows, quarantine)):
        spark_rows = [row.asDict(recursive=True) for row in frame.collect()]
        assert _ordered(_naive(rows.to_pylist())) == _ordered(spark_rows)


def _naive(rows: list[dict]) -> list[dict]:
    """Arrow's UTC times as Spark collects them in its UTC session: naive."""

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, datetime):
            return value.replace(tzinfo=None)
        return value

    return [plain(row) for row in rows]


def _ordered(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda row: (row["user_id"], row["session_start"]))
