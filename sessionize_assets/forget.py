"""`sessionize forget --user KEY ...`: erase people on request (SPEC §8), in this process.

The same jobs the UI launches, one after the other, each recorded in the Dagster instance:
`forget_job` with the keys; the runs that follow it, as `sessionize replay` catches up with
what the lake holds behind (events, identities, sessions, the lifecycle); and
`finish_erasures_job`, which deletes the files that held the keys. Each run holds the lake's
writer lock, so the command takes turns with a daemon's runs. Run again after a failure or a
kill, with the same keys, it finishes the erasure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dagster import DagsterInstance, ExecuteInProcessResult, JobDefinition

from sessionize_assets.assets.reports import ErasureBegunMetadata, ErasureFinishedMetadata
from sessionize_assets.definitions import build_definitions
from sessionize_assets.erasure_jobs import FINISH_ERASURES_JOB, FORGET_JOB
from sessionize_assets.lake.writer_lock import lake_writer
from sessionize_assets.replay.command import announce_daemon
from sessionize_assets.replay.driver import QUIET, BatchDriver
from sessionize_assets.replay.results import first_error, op_output, run_succeeded
from sessionize_assets.settings import Settings


def forget(
    *,
    settings: Settings,
    instance: DagsterInstance,
    keys: Sequence[str],
    echo: Callable[[str], None] = print,
) -> bool:
    """Erase `keys` and what was derived from them; False (having said why) on a failure."""
    defs = build_definitions(settings)
    announce_daemon(instance, lake_dir=settings.lake_dir, echo=echo)

    def run(job: JobDefinition, config: dict) -> ExecuteInProcessResult | None:
        with lake_writer(settings.lake_dir, holder=f"sessionize forget ({job.name})", on_wait=echo):
            result = job.execute_in_process(
                instance=instance, run_config={**QUIET, **config}, raise_on_error=False
            )
        if run_succeeded(result):
            return result
        echo(f"{job.name} run {result.run_id} failed: {first_error(result)}")
        return None

    config = {"ops": {"forget_keys": {"config": {"keys": list(keys)}}}}
    begun = run(defs.resolve_job_def(FORGET_JOB), config)
    record = op_output(begun, ErasureBegunMetadata) if begun else None
    if record is None:
        return False
    echo(
        f"erasure {record.erasure_id}: {record.keys_given} keys and {record.stitched_ids} "
        f"anonymousIds stitched to them; {len(record.batches_ingested_again)} batches ingested "
        f"again without their lines, {len(record.event_dates_behind)} event dates to redo"
    )
    for table, rows in record.rows_removed.items():
        echo(f"  {table}: {rows} rows removed")
    caught_up = BatchDriver(defs=defs, instance=instance, settings=settings, echo=echo).catch_up()
    if caught_up is not None:
        if not caught_up.succeeded:
            echo(f"{caught_up.failed_job} failed: {caught_up.error}; run forget again to finish")
            return False
        echo(
            f"followed by {caught_up.runs} runs: {caught_up.event_dates_updated} event dates, "
            f"{caught_up.session_dates_updated} session dates and {caught_up.lifecycle_days} "
            "snapshot days updated"
        )
    finished = run(defs.resolve_job_def(FINISH_ERASURES_JOB), {})
    done = op_output(finished, ErasureFinishedMetadata) if finished else None
    if done is None:
        return False
    deleted = sum(done.files_deleted.values())
    echo(
        f"finished erasures {done.erasures_finished}: {deleted} data files that held the keys "
        f"deleted, {done.corrections_redacted} corrections-log rows kept without the key"
    )
    return True
