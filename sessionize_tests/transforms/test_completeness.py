"""SPEC §9's grace period and status, clause by clause, on hand-made arrival curves."""

from datetime import date, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionize_assets.transforms.completeness import (
    COMPLETE,
    PROVISIONAL,
    Lateness,
    grace_period,
)

R = date(2026, 3, 31)
RULE = Lateness(horizon_days=28, window_days=28, target=0.99)


def ago(days: int) -> date:
    return R - timedelta(days=days)


def test_reference_dates_are_h_to_h_plus_w_minus_one_days_old():
    assert RULE.reference_dates(R) == (ago(55), ago(28))


def test_no_reference_event_gives_the_horizon_and_full_shares():
    # Events only on dates younger than H, and one older than H + W: neither is a reference.
    arrivals = {(ago(3), 0): 10, (ago(3), 2): 5, (ago(56), 40): 7}
    period = grace_period(arrivals, latest_received=R, lateness=RULE)
    assert (period.days, period.reference_events) == (28, 0)
    assert period.status(ago(27)) == PROVISIONAL
    assert period.status(ago(28)) == COMPLETE
    assert period.expected_completeness(ago(0)) == 1.0


def test_the_smallest_lag_reaching_the_target():
    # 100 reference events: 90 on time, 9 a day late (F(1) = 0.99), 1 forty days late.
    arrivals = {(ago(30), 0): 90, (ago(31), 1): 9, (ago(50), 40): 1}
    period = grace_period(arrivals, latest_received=R, lateness=RULE)
    assert period.days == 1
    assert period.completeness(0) == 0.9
    assert period.completeness(1) == 0.99
    assert period.completeness(39) == 0.99
    assert period.completeness(40) == 1.0
    assert [period.status(ago(n)) for n in (0, 1, 2)] == [PROVISIONAL, COMPLETE, COMPLETE]
    assert period.expected_completeness(ago(0)) == 0.9
    assert period.expected_completeness(ago(45)) == 1.0


def test_a_target_of_one_waits_for_the_latest_reference_event():
    arrivals = {(ago(30), 0): 90, (ago(50), 40): 1}
    rule = Lateness(horizon_days=28, window_days=28, target=1.0)
    assert grace_period(arrivals, latest_received=R, lateness=rule).days == 40


def test_events_received_before_their_date_count_from_lag_zero():
    # The future tolerance: an event of tomorrow in today's batch has a lag of -1.
    arrivals = {(ago(30), -1): 99, (ago(30), 3): 1}
    period = grace_period(arrivals, latest_received=R, lateness=RULE)
    assert period.days == 0
    assert period.completeness(-1) == 0.99
    # A date after R: F(-1), and provisional whatever g is.
    assert period.status(R + timedelta(days=1)) == PROVISIONAL
    assert period.expected_completeness(R + timedelta(days=1)) == 0.99


def test_only_reference_dates_count():
    # Old and young dates' late events do not move g.
    arrivals = {(ago(29), 0): 100, (ago(2), 1): 1_000, (ago(60), 50): 1_000}
    assert grace_period(arrivals, latest_received=R, lateness=RULE).days == 0


def test_a_later_r_moves_the_reference_window():
    # At R both dates are reference dates (28 and 55 days old): F(0) = 0.99.
    arrivals = {(ago(28), 5): 1, (ago(55), 0): 99}
    assert grace_period(arrivals, latest_received=R, lateness=RULE).days == 0
    # A day later ago(55) is 56 days old, past the window: only the late event is left.
    later = grace_period(arrivals, latest_received=R + timedelta(days=1), lateness=RULE)
    assert (later.days, later.first_reference) == (5, ago(54))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"horizon_days": -1}, "horizon"),
        ({"window_days": 0}, "window"),
        ({"target": 0.0}, "target"),
        ({"target": 1.5}, "target"),
    ],
)
def test_settings_out_of_range_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Lateness(**{"horizon_days": 28, "window_days": 28, "target": 0.99, **fields})


curves = st.dictionaries(
    st.tuples(st.integers(0, 90).map(ago), st.integers(-1, 89)),
    st.integers(0, 50),
    max_size=40,
)


@given(
    curves,
    st.integers(0, 40),
    st.integers(1, 40),
    st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
def test_against_the_definition_read_literally(arrivals, horizon, window, target):
    rule = Lateness(horizon_days=horizon, window_days=window, target=target)
    period = grace_period(arrivals, latest_received=R, lateness=rule)
    # SPEC §9 word for word: the reference events, F, and the smallest k >= 0.
    lags = [
        lag
        for (day, lag), events in arrivals.items()
        for _ in range(events)
        if horizon <= (R - day).days < horizon + window
    ]

    def f(k: int) -> float:
        return sum(lag <= k for lag in lags) / len(lags)

    expected = horizon if not lags else next(k for k in range(200) if f(k) >= target)
    assert period.days == expected
    for n in range(-1, 95):
        day = ago(n)
        assert period.status(day) == (COMPLETE if n >= expected else PROVISIONAL)
        assert period.expected_completeness(day) == (f(n) if lags else 1.0)
