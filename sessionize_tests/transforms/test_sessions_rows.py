"""SPEC §3 on the driver: the sessions of Arrow rows equal Spark's pass, column for column."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from sessionize_assets.lake.tables import EVENTS, SESSION_QUARANTINE, SESSIONS
from sessionize_assets.transforms.attributes import UTM_FIELDS, url_campaign, url_host
from sessionize_assets.transforms.identities import stitch, stitch_rows
from sessionize_assets.transforms.sessions import (
    QUARANTINE_DETAIL,
    SESSION_EVENT_COLUMNS,
    sessions_with_quarantine,
    split_quarantine,
)
from sessionize_assets.transforms.sessions_rows import (
    SESSIONS_ROWS_SCHEMA,
    merged_session_row,
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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMES = ("session_start", "session_end", "landing_at", "exit_at", "campaign_at")


def _derived(event: dict) -> dict:
    """An event as ingestion writes it: its page's host and campaign read from its URL."""
    url = event["page_url"]
    campaign = dict(zip(UTM_FIELDS, url_campaign(url), strict=True))
    return {**event, "page_host": url_host(url), "url_campaign": campaign}


def _micros(value: datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)


def _event_rows(events: pa.Table) -> list[dict]:
    return [{**row, "_ts": _micros(row["event_ts"])} for row in events.to_pylist()]


# Events as ingestion writes them, at times that tie less often than _EVENT's (a tie with
# one of an old session's picks is not merged).
_ADDED_OR_OLD = st.tuples(
    _EVENT, st.one_of(st.sampled_from([0, 1]), st.integers(0, 299_999_999))
).map(lambda drawn: {**_derived(drawn[0]), "micros": drawn[1]})


@examples(max_examples=500, deadline=None)
@given(
    drawn=st.lists(_ADDED_OR_OLD, min_size=2, max_size=40),
    data=st.data(),
    gap=st.sampled_from([GAP, timedelta(minutes=10)]),
)
def test_a_session_merged_from_its_row_equals_the_session_of_all_its_events(drawn, data, gap):
    """Where `merged_session_row` takes the events added within the gap of one old session
    (and of no other), its row is the session the rules give all the events: every column
    but the number, which the caller gives; and the user has as many sessions as before."""
    events = _events(drawn)
    added = data.draw(
        st.lists(st.booleans(), min_size=events.num_rows, max_size=events.num_rows), label="added"
    )
    options = {"gap": gap, "max_length": MAX_LENGTH, "conversion_events": CONVERSIONS}
    before = sessions_with_quarantine_rows(
        events.filter(pa.array([not a for a in added])), **options
    )
    after = sessions_with_quarantine_rows(events, **options).to_pylist()
    rows = [row for row, was_added in zip(_event_rows(events), added, strict=True) if was_added]
    gap_us = gap // timedelta(microseconds=1)
    for user in ("u", "v"):
        theirs = [row for row in rows if row["user_id"] == user]
        olds = [
            {**s, **{name: _micros(s[name]) for name in _TIMES}}
            for s in before.to_pylist()
            if s["user_id"] == user
        ]
        # What the caller finds: the old sessions (their chains) within the gap of an added one.
        ends = [s[QUARANTINE_DETAIL]["chain_end"] if s["is_quarantined"] else None for s in olds]
        near = [
            s
            for s, chain_end in zip(olds, ends, strict=True)
            if any(
                s["session_start"] - gap_us
                <= row["_ts"]
                <= (s["session_end"] if chain_end is None else _micros(chain_end)) + gap_us
                for row in theirs
            )
        ]
        if not theirs or len(near) != 1:
            continue
        merged = merged_session_row(near[0], theirs, **options)
        if merged is None:
            continue
        [got] = pa.Table.from_pylist([merged], schema=SESSIONS_ROWS_SCHEMA).to_pylist()
        expected = [s for s in after if s["session_id"] == got["session_id"]]
        assert len(expected) == 1
        assert {**got, "session_number": None} == {**expected[0], "session_number": None}
        assert sum(s["user_id"] == user for s in after) == len(olds)


def test_a_late_page_view_before_a_session_becomes_its_landing_page_and_campaign():
    """One merge worked by hand: a page view with campaign parameters 20 minutes before a
    session of two screens and a campaign event; the landing page, the channel's source and
    the start move, the campaign stays the event's."""
    base = {"user_id": "u", "event_name": None, "page_path": None, "page_referrer": None}
    base |= {"referrer_host": None, "device_type": "ios", "os_name": "iOS", "micros": 0}
    screen = {**base, "event_type": "screen", "page_url": None, "campaign": None}
    campaign = {name: None for name in UTM_FIELDS} | {"utm_source": "news", "utm_medium": "email"}
    old = [
        {**screen, "event_id": "b", "minute": 30},
        {**screen, "event_id": "c", "minute": 40, "campaign": campaign},
    ]
    page = {**base, "event_type": "page", "campaign": None, "device_type": "web"}
    late = {**page, "event_id": "a", "minute": 10, "page_url": "https://x.org/?utm_source=ads"}
    options = {"gap": GAP, "max_length": MAX_LENGTH, "conversion_events": CONVERSIONS}
    [session] = sessions_with_quarantine_rows(
        _events([_derived(e) for e in old]), **options
    ).to_pylist()
    merged = merged_session_row(
        {**session, **{name: _micros(session[name]) for name in _TIMES}},
        _event_rows(_events([_derived(late)])),
        **options,
    )
    everything = _events([_derived(e) for e in (*old, late)])
    [expected] = sessions_with_quarantine_rows(everything, **options).to_pylist()
    assert merged is not None
    [got] = pa.Table.from_pylist([merged], schema=SESSIONS_ROWS_SCHEMA).to_pylist()
    assert got == expected
    assert (got["landing_page_url"], got["utm_source"], got["device_type"]) == (
        "https://x.org/?utm_source=ads",
        "news",
        "web",
    )
    assert got["event_count"] == 3 and got["page_views"] == 3 and got["first_event_id"] == "a"
