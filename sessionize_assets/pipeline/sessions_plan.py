"""What a sessions run recomputes: the dates it recomputes whole and the (user, date) pairs
touched elsewhere since what each date absorbed, with the progress the run then records.

A date never computed, computed with another definition (gap, cap, conversions), asked for with
`full_refresh`, or whose `events` history since its absorbed version is gone is recomputed
whole; a date behind the `events` version is brought up to date by the pairs a change touched
(`pipeline/touched.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.pipeline.keyed_reads import PRUNING_PAIRS_LIMIT, keys_by_partition
from sessionize_assets.pipeline.manifests import SessionsProgress, sessions_progress
from sessionize_assets.pipeline.sessions_diff import SessionsScope
from sessionize_assets.pipeline.touched import TouchedPairs, touched_pairs
from sessionize_assets.settings import Settings


@dataclass(frozen=True, kw_only=True)
class SessionsPlan:
    """Which sessions dates a run recomputes whole, which it brings up to date by the (user,
    date) pairs touched since what they absorbed (`scope`), and the progress it records."""

    scope: SessionsScope  # its `pairs` frame is persisted: the run unpersists it
    partial: list[date]
    pairs: int  # touched (user, date) pairs outside the whole dates
    progress: SessionsProgress

    @property
    def computed(self) -> list[date]:
        return sorted([*self.scope.whole, *self.partial])

    @property
    def recomputes_nothing(self) -> bool:
        """No date is recomputed whole and no pair in the others' windows changed."""
        return not self.scope.whole and not self.pairs


def plan_sessions(
    store: DeltaStore,
    spark: SparkSession,
    dates: list[date],
    *,
    definition: str,
    settings: Settings,
    full_refresh: bool,
) -> SessionsPlan | None:
    """The dates to recompute whole and the pairs touched elsewhere, with the sessions
    `definition` the run computes by; None before any events, or when every date is up to
    date. Spark finds the pairs of a large change (`touched_pairs`); those are then brought to
    the driver in one job (`keys_by_partition`), and counted in another past
    PRUNING_PAIRS_LIMIT."""
    events_version = store.version(EVENTS)
    if events_version is None:
        return None
    progress = sessions_progress(store, partitions=dates)
    whole = [
        d
        for d in dates
        if full_refresh or d not in progress or progress[d].definition != definition
    ]
    partial = [d for d in dates if d not in whole and progress[d].events_version < events_version]
    found = touched_pairs(
        store, spark, {d: progress[d].events_version for d in partial}, events_version, settings
    )
    if found is None:  # the events history since then is gone: recompute those dates
        whole, partial = sorted([*whole, *partial]), []
        found = TouchedPairs.none(spark)
    if not whole and not partial:
        return None
    touched = found.pairs.persist(StorageLevel.MEMORY_AND_DISK)
    by_date = (
        found.listed
        if found.listed is not None
        else keys_by_partition(
            touched, partition="session_date", key="user_id", limit=PRUNING_PAIRS_LIMIT
        )
    )
    return SessionsPlan(
        scope=SessionsScope(whole=whole, pairs=touched, listed=by_date),
        partial=partial,
        pairs=touched.count() if by_date is None else sum(map(len, by_date.values())),
        progress=SessionsProgress(events_version=events_version, definition=definition),
    )
