"""Replay a landing zone batch by batch through the project's own Definitions.

For each batch: one run ingests it; the late-data sensor (evaluated as the daemon would) asks
for range runs over the event dates the batch touched; the declarative automation conditions
(evaluated as the daemon would) then request the sessions those dates decide, run as ranges.
Range runs skip partitions with nothing new, so a batch costs three runs unless its late
events span more than `max_partitions_per_run` days. Runs go into the given Dagster
instance, so `dagster dev` on the same DAGSTER_HOME shows them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from dagster import (
    AssetKey,
    DagsterInstance,
    Definitions,
    ExecuteInProcessResult,
    JobDefinition,
    RunRequest,
    SensorResult,
    build_sensor_context,
    evaluate_automation_conditions,
)

from sessionize_assets.definitions import EVENTS_JOB, INGEST_JOB, SESSIONS_JOB, build_definitions
from sessionize_assets.partitions import contiguous_ranges
from sessionize_assets.settings import Settings

# Progress lines are replay's output; the runs' own logs stay in the instance for the UI.
_MAX_AUTOMATION_ROUNDS = 5
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass(frozen=True, kw_only=True)
class BatchOutcome:
    received_date: date
    runs: int
    succeeded: bool
    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    late_events: int = 0
    event_dates_updated: int = 0
    session_dates_updated: int = 0
    users_recomputed: int = 0
    users_in_partitions: int = 0
    seconds: float = 0.0


@dataclass(kw_only=True)
class ReplaySummary:
    batches: list[BatchOutcome] = field(default_factory=list)
    skipped: list[date] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(batch.succeeded for batch in self.batches)

    def lines(self) -> list[str]:
        def total(name: str) -> int:
            return sum(getattr(b, name) for b in self.batches)

        runs = [b.runs for b in self.batches]
        out = [
            f"batches: {len(self.batches)} processed, {len(self.skipped)} skipped, "
            f"{sum(not b.succeeded for b in self.batches)} failed",
            f"lines: {total('lines')} = {total('accepted')} accepted + "
            f"{total('rejected')} rejected at ingestion; late events: {total('late_events')}",
            f"users recomputed: {total('users_recomputed')} over the batches, against "
            f"{total('users_in_partitions')} users in the partitions they touched",
        ]
        if runs:
            out.append(f"runs per batch: max {max(runs)}, total {sum(runs)}")
        return out


def replay(
    *, settings: Settings, instance: DagsterInstance, echo: Callable[[str], None] = print
) -> ReplaySummary:
    defs = build_definitions(settings)
    landing = defs.resources["landing"]
    ingest, events, sessions = (
        defs.resolve_job_def(name) for name in (INGEST_JOB, EVENTS_JOB, SESSIONS_JOB)
    )
    late_data = LateDataTicks(defs, instance)
    automation = AutomationTicks(defs, instance)
    assert ingest.partitions_def is not None
    known = set(ingest.partitions_def.get_partition_keys(dynamic_partitions_store=instance))
    batches = landing.batches()  # type: ignore[attr-defined]
    summary = ReplaySummary()
    echo(f"replaying {len(batches)} batches from {landing.root}")  # type: ignore[attr-defined]
    for index, received in enumerate(batches, start=1):
        key = received.isoformat()
        prefix = f"[{index}/{len(batches)}] {key}:"
        if key not in known:
            echo(f"{prefix} outside the received-day partitions, skipped")
            summary.skipped.append(received)
            continue
        outcome = _replay_batch(received, ingest, events, sessions, late_data, automation, settings)
        summary.batches.append(outcome)
        echo(
            f"{prefix} {'ok' if outcome.succeeded else 'FAILED'} in {outcome.seconds:.1f}s, "
            f"runs={outcome.runs}, lines={outcome.lines} (accepted {outcome.accepted}, "
            f"rejected {outcome.rejected}, late {outcome.late_events}); "
            f"event dates updated {outcome.event_dates_updated}, session dates updated "
            f"{outcome.session_dates_updated}, users recomputed {outcome.users_recomputed} "
            f"of {outcome.users_in_partitions}"
        )
        if not outcome.succeeded:
            echo(f"stopping: batch {key} failed; see its runs in the Dagster UI")
            break
    for line in summary.lines():
        echo(line)
    return summary


class LateDataTicks:
    """Evaluates the project's late-data sensor as the daemon would, keeping its cursor."""

    def __init__(self, defs: Definitions, instance: DagsterInstance) -> None:
        self._defs = defs
        self._instance = instance
        self._sensor = defs.resolve_sensor_def("late_data_sensor")
        self._cursor: str | None = None

    @property
    def instance(self) -> DagsterInstance:
        return self._instance

    def tick(self) -> list[RunRequest]:
        context = build_sensor_context(
            instance=self._instance, definitions=self._defs, cursor=self._cursor
        )
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


def _replay_batch(
    received: date,
    ingest: JobDefinition,
    events: JobDefinition,
    sessions: JobDefinition,
    late_data: LateDataTicks,
    automation: AutomationTicks,
    settings: Settings,
) -> BatchOutcome:
    started = time.monotonic()
    instance = late_data.instance
    tags = {"sessionize/replay_batch": received.isoformat()}
    result = _run(ingest, received.isoformat(), received.isoformat(), instance, tags)
    runs = 1
    raw = _metadata(result, "raw_events")
    event_dates_updated = 0
    for request in late_data.tick() if result.success else []:
        runs += 1
        result = _run(
            events,
            request.tags["dagster/asset_partition_range_start"],
            request.tags["dagster/asset_partition_range_end"],
            instance,
            {**tags, **request.tags},
        )
        event_dates_updated += len(_metadata(result, "events").get("dates_updated") or [])
        if not result.success:
            break
    session_meta: list[dict[str, Any]] = []
    # Tick until nothing more is requested: a tick also records that the last runs handled
    # their requests, which a new request in the same tick would otherwise be lost to.
    for _ in range(_MAX_AUTOMATION_ROUNDS):
        requested = automation.tick() if result.success else []
        if not requested:
            break
        for first, last in contiguous_ranges(requested, max_days=settings.max_partitions_per_run):
            runs += 1
            result = _run(sessions, first.isoformat(), last.isoformat(), instance, tags)
            session_meta.append(_metadata(result, "sessions"))
            if not result.success:
                break
    return BatchOutcome(
        received_date=received,
        runs=runs,
        succeeded=result.success,
        lines=int(raw.get("lines", 0)),
        accepted=int(raw.get("accepted", 0)),
        rejected=int(raw.get("rejected", 0)),
        late_events=int(raw.get("late_events", 0)),
        event_dates_updated=event_dates_updated,
        session_dates_updated=sum(len(m.get("dates_updated") or []) for m in session_meta),
        users_recomputed=sum(int(m.get("users_recomputed", 0)) for m in session_meta),
        users_in_partitions=sum(int(m.get("users_in_partitions", 0)) for m in session_meta),
        seconds=time.monotonic() - started,
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
            tags={
                k: v for k, v in tags.items() if not k.startswith("dagster/asset_partition_range")
            },
        )
    return job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config=QUIET,
        tags={
            **tags,
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
    )


def _metadata(result: ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    for event in result.get_asset_materialization_events():
        if event.asset_key == AssetKey(asset):
            return {k: v.value for k, v in event.materialization.metadata.items()}
    return {}
