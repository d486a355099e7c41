"""Runs whose process died: found and reported failed, so that nothing waits on them.

A run killed with `kill -9` (or by the OOM killer) never reports its end, and stays STARTED in
the instance. The sensors wait for unfinished runs and automation treats their partitions as
in progress, so such a run would hold its dates back forever. Dagster's run monitoring fails a
run that never starts or outlives `max_runtime_seconds` (dagster.yaml), but the default run
launcher cannot tell that a run's process is gone. We can: every event a run writes records
the pid of the process that wrote it, and the default launcher runs a run on this machine.

A STARTED run whose `RUN_START` was written by a process that no longer exists is dead. Its
work is not lost: what it did not commit is still pending in the lake's bookkeeping, and
reporting it failed lets run retries (dagster.yaml) and the sensors ask for it again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _worker_pid(instance: DagsterInstance, run: DagsterRun) -> int | None:
    """The pid of the process that started executing the run, from its RUN_START event."""
    records = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.RUN_START, limit=1
    ).records
    if not records or records[0].event_log_entry.dagster_event is None:
        return None
    return records[0].event_log_entry.dagster_event.pid


def _launched_pid(instance: DagsterInstance, run: DagsterRun) -> int | None:
    """The pid of the run's process before it writes RUN_START: the process says "Started
    process for run (pid: N)" first, an engine event with the metadata `pid`."""
    for record in instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ENGINE_EVENT
    ).records:
        event = record.event_log_entry.dagster_event
        data = event.engine_event_data if event is not None else None
        entry = data.metadata.get("pid") if data is not None else None
        if entry is not None and str(entry.value).isdigit():
            return int(str(entry.value))
    return None


# A STARTING run whose process has not named itself within this is dead: a run's process
# writes its pid within seconds of its launch, so the launch was lost (a machine's restart can
# land between the daemon marking the run STARTING and its process starting). A process slower
# than this finds its run failed and stops before executing (Dagster checks the run is
# STARTING); the run's retry takes it up.
LAUNCH_TIMEOUT = timedelta(seconds=30)


def is_dead(
    instance: DagsterInstance, run: DagsterRun, *, launch_timeout: timedelta = LAUNCH_TIMEOUT
) -> bool:
    """Whether a STARTED or STARTING run's process is gone from this machine.

    A run killed while STARTING would otherwise wait for run monitoring's start timeout
    (dagster.yaml), holding the lake's pool: killed after its launch (its process's pid is
    known, and gone) or before it (no pid `launch_timeout` after the run became STARTING).
    """
    if run.status == DagsterRunStatus.STARTED:
        pid = _worker_pid(instance, run)
    elif run.status == DagsterRunStatus.STARTING:
        pid = _launched_pid(instance, run)
        if pid is None:
            record = instance.get_run_record_by_id(run.run_id)
            since = record.update_timestamp.timestamp() if record is not None else time.time()
            return time.time() - since >= launch_timeout.total_seconds()
    else:
        return False
    return pid is not None and pid != os.getpid() and not _process_exists(pid)


def fail_dead_runs(
    instance: DagsterInstance,
    runs: Sequence[DagsterRun],
    *,
    log: Callable[[str], None],
    abandoned: Callable[[DagsterRun], bool] = lambda run: False,
) -> list[DagsterRun]:
    """Report failed the runs among `runs` that are dead, or that `abandoned` says were left
    behind (a replay's runs when no replay is running: one may never have started, and a
    reused pid could pass for its process); return the others."""
    alive = []
    for run in runs:
        if is_dead(instance, run) or (
            run.status == DagsterRunStatus.NOT_STARTED and abandoned(run)
        ):
            message = (
                f"run {run.run_id} of {run.job_name} ({run.status.value}) has no process any "
                "more (killed?): reported failed, so that its partitions are asked for again"
            )
            instance.report_run_failed(run, message=message)
            log(message)
        else:
            alive.append(run)
    return alive


def unfinished_runs(
    instance: DagsterInstance, *, job_name: str | None = None, log: Callable[[str], None]
) -> list[DagsterRun]:
    """The unfinished runs (of `job_name`, or all) that are really going; dead ones are
    reported failed on the way."""
    runs = instance.get_runs(RunsFilter(job_name=job_name, statuses=UNFINISHED))
    return fail_dead_runs(instance, runs, log=log)


# The state a run was asked to bring up to date (a digest of what was behind), on its tags.
RUN_STATE_TAG = "sessionize/state"
MAX_ATTEMPTS = 5


def next_attempt(
    instance: DagsterInstance, *, job_name: str, state: str, backoff: timedelta
) -> tuple[int | None, str]:
    """Which attempt at bringing `state` up to date to request now, or None with the reason.

    A sensor derives `state` from the lake, so a state that is still behind after a run says
    that run failed, was canceled or died: it is asked for again after `backoff`, doubled at
    each attempt, at most MAX_ATTEMPTS times; then a person has to look (the reason says so).
    Run retries (dagster.yaml) copy the tag, so the daemon's retries count as attempts too.
    """
    runs = instance.get_runs(RunsFilter(job_name=job_name, tags={RUN_STATE_TAG: state}))
    if not runs:
        return 0, ""
    if len(runs) >= MAX_ATTEMPTS:
        return None, (
            f"{len(runs)} {job_name} runs left the same dates behind"
            + last_failure(instance, runs[0].run_id)
            + "; not asking again: see their errors, act on them, then re-execute the last "
            "one from the UI"
        )
    latest = instance.get_run_record_by_id(runs[0].run_id)
    ended = latest.end_time if latest is not None else None
    wait = backoff * 2 ** (len(runs) - 1)
    if ended is None or time.time() - ended < wait.total_seconds():
        return None, f"{len(runs)} {job_name} run(s) left these dates behind; retrying after {wait}"
    return len(runs), ""


def last_failure(instance: DagsterInstance, run_id: str) -> str:
    """What the run's last failed step said, as a clause (`, the last in step S: ...`), or ""
    when no step failed (the run died or was canceled): a step that failed for lack of room
    says what to change (`resources/spark_capacity.py`), which the sensor's reason repeats."""
    failures = instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
    if not failures:
        return ""
    event = failures[-1].dagster_event
    if event is None:
        return ""
    data = event.step_failure_data
    said = data.user_failure_data.description if data.user_failure_data else None
    if not said:
        said = data.error.message.strip().splitlines()[0] if data.error else "no error recorded"
    return f", the last in step {event.step_key}: {said}"
