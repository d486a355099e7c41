"""What a finished in-process run reports, read through the typed records its assets and
checks wrote (`reports.py`, `CheckMetadata`): whether it succeeded, which checks failed and
its first error, the partitions it reported with a flag, its steps' figures and Spark jobs.

`replay`, `rebuild` and the benchmarks read their runs through these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date
from typing import Any, TypeVar

from dagster import AssetKey, DagsterEventType, ExecuteInProcessResult

from sessionize_assets.assets.reports import STEP_FIGURES, AssetRecord, StepFigures
from sessionize_assets.checks.definitions import CheckMetadata
from sessionize_assets.typed_metadata import MetadataRecord

R = TypeVar("R", bound=AssetRecord)
F = TypeVar("F", bound=StepFigures)
M = TypeVar("M", bound=MetadataRecord)


def run_succeeded(result: ExecuteInProcessResult) -> bool:
    """The run succeeded and so did every asset check it ran (the checks of the SPEC's
    invariants are blocking: one that fails fails its run, and `failed_checks` names it)."""
    return result.success and not failed_checks(result)


def failed_checks(result: ExecuteInProcessResult) -> str:
    """The checks of the run that failed, with their violations ('' when none did)."""
    failed = []
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.passed:
            continue
        reported = CheckMetadata.in_metadata(evaluation.metadata)
        failed.append(
            f"check {evaluation.asset_key.to_user_string()}:{evaluation.check_name} failed "
            f"({reported.violations if reported else '?'} violations)"
        )
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


def reported(result: ExecuteInProcessResult, record: type[R]) -> list[R]:
    """Each materialization of `record`'s table that the run logged, read as `record`."""
    return [record.from_metadata(metadata) for _, metadata in _materializations(result, record)]


def op_output(result: ExecuteInProcessResult, record: type[M]) -> M | None:
    """The first output of an op of the run whose metadata holds `record` (an op job's
    figures: `ErasureBegunMetadata`, say)."""
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_OUTPUT:
            found = record.in_metadata(event.step_output_data.metadata)
            if found is not None:
                return found
    return None


def flagged_partitions(
    result: ExecuteInProcessResult, record: type[R], flag: Callable[[R], bool]
) -> list[date]:
    """The partitions of `record`'s table that the run reported with `flag` true (say
    `lambda m: m.updated` for `EventDateMetadata`)."""
    return sorted(
        {
            date.fromisoformat(partition or "")
            for partition, metadata in _materializations(result, record)
            if flag(record.from_metadata(metadata))
        }
    )


def step_figures(result: ExecuteInProcessResult, figures: type[F]) -> list[F]:
    """The run's figures of the step behind `figures` (one per run of the step that ran: on
    the latest partition it reported)."""
    return [
        found
        for _, metadata in _materializations(result, figures)
        if (found := figures.in_metadata(metadata)) is not None
    ]


def spark_jobs(result: ExecuteInProcessResult) -> int:
    """The Spark jobs a run started: its asset steps' (`StepFigures.spark_jobs`) and its check
    steps' (each result of a step reports the jobs its checks shared: counted once per step)."""
    checks = {
        event.step_key: reported.spark_jobs
        for event in result.all_events
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
        for reported in [CheckMetadata.in_metadata(event.asset_check_evaluation_data.metadata)]
        if reported is not None and reported.spark_jobs is not None
    }
    return sum(checks.values()) + sum(
        found.spark_jobs or 0 for figures in STEP_FIGURES for found in step_figures(result, figures)
    )


def _materializations(
    result: ExecuteInProcessResult, record: type[AssetRecord]
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """The partition and metadata of each materialization of `record`'s table in the run."""
    key = AssetKey(record.table.name)
    for event in result.get_asset_materialization_events():
        if event.asset_key == key:
            yield event.partition, dict(event.materialization.metadata)
