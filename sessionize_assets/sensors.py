"""Sensors: the landing zone into the graph, and late data through it.

- landing_sensor: new or changed batch folders -> ingest runs (compared with the lake's record
  of what was ingested, so it needs no cursor to be right).
- late_data_sensor: event dates whose partition has not absorbed the batches the lake's
  index says hold them -> events range runs (derived from the lake, so a failed or dead run
  leaves its dates to be asked for again).
- stale_sessions_sensor: session dates whose window holds events newer than what they
  absorbed, or materialized after them -> sessions range runs, as soon as an events run ends
  (automation's condition asks for the same dates a tick later, as a backfill, if nothing has
  taken them up: see `partitions.late_data_condition`); also a failed or dead run's dates,
  which automation does not ask for again.
- lifecycle_sensor: session dates materialized again, or new received days -> one snapshot
  run through the latest received day, which corrects every stale day in one go (automation
  would cascade one day per tick) and reports each day from the earliest of them, so that
  none is left unsynced in the UI.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import date

import pyarrow as pa
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogRecord,
    PartitionsDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from sessionize_assets.assets.metadata import is_flagged
from sessionize_assets.lake.log_files import read_small_table, table_path
from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS,
    EVENTS_MANIFEST,
    LANDING_BATCHES,
    SESSIONS,
    SESSIONS_MANIFEST,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import (
    PARTITION_TAG,
    RANGE_END,
    RANGE_START,
    contiguous_ranges,
    lifecycle_range,
    session_dates_for,
)
from sessionize_assets.pipeline.landing import (
    LandingComparison,
    compare_landing,
    ingested_batches,
)
from sessionize_assets.pipeline.lifecycle import ABSORBED, absorbed_by
from sessionize_assets.pipeline.manifests import Plan, event_dates_behind, session_dates_behind
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.run_health import RUN_STATE_TAG, next_attempt, unfinished_runs
from sessionize_assets.settings import Settings

RAW_EVENTS_KEY = AssetKey("raw_events")
SESSIONS_KEY = AssetKey("sessions")
SNAPSHOT_KEY = AssetKey("user_lifecycle_snapshot")
EVENTS_KEY = AssetKey(EVENTS.name)
_PAGE = 500
# Backfills looked at for one of sessions still requested: the newest, as they are listed.
_BACKFILLS = 20


def landing_comparison(
    settings: Settings, *, last: date, cached: Mapping[str, tuple[int, int, str]] | None = None
) -> LandingComparison:
    """The landing zone's batch folders up to received day `last` against what the lake
    records as ingested: what the landing sensor and `sessionize replay` both act on."""
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir.absolute()))
    records = _bookkeeping(settings, LANDING_BATCHES)
    return compare_landing(
        landing.folders(settings.start_date, last), ingested_batches(records), cached=cached
    )


def event_plans_behind(settings: Settings) -> dict[date, Plan]:
    """Event dates from the start date whose partition has not absorbed the batches the lake's
    index says hold them (`manifests.event_dates_behind`), with their plans."""
    plans = event_dates_behind(
        _bookkeeping(settings, BATCH_EVENT_DATES), _bookkeeping(settings, EVENTS_MANIFEST)
    )
    return {day: plan for day, plan in plans.items() if day >= settings.start_date}


def lifecycle_catch_up(settings: Settings, instance: DagsterInstance) -> tuple[date, date] | None:
    """The range a lifecycle run takes when nothing new changed (`_lifecycle_span`)."""
    return _lifecycle_span(
        settings, instance, reported=set(), behind=_lifecycle_behind(settings) is not None
    )


def _lifecycle_span(
    settings: Settings,
    instance: DagsterInstance,
    *,
    reported: set[date],
    behind: bool,
    failed_from: date | None = None,
) -> tuple[date, date] | None:
    """`lifecycle_range` on the instance's partitions: the snapshot days no run has computed
    yet, a failed run's days, the session dates `reported` since the last run, and the
    latest received day when the intervals are `behind` `sessions` (a run died after the
    sessions commit). None: up to date. A lifecycle run corrects whatever is stale, whichever
    range it is given."""
    latest = _latest_received(settings, instance)
    if behind and latest is not None:
        reported = {*reported, latest}
    return lifecycle_range(
        sessions_reported=reported,
        through=_latest_day(instance, SNAPSHOT_KEY),
        latest=latest,
        start=settings.start_date,
        failed_from=failed_from,
    )


def sessions_behind(
    settings: Settings, instance: DagsterInstance, *, session_days: PartitionsDefinition
) -> dict[date, tuple[int, int]]:
    """Session dates through the last of `session_days` to run again, each with what it is
    behind on (the events version it has not absorbed, the storage id of the newest
    materialization of an event date of its window; -1 where it is not behind on that side):

    - the lake: dates that have not absorbed the events their window holds
      (`manifests.session_dates_behind`). A failed or dead run leaves its dates here;
    - Dagster: dates materialized before an event date of their window last was (or never,
      while one was). That is what automation's condition asks for: every date around an
      events run's range, changed or not. Asking for it here too leaves automation nothing to
      ask for, so the sessions start at once as one range run, not as a backfill that the
      backfill daemon takes up to 30 s to start.
    """
    last_key = session_days.get_last_partition_key()
    if last_key is None:
        return {}
    last = date.fromisoformat(last_key)
    lake = session_dates_behind(
        _bookkeeping(settings, EVENTS_MANIFEST),
        _bookkeeping(settings, SESSIONS_MANIFEST),
        settings=settings,
    )
    materialized = DagsterEventType.ASSET_MATERIALIZATION
    newest: dict[date, int] = {}
    for key, storage_id in instance.get_latest_storage_id_by_partition(
        EVENTS_KEY, materialized
    ).items():
        for day in session_dates_for([date.fromisoformat(key)], settings):
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


def build_landing_sensor(
    *, settings: Settings, ingest_job_name: str, received_days: PartitionsDefinition
) -> SensorDefinition:
    @sensor(
        name="landing_sensor",
        job_name=ingest_job_name,
        minimum_interval_seconds=settings.sensor_minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Ingests every batch folder of the landing zone that is new or whose files changed "
            "(names, sizes, SHA-256), compared with what the lake records as ingested; an "
            "unchanged folder, re-delivered or not, requests nothing."
        ),
    )
    def landing_sensor(context: SensorEvaluationContext):
        # An ingest run records its batches when it ends: wait, or the tick would ask again.
        if unfinished_runs(context.instance, job_name=ingest_job_name, log=context.log.warning):
            return SkipReason("an ingest run is still going; waiting for it")
        # Received days run through today: a folder dated later waits for its day.
        last = received_days.get_last_partition_key()
        if last is None:
            return SkipReason("no received day has a partition yet")
        # The cursor only caches digests of files that differ from the lake's record by size or
        # time (a re-delivery), so they are not read again every tick; losing it costs a read.
        cached = {path: tuple(entry) for path, entry in json.loads(context.cursor or "{}").items()}
        comparison = landing_comparison(settings, last=date.fromisoformat(last), cached=cached)
        if comparison.vanished:
            context.log.warning(
                f"batches ingested before have no folder any more (kept as ingested): "
                f"{', '.join(map(str, comparison.vanished))}"
            )
        cursor = json.dumps({path: list(e) for path, e in sorted(comparison.digests.items())})
        if not comparison.pending:
            return SensorResult(
                skip_reason=f"{len(comparison.unchanged)} batch folders, none new or changed",
                cursor=cursor,
            )
        pending = {batch.received: batch for batch in comparison.pending}
        requests = []
        for first, end in contiguous_ranges(
            sorted(pending), max_days=settings.max_partitions_per_run, bridge_gaps=False
        ):
            # The key names the content found and the content it replaces: the same folder
            # state is requested once, and content changed back to an earlier state again.
            states = "".join(
                f"{day}:{batch.found.digest}:{batch.ingested.digest if batch.ingested else ''};"
                for day, batch in sorted(pending.items())
                if first <= day <= end
            )
            requests.append(
                RunRequest(
                    run_key=f"landing-{first}-{end}-{hashlib.sha256(states.encode()).hexdigest()}",
                    tags={RANGE_START: first.isoformat(), RANGE_END: end.isoformat()},
                )
            )
        context.log.info(
            "batches to ingest: "
            + ", ".join(f"{b.received} ({b.why})" for b in comparison.pending)
            + f"; {len(requests)} run(s)"
        )
        return SensorResult(run_requests=requests, cursor=cursor)

    return landing_sensor


def build_late_data_sensor(*, settings: Settings, events_job_name: str) -> SensorDefinition:
    @sensor(
        name="late_data_sensor",
        job_name=events_job_name,
        minimum_interval_seconds=settings.sensor_minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Requests every event date whose partition has not absorbed the batches that hold "
            "it (the lake's index against the events manifest), as range runs of at most "
            f"{settings.max_partitions_per_run} days; dates a failed run left behind are asked "
            "for again, with a backoff."
        ),
    )
    def late_data_sensor(context: SensorEvaluationContext):
        if unfinished_runs(context.instance, job_name=events_job_name, log=context.log.warning):
            return SkipReason("an events run is still going; waiting for it")
        behind = event_plans_behind(settings)
        if not behind:
            return SkipReason("every event date has absorbed the batches that hold it")
        return _range_requests(
            context,
            settings,
            job_name=events_job_name,
            states={
                d: [sorted(map(str, p.new.items())), sorted(map(str, p.gone.items()))]
                for d, p in behind.items()
            },
            what="event dates behind their batches",
        )

    return late_data_sensor


def build_stale_sessions_sensor(
    *,
    settings: Settings,
    sessions_job_name: str,
    events_job_name: str,
    session_days: PartitionsDefinition,
) -> SensorDefinition:
    @sensor(
        name="stale_sessions_sensor",
        job_name=sessions_job_name,
        minimum_interval_seconds=settings.sensor_minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Once an events run has ended, requests the session dates whose window holds "
            "events they have not absorbed (the lake's two manifests) or were materialized "
            "before an event date of their window was (what automation asks for), as range "
            "runs of at most "
            f"{settings.max_partitions_per_run} days; dates a failed run left behind are "
            "asked for again, with a backoff."
        ),
    )
    def stale_sessions_sensor(context: SensorEvaluationContext):
        going = _writers_going(context, (events_job_name, sessions_job_name))
        if going:
            return SkipReason(f"an events or sessions run is going ({going[0].run_id}); waiting")
        backfill = _sessions_backfill_requested(context.instance)
        if backfill is not None:
            return SkipReason(f"backfill {backfill} of sessions is requested; waiting for it")
        behind = sessions_behind(settings, context.instance, session_days=session_days)
        if not behind:
            return SkipReason("every session date has absorbed the events its window holds")
        return _range_requests(
            context,
            settings,
            job_name=sessions_job_name,
            states={day: list(state) for day, state in behind.items()},
            what="session dates behind their events",
        )

    return stale_sessions_sensor


def _range_requests(
    context: SensorEvaluationContext,
    settings: Settings,
    *,
    job_name: str,
    states: Mapping[date, object],
    what: str,
) -> SensorResult | SkipReason:
    """Range runs over the dates behind (each with what it is behind on, `states`), of at
    most `max_partitions_per_run` days, each under a run key of its state and attempt."""
    requests, waiting = [], []
    for first, end in contiguous_ranges(sorted(states), max_days=settings.max_partitions_per_run):
        state = _digest({str(d): s for d, s in states.items() if first <= d <= end})
        request = _state_request(
            context, settings, job_name=job_name, state=state, first=first, last=end
        )
        if isinstance(request, str):
            waiting.append(f"{first}..{end}: {request}")
        else:
            requests.append(request)
    for line in waiting:
        context.log.warning(line)
    if not requests:
        return SkipReason("; ".join(waiting))
    context.log.info(f"{len(states)} {what}: {len(requests)} run(s)")
    return SensorResult(run_requests=requests)


def _writers_going(
    context: SensorEvaluationContext, job_names: tuple[str, ...]
) -> list[DagsterRun]:
    """Unfinished runs of these jobs or of automation on sessions (dead ones are failed)."""
    return [
        run
        for run in unfinished_runs(context.instance, log=context.log.warning)
        if _of_jobs_or_sessions(run, job_names)
    ]


def _of_jobs_or_sessions(run: DagsterRun, job_names: tuple[str, ...]) -> bool:
    """A run of one of these jobs, or of automation on sessions (an asset selection)."""
    return run.job_name in job_names or SESSIONS_KEY in (run.asset_selection or ())


def _sessions_backfill_requested(instance: DagsterInstance) -> str | None:
    """The id of a backfill of sessions that is requested (automation's, or the UI's) and so
    may not have launched its run yet."""
    for backfill in instance.get_backfills(limit=_BACKFILLS):
        if backfill.status.value == "REQUESTED" and SESSIONS_KEY in (
            backfill.asset_selection or ()
        ):
            return backfill.backfill_id
    return None


def _state_request(
    context: SensorEvaluationContext,
    settings: Settings,
    *,
    job_name: str,
    state: str,
    first: date,
    last: date,
) -> RunRequest | str:
    """A range run to bring `state` (what the lake says is behind) up to date, under a run key
    of its attempt; or why not now (see `next_attempt`)."""
    attempt, reason = next_attempt(
        context.instance, job_name=job_name, state=state, backoff=settings.retry_backoff
    )
    if attempt is None:
        return reason
    return RunRequest(
        run_key=f"{job_name}-{first}-{last}-{state}-{attempt}",
        tags={RANGE_START: first.isoformat(), RANGE_END: last.isoformat(), RUN_STATE_TAG: state},
    )


def _bookkeeping(settings: Settings, spec: TableSpec) -> pa.Table:
    return read_small_table(table_path(settings.lake, spec), spec)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


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


def _lifecycle_behind(settings: Settings) -> list[int | None] | None:
    """[sessions version, version the intervals absorbed] when the intervals are behind."""
    try:
        sessions = DeltaTable(str(table_path(settings.lake, SESSIONS))).version()
    except DeltaError:  # none yet, or unreadable: a lifecycle run would say what is wrong
        return None
    try:
        state = DeltaTable(str(table_path(settings.lake, USER_LIFECYCLE_STATE)))
        absorbed, _ = absorbed_by(state.transaction_version(ABSORBED))
    except DeltaError:
        absorbed = None
    return None if absorbed is not None and absorbed >= sessions else [sessions, absorbed]


def _latest_day(instance: DagsterInstance, key: AssetKey) -> date | None:
    keys = instance.get_materialized_partitions(key)
    return max((date.fromisoformat(k) for k in keys), default=None)


def _latest_received(settings: Settings, instance: DagsterInstance) -> date | None:
    """The latest received day ingested. Dagster's record of `raw_events` can miss the last
    batch: an ingest run killed after its last commit (the lake's landing record) has ingested
    it for good, and nothing will ingest it again. So once this instance has recorded a batch,
    the lake's landing record counts too. An instance that has recorded none has not followed
    this lake (a new Dagster home): new batches start it, as they start the other sensors."""
    seen = _latest_day(instance, RAW_EVENTS_KEY)
    if seen is None:
        return None
    recorded = _bookkeeping(settings, LANDING_BATCHES).column("received_date").to_pylist()
    return max([seen, *recorded])


def build_lifecycle_sensor(
    *, settings: Settings, lifecycle_job_name: str, sessions_job_name: str
) -> SensorDefinition:
    @sensor(
        name="lifecycle_sensor",
        job_name=lifecycle_job_name,
        minimum_interval_seconds=settings.sensor_minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "When sessions are materialized again from day X (a late batch), corrects the user "
            "lifecycle snapshot through the latest received day in one run, which reports each "
            "day from X with its figures; also extends it to each new day."
        ),
    )
    def lifecycle_sensor(context: SensorEvaluationContext):
        # Each day is advanced from the day before: never two runs over the snapshot at once.
        if unfinished_runs(context.instance, job_name=lifecycle_job_name, log=context.log.warning):
            return SkipReason("a lifecycle run is still going; waiting for it")
        # Sessions commit before they report which dates changed: a run started in between
        # would see the table ahead of its intervals but not the dates, and take a second run.
        sessions = _writers_going(context, (sessions_job_name,))
        if sessions:
            return SkipReason(f"a sessions run is going ({sessions[0].run_id}); waiting for it")
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
                        if is_flagged(materialization, "changed"):
                            changed.add(day)
                elif not _dates(materialization, "touched_event_dates"):
                    # A batch that touched no event date starts no sessions run: advance here.
                    triggered = True
        # A failed or canceled run left its days stale: the next range reports them again.
        failed_from = _failed_start(context, lifecycle_job_name)
        triggered = triggered or failed_from is not None
        # And whatever any run did: sessions newer than what the intervals absorbed (a run that
        # died after the sessions commit reported nothing) ask for a run too.
        behind = _lifecycle_behind(settings)
        triggered = triggered or behind is not None
        if not triggered:
            return SensorResult(skip_reason="no new sessions", cursor=json.dumps(new_cursor))
        span = _lifecycle_span(
            settings,
            context.instance,
            reported=reported,
            behind=behind is not None,
            failed_from=failed_from,
        )
        if span is None:
            return SensorResult(
                skip_reason="the snapshot is up to date", cursor=json.dumps(new_cursor)
            )
        first, last = span
        state = _digest([new_cursor, behind, str(first), str(last)])
        request = _state_request(
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
