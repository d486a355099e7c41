"""SPEC §4 recomputed from scratch in plain Python, day by day, to check the Spark snapshot.

Nothing here imports the pipeline: it takes every session day there is and applies the rules
as written, with no previous balance to carry.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta

STATES = ("new", "active", "inactive", "dormant", "churned")

UserStates = dict[tuple[date, str], tuple[str, date, int]]
SnapshotRow = tuple[date, str, int, int, int]
Interval = tuple[str, str, date, date | None]  # user, state, valid_from, valid_to (None: open)


def state_on(day: date, sessions: set[date]) -> str | None:
    """The user's state at the end of `day`, None before their first session."""
    first = min(sessions)
    if first > day:
        return None
    if first == day:
        return "new"
    if day in sessions:
        return "active"
    idle = (day - max(d for d in sessions if d <= day)).days
    if idle <= 6:
        return "inactive"
    if idle <= 29:
        return "dormant"
    return "churned"


def lifecycle_reference(
    *, session_days: Iterable[tuple[str, date]], start: date, end: date
) -> tuple[UserStates, list[SnapshotRow]]:
    """Per-user (state, state_since, days_in_state) by (day, user), and the snapshot rows.

    States are walked from the earliest session day, so a run that began before `start`
    keeps its true state_since.
    """
    by_user: dict[str, set[date]] = {}
    for user, day in session_days:
        by_user.setdefault(user, set()).add(day)
    earliest = min([start, *(min(days) for days in by_user.values())])

    states: UserStates = {}
    rows: list[SnapshotRow] = []
    yesterday: dict[str, tuple[str, date]] = {}
    day = earliest
    while day <= end:
        today: dict[str, tuple[str, date]] = {}
        for user, sessions in by_user.items():
            state = state_on(day, sessions)
            if state is None:
                continue
            before = yesterday.get(user)
            since = before[1] if before is not None and before[0] == state else day
            today[user] = (state, since)
            if day >= start:
                states[(day, user)] = (state, since, (day - since).days + 1)
        if day >= start:
            for state in STATES:
                now = {u for u, (s, _) in today.items() if s == state}
                then = {u for u, (s, _) in yesterday.items() if s == state}
                rows.append((day, state, len(now), len(now - then), len(then - now)))
        yesterday = today
        day += timedelta(days=1)
    return states, sorted(rows)


def reference_intervals(states: UserStates, *, end: date) -> set[Interval]:
    """The stretches of `lifecycle_reference`'s states: each user's run of days in one state,
    open (valid_to None) for the one that covers `end`."""
    out: set[Interval] = set()
    for (day, user), (state, since, _) in states.items():
        following = states.get((day + timedelta(days=1), user))
        if day == end:
            out.add((user, state, since, None))
        elif following is None or following[0] != state:
            out.add((user, state, since, day))
    return out
