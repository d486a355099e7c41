"""What `sessionize serve` writes before the supervisor starts."""

from __future__ import annotations

import pytest

from sessionize_assets.deployment.serve import EVENT_BATCH_SIZE, DeploymentError, prepare
from sessionize_assets.settings import DeploymentSettings, Settings
from sessionize_tests.conftest import PROJECT

EXTERNAL = "postgresql://dagster:secret@db.internal:5432/dagster"


def _prepare(
    tmp_path,
    *,
    settings: Settings | None = None,
    instance=PROJECT / "dagster.yaml",
    environ: dict[str, str] | None = None,
):
    deployment = DeploymentSettings(
        deploy_dir=tmp_path / "deploy", code_server_port=4999, postgres_url=EXTERNAL
    )
    return prepare(
        settings=settings or Settings(),
        deployment=deployment,
        instance_settings=instance,
        working_dir=tmp_path,
        environ={"SESSIONIZE_LAKE_DIR": "lake", **(environ or {})},
    )


def test_the_instance_is_the_projects_on_postgres_its_url_in_the_environment_alone(tmp_path):
    prepared = _prepare(tmp_path)
    home = tmp_path / "deploy" / "dagster_home"
    assert prepared.environment["DAGSTER_HOME"] == str(home)
    assert prepared.environment["DAGSTER_PG_URL"] == EXTERNAL.replace(
        "postgresql://", "postgresql+psycopg2://"
    )
    assert prepared.environment["SESSIONIZE_LAKE_DIR"] == "lake"
    assert prepared.environment["SESSIONIZE_SPARK_MASTER"].startswith("sc://127.0.0.1:15002/")
    # An external Postgres: no cluster of its own to supervise.
    assert prepared.programs == ("spark-server", "code-server", "webserver", "daemon")
    for written in (tmp_path / "deploy").rglob("*"):
        if written.is_file():
            assert "secret" not in written.read_text(errors="replace"), written
    text = (home / "dagster.yaml").read_text()
    assert text.startswith((PROJECT / "dagster.yaml").read_text().rstrip("\n"))
    assert "postgres_url:\n      env: DAGSTER_PG_URL" in text
    assert "port: 4999" in (tmp_path / "deploy" / "workspace.yaml").read_text()


def test_another_spark_has_no_server_and_instance_settings_with_storage_are_refused(tmp_path):
    prepared = _prepare(tmp_path, settings=Settings(spark_master="spark://cluster:7077"))
    assert "spark-server" not in prepared.programs
    assert "SESSIONIZE_SPARK_MASTER" not in prepared.environment
    own = tmp_path / "dagster.yaml"
    own.write_text("storage:\n  sqlite:\n    base_dir: /x\n")
    with pytest.raises(DeploymentError, match="names a storage of its own"):
        _prepare(tmp_path, instance=own)


def test_dagsters_events_are_stored_in_batches_unless_the_environment_says_otherwise(tmp_path):
    prepared = _prepare(tmp_path)
    assert prepared.environment["DAGSTER_EVENT_BATCH_SIZE"] == str(EVENT_BATCH_SIZE)
    own = _prepare(tmp_path, environ={"DAGSTER_EVENT_BATCH_SIZE": "0"})
    assert own.environment["DAGSTER_EVENT_BATCH_SIZE"] == "0"
