"""SPEC §4's states, and the idle rule: the one place that says when each idle state begins.

A user is `new` on their first session day and `active` on each later one; after their last
session they become `inactive`, `dormant` and `churned` a fixed number of idle days later. Every
engine asks this module: the Spark column (`last_session_on`), the driver's day numbers
(`last_session_day`) and the end of a current stretch (`runs_out`).
"""

from __future__ import annotations

from datetime import date, timedelta
from enum import StrEnum

from pyspark.sql import Column
from pyspark.sql import functions as F

# valid_to of the stretch a user is in on the as-of day (Kimball's far-future end date).
OPEN_END = date(9999, 12, 31)


class State(StrEnum):
    """A user's lifecycle state, stored as its lower-case name."""

    NEW = "new"
    ACTIVE = "active"
    INACTIVE = "inactive"
    DORMANT = "dormant"
    CHURNED = "churned"


STATES: tuple[State, ...] = tuple(State)
# The states of a day with a session.
SESSION_STATES = (State.NEW, State.ACTIVE)
# The idle rule (SPEC §4): idle days after the last session on which each idle state begins,
# in the order they follow one another.
IDLE_AFTER: dict[State, int] = {State.INACTIVE: 1, State.DORMANT: 7, State.CHURNED: 30}


def last_session_on(*, state: Column, valid_from: Column, day: Column) -> Column:
    """The user's latest session day on or before `day`, for the stretch (state, valid_from)
    that covers `day`: stretches are maximal, so an idle one began a fixed number of days
    after that session."""
    latest = F.when(state.isin(*SESSION_STATES), day)
    for idle, after in IDLE_AFTER.items():
        latest = latest.when(state == idle.value, F.date_sub(valid_from, after))
    return latest


# Days an idle state lasts before the next begins: None for the last, which never ends.
_IDLE_DAYS: dict[State, int | None] = {
    state: (following - after if following is not None else None)
    for (state, after), following in zip(
        IDLE_AFTER.items(), [*list(IDLE_AFTER.values())[1:], None], strict=True
    )
}


def last_session_day(*, state: str, since: int, day: int) -> int:
    """`last_session_on` for one stretch, on day numbers (a `State` is its stored string)."""
    return day if state in SESSION_STATES else since - IDLE_AFTER[State(state)]


def runs_out(*, state: str, since: date, previous_as_of: date) -> date:
    """The last day of a current stretch (in `state` since `since`, as of `previous_as_of`) if
    no session comes: the day before the next idle state begins (far future for the last)."""
    if state in SESSION_STATES:
        return previous_as_of
    lasts = _IDLE_DAYS[State(state)]
    return OPEN_END if lasts is None else since + timedelta(days=lasts - 1)
