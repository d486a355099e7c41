"""Sessions updated from their old rows and the events added, without reading the history.

A late event spread over a long history touches a few users on every date, and every row
group of `events` holds some of them: recomputing those pairs from `events` reads the
history (docs/benchmarks.md, "The full size"). Most such events join no session: they
arrive more than the gap G away from each of the user's old events, so they start sessions
of their own and change no old one. For a pair where that holds, its new sessions are
exactly:

- the old sessions of each touched (user, date) pair as they are (their chains gained no
  event: an added event between two events of a chain is within G of one of them), and
- the chains of the added events alone (an added event and an old one that follow each
  other in the user's order are more than G apart, so a chain holds one kind only),

the pair's sessions numbered again by start. The old rows come from the diff's own read of
the touched pairs, the added events from the few files the batch added.

A user's changed rows fall into *clusters*: rows whose event dates are at most
`cluster_days` apart, so that no session date is decided by two clusters and no chain spans
two. The pairs a cluster touches are updated this way (the cluster is *isolated*) when
1. no file removed since the dates' absorbed versions holds a row of the user (nothing
   displaced, recomputed or erased: only additions);
2. each of its rows is added for every session date it decides (`partitions.session_dates_for`:
   each absorbed an older version than the row's file) or absorbed already by all of them, and
   each such date is brought up to date by this run, pair by pair, with that pair touched: its
   old rows are read, and they hold every old chain near the row (a chain within reach is at
   most L + G long, unless quarantined);
3. no added row lies within G of one of the user's old chains: of those rows, from
   `session_start` to `session_end`, or of a quarantined chain (any date, the quarantine
   table's `chain_end`). An added row that another date absorbed already lies in its own chain
   there, and is recomputed from `events`.

A cluster that meets 1 and 2 but whose added rows all lie within G of exactly one old chain,
an unquarantined session, is *merged*: its pairs' new sessions are their old rows with that
session replaced by the session of its events and the added ones, built from its row
(`transforms/sessions_rows.merged_session_row`). Its counts add up; its first event, landing
and exit pages and campaign are picked among its old picks (the row's SESSION_PICKS and the
values beside them) and the added events. An added row within G of the session joins its
chain, and each added row outside it chains towards it; no other chain is within G, so none
joins. `events` derives a page's host and campaign from its URL (`transforms/attributes.py`),
so the landing page's are read from its URL. A chain past the cap L, a tie in time with one
of the picks, or a row without picks is recomputed from `events`.

Every other touched pair is recomputed from `events` as before: with a user's late events
far back and their on-time ones on the new day, the late ones' pairs are isolated or merged,
the new day's are not (its dates are computed whole).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, SESSION_QUARANTINE, SESSIONS
from sessionize_assets.partitions import (
    event_window,
    session_dates_for,
    session_lookahead_days,
    session_lookback_days,
)
from sessionize_assets.pipeline.keyed_reads import (
    PUSHED_KEYS_TOTAL,
    isin_texts,
    pair_filter,
    pair_keys,
    pair_texts,
)
from sessionize_assets.pipeline.touched import ChangedEvents, micros_of
from sessionize_assets.settings import Settings
from sessionize_assets.sql_text import sql_identifier
from sessionize_assets.transforms.sessions import (
    QUARANTINE_DETAIL,
    SESSION_EVENT_COLUMNS,
    sessions_with_quarantine,
)
from sessionize_assets.transforms.sessions_rows import SESSIONS_ROWS_SCHEMA, merged_session_row

# The fast path costs a Spark job of its own (telling the isolated clusters from the near
# ones, 0.1-0.5 s) and saves reading the events of the dates only candidate clusters need:
# taken when those dates hold at least this many events. A scan of 7.36 M events by user
# took 2-3 s on 2 cores (docs/benchmarks.md, "The full size"): below about 2 M the job costs
# what it saves, so a small batch, or a mid-size one whose late events reach few dates
# beyond the new day's, is recomputed from `events` as before.
ADDITIONS_MIN_EVENTS_SKIPPED = 2_000_000


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """The clusters that conditions 1 and 2 allow: each as the times (microseconds) of its
    added rows, the pairs it touches and the (event date, user) of its added rows."""

    times: list[tuple[str, list[int]]]  # (user, times) a cluster
    pairs: list[set[tuple[date, str]]]  # the (session date, user) pairs of each cluster
    rows: list[set[tuple[date, str]]]  # the (event date, user) of each cluster's added rows
    paths: list[str]  # the files holding the added rows

    def skippable(self, listed: Mapping[date, Collection[str]], settings: Settings) -> set[date]:
        """The event dates only these clusters' pairs would have read (the events looked up
        by user if every one of them is isolated)."""
        theirs = set().union(*self.pairs) if self.pairs else set()
        mine: set[date] = set()
        others: set[date] = set()
        for day, users in listed.items():
            window = event_window([day], settings)
            for user in users:
                (mine if (day, user) in theirs else others).update(window)
        return mine - others


@dataclass(frozen=True, kw_only=True)
class Additions:
    """The pairs a run updates from their old rows and added events: the touched pairs of the
    isolated and merged clusters, the (event date, user) of the isolated clusters' added rows
    and the files holding them, the quarantine rows of their users (any date), and the
    sessions the merged clusters' events joined (`merged`, in SESSIONS_ROWS_SCHEMA) with the
    ids of the old sessions they replace."""

    pairs: set[tuple[date, str]]
    rows: set[tuple[date, str]]
    paths: list[str]
    quarantine: pa.Table
    merged: pa.Table
    replaced: set[str]

    @property
    def users(self) -> set[str]:
        return {user for _, user in self.pairs}


def cluster_days(settings: Settings) -> int:
    """The most days apart two of a user's changed rows are in one cluster: rows further apart
    decide no session date in common (a row on E decides E - lookahead .. E + lookback)."""
    return session_lookahead_days(settings) + session_lookback_days(settings) + 1


def candidates(
    changed: ChangedEvents | None,
    *,
    listed: Mapping[date, Collection[str]] | None,
    absorbed: Mapping[date, int],
    settings: Settings,
) -> Candidates:
    """The clusters conditions 1 and 2 allow: known on the driver from the changed files, the
    touched pairs and the `events` version each of the run's partial dates has absorbed.

    A changed file's rows are *added* when every session date their event date decides
    absorbed an older version than the file's, and *absorbed* already when every one absorbed
    its version or a later one (dates absorb different versions when earlier runs asked for
    different dates). A cluster with a row of neither kind, or deciding a date outside the
    partial ones, is recomputed from `events`."""
    found = Candidates(times=[], pairs=[], rows=[], paths=[])
    if changed is None or listed is None:
        return found
    touched = {(day, user) for day, users in listed.items() for user in users}
    if len(touched) > PUSHED_KEYS_TOTAL:
        return found
    decided: dict[date, list[date]] = {}
    apart = cluster_days(settings)
    paths: set[str] = set()
    for user, rows in changed.added.items():
        if user in changed.removed:
            continue
        by_date: dict[date, list[tuple[int, str]]] = {}
        for event_date, micros, path in rows:
            by_date.setdefault(event_date, []).append((micros, path))
        clusters: list[list[date]] = []
        for event_date in sorted(by_date):
            if clusters and (event_date - clusters[-1][-1]).days <= apart:
                clusters[-1].append(event_date)
            else:
                clusters.append([event_date])
        for cluster in clusters:
            times: list[int] = []
            pairs: set[tuple[date, str]] = set()
            files: set[str] = set()
            isolated = True
            for event_date in cluster:
                dates = decided.get(event_date)
                if dates is None:
                    dates = decided[event_date] = session_dates_for([event_date], settings)
                pairs.update((day, user) for day in dates)
                for micros, path in by_date[event_date]:
                    version = changed.versions[path]
                    if all(day in absorbed and absorbed[day] >= version for day in dates):
                        continue
                    if not all(
                        day in absorbed and absorbed[day] < version and (day, user) in touched
                        for day in dates
                    ):
                        isolated = False
                        break
                    times.append(micros)
                    files.add(path)
                if not isolated:
                    break
            if isolated and times:
                found.times.append((user, times))
                found.pairs.append(pairs & touched)
                found.rows.append({(event_date, user) for event_date in cluster})
                paths |= files
    found.paths.extend(sorted(paths))
    return found


def isolated_pairs(
    store: DeltaStore,
    spark: SparkSession,
    *,
    found: Candidates,
    old: DataFrame,
    settings: Settings,
) -> Additions | None:
    """Of the `candidates`' clusters, those whose added rows lie more than G from every old
    chain (condition 3), and those whose added rows all join the one old session they lie
    within G of (`merged_session_row`: from its row, with its picks): the quarantined chains
    checked on the driver, the old rows of the touched pairs (`old`) in one Spark job, the
    merged clusters' added rows read on the driver. None when no cluster is either."""
    gap = int(settings.session_gap.total_seconds() * 1_000_000)
    quarantined = _quarantine_of(store, {user for user, _ in found.times})
    chains: dict[str, list[tuple[int, int]]] = {}
    for user, start, end in zip(
        quarantined.column("user_id").to_pylist(),
        micros_of(quarantined.column("session_start")),
        micros_of(quarantined.column("chain_end")),
        strict=True,
    ):
        chains.setdefault(user, []).append((start - gap, end + gap))
    kept = [
        index
        for index, (user, times) in enumerate(found.times)
        if not any(low <= t <= high for low, high in chains.get(user, ()) for t in times)
    ]
    if not kept:
        return None
    added = spark.createDataFrame(
        [(index, found.times[index][0], t) for index in kept for t in found.times[index][1]],
        "_cluster int, user_id string, _t long",
    )
    users = sorted({found.times[index][0] for index in kept})
    near: dict[int, list[dict[str, Any]]] = {}
    for row in (
        old.where(isin_texts(F.col("user_id"), users))
        .join(added, on="user_id")
        .where(
            (F.col("_t") >= F.unix_micros("session_start") - gap)
            & (F.col("_t") <= F.unix_micros("session_end") + gap)
        )
        .selectExpr("_cluster", *_MERGED_FROM)
        .distinct()
        .collect()
    ):
        near.setdefault(row["_cluster"], []).append(row.asDict())
    isolated = sorted(set(kept) - set(near))
    merged = _merged(store, found=found, near=near, settings=settings)
    if not isolated and not merged:
        return None
    pairs = set().union(*(found.pairs[index] for index in (*isolated, *merged)))
    rows = set().union(*(found.rows[index] for index in isolated))
    return Additions(
        pairs=pairs,
        rows=rows,
        paths=found.paths,
        quarantine=quarantined.filter(
            pc.is_in(quarantined.column("user_id"), pa.array(sorted({u for _, u in pairs})))
        ),
        merged=pa.Table.from_pylist(
            [row for row, _ in merged.values()], schema=SESSIONS_ROWS_SCHEMA
        ),
        replaced={session_id for _, session_id in merged.values()},
    )


# The old row's columns a merge reads (`merged_session_row`), its times as microseconds, as
# SQL text over the table's column names.
_MERGED_TIMES = ("session_start", "session_end", "landing_at", "exit_at", "campaign_at")
_MERGED_FROM = [
    f"unix_micros({sql_identifier(name)}) AS {sql_identifier(name)}"
    if name in _MERGED_TIMES
    else sql_identifier(name)
    for name in SESSIONS.schema.fieldNames()
    if name not in ("session_date", "duration_seconds", "channel", "is_engaged", "stitched_user_id")
]


def _merged(
    store: DeltaStore,
    *,
    found: Candidates,
    near: Mapping[int, list[dict[str, Any]]],
    settings: Settings,
) -> dict[int, tuple[dict[str, Any], str]]:
    """The clusters within G of exactly one old session whose added rows all join it, each with
    the session they make (`merged_session_row`) and the old session's id. Their added rows
    are those `sessions_of_additions` would read: their (event date, user) in the files."""
    single = {
        index: rows[0] for index, rows in near.items() if len({r["session_id"] for r in rows}) == 1
    }
    if not single:
        return {}
    wanted = {key: index for index in single for key in found.rows[index]}
    events = store.read_files_arrow(EVENTS, found.paths, columns=list(SESSION_EVENT_COLUMNS))
    keys = pair_keys(events, partition="event_date", key="user_id")
    events = events.filter(pc.is_in(keys, value_set=pa.array(pair_texts(wanted), pa.string())))
    times = micros_of(events.column("event_ts"))
    by_cluster: dict[int, list[dict[str, Any]]] = {}
    for row, ts in zip(events.drop_columns(["event_ts"]).to_pylist(), times, strict=True):
        row["_ts"] = ts
        by_cluster.setdefault(wanted[(row["event_date"], row["user_id"])], []).append(row)
    merged = {}
    for index, old in single.items():
        row = merged_session_row(
            old,
            by_cluster.get(index, []),
            gap=settings.session_gap,
            max_length=settings.max_session_length,
            conversion_events=settings.conversion_events,
        )
        if row is not None:
            merged[index] = (row, old["session_id"])
    return merged


def sessions_of_additions(
    store: DeltaStore,
    spark: SparkSession,
    *,
    additions: Additions,
    old: DataFrame,
    settings: Settings,
) -> DataFrame:
    """The isolated and merged pairs' sessions, in the shape of `sessions_with_quarantine`
    (QUARANTINE_DETAIL included): their old rows but those the merged sessions replace, with
    the quarantine's detail of a flagged one, the merged sessions, and the sessions of the
    isolated clusters' added rows alone (read from their files), numbered again by start."""
    pairs = pair_filter(additions.pairs, partition="session_date", key="user_id")
    built = []
    if additions.merged.num_rows:
        built.append(spark.createDataFrame(additions.merged))
    if additions.rows:
        added = (
            store.read_files(EVENTS, additions.paths)
            .select(*SESSION_EVENT_COLUMNS)
            .where(pair_filter(additions.rows, partition="event_date", key="user_id"))
        )
        built.append(
            sessions_with_quarantine(
                added,
                gap=settings.session_gap,
                max_length=settings.max_session_length,
                conversion_events=settings.conversion_events,
            )
        )
    detail_columns = ["capped_at", "chain_end", "excluded_events"]
    detail = spark.createDataFrame(
        additions.quarantine.select(["session_id", *detail_columns]).to_pylist(),
        "session_id string, capped_at timestamp, chain_end timestamp, excluded_events long",
    )
    # The old rows but those the merged sessions replace (a merged session keeps its old id
    # when its start did not move).
    unmerged = (
        pairs & ~isin_texts(F.col("session_id"), sorted(additions.replaced))
        if additions.replaced
        else pairs
    )
    kept = (
        old.where(unmerged)
        .drop("stitched_user_id", "_file")
        .join(detail, on="session_id", how="left")
        .withColumn(
            QUARANTINE_DETAIL,
            F.when(F.col("is_quarantined"), F.struct(*detail_columns)),
        )
        .drop(*detail_columns)
    )
    number = "PARTITION BY user_id, session_date ORDER BY session_start"
    return reduce(
        DataFrame.unionByName, [*(frame.where(pairs) for frame in built), kept]
    ).withColumn("session_number", F.expr(f"CAST(row_number() OVER ({number}) AS INT)"))


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
        return to_arrow_schema(SESSION_QUARANTINE.schema).empty_table().select(columns)
    rows = store.read_arrow(SESSION_QUARANTINE, columns=columns)
    return rows.filter(pc.is_in(rows.column("user_id"), pa.array(sorted(users), pa.string())))
