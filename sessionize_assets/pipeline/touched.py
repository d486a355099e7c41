"""Which (user_id, session_date) pairs a change of `events` touched: what a sessions run
recomputes outside the dates it recomputes whole.

A change for user u on event date E can only move u's sessions on E - lookahead .. E +
lookback (partitions.py). The files `events` added or removed since a session date absorbed
its version (read from its Delta log) hold those users: a few files for a daily batch, read
on the driver with Arrow, more read by Spark in one query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.parquet_files import FILE_COLUMN
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.partitions import (
    event_window,
    session_dates_for,
    session_lookahead_days,
    session_lookback_days,
)
from sessionize_assets.pipeline.keyed_reads import isin_texts
from sessionize_assets.settings import Settings

PAIR = ("user_id", "session_date")
PAIRS_SCHEMA = "user_id string, session_date date"


@dataclass(frozen=True, kw_only=True)
class ChangedEvents:
    """What the changed `events` files hold, by user, when they were read on the driver: the
    times of each user's rows in the files added (and still live or kept by compaction), and
    the users with a row in a file removed (a displaced copy, a recomputed date, an erasure).
    A user absent from `removed` had events added and none removed: what
    `pipeline/sessions_additions.py` updates sessions from without reading the history."""

    # user -> (event_date, event_ts in microseconds since the epoch, the file) of each row
    # added
    added: dict[str, list[tuple[date, int, str]]] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    # The commit that added each file of `added`.
    versions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TouchedPairs:
    """The (user_id, session_date) pairs whose events changed: `listed` by date when they
    were found on the driver (with `changed`, the rows of the changed files), else `pairs`,
    the frame Spark found them in."""

    pairs: DataFrame | None = None
    listed: dict[date, list[str]] | None = None
    changed: ChangedEvents | None = None

    def frame(self, spark: SparkSession) -> DataFrame:
        """The pairs as a Spark frame (`PAIRS_SCHEMA`): made from `listed` when they are
        listed (a run done on the driver asks for none)."""
        if self.pairs is not None:
            return self.pairs
        listed = self.listed or {}
        pairs = [(user, day) for day, users in listed.items() for user in users]
        return spark.createDataFrame(pairs, PAIRS_SCHEMA)


# No pair touched.
NO_PAIRS = TouchedPairs(listed={})


def touched_pairs(
    store: DeltaStore,
    absorbed: dict[date, int],
    events_version: int,
    settings: Settings,
) -> TouchedPairs | None:
    """(user_id, session_date) pairs whose events changed after each date's absorbed version.

    The changed files are read on the driver when they hold at most `driver_write_bytes`
    together (a daily batch's), by Spark otherwise. None when the `events` history since then
    can no longer be read.
    """
    if not absorbed:
        return NO_PAIRS
    changes = store.changes(
        EVENTS, since_version=min(absorbed.values()), through_version=events_version
    )
    if changes is None:
        return None
    # The event dates that decide these session dates.
    window = {event_date.isoformat() for event_date in event_window(list(absorbed), settings)}
    latest: dict[str, int] = {}
    sizes: dict[str, int | None] = {}
    removed: set[str] = set()
    event_dates: dict[str, date] = {}
    for change in changes:
        if change.partition in window:
            latest[change.path] = max(latest.get(change.path, -1), change.version)
            event_dates[change.path] = date.fromisoformat(change.partition)
            if sizes.get(change.path) is None:
                sizes[change.path] = change.size
            if not change.added:
                removed.add(change.path)
    # A file whose last change every session date its event date decides has absorbed touches
    # no pair: it is not read. The changes are read from the oldest absorbed version, so one
    # date left behind (say, the day after a rebuild's last event date) would otherwise have
    # the run read every file changed since (that rebuild's rewrite of the whole history).
    # The session dates each changed event date decides, once per date.
    decided = {day: session_dates_for([day], settings) for day in set(event_dates.values())}
    for path in [
        p for p, v in latest.items() if _absorbed_by_all(decided[event_dates[p]], v, absorbed)
    ]:
        del latest[path], sizes[path]
        removed.discard(path)
    if not latest:
        return NO_PAIRS
    known = [size for size in sizes.values() if size is not None]
    if len(known) == len(sizes) and sum(known) <= settings.driver_write_bytes:
        listed, changed = _touched_on_driver(store, latest, removed, absorbed, decided)
        return TouchedPairs(listed=listed, changed=changed)
    # Which commit last changed each file, and which version each date absorbed: few distinct
    # versions, so both are expressions in the query.
    changed_at: dict[int, list[str]] = {}
    for path, version in latest.items():
        changed_at.setdefault(version, []).append(path)
    absorbed_at: dict[int, list[date]] = {}
    for session_date, version in absorbed.items():
        absorbed_at.setdefault(version, []).append(session_date)
    # The path relative to the table root, as the Delta log names it.
    relative_path = F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+/[^/]+)$", 1)
    return TouchedPairs(
        pairs=store.read_files(EVENTS, latest)
        .select(
            "user_id",
            _lookup(relative_path, changed_at).alias("_version"),
            _session_dates(F.col("event_date"), settings),
        )
        .withColumn("_absorbed", _lookup(F.col("session_date"), absorbed_at))
        .where(F.col("_version") > F.col("_absorbed"))
        .select(*PAIR)
        .distinct()
    )


def _touched_on_driver(
    store: DeltaStore,
    latest: dict[str, int],
    removed: set[str],
    absorbed: dict[date, int],
    decided: dict[date, list[date]],
) -> tuple[dict[date, list[str]], ChangedEvents]:
    """`touched_pairs` of a few changed files (`latest`: the commit that last changed each;
    `removed`: those a commit removed), read with Arrow: the users of each absorbed session
    date that a newer commit changed, and what the files hold by user. `decided`: the session
    dates each of the files' event dates decides."""
    columns = ["user_id", "event_date", "event_ts"]
    rows = store.read_files_arrow(EVENTS, latest, columns=columns, with_file=True)
    found: dict[date, set[str]] = {}
    changed = ChangedEvents(versions={path: v for path, v in latest.items() if path not in removed})
    micros = micros_of(rows.column("event_ts"))
    for user, event_date, event_ts, path in zip(
        rows.column("user_id").to_pylist(),
        rows.column("event_date").to_pylist(),
        micros,
        rows.column(FILE_COLUMN).to_pylist(),
        strict=True,
    ):
        version = latest[path]
        for session_date in decided[event_date]:
            if absorbed.get(session_date, version) < version:
                found.setdefault(session_date, set()).add(user)
        if path in removed:
            changed.removed.add(user)
        else:
            changed.added.setdefault(user, []).append((event_date, event_ts, path))
    return {day: sorted(users) for day, users in sorted(found.items())}, changed


def _absorbed_by_all(session_dates: list[date], version: int, absorbed: dict[date, int]) -> bool:
    """Whether every one of `session_dates` (those a file's event date decides) absorbed
    `version` or a later one: a file last changed at `version` touches none of their pairs
    (nor do the rows of a file removed then: every session that could hold them was computed
    after)."""
    return all(day in absorbed and absorbed[day] >= version for day in session_dates)


def _session_dates(event_date: Column, settings: Settings) -> Column:
    """`session_date`, one row per session date the event date decides: what
    `partitions.session_dates_for` gives, computed in the query."""
    return days_around_column(
        event_date,
        before=session_lookahead_days(settings),
        after=session_lookback_days(settings),
    ).alias("session_date")


def days_around_column(day: Column, *, before: int, after: int) -> Column:
    """One row per date from `before` days before `day` to `after` days after it."""
    return F.explode(F.sequence(F.date_sub(day, before), F.date_add(day, after)))


def _lookup(column: Column, groups: dict[int, list]) -> Column:
    """The number whose list holds `column`'s value (null for none), as a CASE expression of
    hash-set tests (`isin_texts`: a list of paths is one string to the JVM): a driver-side
    mapping with few distinct numbers, without a broadcast job."""
    found: Column | None = None
    for number, values in sorted(groups.items()):
        test = isin_texts(column, values)
        found = F.when(test, F.lit(number)) if found is None else found.when(test, F.lit(number))
    return found if found is not None else F.lit(None).cast("long")


def micros_of(timestamps: pa.ChunkedArray) -> list[int]:
    """Arrow timestamps as microseconds since the epoch (UTC)."""
    return pc.cast(timestamps, pa.timestamp("us")).cast(pa.int64()).to_pylist()
