"""summaries_sensor: a `summaries_job` run when arrivals or daily_sessions are behind the lake.

It is how the summaries follow every change: a sessions run (late events, a relabel, an
erasure), a batch that changed no event but moved R on (statuses only), a day that is over
(its partition is reported), a run that died between its commits. It waits while any run that
writes the lake is going, and while events or sessions are behind (their runs come first), so
one summaries run follows a batch's sessions runs, however many.
"""

from __future__ import annotations

from datetime import date

from dagster import (
    DailyPartitionsDefinition,
    PartitionsDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from sessionize_assets.partitions import last_partition_through
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
    daily_days: DailyPartitionsDefinition,
) -> SensorDefinition:
    @pipeline_sensor(
        name="summaries_sensor",
        job_name=summaries_job_name,
        settings=settings,
        description=(
            "When arrivals or daily_sessions are behind the lake and no events or sessions "
            "run is to come, one run brings every date behind up to date and reports each."
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
        dates = behind.summary_dates(context.instance, daily_days=daily_days)
        if not dates:
            return SkipReason("arrivals and daily_sessions match the lake")
        # One run: its steps update every date behind, wherever it is, and report each. Its
        # partition is the latest of them that is a partition, so Dagster plans one.
        key = last_partition_through(daily_days, dates[-1])
        if key is None:
            return SkipReason(f"{len(dates)} dates behind, and no day is over yet to run on")
        last = date.fromisoformat(key)
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
