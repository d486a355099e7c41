"""SPEC §4 as state intervals: a user's lifecycle is a few stretches of days in one state.

A user's state on day D depends only on their first session day and their last session on or
before D. So when the session days change from day X on, the states change from X on and not
before: the user's intervals are restated from an anchor day (the earliest day that can have
changed), continuing the stretch that covered the day before it. The snapshot's counts then
move by what the restated intervals added and removed: a stretch in state s over
[valid_from, valid_to] is one of the users in s on each of its days, entered s on valid_from
and exited it on valid_to + 1.

The intervals run through an as-of day (the latest day ingested); the stretch that covers it is
open-ended (valid_to = OPEN_END, Kimball's far-future end date, so that
`D BETWEEN valid_from AND valid_to` needs no null handling).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DataType, DateType, LongType, StringType, StructField, StructType

from sessionize_assets.transforms.lifecycle_states import (
    IDLE_AFTER,
    OPEN_END,
    STATES,
    State,
    last_session_day,
    last_session_on,
)


def _fields(*columns: tuple[str, DataType, str]) -> StructType:
    return StructType(
        [StructField(name, kind, False, metadata={"comment": doc}) for name, kind, doc in columns]
    )


INTERVAL_SCHEMA = _fields(
    ("user_id", StringType(), "user key"),
    ("state", StringType(), "new, active, inactive, dormant or churned"),
    ("valid_from", DateType(), "first day of the stretch in this state"),
    ("valid_to", DateType(), "last day of the stretch; 9999-12-31 while it is current"),
)
INTERVAL_COLUMNS = INTERVAL_SCHEMA.fieldNames()

SNAPSHOT_SCHEMA = _fields(
    ("snapshot_date", DateType(), "the day whose end the counts describe"),
    ("state", StringType(), "new, active, inactive, dormant or churned"),
    ("users", LongType(), "users in the state at the end of the day"),
    ("entered", LongType(), "users in the state on the day and not on the day before"),
    ("exited", LongType(), "users in the state the day before and not on the day"),
)

Counts = Mapping[tuple[date, str], tuple[int, int, int]]  # (day, state) -> users, entered, exited
Moves = Mapping[tuple[date, str], tuple[int, int]]  # (day, state) -> net entries, net exits


ARROW_INTERVAL_SCHEMA = to_arrow_schema(INTERVAL_SCHEMA)
# Arrow dates are days since 1970-01-01; the rules below work on those day numbers.
_EPOCH = date(1970, 1, 1)
_OPEN_END_DAY = (OPEN_END - _EPOCH).days


def _day_numbers(values: pa.ChunkedArray | pa.Array) -> list[int]:
    return pc.cast(values, pa.int32()).to_pylist()


def restate_intervals(*, balances: pa.Table, session_days: pa.Table, as_of: date) -> pa.Table:
    """The intervals (ARROW_INTERVAL_SCHEMA) of the users in `balances` that end on or after
    the day before their anchor, with the session days as they are now.

    `balances` has one row per user: `user_id`, `anchor` (no later than `as_of`), and
    `prior_state`, `prior_from`: the stretch that covers anchor - 1, null for a user with no
    session before the anchor. `session_days` holds (user_id, session_date) rows; duplicates,
    other users and days outside anchor..as_of are ignored. The prior stretch is continued when
    the state on the anchor is the same, else it ends the day before; the stretch that covers
    `as_of` is open (OPEN_END).

    Work: a few steps per session day of the users from their anchor, in plain Python on
    Arrow columns; it holds no Spark state, so it runs on the driver for a batch's users and
    on the executors (`applyInArrow`) when every user is restated.
    """
    last_day = (as_of - _EPOCH).days
    found: dict[str, list[int]] = {}
    for user, day in zip(
        session_days.column("user_id").to_pylist(),
        _day_numbers(session_days.column("session_date")),
        strict=True,
    ):
        found.setdefault(user, []).append(day)
    users, states, starts, ends = [], [], [], []
    for user, anchor, prior_state, prior_from in zip(
        balances.column("user_id").to_pylist(),
        _day_numbers(balances.column("anchor")),
        balances.column("prior_state").to_pylist(),
        _day_numbers(balances.column("prior_from")),
        strict=True,
    ):
        days = sorted({d for d in found.get(user, ()) if anchor <= d <= last_day})
        prior = None if prior_state is None else (prior_state, prior_from)
        for state, start, end in _stretches(anchor=anchor, prior=prior, days=days, last=last_day):
            users.append(user)
            states.append(state)
            starts.append(start)
            ends.append(end)
    return pa.table(
        {
            "user_id": pa.array(users, pa.string()),
            "state": pa.array(states, pa.string()),
            "valid_from": pa.array(starts, pa.int32()).cast(pa.date32()),
            "valid_to": pa.array(ends, pa.int32()).cast(pa.date32()),
        },
        schema=ARROW_INTERVAL_SCHEMA,
    )


def _stretches(
    *, anchor: int, prior: tuple[str, int] | None, days: list[int], last: int
) -> list[tuple[str, int, int]]:
    """One user's stretches (state, first day, last day) from the one covering anchor - 1
    through `last` (that one open-ended), given their sorted session days in anchor..last."""
    begins: list[tuple[int, str]] = []  # (day, state): where each stretch begins

    def begin(day: int, state: str) -> None:
        if not begins or begins[-1][1] != state:
            begins.append((day, state))

    latest: int | None = None  # the latest session day so far
    if prior is not None:
        state, since = prior
        begins.append((since, state))
        latest = last_session_day(state=state, since=since, day=anchor - 1)

    def idle_until(until: int) -> None:
        """The idle states that begin after `latest`, from the anchor, before `until`."""
        assert latest is not None
        for state, after in IDLE_AFTER.items():
            if anchor <= latest + after < until:
                begin(latest + after, state)

    for day in days:
        if latest is None:
            begin(day, State.NEW)
        else:
            idle_until(day)
            begin(day, State.ACTIVE)
        latest = day
    if latest is None:
        return []
    idle_until(last + 1)
    ends = [day - 1 for day, _ in begins[1:]] + [_OPEN_END_DAY]
    return [(state, day, end) for (day, state), end in zip(begins, ends, strict=True)]


def snapshot_moves(signed: pa.Table) -> dict[tuple[date, str], tuple[int, int]]:
    """Per (day, state), the net stretches that begin and that end the day before.

    `signed` holds interval rows with `sign` +1 (added) or -1 (removed). A row kept by a
    copy-on-write rewrite is both removed and added: it cancels out.
    """
    moves: dict[tuple[date, str], tuple[int, int]] = {}
    begins = signed.group_by(["valid_from", "state"]).aggregate([("sign", "sum")])
    for row in begins.to_pylist():
        moves[(row["valid_from"], row["state"])] = (row["sign_sum"], 0)
    closed = signed.filter(pc.not_equal(signed["valid_to"], pa.scalar(OPEN_END, pa.date32())))
    for row in closed.group_by(["valid_to", "state"]).aggregate([("sign", "sum")]).to_pylist():
        key = (row["valid_to"] + timedelta(days=1), row["state"])
        moves[key] = (moves.get(key, (0, 0))[0], row["sign_sum"])
    return {key: move for key, move in sorted(moves.items()) if any(move)}


def corrected_snapshot(
    *, old: Counts, old_last: date | None, moves: Moves, start: date, as_of: date
) -> dict[tuple[date, str], tuple[int, int, int]]:
    """The snapshot rows that change: the days a move touches and the days after `old_last`.

    `old` holds the snapshot through `old_last` (None: no snapshot yet, every day from `start`
    is written). A day after `old_last` starts from the users of `old_last`: the stretches that
    were current then are open-ended. Each day's users move by the running sum of the net
    entries less the net exits so far; entered and exited move by that day's own.
    """
    first_new = start if old_last is None else old_last + timedelta(days=1)
    days_moved = sorted({day for day, _ in moves})
    if not days_moved and first_new > as_of:
        return {}
    day = min([first_new, *days_moved])
    running = dict.fromkeys(STATES, 0)
    out: dict[tuple[date, str], tuple[int, int, int]] = {}
    while day <= as_of:
        today = {state: moves.get((day, state), (0, 0)) for state in STATES}
        for state, (begins, ends) in today.items():
            running[state] += begins - ends
        if day >= first_new or any(running.values()) or any(any(m) for m in today.values()):
            for state in STATES:
                if day >= first_new:
                    users = 0 if old_last is None else old.get((old_last, state), (0, 0, 0))[0]
                    entered = exited = 0
                else:
                    users, entered, exited = old.get((day, state), (0, 0, 0))
                begins, ends = today[state]
                out[(day, state)] = (users + running[state], entered + begins, exited + ends)
        day += timedelta(days=1)
    return out


def states_by_day(intervals: DataFrame, *, first_date: date, last_date: date) -> DataFrame:
    """The per-user-per-day shape of the lifecycle for first_date..last_date: one row per day
    and user with a state (`snapshot_date, user_id, state, state_since, days_in_state,
    first_session_date, last_session_date`).

    `intervals` must hold every stretch of the users wanted (first_session_date is the start of
    their `new` stretch). Days after the as-of day are not states yet: keep last_date on or
    before it.
    """
    if last_date < first_date:
        raise ValueError(f"empty range: {first_date} .. {last_date}")
    day = F.col("snapshot_date")
    first_session = F.min("valid_from").over(Window.partitionBy("user_id"))
    return (
        intervals.withColumn("first_session_date", first_session)
        .where((F.col("valid_from") <= F.lit(last_date)) & (F.col("valid_to") >= F.lit(first_date)))
        .withColumn(
            "snapshot_date",
            F.explode(
                F.sequence(
                    F.greatest("valid_from", F.lit(first_date)),
                    F.least("valid_to", F.lit(last_date)),
                )
            ),
        )
        .select(
            day,
            "user_id",
            "state",
            F.col("valid_from").alias("state_since"),
            (F.datediff(day, "valid_from") + 1).alias("days_in_state"),
            "first_session_date",
            last_session_on(state=F.col("state"), valid_from=F.col("valid_from"), day=day).alias(
                "last_session_date"
            ),
        )
    )
