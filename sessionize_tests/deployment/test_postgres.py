"""The deployment's own Postgres cluster: made once, password-protected, loopback alone."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg2
import pytest

from sessionize_assets.deployment.postgres import DATABASE, LocalPostgres, PostgresError
from sessionize_assets.deployment.serve import postgres_address, with_driver
from sessionize_assets.resources.spark import answers
from sessionize_assets.settings import DeploymentSettings, SettingsError
from sessionize_tests.dev_server import free_port


@pytest.fixture
def folder():
    # Not pytest's folder: as root, the server's account must reach it.
    made = Path(tempfile.mkdtemp(prefix="sessionize-pg-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_the_cluster_is_made_once_and_listens_on_loopback_with_a_password(folder):
    cluster = LocalPostgres(folder / "postgres", port=free_port())
    credentials = cluster.ensure()
    assert stat.S_IMODE(os.stat(cluster.credentials_file).st_mode) == 0o600
    assert cluster.ensure() == credentials  # kept, not made again
    server = subprocess.Popen(
        cluster.server_command(),
        user=cluster.account,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        address = postgres_address(credentials.url)
        assert address == ("127.0.0.1", cluster.port)
        deadline = time.monotonic() + 60
        while not answers(*address):
            assert server.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.1)
        connection = psycopg2.connect(credentials.url)
        try:
            cursor = connection.cursor()
            cursor.execute("SHOW listen_addresses")
            assert cursor.fetchone() == ("127.0.0.1",)
            cursor.execute("SHOW unix_socket_directories")
            assert cursor.fetchone() == ("",)
            cursor.execute("SELECT current_database()")
            assert cursor.fetchone() == (DATABASE,)
        finally:
            connection.close()
        wrong = credentials.url.replace(credentials.password, "not-the-password")
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(wrong).close()
    finally:
        server.send_signal(signal.SIGINT)  # Postgres's fast shutdown
        server.wait(timeout=30)


def test_a_cluster_its_account_cannot_reach_is_refused_saying_where(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root hands the cluster to the postgres account")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(PostgresError, match="not searchable by others"):
        LocalPostgres(private / "postgres", port=free_port()).ensure()


def test_the_storage_url_comes_from_dagsters_variables():
    assert DeploymentSettings.from_env({}).postgres_url is None
    url = "postgresql://u:p@db.internal:5432/dagster"
    assert DeploymentSettings.from_env({"DAGSTER_PG_URL": url}).postgres_url == url
    parts = {
        "DAGSTER_PG_HOST": "db.internal",
        "DAGSTER_PG_USERNAME": "dagster",
        "DAGSTER_PG_PASSWORD": "p@ss word",
        "DAGSTER_PG_DB": "runs",
    }
    built = DeploymentSettings.from_env(parts).postgres_url
    assert built == "postgresql://dagster:p%40ss%20word@db.internal:5432/runs"
    assert with_driver(built).startswith("postgresql+psycopg2://dagster:")
    assert with_driver("postgresql+psycopg://x@h/db") == "postgresql+psycopg://x@h/db"
    with pytest.raises(SettingsError, match="DAGSTER_PG_URL"):
        DeploymentSettings.from_env({"DAGSTER_PG_URL": "mysql://x"})
    with pytest.raises(SettingsError, match="SESSIONIZE_WEBSERVER_PORT"):
        DeploymentSettings.from_env({"SESSIONIZE_WEBSERVER_PORT": "http"})
