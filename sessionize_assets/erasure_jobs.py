"""SPEC §8 as Dagster jobs: `forget_job` begins an erasure, `finish_erasures_job` ends it.

Between the two, the runs that follow a re-delivered batch follow the erasure: the
late-data sensor finds the event dates of the batches it ingested again behind, automation
and the stale-sessions sensor the sessions, the lifecycle sensor the snapshot. Once nothing is
behind, `erasure_sensor` launches `finish_erasures_job`. From the UI: launch `forget_job` with
the keys in the launchpad; `sessionize forget` runs the same three stages in its own process
(`forget.py`). Both ops write the lake: they are in its pool and hold its writer lock.
"""

from dagster import Config, JobDefinition, OpExecutionContext, Output, job, op
from pydantic import Field

from sessionize_assets.assets.ingest import batch_materializations
from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import LAKE_POOL, markdown_table
from sessionize_assets.assets.reports import ErasureBegunMetadata, ErasureFinishedMetadata
from sessionize_assets.pipeline.forget import begin_erasure, finish_erasure
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings

FORGET_JOB = "forget_job"
FINISH_ERASURES_JOB = "finish_erasures_job"


class ForgetConfig(Config):
    """The keys to erase: each a `userId` or an `anonymousId`, as the events hold it."""

    keys: list[str] = Field(
        description="userId or anonymousId values to erase; the anonymousIds that "
        "user_identities maps to them are erased with them"
    )


def build_forget_job(settings: Settings) -> JobDefinition:
    @op(
        pool=LAKE_POOL,
        description=(
            "Records the erasure of the keys given (and of the anonymousIds stitched to them) as "
            "salted hashes, and ingests the batches that hold their lines again, without them. "
            "The runs that follow a changed batch then follow the erasure, and "
            "finish_erasures_job deletes the files that held them."
        ),
    )
    def forget_keys(context: OpExecutionContext, config: ForgetConfig, lake: LakeResource):
        with lake_step(context, lake, step="forget") as step:
            with step.counting_jobs(on_demand=True):
                begun = begin_erasure(
                    step.store, keys=config.keys, settings=settings, run_id=step.run_id
                )
            jobs = step.spark_jobs()
            ingested = begun.ingested
            if ingested is not None:
                yield from batch_materializations(
                    step.store,
                    ingested,
                    files={day: len(f.files) for day, f in begun.fingerprints.items()},
                    ignored={day: [] for day in begun.fingerprints},
                    fingerprints=begun.fingerprints,
                    spark_jobs=jobs,
                    log=context.log.info,
                )
        erasure = begun.erasure
        removed = dict(erasure.rows_removed)
        behind = sorted(
            {
                d
                for b in (ingested.batches.values() if ingested else ())
                for d in b.touched_event_dates
            }
        )
        context.log.info(
            f"erasure {erasure.erasure_id}: {len(erasure.key_hashes)} keys and "
            f"{len(erasure.stitched_hashes)} stitched anonymousIds; rows to remove: {removed}"
        )
        yield Output(
            None,
            metadata=ErasureBegunMetadata(
                erasure_id=erasure.erasure_id,
                keys_given=len(erasure.key_hashes),
                stitched_ids=len(erasure.stitched_hashes),
                rows_removed=removed,
                batches_ingested_again=[d.isoformat() for d in sorted(begun.fingerprints)],
                event_dates_behind=[d.isoformat() for d in behind],
                summary=markdown_table(removed, key="table", value="rows removed"),
                spark_jobs=jobs,
            ).to_metadata(),
        )

    @job(
        name=FORGET_JOB,
        description="Erase people on request (SPEC §8): launch it with the keys as run config.",
    )
    def forget_job():
        forget_keys()

    return forget_job


def build_finish_erasures_job() -> JobDefinition:
    @op(
        pool=LAKE_POOL,
        description=(
            "Finishes the erasures going once no live row but the corrections log's holds their "
            "keys: the corrections log keeps their sessions' changes without the key, and every "
            "data file that held one (kept for time travel) is deleted at once."
        ),
    )
    def finish_erasures(context: OpExecutionContext, lake: LakeResource):
        with lake_step(context, lake, step="finish erasures") as step:
            with step.counting_jobs(on_demand=True):
                finished = finish_erasure(step.store, step.spark, run_id=step.run_id)
            jobs = step.spark_jobs()
        context.log.info(
            f"erasures finished: {[e.erasure_id for e in finished.erasures]}; files deleted: "
            f"{dict(finished.files_deleted)}"
        )
        yield Output(
            None,
            metadata=ErasureFinishedMetadata(
                erasures_finished=[e.erasure_id for e in finished.erasures],
                corrections_redacted=finished.corrections_redacted,
                files_deleted=dict(finished.files_deleted),
                spark_jobs=jobs,
            ).to_metadata(),
        )

    @job(
        name=FINISH_ERASURES_JOB,
        description="Finish the erasures whose follow-up runs have caught up (erasure_sensor "
        "launches it).",
    )
    def finish_erasures_job():
        finish_erasures()

    return finish_erasures_job
