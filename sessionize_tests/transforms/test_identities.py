"""SPEC §3c rules on the pure identity transforms."""

from __future__ import annotations

from datetime import date, datetime

from sessionize_assets.transforms.identities import identities_from_events, stitch

EVENT_SCHEMA = "event_id string, anonymous_id string, segment_user_id string, event_ts timestamp"


def identities_of(spark, events: list[tuple]) -> dict[str, tuple]:
    rows = identities_from_events(spark.createDataFrame(events, EVENT_SCHEMA)).collect()
    return {
        r.anonymous_id: (r.user_id, r.identified_at, r.identified_date, r.first_event_id)
        for r in rows
    }


def test_the_latest_sign_in_maps_a_device_and_the_earliest_dates_it(spark):
    found = identities_of(
        spark,
        [
            ("e1", "d1", None, datetime(2026, 1, 1, 8)),  # anonymous: not an identity
            ("e3", "d1", "bob", datetime(2026, 1, 3, 9)),
            ("e2", "d1", "alice", datetime(2026, 1, 2, 23, 59)),
            ("e4", None, "carol", datetime(2026, 1, 4)),  # no device
        ],
    )
    assert found == {"d1": ("bob", datetime(2026, 1, 2, 23, 59), date(2026, 1, 2), "e2")}


def test_a_tie_in_time_goes_to_the_greater_event_id(spark):
    at = datetime(2026, 1, 2, 10)
    found = identities_of(spark, [("b", "d1", "bob", at), ("a", "d1", "alice", at)])
    assert found == {"d1": ("bob", at, date(2026, 1, 2), "a")}


def test_stitch_maps_anonymous_keys_and_keeps_the_others(spark):
    sessions = spark.createDataFrame(
        [("s1", "d1"), ("s2", "d2"), ("s3", "bob")], "session_id string, user_id string"
    )
    identities = spark.createDataFrame([("d1", "bob")], "anonymous_id string, user_id string")
    stitched = {r.session_id: r.stitched_user_id for r in stitch(sessions, identities).collect()}
    assert stitched == {"s1": "bob", "s2": "d2", "s3": "bob"}
    assert stitch(sessions, None).where("stitched_user_id = user_id").count() == 3
