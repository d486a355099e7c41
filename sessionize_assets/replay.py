"""Replay a landing zone batch by batch through the project's own Definitions.

Runs go into the given Dagster instance, so `dagster dev` on the same DAGSTER_HOME shows them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date

from dagster import AssetKey, DagsterInstance

from sessionize_assets.definitions import INGEST_JOB, build_definitions
from sessionize_assets.settings import Settings

# Progress lines are replay's output; the runs' own logs stay in the instance for the UI.
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
    event_dates: int = 0
    seconds: float = 0.0


@dataclass(kw_only=True)
class ReplaySummary:
    batches: list[BatchOutcome] = field(default_factory=list)
    skipped: list[date] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(batch.succeeded for batch in self.batches)

    def lines(self) -> list[str]:
        total = lambda name: sum(getattr(b, name) for b in self.batches)  # noqa: E731
        runs = [b.runs for b in self.batches]
        out = [
            f"batches: {len(self.batches)} processed, {len(self.skipped)} skipped, "
            f"{sum(not b.succeeded for b in self.batches)} failed",
            f"lines: {total('lines')} = {total('accepted')} accepted + "
            f"{total('rejected')} rejected; late events: {total('late_events')}",
        ]
        if runs:
            out.append(f"runs per batch: max {max(runs)}, total {sum(runs)}")
        return out


def replay(
    *, settings: Settings, instance: DagsterInstance, echo: Callable[[str], None] = print
) -> ReplaySummary:
    defs = build_definitions(settings)
    landing = defs.resources["landing"]
    job = defs.resolve_job_def(INGEST_JOB)
    partitions = job.partitions_def
    assert partitions is not None
    known = set(partitions.get_partition_keys(dynamic_partitions_store=instance))
    batches = landing.batches()  # type: ignore[attr-defined]
    summary = ReplaySummary()
    echo(f"replaying {len(batches)} batches from {landing.root}")  # type: ignore[attr-defined]
    for index, received in enumerate(batches, start=1):
        key = received.isoformat()
        if key not in known:
            echo(f"[{index}/{len(batches)}] {key}: outside the received-day partitions, skipped")
            summary.skipped.append(received)
            continue
        started = time.monotonic()
        result = job.execute_in_process(
            partition_key=key,
            instance=instance,
            raise_on_error=False,
            run_config=QUIET,
            tags={"sessionize/replay_batch": key},
        )
        metadata = _materialization_metadata(result, AssetKey("raw_events"))
        outcome = BatchOutcome(
            received_date=received,
            runs=1,
            succeeded=result.success,
            lines=int(metadata.get("lines", 0)),
            accepted=int(metadata.get("accepted", 0)),
            rejected=int(metadata.get("rejected", 0)),
            late_events=int(metadata.get("late_events", 0)),
            event_dates=len(metadata.get("event_dates", {}) or {}),
            seconds=time.monotonic() - started,
        )
        summary.batches.append(outcome)
        status = "ok" if outcome.succeeded else "FAILED"
        echo(
            f"[{index}/{len(batches)}] {key}: {status} in {outcome.seconds:.1f}s, "
            f"runs={outcome.runs}, lines={outcome.lines}, accepted={outcome.accepted}, "
            f"rejected={outcome.rejected}, late={outcome.late_events} "
            f"over {outcome.event_dates} event dates"
        )
        if not outcome.succeeded:
            echo(f"stopping: batch {key} failed (run {result.run_id}); see the run's logs")
            break
    for line in summary.lines():
        echo(line)
    return summary


def _materialization_metadata(result, asset_key: AssetKey) -> dict:  # type: ignore[no-untyped-def]
    for event in result.get_asset_materialization_events():
        if event.asset_key == asset_key:
            return {k: v.value for k, v in event.materialization.metadata.items()}
    return {}
