"""SPEC §4 rules on the pure lifecycle transforms: intervals restated from an anchor, and the
snapshot moved by the interval rows that change, against a from-scratch reference."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pyarrow as pa
import pytest

from sessionize_assets.transforms.lifecycle import (
    INTERVAL_SCHEMA,
    corrected_snapshot,
    restate_intervals,
    snapshot_moves,
    states_by_day,
)
from sessionize_assets.transforms.lifecycle_states import OPEN_END, STATES
from sessionize_tests.lifecycle_reference import lifecycle_reference, reference_intervals

S = date(2026, 1, 1)
BALANCES = pa.schema(
    [("user_id", pa.string()), ("anchor", pa.date32())]
    + [("prior_state", pa.string()), ("prior_from", pa.date32())]
)


def d(n: int) -> date:
    """Day n of the test calendar, day 0 being S."""
    return S + timedelta(days=n)


def as_sets(rows) -> set[tuple]:
    """Interval rows as (user, state, valid_from, valid_to), None for an open stretch."""
    return {
        (
            r["user_id"],
            r["state"],
            r["valid_from"],
            None if r["valid_to"] == OPEN_END else r["valid_to"],
        )
        for r in rows
    }


def restate(sessions, as_of, balances=None) -> list[dict]:
    """Intervals of every user in `sessions` from day 0, or of the users in `balances`."""
    if balances is None:
        balances = [(u, S, None, None) for u in sorted({u for u, _ in sessions})]
    table = restate_intervals(
        balances=pa.Table.from_pylist(
            [dict(zip(BALANCES.names, b, strict=True)) for b in balances], BALANCES
        ),
        session_days=pa.table(
            {"user_id": [u for u, _ in sessions], "session_date": [day for _, day in sessions]}
        ),
        as_of=as_of,
    )
    return table.to_pylist()


def _moves(rows, sign, into):
    """Add the (begins, ends) of interval tuples `rows`, each counted `sign` times."""
    for _, state, since, until in rows:
        begins, ends = into.get((since, state), (0, 0))
        into[(since, state)] = (begins + sign, ends)
        if until is not None:
            key = (until + timedelta(days=1), state)
            begins, ends = into.get(key, (0, 0))
            into[key] = (begins, ends + sign)
    return into


def snapshot_from(rows, *, as_of):
    """The snapshot of interval tuples `rows`, counted from an empty one."""
    return corrected_snapshot(
        old={}, old_last=None, moves=_moves(rows, 1, {}), start=S, as_of=as_of
    )


def as_rows(counts) -> list[tuple]:
    return sorted((day, state, *values) for (day, state), values in counts.items())


def test_first_day_is_new_then_active_then_idle_states_follow_by_time(spark):
    sessions = [("u", d(0)), ("u", d(1)), ("u", d(1)), ("u", d(2)), ("r", d(5)), ("r", d(40))]
    assert as_sets(restate(sessions, d(45))) == {
        ("u", "new", d(0), d(0)),
        ("u", "active", d(1), d(2)),  # consecutive session days are one stretch
        ("u", "inactive", d(3), d(8)),
        ("u", "dormant", d(9), d(31)),
        ("u", "churned", d(32), None),
        ("r", "new", d(5), d(5)),
        ("r", "inactive", d(6), d(11)),
        ("r", "dormant", d(12), d(34)),
        ("r", "churned", d(35), d(39)),
        ("r", "active", d(40), d(40)),
        ("r", "inactive", d(41), None),  # covers the as-of day: open
    }


def test_a_stretch_before_the_anchor_continues_or_ends_the_day_before(spark):
    balances = [
        # dormant since day 2 (last session day -5): still dormant, then churned on day 25
        ("u", d(10), "dormant", d(2)),
        # active since day 8: a session on the anchor continues the stretch
        ("a", d(10), "active", d(8)),
        # inactive since day 9 (session on day 8): a session on day 10 ends it on day 9
        ("i", d(10), "inactive", d(9)),
        # no stretch before: first session on day 12 is `new`
        ("n", d(10), None, None),
        # no stretch before and no session: no interval at all
        ("z", d(10), None, None),
    ]
    sessions = [("a", d(10)), ("i", d(10)), ("n", d(12)), ("n", d(3)), ("x", d(11))]
    assert as_sets(restate(sessions, d(30), balances)) == {
        ("u", "dormant", d(2), d(24)),
        ("u", "churned", d(25), None),
        ("a", "active", d(8), d(10)),
        ("a", "inactive", d(11), d(16)),
        ("a", "dormant", d(17), None),
        ("i", "inactive", d(9), d(9)),
        ("i", "active", d(10), d(10)),
        ("i", "inactive", d(11), d(16)),
        ("i", "dormant", d(17), None),
        ("n", "new", d(12), d(12)),
        ("n", "inactive", d(13), d(18)),
        ("n", "dormant", d(19), None),
    }


def random_sessions(seed: int, *, users: int = 8, days: int = 45) -> list[tuple[str, date]]:
    """Users starting on random days, each with its own rhythm, long gaps included.

    Duplicates and days after the range are mixed in: the transform must ignore them.
    """
    rng = random.Random(seed)
    out = []
    for n in range(users):
        if n == 0:  # churns, then comes back
            active = [rng.randrange(5), rng.randrange(36, days)]
        else:
            start = rng.randrange(days)
            rate = rng.choice((0.03, 0.1, 0.3, 0.7))
            active = [start] + [k for k in range(start + 1, days + 5) if rng.random() < rate]
        out += [(f"u{n}", d(k)) for k in active]
    out += rng.sample(out, k=min(5, len(out)))
    rng.shuffle(out)
    return out


SEEDS = [1, 7, 19, 42, 2026]
N = 45


@pytest.mark.parametrize("seed", SEEDS)
def test_intervals_and_snapshot_from_scratch_match_a_full_recompute(spark, seed):
    sessions = random_sessions(seed, days=N)
    states, snapshot = lifecycle_reference(session_days=sessions, start=S, end=d(N - 1))
    intervals = as_sets(restate(sessions, d(N - 1)))
    assert {"new", "active", "inactive", "dormant", "churned"} == {s for _, s, _, _ in intervals}
    assert intervals == reference_intervals(states, end=d(N - 1))
    assert as_rows(snapshot_from(intervals, as_of=d(N - 1))) == snapshot


def test_a_late_session_moves_only_the_changed_stretches_and_days(spark):
    sessions = random_sessions(SEEDS[1], days=N)
    end = d(N - 1)
    before = as_sets(restate(sessions, end))
    old = snapshot_from(before, as_of=end)
    x = 20
    late = [*sessions, ("u0", d(x)), ("late", d(x))]
    # The touched users from the late day, continuing the stretch that covers the day before.
    balances = [("late", d(x), None, None)] + [
        ("u0", d(x), state, since)
        for user, state, since, until in before
        if user == "u0" and since <= d(x - 1) and (until is None or until >= d(x - 1))
    ]
    restated = as_sets(restate(late, end, balances))
    kept_before = {
        i for i in before if i[0] in ("u0", "late") and i[3] is not None and i[3] < d(x - 1)
    }
    old_rows = {i for i in before if i[0] in ("u0", "late")} - kept_before
    removed, added = old_rows - restated, restated - old_rows
    after = (before - removed) | added
    states, snapshot = lifecycle_reference(session_days=late, start=S, end=end)
    assert after == reference_intervals(states, end=end)
    # The snapshot, moved by what changed from the old one: only days from x on are written.
    moves = _moves(removed, -1, _moves(added, 1, {}))
    corrected = corrected_snapshot(old=old, old_last=end, moves=moves, start=S, as_of=end)
    assert min(day for day, _ in corrected) == d(x)
    merged = {**old, **corrected}
    assert as_rows(merged) == snapshot


def test_new_days_start_from_the_last_day_and_move_by_what_changed(spark):
    sessions = random_sessions(SEEDS[2], days=N)
    k = 30
    head = as_sets(restate(sessions, d(k)))
    old = snapshot_from(head, as_of=d(k))
    whole = as_sets(restate(sessions, d(N - 1)))
    moves = _moves(head - whole, -1, _moves(whole - head, 1, {}))
    corrected = corrected_snapshot(old=old, old_last=d(k), moves=moves, start=S, as_of=d(N - 1))
    assert {day for day, _ in corrected} >= {d(n) for n in range(k + 1, N)}
    _, snapshot = lifecycle_reference(session_days=sessions, start=S, end=d(N - 1))
    assert as_rows({**old, **corrected}) == snapshot


def test_nothing_moved_writes_nothing_and_every_new_day_has_five_rows():
    assert corrected_snapshot(old={}, old_last=d(3), moves={}, start=S, as_of=d(3)) == {}
    assert as_rows(corrected_snapshot(old={}, old_last=None, moves={}, start=S, as_of=d(2))) == [
        (d(n), s, 0, 0, 0) for n in range(3) for s in sorted(STATES)
    ]


def test_snapshot_moves_cancel_rows_carried_by_a_rewrite(spark):
    carried = ("u", "inactive", d(3), d(8))
    rows = [
        (*carried, -1),
        (*carried, 1),
        ("v", "churned", d(4), OPEN_END, -1),
        ("v", "churned", d(4), d(9), 1),
        ("v", "active", d(10), OPEN_END, 1),
    ]
    names = ["user_id", "state", "valid_from", "valid_to", "sign"]
    signed = pa.Table.from_pylist([dict(zip(names, row, strict=True)) for row in rows])
    assert snapshot_moves(signed) == {(d(10), "churned"): (0, 1), (d(10), "active"): (1, 0)}


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_states_by_day_gives_the_per_user_per_day_shape(spark, seed):
    sessions = random_sessions(seed, days=N)
    intervals = spark.createDataFrame(
        [tuple(r.values()) for r in restate(sessions, d(N - 1))], INTERVAL_SCHEMA
    )
    states, _ = lifecycle_reference(session_days=sessions, start=S, end=d(N - 1))
    got = states_by_day(intervals, first_date=d(10), last_date=d(N - 1)).collect()
    assert {
        (r.snapshot_date, r.user_id): (r.state, r.state_since, r.days_in_state) for r in got
    } == {key: value for key, value in states.items() if key[0] >= d(10)}
    by_user = {}
    for user, day in sessions:
        by_user.setdefault(user, set()).add(day)
    for r in got:
        days = by_user[r.user_id]
        assert r.first_session_date == min(days)
        assert r.last_session_date == max(x for x in days if x <= r.snapshot_date)
    with pytest.raises(ValueError, match="empty range"):
        states_by_day(intervals, first_date=d(3), last_date=d(2))
