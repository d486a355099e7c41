"""Process a landing zone's new and changed batches one by one through the project's own
Definitions, as the daemon would: what a user runs each day when no daemon is kept up.

The batches are those the landing sensor would ingest (see `pipeline/landing.py`). For each,
one run ingests it; the late-data sensor (evaluated as the daemon would) asks for range runs
over the event dates the batch touched; the declarative automation conditions (evaluated as
the daemon would) then request the sessions those dates decide, run as ranges; the lifecycle
sensor finally asks for one snapshot run through the batch's day, which corrects every day from
the earliest changed session date on. Range runs skip partitions with nothing new, so a batch
costs four runs unless its late events span more than `max_partitions_per_run` days. Runs go
into the given Dagster instance, so `dagster dev` on the same DAGSTER_HOME shows them.

`at_once` takes a backlog as the daemon does when it finds several folders at one tick: the
batches of consecutive days in one ingest range run, followed through together (four runs for
all of them).
"""

from __future__ import annotations

import fcntl
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    ExecuteInProcessResult,
    JobDefinition,
    PartitionsDefinition,
    RunRequest,
    RunsFilter,
    SensorResult,
    build_sensor_context,
    evaluate_automation_conditions,
)

from sessionize_assets.assets.keys import SNAPSHOT_KEY
from sessionize_assets.assets.metadata import is_flagged
from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    SESSIONS_JOB,
    build_definitions,
    resource_of,
)
from sessionize_assets.lake.summary import describe_lake
from sessionize_assets.lake.writer_lock import lake_writer
from sessionize_assets.partitions import ONE_DAY, RANGE_END, RANGE_START, contiguous_ranges
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.run_health import UNFINISHED, fail_dead_runs
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.settings import Settings

# The tag on every run of a replay, with the received day (first..last) of the batches it
# processes.
REPLAY_BATCH_TAG = "sessionize/replay_batch"
# Progress lines are replay's output; the runs' own logs stay in the instance for the UI.
_MAX_AUTOMATION_ROUNDS = 5
# The asset of each step whose materializations carry the step's `run_spark_jobs`.
JOB_REPORTERS = ("raw_events", "events", "user_identities", "sessions", "user_lifecycle_state")
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


@dataclass(kw_only=True)
class ReplaySummary:
    batches: list[BatchOutcome] = field(default_factory=list)
    skipped: list[date] = field(default_factory=list)
    # The runs that brought up to date what the lake held behind before the first batch
    # (a killed replay's, a failed run's): None when nothing was behind.
    caught_up: BatchOutcome | None = None
    # Where the plain sensors stopped, for the daemon to carry on from (sensor name -> cursor).
    sensor_cursors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        outcomes = [*self.batches, *([self.caught_up] if self.caught_up else [])]
        return all(outcome.succeeded for outcome in outcomes)

    def lines(self) -> list[str]:
        def total(name: str) -> int:
            return sum(getattr(b, name) for b in self.batches)

        runs = [b.runs for b in self.batches]
        failed = [b for b in self.batches if not b.succeeded]
        days = sum((b.received[1] - b.received[0]).days + 1 for b in self.batches if b.received)
        out = [
            f"batches: {days} processed, {len(self.skipped)} skipped, {len(failed)} failed",
            *(f"  FAILED {_days(b.received)} in {b.failed_job}: {b.error}" for b in failed),
            f"lines: {total('lines')} = {total('accepted')} accepted + "
            f"{total('rejected')} rejected at ingestion; late events: {total('late_events')}",
            f"sessions recomputed for {total('pairs_recomputed')} (user, day) pairs of "
            f"{total('users_recomputed')} users over the batches",
            f"lifecycle snapshot: {total('lifecycle_days')} days written over the batches "
            "(each batch extends it to its day and corrects from its earliest changed session)",
        ]
        if runs:
            out.append(f"runs per batch (or batches at once): max {max(runs)}, total {sum(runs)}")
        return out


class ReplayBusyError(RuntimeError):
    """Another `sessionize replay` holds the lake."""


@contextmanager
def replay_lock(lake_dir: Path) -> Iterator[None]:
    """One replay per lake at a time: a second one stops at once instead of interleaving."""
    lake_dir.mkdir(parents=True, exist_ok=True)
    path = lake_dir / ".replay.lock"
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReplayBusyError(
                f"another sessionize replay is running on {lake_dir} (it holds {path})"
            ) from None
        yield  # the lock goes with the file handle, also when the process is killed


# A daemon whose latest heartbeat is this recent is running.
_DAEMON_ALIVE_SECONDS = 120


def announce_daemon(
    instance: DagsterInstance, *, lake_dir: Path, echo: Callable[[str], None]
) -> None:
    """Say so when a dagster-daemon runs on this instance: its runs and this command's take
    turns on the lake (`lake/writer_lock.py`), and the command says whom it waits for."""
    beats = instance.get_daemon_heartbeats().values()
    if any(time.time() - beat.timestamp < _DAEMON_ALIVE_SECONDS for beat in beats):
        echo(
            f"a dagster-daemon is running on this Dagster instance: its runs and this "
            f"command's take turns writing {lake_dir} (each run waits for the one before)"
        )


def replay(
    *,
    settings: Settings,
    instance: DagsterInstance,
    echo: Callable[[str], None] = print,
    at_once: bool = False,
) -> ReplaySummary:
    """Process the landing zone's new and changed batches, oldest first, each through to the
    snapshot; a batch whose content was ingested already is not touched (as the landing
    sensor decides), so a second replay of the same zone does nothing.

    With `at_once`, the batches of consecutive received days go together, as the daemon's
    landing sensor asks for them when it finds them at one tick (a first load, a backlog):
    one ingest range run of at most `max_partitions_per_run` days, followed through to the
    snapshot together. The tables end the same; the runs' fixed costs are paid once, and
    late events no longer show as corrections of what an earlier batch wrote.

    It holds the lake's replay lock throughout. It starts by reporting failed the runs a
    killed replay (or a dead run worker) left unfinished, so nothing waits on them."""
    with replay_lock(settings.lake_dir.absolute()):
        announce_daemon(instance, lake_dir=settings.lake_dir, echo=echo)
        fail_dead_runs(
            instance,
            instance.get_runs(RunsFilter(statuses=UNFINISHED)),
            log=echo,
            # Only a replay runs its runs; holding the lock, none of theirs is still going.
            abandoned=lambda run: REPLAY_BATCH_TAG in run.tags,
        )
        return _replay(settings=settings, instance=instance, echo=echo, at_once=at_once)


def _days(received: tuple[date, date] | None) -> str:
    if received is None:
        return "catch-up"
    first, last = received
    return first.isoformat() if first == last else f"{first}..{last}"


def _replay(
    *,
    settings: Settings,
    instance: DagsterInstance,
    echo: Callable[[str], None],
    at_once: bool,
) -> ReplaySummary:
    defs = build_definitions(settings)
    landing = resource_of(defs, "landing", LandingZoneResource)
    driver = BatchDriver(defs=defs, instance=instance, settings=settings, echo=echo)
    last_key = driver.received_days.get_last_partition_key()
    last = date.fromisoformat(last_key) if last_key else settings.start_date - ONE_DAY
    comparison = driver.behind.landing_batches(last=last)
    summary = ReplaySummary(
        skipped=[day for day in landing.batches() if not settings.start_date <= day <= last]
    )
    pending = comparison.pending
    echo(
        f"{len(pending)} new or changed batches in {landing.root}, "
        f"{len(comparison.unchanged)} unchanged since they were ingested"
    )
    for day in summary.skipped:
        echo(f"{day}: outside the received-day partitions {settings.start_date}..{last}, skipped")
    for day in comparison.vanished:
        echo(f"{day}: ingested before, its folder is gone; what was ingested stays")
    for name in landing.foreign_entries():
        echo(f"{name}: not a batch folder (received_date=YYYY-MM-DD), ignored")
    # First what an earlier replay or run left behind: the lake says which partitions.
    summary.caught_up = driver.catch_up()
    if summary.caught_up is not None:
        outcome = summary.caught_up
        echo(
            f"caught up with what the lake held behind: {outcome.runs} runs, "
            f"{'ok' if outcome.succeeded else 'FAILED'}; event dates updated "
            f"{outcome.event_dates_updated}, session dates updated "
            f"{outcome.session_dates_updated}, lifecycle days {outcome.lifecycle_days}"
        )
        if not outcome.succeeded:
            echo(f"stopping: {outcome.failed_job} failed ({outcome.error}); see its runs in the UI")
            pending = []
    why = {batch.received: batch.why for batch in pending}
    groups = (
        contiguous_ranges(sorted(why), max_days=settings.max_partitions_per_run, bridge_gaps=False)
        if at_once
        else [(day, day) for day in sorted(why)]
    )
    for index, (first, last) in enumerate(groups, start=1):
        key = _days((first, last))
        reasons = Counter(why[day] for day in why if first <= day <= last)
        said = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        prefix = f"[{index}/{len(groups)}] {key} ({said if first != last else why[first]}):"
        outcome = driver.batches(first, last)
        summary.batches.append(outcome)
        echo(
            f"{prefix} {'ok' if outcome.succeeded else 'FAILED'} in {outcome.seconds:.1f}s, "
            f"runs={outcome.runs}, spark jobs={outcome.spark_jobs}, "
            f"lines={outcome.lines} (accepted {outcome.accepted}, "
            f"rejected {outcome.rejected}, late {outcome.late_events}); "
            f"event dates updated {outcome.event_dates_updated}, session dates updated "
            f"{outcome.session_dates_updated}, (user, day) pairs recomputed "
            f"{outcome.pairs_recomputed} of {outcome.users_recomputed} users; "
            f"lifecycle days {outcome.lifecycle_days}"
        )
        if outcome.failed_job == INGEST_JOB:
            # Nothing of the batch was committed, and later batches do not depend on it.
            echo(f"{prefix} not ingested ({outcome.error}); going on with the next batches")
        elif not outcome.succeeded:
            echo(f"stopping: batch {key} failed in {outcome.failed_job}; see its runs in the UI")
            break
    summary.sensor_cursors = driver.sensor_cursors()
    for line in summary.lines():
        echo(line)
    store = resource_of(defs, "lake", LakeResource).store()
    for line in describe_lake(store, lake=settings.lake):
        echo(line)
    return summary


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
        keys = result.get_requested_partitions(AssetKey("sessions"))
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
        self.ingest, self.events, self.sessions, self.lifecycle = (
            defs.resolve_job_def(name)
            for name in (INGEST_JOB, EVENTS_JOB, SESSIONS_JOB, LIFECYCLE_JOB)
        )
        assert self.ingest.partitions_def is not None
        self.received_days: PartitionsDefinition = self.ingest.partitions_def
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

    def _drive(self, received: tuple[date, date] | None) -> BatchOutcome:
        started = time.monotonic()
        # Replay retries by being run again; a daemon on the same instance must not re-run
        # its runs behind it.
        batch = _days(received)
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

        ok, raw = True, Counter[str]()
        if received is not None:
            ok = run(self.ingest, received[0].isoformat(), received[1].isoformat())
            raw = _batch_totals(runs[-1])
        # Catching up, replay is the retry of what is behind: it asks the lake, with no backoff.
        events_ranges = (
            [
                {RANGE_START: first.isoformat(), RANGE_END: last.isoformat()}
                for first, last in contiguous_ranges(
                    sorted(self.behind.event_dates()),
                    max_days=self.settings.max_partitions_per_run,
                )
            ]
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
            requested = sorted({*self.automation.tick(), *self._stale_sessions()}) if ok else []
            if not requested:
                break
            for first, last in contiguous_ranges(
                requested, max_days=self.settings.max_partitions_per_run
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
        failed = next((r for r in runs if not run_succeeded(r)), None)
        return BatchOutcome(
            received=received,
            runs=len(runs),
            succeeded=ok,
            failed_job=failed.job_def.name if failed else None,
            error=(failed_checks(failed) or _first_error(failed)) if failed else None,
            lines=raw["lines"],
            accepted=raw["accepted"],
            rejected=raw["rejected"],
            late_events=raw["late_events"],
            event_dates_updated=sum(len(flagged_partitions(r, "events", "updated")) for r in runs),
            session_dates_updated=sum(
                len(flagged_partitions(r, "sessions", "updated")) for r in runs
            ),
            users_recomputed=sum(run_figure(r, "sessions", "users_recomputed") for r in runs),
            pairs_recomputed=sum(run_figure(r, "sessions", "pairs_recomputed") for r in runs),
            lifecycle_days=sum(
                len(flagged_partitions(r, SNAPSHOT_KEY.path[-1], "rewritten")) for r in runs
            ),
            spark_jobs=sum(spark_jobs(r) for r in runs),
            seconds=time.monotonic() - started,
        )

    def _stale_sessions(self) -> list[date]:
        assert self.sessions.partitions_def is not None
        return list(
            self.behind.session_dates(self.instance, session_days=self.sessions.partitions_def)
        )


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


def run_succeeded(result: ExecuteInProcessResult) -> bool:
    """The run succeeded and so did every asset check it ran (the checks of the SPEC's
    invariants are blocking: one that fails fails its run, and `failed_checks` names it)."""
    return result.success and not failed_checks(result)


def failed_checks(result: ExecuteInProcessResult) -> str:
    """The checks of the run that failed, with their violations ('' when none did)."""
    failed = [
        f"check {e.asset_key.to_user_string()}:{e.check_name} failed "
        f"({e.metadata['violations'].value if 'violations' in e.metadata else '?'} violations)"
        for e in result.get_asset_check_evaluations()
        if not e.passed
    ]
    return "; ".join(sorted(failed))


def _first_error(result: ExecuteInProcessResult) -> str:
    """The first line of the run's first step error, without Dagster's wrapper."""
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        if error is None:
            continue
        while error.cause is not None and error.cls_name == "DagsterExecutionStepExecutionError":
            error = error.cause
        # The message reads "package.module.ErrorClass: what"; keep what.
        kind, _, what = error.message.strip().partition(": ")
        text = what if kind.endswith(error.cls_name or "?") else error.message
        # An interrupted run's error has no message: its class says what happened.
        return (text.strip().splitlines() or [error.cls_name or "the run failed"])[0]
    return "the run failed"


def _batch_totals(result: ExecuteInProcessResult) -> Counter[str]:
    """The lines, accepted, rejected and late events of the batches an ingest run read (its
    `raw_events` materializations, one per batch)."""
    totals: Counter[str] = Counter()
    for event in result.get_asset_materialization_events():
        if event.asset_key == AssetKey("raw_events"):
            figures = {k: v.value for k, v in event.materialization.metadata.items()}
            for name in ("lines", "accepted", "rejected", "late_events"):
                totals[name] += _number(figures.get(name))
    return totals


def flagged_partitions(result: ExecuteInProcessResult, asset: str, flag: str) -> list[date]:
    """The partitions of `asset` that the run reported with the metadata entry `flag` true
    (`updated`, `recomputed`, `changed`, `rewritten`)."""
    return sorted(
        {
            date.fromisoformat(event.partition or "")
            for event in result.get_asset_materialization_events()
            if event.asset_key == AssetKey(asset) and is_flagged(event.materialization, flag)
        }
    )


def spark_jobs(result: ExecuteInProcessResult) -> int:
    """The Spark jobs a run started: its assets' (`run_spark_jobs`) and its check steps' (each
    result of a step reports the `spark_jobs` its checks shared: counted once per step)."""
    checks = {
        event.step_key: _number(evaluation.metadata["spark_jobs"].value)
        for event in result.all_events
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
        for evaluation in [event.asset_check_evaluation_data]
        if "spark_jobs" in evaluation.metadata
    }
    return sum(checks.values()) + sum(
        run_figure(result, asset, "spark_jobs") for asset in JOB_REPORTERS
    )


def _number(value: object) -> int:
    """A figure's metadata value: an int (a float is truncated), 0 for none."""
    return int(value) if isinstance(value, int | float) else 0


def run_figure(result: ExecuteInProcessResult, asset: str, name: str) -> int:
    """A range run's figure over all its partitions (`run_<name>`, reported once), or 0."""
    return sum(
        _number(entry.value)
        for event in result.get_asset_materialization_events()
        if event.asset_key == AssetKey(asset)
        for key, entry in event.materialization.metadata.items()
        if key == f"run_{name}"
    )
