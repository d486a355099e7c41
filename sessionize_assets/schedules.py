"""Table maintenance as a Dagster job on a schedule: compaction, checkpoints, vacuum.

The job writes the lake, so its op is in the lake's concurrency pool: it never runs while a
run that writes the lake does (dagster.yaml), and a writer never finds its staged files gone.
"""

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)

from sessionize_assets.assets.metadata import LAKE_POOL, markdown_table
from sessionize_assets.lake.tables import ALL_TABLES
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import DEFAULT_MAINTENANCE_CRON, Settings

MAINTENANCE_JOB = "maintenance_job"


def build_maintenance_job(settings: Settings) -> JobDefinition:
    @op(
        pool=LAKE_POOL,
        description=(
            "Compacts the small files of the tables that grow by a few rows per run, writes a "
            "checkpoint of every table and deletes the files no version within the retention "
            "period reads."
        ),
    )
    def maintain_tables(context: OpExecutionContext, lake: LakeResource):
        store = lake.store()
        results = []
        for spec in ALL_TABLES:
            with lake.writer(context, step=f"maintenance of {spec.name}"):
                result = store.maintain(spec, retention=settings.retention)
            context.log.info(
                f"{spec.name}: {result.files_compacted} files compacted into "
                f"{result.files_written}, {result.files_deleted} files deleted, checkpoint at "
                f"version {result.version}"
            )
            results.append(result)
        yield Output(
            None,
            metadata={
                "retention_days": settings.retention.total_seconds() / 86_400,
                "files_compacted": sum(r.files_compacted for r in results),
                "files_deleted": sum(r.files_deleted for r in results),
                "summary": MetadataValue.md(
                    markdown_table(
                        {
                            r.table: f"{r.files_compacted} -> {r.files_written}; "
                            f"{r.files_deleted} deleted"
                            for r in results
                        },
                        key="table",
                        value="files compacted; deleted",
                    )
                ),
            },
        )

    @job(name=MAINTENANCE_JOB, description="Compact, checkpoint and vacuum every lake table.")
    def maintenance_job():
        maintain_tables()

    return maintenance_job


def build_maintenance_schedule(
    *, settings: Settings, maintenance_job: JobDefinition
) -> ScheduleDefinition:
    """Daily by default (`SESSIONIZE_MAINTENANCE_CRON`); with the setting off, the schedule
    is still listed in the UI, stopped, for a person to start or to run by hand."""
    return ScheduleDefinition(
        name="maintenance_schedule",
        job=maintenance_job,
        cron_schedule=settings.maintenance_cron or DEFAULT_MAINTENANCE_CRON,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING
        if settings.maintenance_cron
        else DefaultScheduleStatus.STOPPED,
    )
