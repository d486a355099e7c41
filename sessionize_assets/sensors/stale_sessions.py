"""stale_sessions_sensor: sessions range runs for the session dates behind their events."""

from __future__ import annotations

from dagster import (
    PartitionsDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.sensors.requests import (
    pipeline_sensor,
    range_requests,
    runs_going,
    sessions_backfill_requested,
)
from sessionize_assets.settings import Settings


def build_stale_sessions_sensor(
    *,
    settings: Settings,
    sessions_job_name: str,
    events_job_name: str,
    session_days: PartitionsDefinition,
) -> SensorDefinition:
    @pipeline_sensor(
        name="stale_sessions_sensor",
        job_name=sessions_job_name,
        settings=settings,
        description=(
            "Once an events run has ended, requests the session dates whose window holds "
            "events they have not absorbed (the lake's two manifests) or were materialized "
            "before an event date of their window was (what automation asks for), as range "
            f"runs of at most {settings.max_partitions_per_run} days' worth of events; dates a "
            "failed run left behind are asked for again, with a backoff."
        ),
    )
    def stale_sessions_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> SensorResult | SkipReason:
        going = runs_going(context, job_names=(events_job_name, sessions_job_name), sessions=True)
        if going:
            return SkipReason(f"an events or sessions run is going ({going[0].run_id}); waiting")
        backfill = sessions_backfill_requested(context.instance)
        if backfill is not None:
            return SkipReason(f"backfill {backfill} of sessions is requested; waiting for it")
        behind, loads = Behind(
            settings=settings, lake=lake.store(), landing=landing
        ).session_dates_and_loads(context.instance, session_days=session_days)
        if not behind:
            return SkipReason("every session date has absorbed the events its window holds")
        return range_requests(
            context,
            settings,
            job_name=sessions_job_name,
            states={day: list(state) for day, state in behind.items()},
            loads=loads,
            what="session dates behind their events",
        )

    return stale_sessions_sensor
