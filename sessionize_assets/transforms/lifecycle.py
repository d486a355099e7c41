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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, LongType, StringType, StructField, StructType

STATES = ("new", "active", "inactive", "dormant", "churned")
# valid_to of the stretch a user is in on the as-of day.
OPEN_END = date(9999, 12, 31)
# Idle days after the last session on which each idle state begins (SPEC §4).
INACTIVE_AFTER, DORMANT_AFTER, CHURNED_AFTER = 1, 7, 30


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


def _state(*, day: Column, first: Column, last: Column, has_session: Column) -> Column:
    idle = F.datediff(day, last)
    return (
        F.when(first == day, "new")
        .when(has_session, "active")
        .when(idle < DORMANT_AFTER, "inactive")
        .when(idle < CHURNED_AFTER, "dormant")
        .otherwise("churned")
    )


def last_session_on(*, state: Column, valid_from: Column, day: Column) -> Column:
    """The user's latest session day on or before `day`, for the stretch (state, valid_from)
    that covers `day`: stretches are maximal, so an idle one began a fixed number of days
    after that session."""
    return (
        F.when(state.isin("new", "active"), day)
        .when(state == "inactive", F.date_sub(valid_from, INACTIVE_AFTER))
        .when(state == "dormant", F.date_sub(valid_from, DORMANT_AFTER))
        .otherwise(F.date_sub(valid_from, CHURNED_AFTER))
    )


def restate_intervals(*, balances: DataFrame, session_days: DataFrame, as_of: date) -> DataFrame:
    """The intervals (INTERVAL_SCHEMA) of the users in `balances` that end on or after the day
    before their anchor, with the session days as they are now.

    `balances` has one row per user: `user_id`, `anchor` (no later than `as_of`), and
    `prior_state`, `prior_from`: the stretch that covers anchor - 1, null for a user with no
    session before the anchor. `session_days` holds (user_id, session_date) rows; duplicates,
    other users and days outside anchor..as_of are ignored. The prior stretch is continued when
    the state on the anchor is the same, else it ends the day before; the stretch that covers
    `as_of` is open (OPEN_END). Work: one row per user and day from the anchor.
    """
    day = F.col("snapshot_date")
    found = (
        session_days.join(balances.select("user_id", "anchor"), on="user_id")
        .where(F.col("session_date").between(F.col("anchor"), F.lit(as_of)))
        .groupBy("user_id")
        .agg(F.collect_set("session_date").alias("_days"), F.min("session_date").alias("_first"))
    )
    started = F.col("prior_state").isNotNull()
    prior_last = last_session_on(
        state=F.col("prior_state"), valid_from=F.col("prior_from"), day=F.date_sub("anchor", 1)
    )
    daily = (
        balances.join(found, on="user_id", how="left")
        .where(started | F.col("_first").isNotNull())
        .withColumn(
            "snapshot_date",
            F.explode(
                F.sequence(
                    F.when(started, F.col("anchor")).otherwise(F.col("_first")), F.lit(as_of)
                )
            ),
        )
        .withColumn(
            "state",
            _state(
                day=day,
                # Only a user with no earlier stretch can be new in the range.
                first=F.when(~started, F.col("_first")),
                last=F.greatest(
                    F.when(started, prior_last),
                    F.array_max(F.filter(F.coalesce("_days", F.array()), lambda x: x <= day)),
                ),
                has_session=F.coalesce(F.array_contains("_days", day), F.lit(False)),
            ),
        )
    )
    by_day = Window.partitionBy("user_id").orderBy("snapshot_date")
    begins = F.coalesce(F.lag("state").over(by_day) != F.col("state"), F.lit(True))
    runs = (
        daily.withColumn(
            "_run",
            F.sum(begins.cast("int")).over(
                by_day.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
        .groupBy("user_id", "anchor", "prior_state", "prior_from", "_run")
        .agg(
            F.first("state").alias("state"),
            F.min("snapshot_date").alias("_from"),
            F.max("snapshot_date").alias("_to"),
        )
    )
    continues = (F.col("_run") == 1) & (F.col("state") == F.col("prior_state"))
    restated = runs.select(
        "user_id",
        "state",
        F.when(continues, F.col("prior_from")).otherwise(F.col("_from")).alias("valid_from"),
        F.when(F.col("_to") == F.lit(as_of), F.lit(OPEN_END))
        .otherwise(F.col("_to"))
        .alias("valid_to"),
    )
    # A prior stretch whose state does not go on at the anchor ends the day before.
    ended = runs.where((F.col("_run") == 1) & F.col("prior_state").isNotNull() & ~continues).select(
        "user_id",
        F.col("prior_state").alias("state"),
        F.col("prior_from").alias("valid_from"),
        F.date_sub("anchor", 1).alias("valid_to"),
    )
    return restated.unionByName(ended).select(
        *(F.col(f.name).cast(f.dataType) for f in INTERVAL_SCHEMA)
    )


def snapshot_moves(signed: DataFrame) -> DataFrame:
    """Per (day, state), the net stretches that begin and that end the day before.

    `signed` holds interval rows with `sign` +1 (added) or -1 (removed). A row kept by a
    copy-on-write rewrite is both removed and added: it cancels out.
    """
    begins = signed.select(
        F.col("valid_from").alias("day"), "state", F.col("sign").alias("begins"), F.lit(0)
    ).toDF("day", "state", "begins", "ends")
    ends = (
        signed.where(F.col("valid_to") != F.lit(OPEN_END))
        .select(F.date_add("valid_to", 1).alias("day"), "state", F.lit(0), F.col("sign"))
        .toDF("day", "state", "begins", "ends")
    )
    return (
        begins.unionByName(ends)
        .groupBy("day", "state")
        .agg(F.sum("begins").alias("begins"), F.sum("ends").alias("ends"))
        .where((F.col("begins") != 0) | (F.col("ends") != 0))
    )


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
