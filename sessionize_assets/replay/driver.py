"""Plays what the daemon does for a batch: run, tick the sensors and automation, repeat.

`sessionize replay` and the scale benchmark drive batches through `BatchDriver`: one run ingests
the batch; the late-data sensor (evaluated as the daemon would) asks for range runs over the
event dates it touched; automation and the stale-sessions sensor ask for the sessions those
dates decide; the lifecycle sensor asks for one snapshot run through the batch's day.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date

from dagster import (
    AssetKey,
    DagsterInstance,
    DailyPartitionsDefinition,
    Definitions,
    ExecuteInProcessResult,
    JobDefinition,
    PartitionsDefinition,
    RunRequest,
    SensorResult,
    build_sensor_context,
    evaluate_automation_conditions,
)

from sessionize_assets.assets.reports import (
    EventDateMetadata,
    RawBatchMetadata,
    SessionDateMetadata,
    SessionsRunMetadata,
    SnapshotDayMetadata,
)
from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    SESSIONS_JOB,
    SUMMARIES_JOB,
    resource_of,
)
from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.lake.writer_lock import lake_writer
from sessionize_assets.partitions import (
    RANGE_END,
    RANGE_START,
    contiguous_ranges,
    last_partition_through,
)
from sessionize_assets.replay.results import (
    failed_checks,
    first_error,
    flagged_partitions,
    reported,
    run_succeeded,
    spark_jobs,
    step_figures,
)
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.settings import Settings

# The tag on every run of a replay, with the received day (first..last) of the batches it
# processes.
REPLAY_BATCH_TAG = "sessionize/replay_batch"
_MAX_AUTOMATION_ROUNDS = 5
# Progress lines are replay's output; the runs' own logs stay in the instance for the UI.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass(frozen=True, kw_only=True)
class BatchOutcome:
    # The first and last received day of the batches processed together (the same day for
    # one batch); None: the catch-up with what the lake held behind.
    received: tuple[date, date] | None
    runs: int
    succeeded: bool
    # The job whose run failed, and the first line of its error (which names the file when
    # a batch file cannot be read).
    failed_job: str | None = None
    error: str | None = None
    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    late_events: int = 0
    event_dates_updated: int = 0
    session_dates_updated: int = 0
    users_recomputed: int = 0
    pairs_recomputed: int = 0
    lifecycle_days: int = 0
    spark_jobs: int = 0  # over the batch's runs (each asset step and check reports its own)
    seconds: float = 0.0


def days_text(received: tuple[date, date] | None) -> str:
    if received is None:
        return "catch-up"
    first, last = received
    return first.isoformat() if first == last else f"{first}..{last}"


class SensorTicks:
    """Evaluates one of the project's sensors as the daemon would, keeping its cursor."""

    def __init__(self, defs: Definitions, instance: DagsterInstance, name: str) -> None:
        self._defs = defs
        self._instance = instance
        self._sensor = defs.resolve_sensor_def(name)
        self._cursor: str | None = None

    @property
    def name(self) -> str:
        return self._sensor.name

    @property
    def cursor(self) -> str | None:
        return self._cursor

    def tick(self) -> list[RunRequest]:
        with build_sensor_context(
            instance=self._instance, resources=self._defs.resources, cursor=self._cursor
        ) as context:
            result = self._sensor(context)
        if not isinstance(result, SensorResult):
            return []
        self._cursor = result.cursor
        return list(result.run_requests or [])


class AutomationTicks:
    """Evaluates the declarative automation conditions as the daemon would, keeping its cursor.

    Returns the requested `sessions` partitions; replay runs them as range runs, as the
    backfill daemon does for a `BackfillPolicy.single_run()` asset.
    """

    def __init__(self, defs: Definitions, instance: DagsterInstance) -> None:
        self._defs = defs
        self._instance = instance
        self._cursor = evaluate_automation_conditions(defs=defs, instance=instance).cursor

    def tick(self) -> list[date]:
        result = evaluate_automation_conditions(
            defs=self._defs, instance=self._instance, cursor=self._cursor
        )
        self._cursor = result.cursor
        keys = result.get_requested_partitions(AssetKey(SESSIONS.name))
        return sorted(date.fromisoformat(key) for key in keys if key is not None)


class BatchDriver:
    """Plays what the daemon does for one batch: run, tick the sensors and automation, repeat.

    Its sensor and automation cursors start where the instance is when it is created plus one
    tick; `replay` and the scale benchmark drive batches through it.
    """

    def __init__(
        self,
        *,
        defs: Definitions,
        instance: DagsterInstance,
        settings: Settings,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.instance = instance
        self.settings = settings
        self.echo = echo  # told whom a run waits for, when another writer holds the lake
        self.ingest, self.events, self.sessions, self.lifecycle, self.summaries = (
            defs.resolve_job_def(name)
            for name in (INGEST_JOB, EVENTS_JOB, SESSIONS_JOB, LIFECYCLE_JOB, SUMMARIES_JOB)
        )
        assert self.ingest.partitions_def is not None
        self.received_days: PartitionsDefinition = self.ingest.partitions_def
        assert isinstance(self.summaries.partitions_def, DailyPartitionsDefinition)
        self.daily_days = self.summaries.partitions_def
        self.late_data = SensorTicks(defs, instance, "late_data_sensor")
        self.lifecycle_sensor = SensorTicks(defs, instance, "lifecycle_sensor")
        self.automation = AutomationTicks(defs, instance)
        self.behind = Behind(
            settings=settings,
            lake=resource_of(defs, "lake", LakeResource).store(),
            landing=resource_of(defs, "landing", LandingZoneResource),
        )

    def sensor_cursors(self) -> dict[str, str]:
        ticks = (self.late_data, self.lifecycle_sensor)
        return {t.name: t.cursor for t in ticks if t.cursor is not None}

    def batches(self, first: date, last: date) -> BatchOutcome:
        """Ingest the batches received `first`..`last` in one range run, then follow them
        through to the snapshot together."""
        return self._drive((first, last))

    def catch_up(self) -> BatchOutcome | None:
        """Follow through what the lake holds behind, with no new batch: the event dates
        behind their batches, the session dates behind their events, the lifecycle behind
        the sessions (a killed replay or a failed run leaves them so). None if nothing was."""
        outcome = self._drive(None)
        return outcome if outcome.runs else None

    def _events_ranges(self) -> list[Mapping[str, str]]:
        """The late-data sensor's ranges, from the lake alone (replay catching up retries
        what is behind with no backoff)."""
        plans, loads = self.behind.event_dates_and_loads()
        return [
            {RANGE_START: first.isoformat(), RANGE_END: last.isoformat()}
            for first, last in contiguous_ranges(
                sorted(plans),
                max_days=self.settings.max_partitions_per_run,
                loads=loads,
            )
        ]

    def _drive(self, received: tuple[date, date] | None) -> BatchOutcome:
        started = time.monotonic()
        # Replay retries by being run again; a daemon on the same instance must not re-run
        # its runs behind it.
        batch = days_text(received)
        tags = {REPLAY_BATCH_TAG: batch, "dagster/max_retries": "0"}
        runs: list[ExecuteInProcessResult] = []

        def run(
            job: JobDefinition, first: str, last: str, extra: Mapping[str, str] | None = None
        ) -> bool:
            with lake_writer(
                self.settings.lake_dir,
                holder=f"sessionize replay ({job.name} {first}..{last}, batch {batch})",
                on_wait=self.echo,
            ):
                runs.append(_run(job, first, last, self.instance, {**tags, **(extra or {})}))
            return run_succeeded(runs[-1])

        ok, batches = True, list[RawBatchMetadata]()
        if received is not None:
            ok = run(self.ingest, received[0].isoformat(), received[1].isoformat())
            batches = reported(runs[-1], RawBatchMetadata)
        # Catching up, replay is the retry of what is behind: it asks the lake, with no backoff.
        events_ranges = (
            self._events_ranges()
            if received is None
            else [request.tags for request in self.late_data.tick()]
        )
        for range_tags in events_ranges if ok else []:
            ok = run(self.events, range_tags[RANGE_START], range_tags[RANGE_END], range_tags)
            if not ok:
                break
        # Tick until nothing more is requested: a tick also records that the last runs handled
        # their requests, which a new request in the same tick would otherwise be lost to.
        # The stale_sessions_sensor's dates go with automation's: it asks for what automation
        # asks for a tick later, and for what the lake says is behind (a run that failed or
        # died before its manifest commit is not requested by automation again).
        for _ in range(_MAX_AUTOMATION_ROUNDS):
            if not ok:
                break
            automation = self.automation.tick()
            stale, loads = self._stale_sessions()
            requested = sorted({*automation, *stale})
            if not requested:
                break
            for first, last in contiguous_ranges(
                requested, max_days=self.settings.max_partitions_per_run, loads=loads
            ):
                ok = run(self.sessions, first.isoformat(), last.isoformat())
                if not ok:
                    break
        if received is None:
            span = self.behind.lifecycle_catch_up(self.instance)
            lifecycle_ranges: list[Mapping[str, str]] = (
                [] if span is None else [{RANGE_START: str(span[0]), RANGE_END: str(span[1])}]
            )
        else:
            lifecycle_ranges = [request.tags for request in self.lifecycle_sensor.tick()]
        for range_tags in lifecycle_ranges if ok else []:
            ok = run(self.lifecycle, range_tags[RANGE_START], range_tags[RANGE_END], range_tags)
        # Then the summaries, in one run, as the summaries sensor asks for once the sessions
        # are up to date (a batch that changed no event moves the dates' status too).
        summaries = (
            self.behind.summary_dates(self.instance, daily_days=self.daily_days) if ok else []
        )
        key = last_partition_through(self.daily_days, summaries[-1]) if summaries else None
        if key is not None:
            ok = run(self.summaries, key, key)
        failed = next((r for r in runs if not run_succeeded(r)), None)
        sessions_figures = [f for r in runs for f in step_figures(r, SessionsRunMetadata)]
        return BatchOutcome(
            received=received,
            runs=len(runs),
            succeeded=ok,
            failed_job=failed.job_def.name if failed else None,
            error=(failed_checks(failed) or first_error(failed)) if failed else None,
            lines=sum(batch.lines for batch in batches),
            accepted=sum(batch.accepted for batch in batches),
            rejected=sum(batch.rejected for batch in batches),
            late_events=sum(batch.late_events for batch in batches),
            event_dates_updated=sum(
                len(flagged_partitions(r, EventDateMetadata, lambda m: m.updated)) for r in runs
            ),
            session_dates_updated=sum(
                len(flagged_partitions(r, SessionDateMetadata, lambda m: m.updated)) for r in runs
            ),
            users_recomputed=sum(f.users_recomputed for f in sessions_figures),
            pairs_recomputed=sum(f.pairs_recomputed for f in sessions_figures),
            lifecycle_days=sum(
                len(flagged_partitions(r, SnapshotDayMetadata, lambda m: m.rewritten)) for r in runs
            ),
            spark_jobs=sum(spark_jobs(r) for r in runs),
            seconds=time.monotonic() - started,
        )

    def _stale_sessions(self) -> tuple[list[date], dict[date, float]]:
        """The session dates behind (what the stale_sessions_sensor asks for), with their
        loads."""
        assert self.sessions.partitions_def is not None
        dates, loads = self.behind.session_dates_and_loads(
            self.instance, session_days=self.sessions.partitions_def
        )
        return list(dates), loads


def _run(
    job: JobDefinition,
    first: str,
    last: str,
    instance: DagsterInstance,
    tags: dict[str, str],
) -> ExecuteInProcessResult:
    """One run over the partitions first..last (a range run when they differ)."""
    if first == last:
        return job.execute_in_process(
            partition_key=first,
            instance=instance,
            raise_on_error=False,
            run_config=QUIET,
            tags={k: v for k, v in tags.items() if k not in (RANGE_START, RANGE_END)},
        )
    return job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config=QUIET,
        tags={**tags, RANGE_START: first, RANGE_END: last},
    )
