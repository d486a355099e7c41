"""Sessions updated from their old rows and the events added, without reading the history.

A late event spread over a long history touches a few users on every date, and every row
group of `events` holds some of them: recomputing those pairs from `events` reads the
history (docs/benchmarks.md, "The full size"). Most such events join no session: they
arrive more than the gap G away from each of the user's old events, so they start sessions
of their own and change no old one. For such a user the new sessions are exactly:

- the old sessions of each touched (user, date) pair as they are (their chains gained no
  event: an added event between two events of a chain is within G of one of them), and
- the chains of the added events alone (an added event and an old one that follow each
  other in the user's order are more than G apart, so a chain holds one kind only),

the pair's sessions numbered again by start. The old rows come from the diff's own read of
the touched pairs, the added events from the few files the batch added.

A user is updated this way (*isolated*) when
1. no file removed since the dates' absorbed versions holds a row of theirs (nothing
   displaced, recomputed or erased: only additions);
2. every session date an added event decides (`partitions.session_dates_for`) is brought up
   to date by this run, pair by pair, and that pair is touched: its old rows are read, and
   they hold every old chain near the event (a chain within reach is at most L + G long,
   unless quarantined), as of a version no older than the earliest absorbed one;
3. no added event lies within G of one of the user's old chains: of those rows, from
   `session_start` to `session_end`, or of a quarantined chain (any date, the quarantine
   table's `chain_end`). An added event that some date has absorbed already lies in its own
   chain there: such a user is recomputed from `events`.
Every other touched user is recomputed from `events` as before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, SESSION_QUARANTINE
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline.keyed_reads import PUSHED_KEYS_TOTAL, isin_texts
from sessionize_assets.pipeline.touched import ChangedEvents
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.sessions import (
    QUARANTINE_DETAIL,
    SESSION_EVENT_COLUMNS,
    sessions_with_quarantine,
)


@dataclass(frozen=True, kw_only=True)
class Additions:
    """The users whose sessions a run updates from their old rows and added events, and
    their quarantine rows (any date)."""

    users: frozenset[str]
    paths: list[str]  # the files holding their added events (and others')
    quarantine: pa.Table


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """The users that conditions 1 and 2 allow, with the times (microseconds) of their added
    events, and the files that hold those events."""

    times: dict[str, list[int]]
    paths: list[str]


def candidates(
    changed: ChangedEvents | None,
    *,
    listed: Mapping[date, Collection[str]] | None,
    absorbed: Mapping[date, int],
    settings: Settings,
) -> Candidates:
    """The users conditions 1 and 2 allow: known on the driver from the changed files, the
    touched pairs and the `events` version each of the run's partial dates has absorbed.

    A changed file's rows are *added* when every session date its event date decides absorbed
    an older version than the file's, and *absorbed* already when every one absorbed its
    version or a later one (dates absorb different versions when earlier runs asked for
    different dates). A user with a row of neither kind, or of a date deciding a date outside
    the partial ones, is recomputed from `events`."""
    if changed is None or listed is None:
        return Candidates(times={}, paths=[])
    pairs = {(day, user) for day, users in listed.items() for user in users}
    if len(pairs) > PUSHED_KEYS_TOTAL:
        return Candidates(times={}, paths=[])
    decided: dict[date, list[date]] = {}
    found: dict[str, list[int]] = {}
    paths: set[str] = set()
    for user, rows in changed.added.items():
        if user in changed.removed:
            continue
        times: list[int] = []
        files: set[str] = set()
        for event_date, micros, path in rows:
            dates = decided.get(event_date)
            if dates is None:
                dates = decided[event_date] = session_dates_for([event_date], settings)
            version = changed.versions[path]
            if all(day in absorbed and absorbed[day] >= version for day in dates):
                continue
            if not all(
                day in absorbed and absorbed[day] < version and (day, user) in pairs
                for day in dates
            ):
                break
            times.append(micros)
            files.add(path)
        else:
            if times:
                found[user] = times
                paths |= files
    return Candidates(times=found, paths=sorted(paths))


def isolated_users(
    store: DeltaStore,
    spark: SparkSession,
    *,
    found: Candidates,
    old: DataFrame,
    settings: Settings,
) -> Additions | None:
    """Of the `candidates`, those whose added events lie more than G from every old chain
    (condition 3): the quarantined chains checked on the driver, the old rows of the touched
    pairs (`old`) in one Spark job. None when no candidate is isolated."""
    gap = int(settings.session_gap.total_seconds() * 1_000_000)
    kept = dict(found.times)
    quarantined = _quarantine_of(store, kept)
    starts = _micros(quarantined.column("session_start"))
    ends = _micros(quarantined.column("chain_end"))
    for user, start, end in zip(
        quarantined.column("user_id").to_pylist(), starts, ends, strict=True
    ):
        times = kept.get(user)
        if times is not None and any(start - gap <= t <= end + gap for t in times):
            del kept[user]
    if not kept:
        return None
    added = spark.createDataFrame(
        [(user, t) for user, times in kept.items() for t in times], "user_id string, _t long"
    )
    near = (
        old.where(isin_texts(F.col("user_id"), sorted(kept)))
        .select("user_id", "session_start", "session_end")
        .join(added, on="user_id")
        .where(
            (F.col("_t") >= F.unix_micros("session_start") - gap)
            & (F.col("_t") <= F.unix_micros("session_end") + gap)
        )
        .select("user_id")
        .distinct()
        .collect()
    )
    users = frozenset(kept) - {row["user_id"] for row in near}
    if not users:
        return None
    return Additions(
        users=users,
        paths=found.paths,
        quarantine=quarantined.filter(
            pc.is_in(quarantined.column("user_id"), pa.array(sorted(users)))
        ),
    )


def sessions_of_additions(
    store: DeltaStore,
    spark: SparkSession,
    *,
    additions: Additions,
    old: DataFrame,
    settings: Settings,
) -> DataFrame:
    """The isolated users' sessions on the touched pairs' dates, in the shape of
    `sessions_with_quarantine` (QUARANTINE_DETAIL included): their old rows, with the
    quarantine's detail of a flagged one, and the sessions of their added events alone
    (read from their files), numbered again by start. The caller keeps the touched pairs."""
    users = sorted(additions.users)
    added = (
        store.read_files(EVENTS, additions.paths)
        .select(*SESSION_EVENT_COLUMNS)
        .where(isin_texts(F.col("user_id"), users))
    )
    new = sessions_with_quarantine(
        added,
        gap=settings.session_gap,
        max_length=settings.max_session_length,
        conversion_events=settings.conversion_events,
    )
    detail_columns = ["capped_at", "chain_end", "excluded_events"]
    detail = spark.createDataFrame(
        additions.quarantine.select(["session_id", *detail_columns]).to_pylist(),
        "session_id string, capped_at timestamp, chain_end timestamp, excluded_events long",
    )
    kept = (
        old.where(isin_texts(F.col("user_id"), users))
        .drop("stitched_user_id", "_file")
        .join(detail, on="session_id", how="left")
        .withColumn(
            QUARANTINE_DETAIL,
            F.when(F.col("is_quarantined"), F.struct(*detail_columns)),
        )
        .drop(*detail_columns)
    )
    number = "PARTITION BY user_id, session_date ORDER BY session_start"
    return new.unionByName(kept).withColumn(
        "session_number", F.expr(f"CAST(row_number() OVER ({number}) AS INT)")
    )


def _quarantine_of(store: DeltaStore, users: Collection[str]) -> pa.Table:
    """The quarantine rows of `users`, on any date (a bot's chain can run for days): few."""
    columns = [
        "session_id",
        "user_id",
        "session_start",
        "capped_at",
        "chain_end",
        "excluded_events",
    ]
    if not users or not store.exists(SESSION_QUARANTINE):
        return pa.table(
            {
                "session_id": pa.array([], pa.string()),
                "user_id": pa.array([], pa.string()),
                "session_start": pa.array([], pa.timestamp("us", tz="UTC")),
                "capped_at": pa.array([], pa.timestamp("us", tz="UTC")),
                "chain_end": pa.array([], pa.timestamp("us", tz="UTC")),
                "excluded_events": pa.array([], pa.int64()),
            }
        )
    rows = store.read_arrow(SESSION_QUARANTINE, columns=columns)
    return rows.filter(pc.is_in(rows.column("user_id"), pa.array(sorted(users), pa.string())))


def _micros(column: pa.ChunkedArray) -> list[int]:
    return pc.cast(column, pa.timestamp("us")).cast(pa.int64()).to_pylist()
