"""erasure_sensor: finish an erasure once the runs that follow it have caught up (SPEC §8)."""

from __future__ import annotations

from dagster import (
    PartitionsDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
)

from sessionize_assets.lake.tables import EVENTS, SESSIONS, USER_LIFECYCLE_STATE
from sessionize_assets.pipeline.erased_keys import erasure_book
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.run_health import RUN_STATE_TAG, next_attempt
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.sensors.requests import digest, pipeline_sensor, runs_going
from sessionize_assets.settings import Settings


def build_erasure_sensor(
    *,
    settings: Settings,
    finish_job_name: str,
    lake_jobs: tuple[str, ...],
    session_days: PartitionsDefinition,
) -> SensorDefinition:
    @pipeline_sensor(
        name="erasure_sensor",
        job_name=finish_job_name,
        settings=settings,
        description=(
            "Launches finish_erasures_job when an erasure is going and nothing it put behind "
            "is left (no run of the pipeline going, no event date, session date or lifecycle "
            "behind): the run deletes the files that held the erased keys."
        ),
    )
    def erasure_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> RunRequest | SkipReason:
        store = lake.store()
        pending = erasure_book(store).pending
        if not pending:
            return SkipReason("no erasure is going")
        if runs_going(context, job_names=(*lake_jobs, finish_job_name), sessions=True):
            return SkipReason("runs of the pipeline are going; waiting for them")
        behind = Behind(settings=settings, lake=store, landing=landing)
        waiting = [
            what
            for what, left in (
                ("event dates", behind.event_dates()),
                (
                    "session dates",
                    behind.session_dates(context.instance, session_days=session_days),
                ),
                ("the lifecycle", behind.lifecycle_versions()),
            )
            if left
        ]
        if waiting:
            return SkipReason(f"an erasure waits for {', '.join(waiting)} behind to catch up")
        state = digest(
            {
                "erasures": [e.erasure_id for e in pending],
                "versions": [
                    store.version(spec) for spec in (EVENTS, SESSIONS, USER_LIFECYCLE_STATE)
                ],
            }
        )
        attempt, reason = next_attempt(
            context.instance, job_name=finish_job_name, state=state, backoff=settings.retry_backoff
        )
        if attempt is None:
            return SkipReason(reason)
        return RunRequest(
            run_key=f"{finish_job_name}-{state}-{attempt}", tags={RUN_STATE_TAG: state}
        )

    return erasure_sensor
