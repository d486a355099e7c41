"""What is behind: the one place that compares the lake's bookkeeping (and the instance's
record of materializations) with what should be, for the sensors, `replay` and `rebuild`.

Everything here reads small bookkeeping tables on the driver (no Spark session is started) and
the Dagster instance; nothing writes. Each answer is derived again at every call, so a failed
or killed run leaves its work to be found behind again: there is no cursor to lose.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

import pyarrow as pa
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DailyPartitionsDefinition,
    PartitionsDefinition,
)
from deltalake.exceptions import DeltaError

from sessionize_assets.assets.daily import unreported_dates
from sessionize_assets.assets.keys import EVENTS_KEY, RAW_EVENTS_KEY, SESSIONS_KEY, SNAPSHOT_KEY
from sessionize_assets.lake.store import DeltaStore, LakeError, TableSpec
from sessionize_assets.lake.tables import (
    ARRIVALS,
    BATCH_EVENT_DATES,
    EVENTS_MANIFEST,
    LANDING_BATCHES,
    SESSIONS,
    SESSIONS_MANIFEST,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import lifecycle_range, session_dates_for
from sessionize_assets.pipeline.daily import daily_behind, sources_behind
from sessionize_assets.pipeline.landing import LandingComparison, compare_landing, ingested_batches
from sessionize_assets.pipeline.lifecycle.bookkeeping import ABSORBED, absorbed_by
from sessionize_assets.pipeline.manifests import (
    Plan,
    event_date_loads,
    event_dates_behind,
    session_date_loads,
    session_dates_behind,
)
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings


class Behind:
    """What the lake (`lake`, a store of the run's backend) and the landing zone (`landing`)
    hold behind, for the pipeline configured by `settings`."""

    def __init__(
        self, *, settings: Settings, lake: DeltaStore, landing: LandingZoneResource
    ) -> None:
        self._settings = settings
        self._lake = lake
        self._landing = landing

    def landing_batches(
        self, *, last: date, cached: Mapping[str, tuple[int, int, str]] | None = None
    ) -> LandingComparison:
        """The landing zone's batch folders up to received day `last` against what the lake
        records as ingested: what the landing sensor and `sessionize replay` both act on.
        `cached`: digests of files read before (the landing sensor's cursor)."""
        return compare_landing(
            self._landing.folders(self._settings.start_date, last),
            ingested_batches(self._bookkeeping(LANDING_BATCHES)),
            cached=cached,
        )

    def event_dates(self) -> dict[date, Plan]:
        """Event dates from the start date whose partition has not absorbed the batches the
        lake's index says hold them (`manifests.event_dates_behind`), with their plans."""
        return self._event_plans(self._bookkeeping(BATCH_EVENT_DATES))

    def event_dates_and_loads(self) -> tuple[dict[date, Plan], dict[date, float]]:
        """`event_dates`, and each one's load: the events its run reads, in typical days
        (`manifests.event_date_loads`), what `partitions.contiguous_ranges` cuts the events
        runs by. Each bookkeeping table is read once."""
        index = self._bookkeeping(BATCH_EVENT_DATES)
        plans = self._event_plans(index)
        return plans, event_date_loads(index, plans) if plans else {}

    def _event_plans(self, index: pa.Table) -> dict[date, Plan]:
        plans = event_dates_behind(index, self._bookkeeping(EVENTS_MANIFEST))
        return {day: plan for day, plan in plans.items() if day >= self._settings.start_date}

    def session_dates(
        self, instance: DagsterInstance, *, session_days: PartitionsDefinition
    ) -> dict[date, tuple[int, int]]:
        """Session dates through the last of `session_days` to run again, each with what it is
        behind on (the events version it has not absorbed, the storage id of the newest
        materialization of an event date of its window; -1 where it is not behind on that
        side):

        - the lake: dates that have not absorbed the events their window holds
          (`manifests.session_dates_behind`). A failed or dead run leaves its dates here;
        - Dagster: dates materialized before an event date of their window last was (or
          never, while one was). That is what automation's condition asks for: every date
          around an events run's range, changed or not. Asking for it here too leaves
          automation nothing to ask for, so the sessions start at once as one range run, not
          as a backfill that the backfill daemon takes up to 30 s to start.
        """
        return self._session_dates(
            instance,
            session_days,
            self._bookkeeping(EVENTS_MANIFEST),
            self._bookkeeping(SESSIONS_MANIFEST),
        )

    def session_dates_and_loads(
        self, instance: DagsterInstance, *, session_days: PartitionsDefinition
    ) -> tuple[dict[date, tuple[int, int]], dict[date, float]]:
        """`session_dates`, and each session date's load: the events of its date it has not
        absorbed, in typical days (`manifests.session_date_loads`), what
        `partitions.contiguous_ranges` cuts the sessions runs by. Each bookkeeping table is
        read once, the index only when a date is behind."""
        events_manifest = self._bookkeeping(EVENTS_MANIFEST)
        sessions_manifest = self._bookkeeping(SESSIONS_MANIFEST)
        dates = self._session_dates(instance, session_days, events_manifest, sessions_manifest)
        if not dates:
            return dates, {}
        index = self._bookkeeping(BATCH_EVENT_DATES)
        return dates, session_date_loads(index, events_manifest, sessions_manifest)

    def _session_dates(
        self,
        instance: DagsterInstance,
        session_days: PartitionsDefinition,
        events_manifest: pa.Table,
        sessions_manifest: pa.Table,
    ) -> dict[date, tuple[int, int]]:
        last_key = session_days.get_last_partition_key()
        if last_key is None:
            return {}
        last = date.fromisoformat(last_key)
        lake = session_dates_behind(events_manifest, sessions_manifest, settings=self._settings)
        materialized = DagsterEventType.ASSET_MATERIALIZATION
        newest: dict[date, int] = {}
        for key, storage_id in instance.get_latest_storage_id_by_partition(
            EVENTS_KEY, materialized
        ).items():
            for day in session_dates_for([date.fromisoformat(key)], self._settings):
                newest[day] = max(newest.get(day, -1), storage_id)
        own = instance.get_latest_storage_id_by_partition(SESSIONS_KEY, materialized)
        dagster = {
            day: storage_id
            for day, storage_id in newest.items()
            if storage_id > own.get(day.isoformat(), -1)
        }
        return {
            day: (lake.get(day, -1), dagster.get(day, -1))
            for day in sorted({*lake, *dagster})
            if day <= last
        }

    def summary_dates(
        self, instance: DagsterInstance, *, daily_days: DailyPartitionsDefinition
    ) -> list[date]:
        """The dates of `arrivals` or `daily_sessions` behind the lake (`pipeline/daily.py`),
        and the `daily_sessions` partitions `instance` shows behind their sessions
        (`assets/daily.unreported_dates`): what a summaries run brings up to date and reports."""
        arrivals = sources_behind(self._lake, ARRIVALS)
        daily = daily_behind(self._lake, self._settings)
        unreported = unreported_dates(instance, daily_days)
        return sorted({*arrivals.dates, *daily.dates, *unreported})

    def lifecycle_versions(self) -> list[int | None] | None:
        """[sessions version, sessions version the lifecycle's intervals absorbed] when the
        intervals are behind the sessions (a run died after the sessions commit), else None."""
        try:
            sessions = self._lake.version(SESSIONS)
        except (DeltaError, LakeError):  # unreadable: a lifecycle run would say what is wrong
            return None
        if sessions is None:
            return None
        try:
            absorbed, _ = absorbed_by(self._lake.applied_version(USER_LIFECYCLE_STATE, ABSORBED))
        except (DeltaError, LakeError):
            absorbed = None
        return None if absorbed is not None and absorbed >= sessions else [sessions, absorbed]

    def lifecycle_span(
        self,
        instance: DagsterInstance,
        *,
        reported: set[date],
        behind: bool,
        failed_from: date | None = None,
    ) -> tuple[date, date] | None:
        """`lifecycle_range` on the instance's partitions: the snapshot days no run has
        computed yet, a failed run's days, the session dates `reported` since the last run,
        and the latest received day when the intervals are `behind` `sessions` (a run died
        after the sessions commit). None: up to date. A lifecycle run corrects whatever is
        stale, whichever range it is given."""
        latest = self.latest_received(instance)
        if behind and latest is not None:
            reported = {*reported, latest}
        return lifecycle_range(
            sessions_reported=reported,
            through=latest_materialized_day(instance, SNAPSHOT_KEY),
            latest=latest,
            start=self._settings.start_date,
            failed_from=failed_from,
        )

    def lifecycle_catch_up(self, instance: DagsterInstance) -> tuple[date, date] | None:
        """The range a lifecycle run takes when nothing new changed (`lifecycle_span`)."""
        return self.lifecycle_span(
            instance, reported=set(), behind=self.lifecycle_versions() is not None
        )

    def latest_received(self, instance: DagsterInstance) -> date | None:
        """The latest received day ingested. Dagster's record of `raw_events` can miss the
        last batch: an ingest run killed after its last commit (the lake's landing record) has
        ingested it for good, and nothing will ingest it again. So once this instance has
        recorded a batch, the lake's landing record counts too. An instance that has recorded
        none has not followed this lake (a new Dagster home): new batches start it, as they
        start the other sensors."""
        seen = latest_materialized_day(instance, RAW_EVENTS_KEY)
        if seen is None:
            return None
        recorded = self._bookkeeping(LANDING_BATCHES).column("received_date").to_pylist()
        return max([seen, *recorded])

    def _bookkeeping(self, spec: TableSpec) -> pa.Table:
        return self._lake.read_arrow(spec)


def latest_materialized_day(instance: DagsterInstance, key: AssetKey) -> date | None:
    """The latest partition (a day) of `key` this instance has a materialization of."""
    keys = instance.get_materialized_partitions(key)
    return max((date.fromisoformat(k) for k in keys), default=None)
