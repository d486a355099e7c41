"""Which events a sessions run recomputes from, and where it reads them.

Every user's events around the run's whole dates, and each touched pair's user's events in
that pair's window, found by user (`keyed_reads.read_by_keys`: Parquet skips the other users'
row groups). A small run reads them on the driver with Arrow in one pass and builds their
sessions there (`built_on_driver`); a larger one reads them with Spark (`read_events`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore, PartitionValue, partition_string
from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.partitions import event_window
from sessionize_assets.pipeline.keyed_reads import (
    PUSHED_KEYS_TOTAL,
    pair_keys,
    pair_texts,
    read_by_keys,
)
from sessionize_assets.pipeline.sessions_diff import EventsRead, SessionsScope, event_dates_of
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.sessions import SESSION_EVENT_COLUMNS
from sessionize_assets.transforms.sessions_rows import sessions_with_quarantine_rows

# A run whose events to read are on dates holding at most EVENTS_SCANNED_ON_DRIVER events (the
# log's counts) reads them with Arrow, and builds their sessions on the driver when it kept at
# most EVENTS_BUILT_ON_DRIVER (`transforms/sessions_rows.py`): Spark's pass over a daily
# batch's few thousand events was a job of about 14 stages, a second or more of scheduling.
# The dates are scanned by row group (the touched users' only, outside the whole dates'
# windows, which are kept whole), and the rows kept are held as Python objects while their
# sessions are built: about 1 KB and 10 us each, 25 us where each event is a session of its
# own (440,000 such took 11 s), so the bound keeps the build within about 2.5 s. The mid size's
# daily batch: 476,000 rows scanned in 0.6-1.0 s, 42,300 kept, their sessions built in 0.4 s,
# where Spark's job took 2-3 s more. Such a run then commits on the driver too when what it
# rewrites fits (pipeline/sessions_on_driver.py). A run that recomputes many whole dates (a
# rebuild) keeps Spark's pass, on both cores; one that kept more than the bound reads its
# events again with Spark.
EVENTS_SCANNED_ON_DRIVER = 1_000_000
EVENTS_BUILT_ON_DRIVER = 100_000


@dataclass(frozen=True, kw_only=True)
class EventsLookup:
    """How a run found its events, for its report: the event dates searched by user, the
    users looked up there, and the rows of the dates read whole."""

    dates_searched_by_user: int
    users_looked_up: int
    events_rows_scanned: int


@dataclass(frozen=True, kw_only=True)
class BuiltOnDriver:
    """The sessions (`sessions_with_quarantine_rows`) of the events the driver read, and how
    many events of how many users, found how."""

    sessions: pa.Table
    read: EventsRead
    lookup: EventsLookup


def users_by_event_date(
    scope: SessionsScope, *, settings: Settings, skipped: set[tuple[date, str]]
) -> dict[date, set[str]] | None:
    """The touched users whose events are looked up on each event date outside the whole
    dates' windows (all of whose events are read), but for the `skipped` pairs; None when the
    pairs did not come to the driver or are too many to look up by key."""
    by_date = scope.listed
    if by_date is None or scope.pair_count > PUSHED_KEYS_TOTAL:
        return None
    wanted: dict[date, set[str]] = {}
    whole_window = set(event_window(scope.whole, settings))
    for session_date, users in by_date.items():
        looked_up = [user for user in users if (session_date, user) not in skipped]
        if not looked_up:
            continue
        for event_date in event_window([session_date], settings):
            if event_date not in whole_window:
                wanted.setdefault(event_date, set()).update(looked_up)
    return wanted


def built_on_driver(
    store: DeltaStore,
    scope: SessionsScope,
    *,
    settings: Settings,
    rules: Mapping[str, Any],
    skipped: set[tuple[date, str]],
    event_rows: Mapping[str, int],
) -> BuiltOnDriver | None:
    """The sessions the driver builds (`sessions_with_quarantine_rows`, given `rules`) from what
    `read_events` reads, read with Arrow in one pass (no Spark job), and what was read; when
    the dates it reads hold at most EVENTS_SCANNED_ON_DRIVER events and it keeps at most
    EVENTS_BUILT_ON_DRIVER; None otherwise. The whole dates' windows are read whole; elsewhere
    the touched users' row groups (the files are sorted by user), then their rows matched on
    (event date, user)."""
    wanted = users_by_event_date(scope, settings=settings, skipped=skipped)
    whole_window = event_window(scope.whole, settings)
    if (
        wanted is None
        or events_on(event_rows, whole_window) > EVENTS_BUILT_ON_DRIVER
        or events_on(event_rows, [*whole_window, *wanted]) > EVENTS_SCANNED_ON_DRIVER
    ):
        return None
    users = sorted({user for looked_up in wanted.values() for user in looked_up})
    read = store.read_arrow(
        EVENTS,
        partitions=[*whole_window, *wanted],
        columns=SESSION_EVENT_COLUMNS,
        where=pc.field("event_date").isin(pa.array(whole_window, pa.date32()))
        | pc.field("user_id").isin(pa.array(users, pa.string())),
    )
    # A row of a date read by user is kept for its own date's users only.
    key = pair_keys(read, partition="event_date", key="user_id")
    listed = pair_texts((day, user) for day, looked_up in wanted.items() for user in looked_up)
    keep = pc.or_(
        pc.is_in(read.column("event_date"), pa.array(whole_window, pa.date32())),
        pc.is_in(key, pa.array(listed, pa.string())),
    )
    kept = read.filter(keep)
    if kept.num_rows > EVENTS_BUILT_ON_DRIVER:
        return None
    return BuiltOnDriver(
        sessions=sessions_with_quarantine_rows(kept, **rules),
        read=EventsRead(kept.num_rows, len(pc.unique(kept.column("user_id")))),
        lookup=EventsLookup(
            dates_searched_by_user=len(wanted),
            users_looked_up=len(listed),
            events_rows_scanned=events_on(event_rows, whole_window),
        ),
    )


def read_events(
    store: DeltaStore,
    scope: SessionsScope,
    *,
    settings: Settings,
    frames: list[DataFrame],
    keep: StorageLevel,
    skipped: set[tuple[date, str]],
    event_rows: Mapping[str, int],
) -> tuple[DataFrame, EventsLookup]:
    """Every user's events around whole dates; elsewhere each touched pair's user's events in
    that pair's window, found by user (Parquet skips the other users' row groups), but for the
    `skipped` pairs (updated from their additions). With a few pairs on the driver, so are the
    users of each event date. Persisted frames (at `keep`) go to `frames`; `event_rows` are
    the events per date (`DeltaStore.row_counts`)."""
    columns = list(SESSION_EVENT_COLUMNS)
    whole_window = event_window(scope.whole, settings)
    wanted: DataFrame | dict[date, set[str]] | None = users_by_event_date(
        scope, settings=settings, skipped=skipped
    )
    if wanted is None:
        wanted = (
            scope.pairs.select("user_id", event_dates_of(F.col("session_date"), settings))
            .where(~F.col("event_date").isin(whole_window))
            .select("event_date", "user_id")
            .distinct()
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        frames.append(wanted)
    lookup = read_by_keys(store, EVENTS, wanted=wanted, key="user_id", columns=columns)
    found = EventsLookup(
        dates_searched_by_user=len(lookup.searched),
        users_looked_up=lookup.keys_pushed,
        events_rows_scanned=events_on(event_rows, [*whole_window, *lookup.scanned]),
    )
    events = store.read(EVENTS, partitions=whole_window).select(*columns).unionByName(lookup.rows)
    if scope.pair_count:
        # Found by user: kept, so the summary's count does not run the lookup again. Whole
        # dates alone are not (every event of them, wide, held to be counted again by user).
        events = events.persist(keep)
        frames.append(events)
    return events, found


def events_on(event_rows: Mapping[str, int], dates: Iterable[PartitionValue]) -> int:
    """The events on these dates, from the rows per date `DeltaStore.row_counts` gives."""
    return sum(event_rows.get(day, 0) for day in {partition_string(value) for value in dates})
