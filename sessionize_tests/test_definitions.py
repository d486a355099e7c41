from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import AssetKey

from sessionize_assets.definitions import INGEST_JOB, build_definitions, build_resources
from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.resources.spark import delta_jars
from sessionize_tests.conftest import DELTA_JARS_DIR


def test_definitions_load_with_documented_assets(settings):
    defs = build_definitions(settings, spark_ui=False)
    graph = defs.resolve_asset_graph()
    assert {
        AssetKey(name)
        for name in (
            "raw_events",
            "rejected_events",
            "events",
            "user_identities",
            "sessions",
            "session_quarantine",
            "session_changes",
            "user_lifecycle_state",
            "user_lifecycle_snapshot",
            "arrivals",
            "daily_sessions",
        )
    } == graph.get_all_asset_keys()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.description, f"{key} needs a business description for the UI"
        # One table of identities for every date (SPEC §3c), one arrival curve; the others
        # are by day.
        assert (node.partitions_def is None) == (key.path in (["user_identities"], ["arrivals"]))
    # The daily figures' partitions are the days that are over: yesterday's is the last.
    daily = graph.get(AssetKey("daily_sessions")).partitions_def
    sessions = graph.get(AssetKey("sessions")).partitions_def
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    assert daily.get_last_partition_key() == yesterday.isoformat()
    assert sessions.get_last_partition_key() > daily.get_last_partition_key()
    job = defs.resolve_job_def(INGEST_JOB)
    assert job.executor_def.name == "in_process"
    first = job.partitions_def.get_first_partition_key()
    assert first == settings.start_date.isoformat()


def test_module_entry_point_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SESSIONIZE_START_DATE", "2026-02-01")
    monkeypatch.setenv("SESSIONIZE_LAKE_DIR", str(tmp_path / "lake"))
    from sessionize_assets.definitions import defs

    loaded = defs()
    job = loaded.resolve_job_def(INGEST_JOB)
    assert job.partitions_def.get_first_partition_key() == "2026-02-01"


def test_the_repository_workspace_names_the_location_cursors_are_handed_to():
    """`sessionize replay` sets sensor cursors under CODE_LOCATION: `make ui` must load the
    definitions under that name, or its daemon starts without them."""
    import tomllib

    import yaml

    from sessionize_assets.workspace import CODE_LOCATION, DEFINITIONS_MODULE, workspace_yaml

    root = Path(__file__).resolve().parents[1]
    dagster = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["dagster"]
    assert (dagster["module_name"], dagster["code_location_name"]) == (
        DEFINITIONS_MODULE,
        CODE_LOCATION,
    )
    for text in ((root / "workspace.yaml").read_text(), workspace_yaml()):
        (entry,) = yaml.safe_load(text)["load_from"]
        assert entry["python_module"]["module_name"] == DEFINITIONS_MODULE
        assert entry["python_module"]["location_name"] == CODE_LOCATION


def test_the_project_instance_serializes_lake_writers_and_heals_failed_runs(tmp_path, settings):
    """dagster.yaml (copied into DAGSTER_HOME by make demo / make ui) is a valid instance whose
    pool `lake` admits one run at a time; every asset and the maintenance op are in it."""
    import shutil

    from dagster import DagsterInstance, DefaultScheduleStatus

    from sessionize_assets.assets.metadata import LAKE_POOL
    from sessionize_assets.schedules import MAINTENANCE_JOB

    shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", tmp_path / "dagster.yaml")
    instance = DagsterInstance.from_config(str(tmp_path))
    pools = instance.get_concurrency_config().pool_config
    assert (pools.pool_granularity.value, pools.default_pool_limit) == ("run", 1)
    assert instance.run_monitoring_enabled and instance.run_retries_enabled
    assert instance.run_retries_max_retries >= 1

    defs = build_definitions(settings, spark_ui=False)
    graph = defs.resolve_asset_graph()
    assert all(graph.get(key).pools == {LAKE_POOL} for key in graph.get_all_asset_keys())
    (node,) = defs.resolve_job_def(MAINTENANCE_JOB).nodes
    assert node.definition.pool == LAKE_POOL

    assert settings.maintenance_cron is None  # tests keep it off
    (schedule,) = defs.schedules
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    daily = build_definitions(settings.with_overrides(maintenance_cron="0 3 * * *"))
    assert next(iter(daily.schedules)).default_status == DefaultScheduleStatus.RUNNING


def test_the_lake_backend_setting_picks_the_store_and_the_delta_jars(spark, settings):
    """Only delta-spark loads the Delta jars and extensions; each backend's resource gives
    its store."""
    embedded = build_resources(settings, spark_ui=False)
    delta = build_resources(settings.with_overrides(lake_backend="delta-spark"), spark_ui=False)

    assert "spark.jars" not in embedded["spark"].spark_config
    config = delta["spark"].spark_config
    assert config["spark.jars"].split(",") == [str(j) for j in delta_jars(DELTA_JARS_DIR)]
    assert config["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert type(embedded["lake"].store()) is EmbeddedDeltaStore
    assert type(delta["lake"].store()) is DeltaSparkStore
