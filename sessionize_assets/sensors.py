"""Sensors that follow late data through the graph with storage-id cursors.

- late_data_sensor: new raw batches -> the event-date partitions they touched.
- lifecycle_sensor: changed session dates -> one snapshot range run from the earliest of
  them through the latest received day (automation would cascade one day per tick).
"""

from __future__ import annotations

import json
from datetime import date

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogRecord,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from sessionize_assets.partitions import (
    PARTITION_TAG,
    RANGE_END,
    RANGE_START,
    contiguous_ranges,
    lifecycle_range,
)
from sessionize_assets.settings import Settings

RAW_EVENTS_KEY = AssetKey("raw_events")
SESSIONS_KEY = AssetKey("sessions")
SNAPSHOT_KEY = AssetKey("user_lifecycle_snapshot")
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
_PAGE = 500


def build_late_data_sensor(*, settings: Settings, events_job_name: str) -> SensorDefinition:
    @sensor(
        name="late_data_sensor",
        job_name=events_job_name,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Reads every new raw_events materialization (not just the latest) and requests the "
            "event dates its batch touched, as range runs of at most "
            f"{settings.max_partitions_per_run} days."
        ),
    )
    def late_data_sensor(context: SensorEvaluationContext):
        after = int(context.cursor) if context.cursor else None
        records = _new_materializations(context, RAW_EVENTS_KEY, after=after)
        if not records:
            return SkipReason("no new raw_events materializations")
        touched: set[date] = set()
        batches = []
        for record in records:
            materialization = record.asset_materialization
            if materialization is None:
                continue
            batches.append(materialization.partition)
            touched.update(_dates(materialization, "touched_event_dates"))
        touched = {d for d in touched if d >= settings.start_date}
        last = records[-1].storage_id
        requests = [
            RunRequest(
                run_key=f"events-{first}-{end}-after-{last}",
                tags={
                    RANGE_START: first.isoformat(),
                    RANGE_END: end.isoformat(),
                    "sessionize/batches": ",".join(sorted(b for b in batches if b)),
                },
            )
            for first, end in contiguous_ranges(
                sorted(touched), max_days=settings.max_partitions_per_run
            )
        ]
        context.log.info(
            f"{len(records)} new raw_events materializations ({', '.join(map(str, batches))}) "
            f"touched {len(touched)} event dates: {len(requests)} run(s)"
        )
        return SensorResult(run_requests=requests, cursor=str(last))

    return late_data_sensor


def _new_materializations(
    context: SensorEvaluationContext, key: AssetKey, *, after: int | None
) -> list[EventLogRecord]:
    """Every materialization of `key` after storage id `after`, oldest first."""
    return list(
        context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=_PAGE, ascending=True
        ).records
    )


def _dates(materialization: AssetMaterialization | None, field: str) -> list[date]:
    """A metadata entry holding a JSON list of ISO dates."""
    value = materialization.metadata.get(field) if materialization else None
    return [date.fromisoformat(d) for d in (value.value if value else [])]


def _failed_start(context: SensorEvaluationContext, job_name: str) -> date | None:
    """First day of the latest run of `job_name` if that run failed or was canceled."""
    runs = context.instance.get_runs(RunsFilter(job_name=job_name), limit=1)
    if not runs or runs[0].status not in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return None
    key = runs[0].tags.get(RANGE_START) or runs[0].tags.get(PARTITION_TAG)
    return date.fromisoformat(key) if key else None


def _latest_day(context: SensorEvaluationContext, key: AssetKey) -> date | None:
    keys = context.instance.get_materialized_partitions(key)
    return max((date.fromisoformat(k) for k in keys), default=None)


def build_lifecycle_sensor(*, settings: Settings, lifecycle_job_name: str) -> SensorDefinition:
    @sensor(
        name="lifecycle_sensor",
        job_name=lifecycle_job_name,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "When sessions change on day X, corrects the user lifecycle snapshot for X through "
            "the latest received day in one range run; also extends it to each new day."
        ),
    )
    def lifecycle_sensor(context: SensorEvaluationContext):
        # Each day is advanced from the day before: never two runs over the snapshot at once.
        busy = context.instance.get_runs_count(
            RunsFilter(job_name=lifecycle_job_name, statuses=UNFINISHED)
        )
        if busy:
            return SkipReason("a lifecycle run is still going; waiting for it")
        cursor = json.loads(context.cursor) if context.cursor else {}
        changed: set[date] = set()
        triggered = False
        new_cursor = dict(cursor)
        for key, field in (
            (SESSIONS_KEY, "dates_changed"),
            (RAW_EVENTS_KEY, "touched_event_dates"),
        ):
            records = _new_materializations(context, key, after=cursor.get(key.path[-1]))
            if not records:
                continue
            new_cursor[key.path[-1]] = records[-1].storage_id
            for record in records:
                dates = _dates(record.asset_materialization, field)
                if key == SESSIONS_KEY:
                    changed.update(dates)
                    triggered = True
                elif not dates:
                    # A batch that touched no event date starts no sessions run: advance here.
                    triggered = True
        # The days of a failed or canceled run are still stale: start the next range there too.
        # Without new sessions the request repeats the failed one's run key, so the daemon does
        # not retry it by itself; re-executing the run from the UI clears it.
        failed_from = _failed_start(context, lifecycle_job_name)
        if failed_from is not None:
            changed.add(failed_from)
            triggered = True
        if not triggered:
            return SensorResult(skip_reason="no new sessions", cursor=json.dumps(new_cursor))
        span = lifecycle_range(
            changed=changed,
            through=_latest_day(context, SNAPSHOT_KEY),
            latest=_latest_day(context, RAW_EVENTS_KEY),
            start=settings.start_date,
        )
        if span is None:
            return SensorResult(
                skip_reason="the snapshot is up to date", cursor=json.dumps(new_cursor)
            )
        first, last = span
        context.log.info(
            f"sessions changed on {sorted(map(str, changed))}: snapshot {first}..{last}"
        )
        return SensorResult(
            run_requests=[
                RunRequest(
                    run_key=f"lifecycle-{first}-{last}-{json.dumps(new_cursor, sort_keys=True)}",
                    tags={RANGE_START: first.isoformat(), RANGE_END: last.isoformat()},
                )
            ],
            cursor=json.dumps(new_cursor),
        )

    return lifecycle_sensor
