"""What an in-process run reports, read back: success, its failed checks or first error, the
flagged partitions and figures its materializations carry, the Spark jobs it ran. `replay`,
`rebuild` and the benchmarks read runs through these."""

from __future__ import annotations

from collections import Counter
from datetime import date

from dagster import (
    AssetKey,
    DagsterEventType,
    ExecuteInProcessResult,
)

from sessionize_assets.assets.metadata import is_flagged

# The asset of each step whose materializations carry the step's `run_spark_jobs`.
JOB_REPORTERS = ("raw_events", "events", "user_identities", "sessions", "user_lifecycle_state")


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


def first_error(result: ExecuteInProcessResult) -> str:
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


def batch_totals(result: ExecuteInProcessResult) -> Counter[str]:
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
