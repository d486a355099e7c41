"""What a sessions run recomputes and what changed: its scope (whole dates and touched pairs),
the one-job summary of the diff against the old rows, and the rows its commit drops and adds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from functools import cached_property, reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.parquet_files import FILE_COLUMN
from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.partitions import session_lookahead_days, session_lookback_days
from sessionize_assets.pipeline.keyed_reads import (
    PUSHED_KEYS_TOTAL,
    keys_for_join,
    pair_filter,
    pair_keys,
    pair_texts,
)
from sessionize_assets.pipeline.stitching import Relabel, relabelled_rows
from sessionize_assets.pipeline.touched import PAIR, days_around_column
from sessionize_assets.settings import Settings


@dataclass(frozen=True)
class Rewrite:
    """What the sessions commit drops and adds (`rewritten`): the old rows of `dropped`, or of
    `drop_keys` when the pairs were too many to list; and `new_rows`."""

    new_rows: DataFrame
    # The pairs whose old rows are dropped, listed; None when they were too many to list.
    dropped: set[tuple[date, str]] | None
    # The same pairs as a frame when they are too many to be a filter in the query.
    drop_keys: DataFrame | None

    def drop_filter(self) -> Column | None:
        """`dropped` as a filter in Spark's queries, unless they are a frame (`drop_keys`).
        Built when asked: a rewrite on the driver takes the pairs as an Arrow table instead,
        and a filter of thousands of pairs is seconds of calls into the JVM."""
        if self.drop_keys is not None or self.dropped is None:
            return None
        return _pair_filter(self.dropped)


def rewritten(
    spark: SparkSession,
    sessions: DataFrame,
    diff: DataFrame,
    *,
    changed_pairs: list[tuple[date, str]] | None,
    changed: int,
    relabel: Relabel,
) -> Rewrite:
    """What the sessions commit drops and adds: the recomputed pairs whose rows differ
    (`changed` of them, listed in `changed_pairs` when few), and the relabelled pairs outside
    them. Few pairs are a filter in the queries; many, a join (`keys_for_join`)."""
    relabelled = relabelled_rows(relabel, recomputed=set(changed_pairs or ()))
    extra = None if relabelled is None else spark.createDataFrame(relabelled, SESSIONS.schema)
    dropped = None if changed_pairs is None else {*changed_pairs, *relabel.pairs}
    if changed_pairs is not None and dropped is not None and len(dropped) <= PUSHED_KEYS_TOTAL:
        new_rows = sessions.where(_pair_filter(changed_pairs))
        new_rows = new_rows if extra is None else new_rows.unionByName(extra)
        return Rewrite(new_rows=new_rows, dropped=dropped, drop_keys=None)
    keys = diff.select(*PAIR).distinct()
    new_rows = sessions.join(keys, on=list(PAIR), how="left_semi")
    if extra is None:
        return Rewrite(
            new_rows=new_rows, dropped=dropped, drop_keys=keys_for_join(keys, rows=changed)
        )
    extra = extra.join(keys, on=list(PAIR), how="left_anti")
    relabelled_keys = spark.createDataFrame(relabel.pairs, "session_date date, user_id string")
    return Rewrite(
        new_rows=new_rows.unionByName(extra),
        dropped=dropped,
        drop_keys=keys_for_join(
            keys.unionByName(relabelled_keys).distinct(), rows=changed + len(relabel.pairs)
        ),
    )


def pairs_table(pairs: Iterable[tuple[date, str]]) -> pa.Table:
    """`pairs` as the key columns of `rewrite_arrow`'s `drop`, in order."""
    ordered = sorted(pairs)
    return pa.table(
        {
            "session_date": pa.array([day for day, _ in ordered], pa.date32()),
            "user_id": pa.array([user for _, user in ordered], pa.string()),
        }
    )


def event_dates_of(session_date: Column, settings: Settings) -> Column:
    """`event_date`, one row per event date that decides the session date: what
    `partitions.event_window` gives, computed in the query (a join with a table of dates made
    on the driver would be a broadcast job of its own)."""
    return days_around_column(
        session_date,
        before=session_lookback_days(settings),
        after=session_lookahead_days(settings),
    ).alias("event_date")


def _pair_filter(pairs: Iterable[tuple[date, str]]) -> Column:
    """Whether a row's (session_date, user_id) is one of `pairs` (`keyed_reads.pair_filter`)."""
    return pair_filter(pairs, partition="session_date", key="user_id")


@dataclass(frozen=True)
class SessionsScope:
    """What a run recomputes: every user on `whole` dates, and the touched (user, date) pairs
    (`listed` holds them by date when they came to the driver)."""

    whole: list[date]
    # The touched pairs' frame (user_id, session_date), kept: `pairs` asks for it once.
    kept_pairs: Callable[[], DataFrame]
    listed: dict[date, list[str]] | None
    pair_count: int  # touched pairs outside the whole dates

    @cached_property
    def pairs(self) -> DataFrame:
        """The touched pairs as a Spark frame, made on first use: a run done on the driver
        makes none."""
        return self.kept_pairs()

    def release(self) -> None:
        """Unpersist `pairs`, if it was made."""
        if "pairs" in self.__dict__:
            self.pairs.unpersist()

    @cached_property
    def rows_filter(self) -> Column | None:
        """The scope as a filter in the query (a hash set) when its pairs came to the driver
        and are few; None otherwise (a join then, a broadcast job of its own). Built once:
        the run's reads, its sessions and its quarantine all take it."""
        if self.listed is None or sum(map(len, self.listed.values())) > PUSHED_KEYS_TOTAL:
            return None
        keep = _pair_filter((day, user) for day, users in self.listed.items() for user in users)
        return (keep | F.col("session_date").isin(self.whole)) if self.whole else keep

    def mask(self, rows: pa.Table) -> pa.ChunkedArray:
        """`within` on the driver: whether each Arrow row's (session_date, user_id) is in the
        scope. Its pairs must be listed."""
        listed = self.listed or {}
        keys = pair_texts((day, user) for day, users in listed.items() for user in users)
        keep = pc.is_in(
            pair_keys(rows, partition="session_date", key="user_id"),
            value_set=pa.array(keys, pa.string()),
        )
        if self.whole:
            keep = pc.or_(keep, pc.is_in(rows["session_date"], pa.array(self.whole, pa.date32())))
        return keep

    def within(self, rows: DataFrame) -> DataFrame:
        keep = self.rows_filter
        if keep is not None:
            return rows.where(keep)
        pairs = keys_for_join(self.pairs.withColumn("_pair", F.lit(True)), rows=self.pair_count)
        marked = rows.join(pairs, on=list(PAIR), how="left")
        keep = F.col("_pair").isNotNull()
        if self.whole:
            keep = keep | F.col("session_date").isin(self.whole)
        return marked.where(keep).drop("_pair")


@dataclass(frozen=True, kw_only=True)
class DateChanges:
    """How one date's sessions changed in a run: a session both removed and added was
    replaced; `users` are those with a changed session on the date."""

    inserted: int
    replaced: int
    removed: int
    users: int


@dataclass(frozen=True)
class EventsRead:
    """The events a run recomputed sessions from, and their users, counted on the driver
    (where it read them: `pipeline/sessions._events_on_driver`)."""

    events: int
    users: int


@dataclass(frozen=True, kw_only=True)
class SessionsSummary:
    """What a run computed, from one Spark job: how each date's sessions changed, the events
    and users they were recomputed from, and the sessions flagged for quarantine."""

    changes: dict[date, DateChanges]
    # The (date, user) pairs with a changed session; None past PUSHED_KEYS_TOTAL of them.
    changed_pairs: list[tuple[date, str]] | None
    events_read: int
    users_read: int
    flagged: int
    # Spark's URIs of the files holding an old row of a changed pair (`old`'s `_file`); None
    # without `old`.
    old_files: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class SessionsCommitted:
    """What a sessions run's commit changed, on either path, for the run's report."""

    summary: SessionsSummary
    files_total: int  # live `sessions` files of the changed dates, before the commit
    rows_written: int = 0
    files_rewritten: int = 0
    # The files searched for the old rows dropped; None when the pairs were too many to list.
    files_searched: int | None = 0


def summarise(
    diff: DataFrame,
    *,
    events: DataFrame | EventsRead,
    sessions: DataFrame,
    old: DataFrame | None = None,
) -> SessionsSummary:
    """Per session date with a changed row, how its sessions changed (`diff`), with what was
    read (`events`, or their counts when the driver read them) and flagged (`sessions`), and
    the files of `old` (the old rows compared, each with its `_file`) holding a row of a pair
    with a change: up to four aggregates, collected in one Spark job."""
    added, removed = F.col("added") == 1, F.col("removed") == 1
    per_session = diff.groupBy("session_date", "session_id", "user_id").agg(
        F.max((F.col("change") == "added").cast("int")).alias("added"),
        F.max((F.col("change") == "removed").cast("int")).alias("removed"),
    )
    per_date = per_session.groupBy("session_date").agg(
        F.count(F.when(added & ~removed, 1)).alias("inserted"),
        F.count(F.when(added & removed, 1)).alias("replaced"),
        F.count(F.when(~added & removed, 1)).alias("removed"),
        F.countDistinct("user_id").alias("users"),
        F.when(F.countDistinct("user_id") <= PUSHED_KEYS_TOTAL, F.collect_set("user_id")).alias(
            "changed_users"
        ),
    )
    flagged = sessions.where("is_quarantined").agg(F.count(F.lit(1)).alias("flagged"))
    parts = [flagged]
    if isinstance(events, DataFrame):
        parts.append(
            events.agg(
                F.count(F.lit(1)).alias("events_read"),
                F.countDistinct("user_id").alias("users_read"),
            )
        )
    if old is not None:
        changed = diff.select(*PAIR).distinct()
        parts.append(
            old.join(changed, on=list(PAIR), how="left_semi").select(FILE_COLUMN).distinct()
        )
    rows = reduce(
        lambda left, right: left.unionByName(right, allowMissingColumns=True), parts, per_date
    ).collect()
    figures = {
        name: value
        for row in rows
        for name, value in row.asDict().items()
        if name in ("events_read", "users_read", "flagged") and value is not None
    }
    if isinstance(events, EventsRead):
        figures |= {"events_read": events.events, "users_read": events.users}
    old_files = (
        None if old is None else sorted(row[FILE_COLUMN] for row in rows if row[FILE_COLUMN])
    )
    dated = [row for row in rows if row.session_date is not None]
    pairs = [(row.session_date, user) for row in dated for user in row.changed_users or []]
    whole = any(row.changed_users is None for row in dated) or len(pairs) > PUSHED_KEYS_TOTAL
    changed_pairs = None if whole else pairs
    return SessionsSummary(
        changed_pairs=changed_pairs,
        changes={
            r.session_date: DateChanges(
                inserted=r.inserted, replaced=r.replaced, removed=r.removed, users=r.users
            )
            for r in dated
        },
        events_read=figures.get("events_read", 0),
        users_read=figures.get("users_read", 0),
        flagged=figures.get("flagged", 0),
        old_files=old_files,
    )


def summarise_rows(diff: pa.Table, *, events: EventsRead, flagged: int) -> SessionsSummary:
    """`summarise` of a diff made on the driver (`corrections.diff_session_rows`): every
    changed pair is listed, whatever their number (the driver's rewrite takes them as a
    table); `old_files` is left to the caller, which holds the old rows' files."""
    per_session: dict[tuple[date, str, str], set[str]] = {}
    for day, session, user, change in zip(
        *(diff[name].to_pylist() for name in ("session_date", "session_id", "user_id", "change")),
        strict=True,
    ):
        per_session.setdefault((day, session, user), set()).add(change)
    counts: dict[date, Counter[str]] = {}
    users: dict[date, set[str]] = {}
    for (day, _, user), changes in per_session.items():
        kind = (
            "replaced" if len(changes) == 2 else ("inserted" if "added" in changes else "removed")
        )
        counts.setdefault(day, Counter())[kind] += 1
        users.setdefault(day, set()).add(user)
    return SessionsSummary(
        changes={
            day: DateChanges(
                inserted=counts[day]["inserted"],
                replaced=counts[day]["replaced"],
                removed=counts[day]["removed"],
                users=len(users[day]),
            )
            for day in sorted(counts)
        },
        changed_pairs=sorted((day, user) for day, held in users.items() for user in held),
        events_read=events.events,
        users_read=events.users,
        flagged=flagged,
    )
