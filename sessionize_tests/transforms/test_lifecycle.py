"""SPEC §4 rules on the pure lifecycle transform, and its accumulation against a full recompute."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pytest

from sessionize_assets.transforms.lifecycle import (
    SNAPSHOT_SCHEMA,
    STATE_SCHEMA,
    STATES,
    advance_lifecycle,
    lifecycle_counts,
)
from sessionize_tests.lifecycle_reference import lifecycle_reference

S = date(2026, 1, 1)


def d(n: int) -> date:
    """Day n of the test calendar, day 0 being S."""
    return S + timedelta(days=n)


def run(spark, sessions, first, last, previous=()):
    """States and counts for first..last from `previous` rows (states cached: one shuffle each)."""
    prev = spark.createDataFrame(list(previous), STATE_SCHEMA)
    days = spark.createDataFrame(list(sessions), "user_id string, session_date date")
    states = advance_lifecycle(
        previous=prev, session_days=days, first_date=first, last_date=last
    ).cache()
    try:
        state_rows = sorted(states.collect(), key=lambda r: (r.snapshot_date, r.user_id))
        counts = lifecycle_counts(states=states, previous=prev, first_date=first, last_date=last)
        count_rows = sorted(tuple(r) for r in counts.collect())
    finally:
        states.unpersist()
    return state_rows, count_rows


def ages(state_rows):
    return {
        (r.snapshot_date, r.user_id): (r.state, r.state_since, r.days_in_state) for r in state_rows
    }


def moves(count_rows, day):
    """{state: (users, entered, exited)} for one day, zero rows left out."""
    return {s: tuple(rest) for (dd, s, *rest) in count_rows if dd == day and any(rest)}


def test_first_day_is_new_then_active_the_next(spark):
    states, counts = run(spark, [("u", d(0)), ("u", d(1)), ("u", d(1)), ("v", d(1))], d(0), d(1))
    assert ages(states) == {
        (d(0), "u"): ("new", d(0), 1),
        (d(1), "u"): ("active", d(1), 1),
        (d(1), "v"): ("new", d(1), 1),
    }
    assert {(r.user_id, r.first_session_date, r.last_session_date) for r in states} == {
        ("u", d(0), d(0)),
        ("u", d(0), d(1)),
        ("v", d(1), d(1)),
    }
    assert moves(counts, d(0)) == {"new": (1, 1, 0)}
    assert moves(counts, d(1)) == {"new": (1, 1, 1), "active": (1, 1, 0)}


def test_idle_days_move_inactive_dormant_churned_and_back(spark):
    # u: one session on day 0 then nothing; r: new on day 5, churns, returns on day 40
    states, counts = run(spark, [("u", d(0)), ("r", d(5)), ("r", d(40))], d(0), d(41))
    by_day = ages(states)
    assert [by_day[(d(n), "u")] for n in (1, 6, 7, 29, 30, 31, 41)] == [
        ("inactive", d(1), 1),
        ("inactive", d(1), 6),
        ("dormant", d(7), 1),
        ("dormant", d(7), 23),
        ("churned", d(30), 1),
        ("churned", d(30), 2),
        ("churned", d(30), 12),
    ]
    assert [by_day[(d(n), "r")] for n in (34, 35, 39, 40, 41)] == [
        ("dormant", d(12), 23),
        ("churned", d(35), 1),
        ("churned", d(35), 5),
        ("active", d(40), 1),
        ("inactive", d(41), 1),
    ]
    assert {r.last_session_date for r in states if r.user_id == "u"} == {d(0)}
    assert (d(4), "r") not in by_day
    assert moves(counts, d(1)) == {"new": (0, 0, 1), "inactive": (1, 1, 0)}
    assert moves(counts, d(6)) == {"inactive": (2, 1, 0), "new": (0, 0, 1)}
    assert moves(counts, d(7)) == {"inactive": (1, 0, 1), "dormant": (1, 1, 0)}
    assert moves(counts, d(30)) == {"dormant": (1, 0, 1), "churned": (1, 1, 0)}
    assert moves(counts, d(40)) == {"churned": (1, 0, 1), "active": (1, 1, 0)}
    assert moves(counts, d(41)) == {
        "churned": (1, 0, 0),
        "active": (0, 0, 1),
        "inactive": (1, 1, 0),
    }
    assert [(day, s) for day, s, *_ in counts] == [
        (d(n), s) for n in range(42) for s in sorted(STATES)
    ]


def test_age_in_state_continues_from_the_previous_balance(spark):
    previous = [
        # dormant since day -3 (idle 7 then), 3 days in state at day -1
        (d(-1), "u", "dormant", d(-20), d(-10), d(-3), 3),
        # active on day -1, and again on day 0: one run
        (d(-1), "a", "active", d(-5), d(-1), d(-2), 2),
        # inactive on day -1, active on day 0: a new run
        (d(-1), "i", "inactive", d(-5), d(-2), d(-1), 1),
        # another day's row of `previous` is not the balance and is ignored
        (d(-2), "x", "new", d(-2), d(-2), d(-2), 1),
    ]
    states, counts = run(spark, [("a", d(0)), ("i", d(0))], d(0), d(20), previous)
    by_day = ages(states)
    assert by_day[(d(0), "u")] == ("dormant", d(-3), 4)
    assert by_day[(d(19), "u")] == ("dormant", d(-3), 23)
    assert by_day[(d(20), "u")] == ("churned", d(20), 1)
    assert by_day[(d(0), "a")] == ("active", d(-2), 3)
    assert by_day[(d(1), "a")] == ("inactive", d(1), 1)
    assert by_day[(d(0), "i")] == ("active", d(0), 1)
    assert {u for _, u in by_day} == {"u", "a", "i"}
    first = {
        r.user_id: (r.first_session_date, r.last_session_date)
        for r in states
        if r.snapshot_date == d(5)
    }
    assert first == {"u": (d(-20), d(-10)), "a": (d(-5), d(0)), "i": (d(-5), d(0))}
    assert moves(counts, d(0)) == {"dormant": (1, 0, 0), "active": (2, 1, 0), "inactive": (0, 0, 1)}


def test_every_day_has_five_rows_even_with_no_users(spark):
    states, counts = run(spark, [], d(0), d(2))
    assert states == []
    assert counts == [(d(n), s, 0, 0, 0) for n in range(3) for s in sorted(STATES)]
    assert [f.name for f in SNAPSHOT_SCHEMA] == [
        "snapshot_date",
        "state",
        "users",
        "entered",
        "exited",
    ]


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


def check_against_reference(states, counts, sessions, first, last):
    want_states, want_counts = lifecycle_reference(session_days=sessions, start=first, end=last)
    assert ages(states) == want_states
    assert counts == want_counts


SEEDS = [1, 7, 19, 42, 2026]
N = 45


@pytest.fixture(scope="module")
def whole(spark):
    """States and counts of days 0..N-1 in one call, per seed, computed once for the module."""
    done = {}

    def get(seed):
        if seed not in done:
            done[seed] = run(spark, random_sessions(seed, days=N), d(0), d(N - 1))
        return done[seed]

    return get


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_a_full_recompute(whole, seed):
    states, counts = whole(seed)
    assert {"new", "active", "inactive", "dormant", "churned"} == {r.state for r in states}
    check_against_reference(states, counts, random_sessions(seed, days=N), d(0), d(N - 1))


def test_advancing_in_two_steps_equals_one(spark, whole):
    sessions = random_sessions(SEEDS[0], days=N)
    k = 17
    whole_states, whole_counts = whole(SEEDS[0])
    head_states, head_counts = run(spark, sessions, d(0), d(k - 1))
    balance = [r for r in head_states if r.snapshot_date == d(k - 1)]
    tail_states, tail_counts = run(spark, sessions, d(k), d(N - 1), balance)
    assert head_states + tail_states == whole_states
    assert sorted(head_counts + tail_counts) == whole_counts


def test_a_late_session_corrects_every_later_day(spark, whole):
    sessions = random_sessions(SEEDS[1], days=N)
    states, counts = whole(SEEDS[1])
    x = 20
    late = [*sessions, ("u0", d(x)), ("late", d(x))]
    balance = [r for r in states if r.snapshot_date == d(x - 1)]
    new_states, new_counts = run(spark, late, d(x), d(N - 1), balance)
    kept_states = [r for r in states if r.snapshot_date < d(x)]
    kept_counts = [r for r in counts if r[0] < d(x)]
    assert new_states != [r for r in states if r.snapshot_date >= d(x)]
    check_against_reference(
        kept_states + new_states, sorted(kept_counts + new_counts), late, d(0), d(N - 1)
    )


def test_outputs_have_the_table_schemas_and_refuse_a_backwards_range(spark):
    prev = spark.createDataFrame([], STATE_SCHEMA)
    days = spark.createDataFrame([], "user_id string, session_date date")
    states = advance_lifecycle(previous=prev, session_days=days, first_date=d(0), last_date=d(3))
    counts = lifecycle_counts(states=states, previous=prev, first_date=d(0), last_date=d(3))

    def kinds(schema):
        return [(f.name, f.dataType) for f in schema]

    assert kinds(states.schema) == kinds(STATE_SCHEMA)
    assert kinds(counts.schema) == kinds(SNAPSHOT_SCHEMA)
    with pytest.raises(ValueError, match="empty range"):
        advance_lifecycle(previous=prev, session_days=days, first_date=d(3), last_date=d(2))
