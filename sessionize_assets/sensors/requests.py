"""What the sensors share: their definition's common arguments, the runs they wait for, and
range run requests keyed by the state they bring up to date (with run_health's backoff)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from sessionize_assets.assets.keys import SESSIONS_KEY
from sessionize_assets.partitions import RANGE_END, RANGE_START, contiguous_ranges
from sessionize_assets.run_health import RUN_STATE_TAG, next_attempt, unfinished_runs
from sessionize_assets.settings import Settings

# Backfills looked at for one of sessions still requested: the newest, as they are listed.
_BACKFILLS = 20


def pipeline_sensor(
    *, name: str, job_name: str, settings: Settings, description: str
) -> Callable[[Callable[..., Any]], SensorDefinition]:
    """`@sensor` as every sensor of the pipeline is declared: running by default, ticking
    every `settings.sensor_minimum_interval_seconds`, launching `job_name`."""
    return sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=settings.sensor_minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=description,
    )


def runs_going(
    context: SensorEvaluationContext, *, job_names: tuple[str, ...], sessions: bool = False
) -> list[DagsterRun]:
    """Unfinished runs of these jobs (with `sessions`, of automation on sessions too: an asset
    selection) that are really going. Dead ones are reported failed on the way
    (`run_health.unfinished_runs`, the one place that does)."""
    return [
        run
        for run in unfinished_runs(context.instance, log=context.log.warning)
        if run.job_name in job_names or (sessions and SESSIONS_KEY in (run.asset_selection or ()))
    ]


def sessions_backfill_requested(instance: DagsterInstance) -> str | None:
    """The id of a backfill of sessions that is requested (automation's, or the UI's) and so
    may not have launched its run yet."""
    for backfill in instance.get_backfills(limit=_BACKFILLS):
        if backfill.status.value == "REQUESTED" and SESSIONS_KEY in (
            backfill.asset_selection or ()
        ):
            return backfill.backfill_id
    return None


def range_requests(
    context: SensorEvaluationContext,
    settings: Settings,
    *,
    job_name: str,
    states: Mapping[date, object],
    loads: Mapping[date, float],
    what: str,
) -> SensorResult | SkipReason:
    """Range runs over the dates behind (each with what it is behind on, `states`), of at
    most `max_partitions_per_run` days' worth of events (each date's `loads`), each under a
    run key of its state and attempt."""
    requests, waiting = [], []
    for first, end in contiguous_ranges(
        sorted(states), max_days=settings.max_partitions_per_run, loads=loads
    ):
        state = digest({str(d): s for d, s in states.items() if first <= d <= end})
        request = state_request(
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


def state_request(
    context: SensorEvaluationContext,
    settings: Settings,
    *,
    job_name: str,
    state: str,
    first: date,
    last: date,
) -> RunRequest | str:
    """A range run to bring `state` (what the lake says is behind) up to date, under a run key
    of its attempt; or why not now (see `run_health.next_attempt`)."""
    attempt, reason = next_attempt(
        context.instance, job_name=job_name, state=state, backoff=settings.retry_backoff
    )
    if attempt is None:
        return reason
    return RunRequest(
        run_key=f"{job_name}-{first}-{last}-{state}-{attempt}",
        tags={RANGE_START: first.isoformat(), RANGE_END: last.isoformat(), RUN_STATE_TAG: state},
    )


def digest(value: object) -> str:
    """A short, stable digest of a JSON-able value (a state of what is behind)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
