"""lifecycle_sensor: one snapshot run through the latest received day when sessions changed."""

from __future__ import annotations

import json
from datetime import date

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterRunStatus,
    EventLogRecord,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from sessionize_assets.assets.keys import RAW_EVENTS_KEY, SESSIONS_KEY
from sessionize_assets.assets.reports import RawBatchMetadata, SessionDateMetadata
from sessionize_assets.partitions import PARTITION_TAG, RANGE_START
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.sensors.requests import digest, pipeline_sensor, runs_going, state_request
from sessionize_assets.settings import Settings

# Materializations read at one tick, per asset: the rest at the next tick.
_PAGE = 500


def build_lifecycle_sensor(
    *, settings: Settings, lifecycle_job_name: str, sessions_job_name: str
) -> SensorDefinition:
    @pipeline_sensor(
        name="lifecycle_sensor",
        job_name=lifecycle_job_name,
        settings=settings,
        description=(
            "When sessions are materialized again from day X (a late batch), corrects the user "
            "lifecycle snapshot through the latest received day in one run, which reports each "
            "day from X with its figures; also extends it to each new day."
        ),
    )
    def lifecycle_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> SensorResult | SkipReason:
        going = runs_going(
            context, job_names=(lifecycle_job_name, sessions_job_name), sessions=True
        )
        # Each day is advanced from the day before: never two runs over the snapshot at once.
        if any(run.job_name == lifecycle_job_name for run in going):
            return SkipReason("a lifecycle run is still going; waiting for it")
        # Sessions commit before they report which dates changed: a run started in between
        # would see the table ahead of its intervals but not the dates, and take a second run.
        if going:
            return SkipReason(f"a sessions run is going ({going[0].run_id}); waiting for it")
        cursor = json.loads(context.cursor) if context.cursor else {}
        reported: set[date] = set()
        changed: set[date] = set()
        triggered = False
        new_cursor = dict(cursor)
        for key in (SESSIONS_KEY, RAW_EVENTS_KEY):
            records = _new_materializations(context, key, after=cursor.get(key.path[-1]))
            if not records:
                continue
            new_cursor[key.path[-1]] = records[-1].storage_id
            for record in records:
                materialization = record.asset_materialization
                if key == SESSIONS_KEY:
                    triggered = True
                    if materialization is not None:
                        # Each sessions date is reported with `changed`: did its rows change.
                        day = date.fromisoformat(materialization.partition or "")
                        reported.add(day)
                        figures = SessionDateMetadata.in_metadata(materialization.metadata)
                        if figures is not None and figures.changed:
                            changed.add(day)
                elif not _touched_event_dates(materialization):
                    # A batch that touched no event date starts no sessions run: advance here.
                    triggered = True
        # A failed or canceled run left its days stale: the next range reports them again.
        failed_from = _failed_start(context, lifecycle_job_name)
        triggered = triggered or failed_from is not None
        # And whatever any run did: sessions newer than what the intervals absorbed (a run that
        # died after the sessions commit reported nothing) ask for a run too.
        behind = Behind(settings=settings, lake=lake.store(), landing=landing)
        versions = behind.lifecycle_versions()
        triggered = triggered or versions is not None
        if not triggered:
            return SensorResult(skip_reason="no new sessions", cursor=json.dumps(new_cursor))
        span = behind.lifecycle_span(
            context.instance,
            reported=reported,
            behind=versions is not None,
            failed_from=failed_from,
        )
        if span is None:
            return SensorResult(
                skip_reason="the snapshot is up to date", cursor=json.dumps(new_cursor)
            )
        first, last = span
        state = digest([new_cursor, versions, str(first), str(last)])
        request = state_request(
            context, settings, job_name=lifecycle_job_name, state=state, first=first, last=last
        )
        if isinstance(request, str):
            return SensorResult(skip_reason=request, cursor=json.dumps(new_cursor))
        context.log.info(
            f"sessions changed on {sorted(map(str, changed))} (materialized again from "
            f"{min(map(str, reported), default='none')}): a snapshot run over {first}..{last} "
            "corrects what changed and reports each of its days"
        )
        return SensorResult(run_requests=[request], cursor=json.dumps(new_cursor))

    return lifecycle_sensor


def _new_materializations(
    context: SensorEvaluationContext, key: AssetKey, *, after: int | None
) -> list[EventLogRecord]:
    """Every materialization of `key` after storage id `after`, oldest first."""
    return list(
        context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=_PAGE, ascending=True
        ).records
    )


def _touched_event_dates(materialization: AssetMaterialization | None) -> list[str]:
    """The event dates a batch's `raw_events` materialization says it touched (none when it
    is not one of ingest's reports)."""
    batch = RawBatchMetadata.in_metadata(materialization.metadata) if materialization else None
    return batch.touched_event_dates if batch is not None else []


def _failed_start(context: SensorEvaluationContext, job_name: str) -> date | None:
    """First day of the latest run of `job_name` if that run failed or was canceled."""
    runs = context.instance.get_runs(RunsFilter(job_name=job_name), limit=1)
    if not runs or runs[0].status not in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return None
    key = runs[0].tags.get(RANGE_START) or runs[0].tags.get(PARTITION_TAG)
    return date.fromisoformat(key) if key else None
