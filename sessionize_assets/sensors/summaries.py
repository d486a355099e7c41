"""summaries_sensor: a `summaries_job` run when arrivals or daily_sessions are behind the lake
and no other run will bring them up to date.

Every sessions run brings both summaries up to date after its sessions, so this sensor is for
what no sessions run follows: R moved on with a batch that changed no event (an empty folder),
which changes statuses only, and a run that died between its commits. It waits while any run
that writes the lake is going, and while events or sessions are behind (their runs will come,
and update the summaries).
"""

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
from sessionize_assets.sensors.requests import digest, pipeline_sensor, runs_going, state_request
from sessionize_assets.settings import Settings


def build_summaries_sensor(
    *,
    settings: Settings,
    summaries_job_name: str,
    lake_jobs: tuple[str, ...],
    session_days: PartitionsDefinition,
) -> SensorDefinition:
    @pipeline_sensor(
        name="summaries_sensor",
        job_name=summaries_job_name,
        settings=settings,
        description=(
            "When arrivals or daily_sessions are behind the lake with no run to come (a batch "
            "that changed no event moved the dates' status on; a run died between commits), "
            "one run brings every date behind up to date and reports each."
        ),
    )
    def summaries_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> SensorResult | SkipReason:
        going = runs_going(context, job_names=(*lake_jobs, summaries_job_name), sessions=True)
        if going:
            return SkipReason(f"a {going[0].job_name} run is going ({going[0].run_id}); waiting")
        behind = Behind(settings=settings, lake=lake.store(), landing=landing)
        if behind.event_dates() or behind.session_dates(
            context.instance, session_days=session_days
        ):
            return SkipReason("events or sessions are behind: their runs update the summaries")
        dates = behind.summary_dates()
        if not dates:
            return SkipReason("arrivals and daily_sessions match the lake")
        # One run: its steps update every date behind, wherever it is, and report each. Its
        # partition is the latest of them, so Dagster plans one partition, not a range.
        last = dates[-1]
        state = digest(sorted(map(str, dates)))
        request = state_request(
            context, settings, job_name=summaries_job_name, state=state, first=last, last=last
        )
        if isinstance(request, str):
            return SkipReason(request)
        context.log.info(
            f"{len(dates)} dates of arrivals or daily_sessions behind the lake: one run "
            "updates them"
        )
        return SensorResult(run_requests=[request])

    return summaries_sensor
