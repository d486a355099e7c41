"""The idle rule, written once: when each idle state begins and when a current stretch ends."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from sessionize_assets.transforms.lifecycle_states import (
    IDLE_AFTER,
    OPEN_END,
    STATES,
    State,
    last_session_day,
    runs_out,
)

D = date(2026, 3, 10)


def test_the_states_are_stored_by_their_names_in_the_spec_order():
    assert [str(s) for s in STATES] == ["new", "active", "inactive", "dormant", "churned"]
    assert State("dormant") is State.DORMANT
    # SPEC §4: inactive after 1 idle day, dormant after 7, churned after 30.
    assert IDLE_AFTER == {State.INACTIVE: 1, State.DORMANT: 7, State.CHURNED: 30}


@pytest.mark.parametrize(
    ("state", "expected"),
    [("new", 20), ("active", 20), ("inactive", 9), ("dormant", 3), ("churned", -20)],
)
def test_the_last_session_day_of_a_stretch(state, expected):
    assert last_session_day(state=state, since=10, day=20) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("new", D + timedelta(days=4)),  # a session state lasts through the as-of day
        ("active", D + timedelta(days=4)),
        ("inactive", D + timedelta(days=5)),  # dormant begins 6 days after inactive
        ("dormant", D + timedelta(days=22)),  # churned begins 23 days after dormant
        ("churned", OPEN_END),
    ],
)
def test_a_current_stretch_runs_out_the_day_before_the_next_idle_state(state, expected):
    assert runs_out(state=state, since=D, previous_as_of=D + timedelta(days=4)) == expected
