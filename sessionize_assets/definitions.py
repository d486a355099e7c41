"""The one place that wires sessionize's Definitions."""

from __future__ import annotations

from typing import TypedDict, TypeVar

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    define_asset_job,
    definitions,
    in_process_executor,
)

from sessionize_assets.assets.daily import build_summary_assets
from sessionize_assets.assets.events import build_events_asset
from sessionize_assets.assets.identities import build_identities_asset
from sessionize_assets.assets.ingest import build_ingest_assets
from sessionize_assets.assets.lifecycle import build_lifecycle_assets
from sessionize_assets.assets.sessions import build_sessions_assets
from sessionize_assets.checks import build_checks
from sessionize_assets.checks.freshness import build_freshness_checks
from sessionize_assets.erasure_jobs import (
    FINISH_ERASURES_JOB,
    FORGET_JOB,
    build_finish_erasures_job,
    build_forget_job,
)
from sessionize_assets.partitions import (
    daily_figure_partitions,
    event_day_partitions,
    received_day_partitions,
    same_day_mapping,
    sessions_on_events_mapping,
)
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.resources.spark import (
    SparkResource,
    delta_jars,
    s3a_conf,
    s3a_jars,
    spark_config,
)
from sessionize_assets.schedules import build_maintenance_job, build_maintenance_schedule
from sessionize_assets.sensors.erasure import build_erasure_sensor
from sessionize_assets.sensors.landing import build_landing_sensor
from sessionize_assets.sensors.late_data import build_late_data_sensor
from sessionize_assets.sensors.lifecycle import build_lifecycle_sensor
from sessionize_assets.sensors.stale_sessions import build_stale_sessions_sensor
from sessionize_assets.sensors.summaries import build_summaries_sensor
from sessionize_assets.settings import Settings

R = TypeVar("R")
INGEST_JOB = "ingest_batch_job"
EVENTS_JOB = "events_job"
SESSIONS_JOB = "sessions_job"
LIFECYCLE_JOB = "lifecycle_job"
SUMMARIES_JOB = "summaries_job"
CHECKS_JOB = "checks_job"
REBUILD_JOB = "rebuild_job"
# The jobs whose runs write the lake: a sensor that must see the lake at rest (the summaries'
# and the erasures') waits while a run of any of them is going.
LAKE_JOBS = (
    INGEST_JOB,
    EVENTS_JOB,
    SESSIONS_JOB,
    LIFECYCLE_JOB,
    SUMMARIES_JOB,
    REBUILD_JOB,
    FORGET_JOB,
    FINISH_ERASURES_JOB,
)
AUTOMATION_SENSOR = "sessions_automation"
# Automation on sessions ticks every this many sensor intervals. It is the backstop: the
# stale_sessions_sensor requests the same dates as a range run as soon as an events run ends,
# and automation asks for a date a tick after its events changed at the earliest
# (`partitions.late_data_condition`). Dagster can see a run's materializations land between
# two reads of one tick, and then requests what that run has just done; the rarer its ticks,
# the rarer that needless run.
AUTOMATION_INTERVALS = 4
SESSION_ASSETS = ("sessions", "session_quarantine", "session_changes")
# SPEC §9's summaries: brought up to date by summaries_job once the sessions are.
SUMMARY_ASSETS = ("arrivals", "daily_sessions")
# rebuild_job's run config. A caller that passes its own run config (logging, say) must merge
# this in: Dagster drops a job's default config when a partitioned run is given any.
REBUILD_CONFIG = {
    "ops": {name: {"config": {"full_refresh": True}} for name in ("events", "sessionize")}
}
# A new gap or cap changes sessions only: `sessions_job` with this recomputes every user's
# sessions from `events` as they are (`sessionize rebuild --sessions-only`).
SESSIONS_REBUILD_CONFIG = {"ops": {"sessionize": {"config": {"full_refresh": True}}}}
LIFECYCLE_ASSETS = ("user_lifecycle_state", "user_lifecycle_snapshot")


class Resources(TypedDict):
    """The resources of every run, by key."""

    spark: SparkResource
    lake: LakeResource
    landing: LandingZoneResource


def build_resources(settings: Settings, *, spark_ui: bool = True) -> Resources:
    jars = delta_jars(settings.delta_jars_dir) if settings.lake_backend == "delta-spark" else []
    s3 = settings.lake_on_s3
    spark = SparkResource(
        spark_config=spark_config(
            master=settings.spark_master,
            conf={**(s3a_conf(endpoint=settings.s3_endpoint) if s3 else {}), **settings.spark_conf},
            ui_enabled=spark_ui,
            jars=[*jars, *(s3a_jars(settings.s3a_jars_dir) if s3 else ())],
            class_archive=settings.jvm_class_archive,
        )
    )
    return {
        "spark": spark,
        "lake": LakeResource(
            lake=str(settings.lake),
            writer_lock_dir=str(settings.lake_dir.absolute()),
            backend=settings.lake_backend,
            driver_write_bytes=settings.driver_write_bytes,
            spark=spark,
        ),
        "landing": LandingZoneResource(landing_dir=str(settings.landing_dir.absolute())),
    }


def resource_of(defs: Definitions, key: str, kind: type[R]) -> R:
    """The resource `key` of `defs` (built by `build_resources`), checked to be a `kind`: how
    the command-line paths (replay, rebuild, the bench) use the runs' own resources."""
    found = (defs.resources or {}).get(key)
    if not isinstance(found, kind):
        raise TypeError(f"resource {key!r} is {type(found).__name__}, not {kind.__name__}")
    return found


def build_definitions(settings: Settings, *, spark_ui: bool = True) -> Definitions:
    received_days = received_day_partitions(settings)
    event_days = event_day_partitions(settings)
    daily_days = daily_figure_partitions(settings)
    # The lifecycle's checks run inside its asset, on each run's result: not in checks_job.
    checks = build_checks(settings=settings)
    freshness_checks, freshness_sensor = build_freshness_checks(settings=settings)
    maintenance_job = build_maintenance_job(settings)
    return Definitions(
        assets=[
            build_ingest_assets(settings=settings, partitions_def=received_days),
            build_events_asset(partitions_def=event_days),
            build_identities_asset(),
            build_sessions_assets(
                settings=settings,
                partitions_def=event_days,
                events_mapping=sessions_on_events_mapping(settings),
            ),
            *build_summary_assets(settings=settings, partitions_def=daily_days),
            build_lifecycle_assets(
                settings=settings,
                partitions_def=received_days,
                sessions_mapping=same_day_mapping(),
            ),
        ],
        jobs=[
            define_asset_job(INGEST_JOB, selection=["raw_events", "rejected_events"]),
            # The identities absorb each events run's changes in the same run.
            define_asset_job(EVENTS_JOB, selection=["events", "user_identities"]),
            define_asset_job(SESSIONS_JOB, selection=list(SESSION_ASSETS)),
            define_asset_job(
                SUMMARIES_JOB,
                # The freshness check runs on its sensor's schedule, not in every run.
                selection=AssetSelection.assets(*SUMMARY_ASSETS).without_checks(),
                description="Bring arrivals and daily_sessions up to date with the lake.",
            ),
            define_asset_job(LIFECYCLE_JOB, selection=list(LIFECYCLE_ASSETS)),
            define_asset_job(CHECKS_JOB, selection=AssetSelection.checks(*checks)),
            define_asset_job(
                REBUILD_JOB,
                selection=AssetSelection.assets(
                    "events", "user_identities", *SESSION_ASSETS
                ).without_checks(),
                description="Recompute events and sessions of the selected days from raw_events.",
                config=REBUILD_CONFIG,
            ),
            maintenance_job,
            build_forget_job(settings),
            build_finish_erasures_job(),
        ],
        schedules=[build_maintenance_schedule(settings=settings, maintenance_job=maintenance_job)],
        asset_checks=[*checks, *freshness_checks],
        sensors=[
            build_landing_sensor(
                settings=settings, ingest_job_name=INGEST_JOB, received_days=received_days
            ),
            build_late_data_sensor(settings=settings, events_job_name=EVENTS_JOB),
            build_stale_sessions_sensor(
                settings=settings,
                sessions_job_name=SESSIONS_JOB,
                events_job_name=EVENTS_JOB,
                session_days=event_days,
            ),
            build_lifecycle_sensor(
                settings=settings, lifecycle_job_name=LIFECYCLE_JOB, sessions_job_name=SESSIONS_JOB
            ),
            build_summaries_sensor(
                settings=settings,
                summaries_job_name=SUMMARIES_JOB,
                lake_jobs=LAKE_JOBS,
                session_days=event_days,
                daily_days=daily_days,
            ),
            freshness_sensor,
            build_erasure_sensor(
                settings=settings,
                finish_job_name=FINISH_ERASURES_JOB,
                lake_jobs=LAKE_JOBS,
                session_days=event_days,
            ),
            # Declared so automation runs on a fresh `dagster dev` (the implicit one is STOPPED).
            AutomationConditionSensorDefinition(
                AUTOMATION_SENSOR,
                target=AssetSelection.assets(*SESSION_ASSETS),
                default_status=DefaultSensorStatus.RUNNING,
                # A backstop: stale_sessions_sensor launches what it would ask for, at once.
                minimum_interval_seconds=AUTOMATION_INTERVALS * settings.sensor_interval_seconds,
                description=(
                    "Re-materializes sessions whose events changed, old dates included, when no "
                    "run has taken them up a tick after the change (stale_sessions_sensor "
                    "launches them first)."
                ),
            ),
        ],
        resources=build_resources(settings, spark_ui=spark_ui),
        # One Spark session per run: steps share it instead of each starting a JVM.
        executor=in_process_executor,
    )


@definitions
def defs() -> Definitions:
    """What `dagster dev` loads: settings come from the environment when the code loads."""
    return build_definitions(Settings.from_env())
