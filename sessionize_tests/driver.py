"""Processing batches the way the orchestration does, without Dagster: for the property tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings
from sessionize_assets.updates import (
    EventsReport,
    SessionsReport,
    ingest_batch_lines,
    update_events,
    update_sessions,
)


@dataclass(frozen=True)
class BatchRun:
    received: date
    events: EventsReport
    sessions: SessionsReport


def process_batch(
    store: DeltaStore, spark: SparkSession, *, settings: Settings, received: date, run_id: str
) -> BatchRun:
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    ingested = ingest_batch_lines(
        store,
        landing.read_lines(spark, received),
        received=received,
        settings=settings,
        run_id=run_id,
    )
    events = update_events(store, spark, event_dates=ingested.touched_event_dates, run_id=run_id)
    sessions = update_sessions(
        store,
        spark,
        session_dates=session_dates_for(events.updated, settings),
        settings=settings,
        run_id=run_id,
    )
    return BatchRun(received=received, events=events, sessions=sessions)
