"""late_data_sensor: events range runs for the event dates behind the batches that hold them."""

from __future__ import annotations

from dagster import SensorDefinition, SensorEvaluationContext, SensorResult, SkipReason

from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.sensors.requests import pipeline_sensor, range_requests, runs_going
from sessionize_assets.settings import Settings


def build_late_data_sensor(*, settings: Settings, events_job_name: str) -> SensorDefinition:
    @pipeline_sensor(
        name="late_data_sensor",
        job_name=events_job_name,
        settings=settings,
        description=(
            "Requests every event date whose partition has not absorbed the batches that hold "
            "it (the lake's index against the events manifest), as range runs of at most "
            f"{settings.max_partitions_per_run} days' worth of events; dates a failed run left "
            "behind are asked for again, with a backoff."
        ),
    )
    def late_data_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> SensorResult | SkipReason:
        if runs_going(context, job_names=(events_job_name,)):
            return SkipReason("an events run is still going; waiting for it")
        behind, loads = Behind(
            settings=settings, lake=lake.store(), landing=landing
        ).event_dates_and_loads()
        if not behind:
            return SkipReason("every event date has absorbed the batches that hold it")
        return range_requests(
            context,
            settings,
            job_name=events_job_name,
            states={
                d: [sorted(map(str, p.new.items())), sorted(map(str, p.gone.items()))]
                for d, p in behind.items()
            },
            loads=loads,
            what="event dates behind their batches",
        )

    return late_data_sensor
