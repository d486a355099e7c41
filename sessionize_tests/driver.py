"""Processing batches the way the orchestration does, without Dagster: for the property tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS_MANIFEST,
    LANDING_BATCHES,
    USER_LIFECYCLE_SNAPSHOT,
)
from sessionize_assets.partitions import lifecycle_range, session_dates_for
from sessionize_assets.pipeline.daily import DailyReport, update_arrivals, update_daily
from sessionize_assets.pipeline.events import EventsReport, update_events
from sessionize_assets.pipeline.identities import IdentitiesReport, update_identities
from sessionize_assets.pipeline.ingest import ingest_landed
from sessionize_assets.pipeline.landing import fingerprint
from sessionize_assets.pipeline.lifecycle.bookkeeping import LifecycleReport
from sessionize_assets.pipeline.lifecycle.update import update_lifecycle
from sessionize_assets.pipeline.manifests import event_dates_behind
from sessionize_assets.pipeline.sessions import SessionsReport, update_sessions
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings


@dataclass(frozen=True)
class BatchRun:
    received: date
    events: EventsReport
    identities: IdentitiesReport
    sessions: SessionsReport
    daily: DailyReport
    lifecycle: LifecycleReport | None


def process_batch(
    store: DeltaStore, spark: SparkSession, *, settings: Settings, received: date, run_id: str
) -> BatchRun:
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    ingested = ingest_landed(
        store,
        landing,
        lambda: spark,
        fingerprints={received: fingerprint(received, landing.batch_files(received))},
        settings=settings,
        run_id=run_id,
    )
    return follow_through(
        store,
        spark,
        settings=settings,
        received=received,
        event_dates=ingested.batches[received].touched_event_dates,
        run_id=run_id,
    )


def catch_up(
    store: DeltaStore, spark: SparkSession, *, settings: Settings, run_id: str
) -> BatchRun:
    """What the sensors run when no batch came: the event dates behind their batches (an
    erasure leaves them so), and what follows them."""
    behind = event_dates_behind(
        store.read_arrow(BATCH_EVENT_DATES), store.read_arrow(EVENTS_MANIFEST)
    )
    latest = _last_date(store, LANDING_BATCHES)
    assert latest is not None, "nothing ingested"
    return follow_through(
        store, spark, settings=settings, received=latest, event_dates=sorted(behind), run_id=run_id
    )


def follow_through(
    store: DeltaStore,
    spark: SparkSession,
    *,
    settings: Settings,
    received: date,
    event_dates: list[date],
    run_id: str,
) -> BatchRun:
    """The runs that follow an ingestion, for these event dates, as the sensors ask for them."""
    events = update_events(store, lambda: spark, event_dates=event_dates, run_id=run_id)
    return after_events(
        store, lambda: spark, settings=settings, received=received, events=events, run_id=run_id
    )


def after_events(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    *,
    settings: Settings,
    received: date,
    events: EventsReport,
    run_id: str,
) -> BatchRun:
    """The runs that follow an events run (`events`), as the sensors ask for them."""
    identities = update_identities(store, run_id=run_id)  # in the events run
    sessions = update_sessions(
        store,
        spark,
        session_dates=session_dates_for([*events.updated, *events.also_changed], settings),
        settings=settings,
        run_id=run_id,
    )
    daily = summarise(store, settings=settings, run_id=run_id)
    # What lifecycle_sensor asks for, with the lake's partitions standing in for Dagster's.
    span = lifecycle_range(
        sessions_reported=sessions.changed,
        through=_last_date(store, USER_LIFECYCLE_SNAPSHOT),
        latest=_last_date(store, LANDING_BATCHES),  # an empty batch is ingested too
        start=settings.start_date,
    )
    lifecycle = None
    if span is not None:
        lifecycle = update_lifecycle(store, through=span[1], settings=settings, run_id=run_id)
    return BatchRun(
        received=received,
        events=events,
        identities=identities,
        sessions=sessions,
        daily=daily,
        lifecycle=lifecycle,
    )


def _last_date(store: DeltaStore, spec: TableSpec) -> date | None:
    return max((date.fromisoformat(d) for d in store.row_counts(spec)), default=None)


def summarise(store: DeltaStore, *, settings: Settings, run_id: str) -> DailyReport:
    """SPEC §9's summaries_job: `arrivals` and `daily_sessions` brought up to date with the
    lake (summaries_sensor asks for it once the sessions are up to date; its tables are the
    lifecycle's neighbours, not its inputs, so the order between the two does not matter)."""
    update_arrivals(store, run_id=run_id)
    return update_daily(store, settings=settings, run_id=run_id)
