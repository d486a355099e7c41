"""SPEC §9's daily figures and arrival curve as aggregations, on hand-made rows."""

from datetime import date

import pyarrow as pa
import pytest

from sessionize_assets.transforms.daily import ALL_CHANNELS, arrival_counts, daily_figures

D1, D2 = date(2026, 2, 1), date(2026, 2, 2)
SESSIONS = pa.table(
    {
        "session_date": pa.array([D1, D1, D1, D2], pa.date32()),
        "channel": ["Direct", "Email", "Direct", "Email"],
        # Two sessions of one stitched user on D1: one user.
        "stitched_user_id": ["u1", "u1", "u2", None],
        "is_engaged": [True, False, None, True],
        "conversions": pa.array([2, 0, None, 1], pa.int64()),
        "page_views": pa.array([3, 1, None, 0], pa.int64()),
        "duration_seconds": [0.1, 0.2, 1e-06, 7.0],
        "is_quarantined": [False, True, False, False],
    }
)
STATUSES = {D1: ("complete", 0.995), D2: ("provisional", 0.5)}


def test_a_row_per_channel_and_one_for_all():
    rows = daily_figures(SESSIONS, statuses=STATUSES).to_pylist()
    assert [(r["session_date"], r["channel"]) for r in rows] == [
        (D1, ALL_CHANNELS),
        (D1, "Direct"),
        (D1, "Email"),
        (D2, ALL_CHANNELS),
        (D2, "Email"),
    ]
    every, direct = rows[0], rows[1]
    assert every == {
        "session_date": D1,
        "channel": ALL_CHANNELS,
        "sessions": 3,
        "users": 2,  # u1 twice, u2
        "engaged_sessions": 1,  # a null is not engaged
        "converting_sessions": 1,
        "page_views": 4,
        "conversions": 2,
        # 0.1 + 0.2 + 0.000001 in whole microseconds: not 0.30000100000000003.
        "duration_seconds": 0.300001,
        "quarantined_sessions": 1,
        "status": "complete",
        "expected_completeness": 0.995,
    }
    assert (direct["sessions"], direct["users"], direct["page_views"]) == (2, 2, 3)
    # A session without a stitched id counts in sessions, not in users.
    assert (rows[3]["sessions"], rows[3]["users"], rows[3]["status"]) == (1, 0, "provisional")


def test_the_figures_do_not_depend_on_the_rows_order():
    reversed_rows = SESSIONS.take(pa.array(range(SESSIONS.num_rows - 1, -1, -1)))
    assert daily_figures(reversed_rows, statuses=STATUSES) == daily_figures(
        SESSIONS, statuses=STATUSES
    )


def test_a_date_without_a_status_is_an_error():
    with pytest.raises(ValueError, match="2026-02-02"):
        daily_figures(SESSIONS, statuses={D1: ("complete", 1.0)})


def test_arrivals_count_each_event_date_by_lag():
    events = pa.table(
        {
            "event_date": pa.array([D2, D1, D1, D2, D2], pa.date32()),
            "received_date": pa.array([D2, D2, D1, D1, date(2026, 3, 4)], pa.date32()),
        }
    )
    assert arrival_counts(events).to_pylist() == [
        {"event_date": D1, "lag_days": 0, "events": 1},
        {"event_date": D1, "lag_days": 1, "events": 1},
        {"event_date": D2, "lag_days": -1, "events": 1},
        {"event_date": D2, "lag_days": 0, "events": 1},
        {"event_date": D2, "lag_days": 30, "events": 1},
    ]
