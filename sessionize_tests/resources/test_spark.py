from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter

import pytest
from py4j.java_gateway import GatewayClient
from pyspark.sql import functions as F

from sessionize_assets.resources.spark import (
    DRIVER_OPTIONS,
    EXECUTOR_OPTIONS,
    JVM_OPTIONS,
    PYTHON_CALL_SITES,
    SHUFFLE_PARTITION_ROWS,
    SHUFFLE_PARTITIONS,
    WINDOW_ROWS_IN_MEMORY,
    SparkResource,
    SparkServerUnavailable,
    class_archive_options,
    connect_address,
    counting_jobs,
    counting_jobs_on_demand,
    delta_jars,
    local_cores,
    s3a_jars,
    shuffle_partitions_for,
    spark_config,
)
from sessionize_assets.settings import Settings
from sessionize_assets.spark_server import server_command, server_conf, server_environment, serves
from sessionize_tests.conftest import JVM_CLASS_ARCHIVE
from sessionize_tests.dev_server import free_port


def test_session_runs_in_utc_with_micros_timestamps(spark_resource):
    spark = spark_resource.session()
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    row = spark.sql("select to_date(timestamp'2026-01-01 23:30:00') as d").first()
    assert str(row.d) == "2026-01-01"


def test_the_jvm_waits_out_jni_critical_regions_before_failing_an_allocation(spark):
    """Java 17 failed the full size's ingest with "Java heap space" after two waits for
    threads in Parquet's native codecs (JDK-8192647): the driver JVM runs with the retries
    raised, and so do the server's and a cluster's executors."""
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    diagnostics = management.getPlatformMXBean(
        spark.sparkContext._jvm.java.lang.Class.forName(
            "com.sun.management.HotSpotDiagnosticMXBean"
        )
    )
    assert diagnostics.getVMOption("GCLockerRetryAllocationCount").getValue() == "100"
    assert server_conf(Settings())[DRIVER_OPTIONS].startswith(JVM_OPTIONS)
    assert spark_config(master="spark://host:7077")[EXECUTOR_OPTIONS] == JVM_OPTIONS


def test_a_busy_users_window_stays_in_its_plain_buffer(spark_resource):
    """Spark's 4,096 rows moved a bot's month of events to a spillable buffer whose creation
    failed the bench's full size with a 1 GB driver: every session, the server's included,
    holds WINDOW_ROWS_IN_MEMORY."""
    threshold = "spark.sql.windowExec.buffer.in.memory.threshold"
    assert spark_resource.session().conf.get(threshold) == str(WINDOW_ROWS_IN_MEMORY)
    assert server_conf(Settings())[threshold] == str(WINDOW_ROWS_IN_MEMORY)


def test_column_functions_cost_no_round_trips_for_their_python_call_sites(spark, monkeypatch):
    """PySpark 4 sends each column function's Python call site into the JVM (four round trips
    a call): sessionize's sessions, the server's included, do not ask for it. Counted on the
    tests' session, after a first call has looked the functions up: 7 round trips, 27 with
    the call sites."""
    F.col("a") + F.lit(1)
    sent = Counter[str]()
    send = GatewayClient.send_command
    caller = threading.get_ident()

    def counted(client: GatewayClient, *args, **kwargs):
        # This thread's only: another test's thread may be talking to the JVM meanwhile.
        if threading.get_ident() == caller:
            sent["round trip"] += 1
        return send(client, *args, **kwargs)

    monkeypatch.setattr(GatewayClient, "send_command", counted)
    F.col("a") + F.lit(1)
    monkeypatch.undo()
    assert sent["round trip"] <= 10, sent
    assert spark.conf.get(PYTHON_CALL_SITES) == "false"
    assert server_conf(Settings())[PYTHON_CALL_SITES] == "false"


def test_a_large_run_shuffles_into_partitions_sized_for_its_rows(spark):
    """Sized within the block, never below the session's setting, restored after."""
    before = spark.conf.get(SHUFFLE_PARTITIONS)
    with shuffle_partitions_for(spark, rows=10 * SHUFFLE_PARTITION_ROWS + 1) as partitions:
        assert partitions == 11
        assert spark.conf.get(SHUFFLE_PARTITIONS) == "11"
        assert spark.range(100).repartition("id").rdd.getNumPartitions() == 11
    assert spark.conf.get(SHUFFLE_PARTITIONS) == before
    with shuffle_partitions_for(spark, rows=1) as partitions:
        assert partitions == int(before)
    assert spark.conf.get(SHUFFLE_PARTITIONS) == before


def test_required_settings_cannot_be_overridden():
    resource = SparkResource(
        spark_config=spark_config(conf={"spark.sql.session.timeZone": "Europe/Berlin"})
    )
    with pytest.raises(ValueError, match="timeZone"):
        resource.session()


@pytest.mark.parametrize(
    ("master", "cores"),
    [("local", 1), ("local[3]", 3), ("local[4,2]", 4), ("local[*]", os.cpu_count())],
)
def test_local_mode_shuffles_and_lists_files_in_one_task_per_core(master, cores):
    assert local_cores(master) == cores
    config = spark_config(master=master)
    assert config["spark.sql.shuffle.partitions"] == str(cores)
    assert config["spark.sql.sources.parallelPartitionDiscovery.parallelism"] == str(cores)


def test_a_cluster_keeps_eight_shuffle_partitions_and_a_setting_overrides_either():
    assert spark_config(master="spark://host:7077")["spark.sql.shuffle.partitions"] == "8"
    conf = {"spark.sql.shuffle.partitions": "64"}
    assert spark_config(master="local[2]", conf=conf)["spark.sql.shuffle.partitions"] == "64"


def test_the_driver_maps_its_classes_from_the_archive_when_there_is_one(spark, tmp_path):
    archive = tmp_path / "spark-driver.jsa"
    options = DRIVER_OPTIONS
    # No archive written yet: the JVM options are left as they are.
    assert spark_config(class_archive=archive)[options] == JVM_OPTIONS
    archive.write_bytes(b"")
    mapped = f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    assert class_archive_options(archive) == mapped
    assert spark_config(class_archive=archive)[options] == f"{JVM_OPTIONS} {mapped}"
    # Whatever a setting makes the options, the archive is added to them.
    conf = {options: "-Dsome.flag=1"}
    assert spark_config(class_archive=archive, conf=conf)[options] == f"-Dsome.flag=1 {mapped}"
    # Spark Connect: no driver JVM of ours to start.
    assert spark_config(master="sc://host:15002", class_archive=archive) == {
        "spark.remote": "sc://host:15002"
    }
    # The tests' own driver maps `make jvm-archive`'s archive (make test writes it first).
    assert JVM_CLASS_ARCHIVE.is_file(), "run `make jvm-archive` (make test does)"
    vm = spark._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert vm.getVMOption("SharedArchiveFile").getValue() == str(JVM_CLASS_ARCHIVE)


def test_the_spark_connect_client_comes_with_the_install():
    """`SESSIONIZE_SPARK_MASTER=sc://...` needs Connect's client (grpcio, its status protos):
    pyproject installs `pyspark[connect]`, so a session to a server can be built; pyspark
    raises an ImportError naming what is missing otherwise."""
    from pyspark.sql.connect.utils import check_dependencies

    check_dependencies("pyspark.sql.connect.session")


def test_a_run_without_its_connect_server_fails_saying_so_at_once():
    """No server at the address: the run's first Spark step fails at once, naming the
    address and how to start one (Connect's client would retry for minutes); a retry of the
    run finds it once it is up."""
    address = f"sc://127.0.0.1:{free_port()}/;session_id=5f0e4c9a-6a57-4c1e-9d0e-1b2c3d4e5f60"
    resource = SparkResource(spark_config=spark_config(master=address))
    with pytest.raises(SparkServerUnavailable, match="sessionize spark-server") as raised:
        resource.session()
    assert address in str(raised.value)


def test_connect_addresses_name_a_host_and_a_port():
    assert connect_address("sc://10.0.0.5:15010/;session_id=x") == ("10.0.0.5", 15010)
    assert connect_address("sc://spark.internal") == ("spark.internal", 15002)
    with pytest.raises(ValueError, match="sc://host:port"):
        connect_address("local[2]")


def test_the_server_starts_with_the_local_settings_on_loopback_with_its_ui():
    settings = Settings(
        spark_server_master="local[3]",
        spark_server_port=15010,
        spark_server_memory="3g",
        spark_conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "6"},
    )
    conf = server_conf(settings)
    assert conf["spark.master"] == "local[3]" and conf["spark.sql.adaptive.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "6"  # the user's setting still wins
    assert conf["spark.ui.enabled"] == "true"  # the runs count their jobs from it
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15010"
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    # A server whose driver runs on a cluster: its executors reach it as the user says.
    on_cluster = server_conf(Settings(spark_server_master="spark://host:7077"))
    assert "spark.driver.bindAddress" not in on_cluster
    # Its Spark UI binds to SPARK_LOCAL_IP (every interface without it), a cluster's to none.
    assert server_environment(settings, {})["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert "SPARK_LOCAL_IP" not in server_environment(
        Settings(spark_server_master="spark://host:7077"), {}
    )
    command = server_command(settings)
    assert command[command.index("--class") + 1].endswith("SparkConnectServer")
    assert command[-1].endswith(".jar") and "spark-connect_" in command[-1]


def test_only_local_masters_on_the_embedded_backend_get_a_server():
    assert serves(Settings()) is None
    assert "spark://host:7077" in serves(Settings(spark_master="spark://host:7077"))
    assert "Delta Connect" in serves(Settings(lake_backend="delta-spark"))


LAZY_START = """
import sys
from dagster import build_resources
from pyspark import SparkContext
from sessionize_assets.definitions import build_resources as sessionize_resources
from sessionize_assets.settings import Settings

settings = Settings(spark_master="local[1]", spark_conf={"spark.ui.enabled": "false"})
with build_resources(sessionize_resources(settings, spark_ui=False)) as resources:
    print("before", SparkContext._active_spark_context is not None)
    resources.spark.session().range(1).count()
    print("after", SparkContext._active_spark_context is not None)
    # Spark's catalog makes its warehouse folder when first asked (Delta Spark's is, always).
    resources.spark.session().sql("show databases").collect()
"""


def test_the_session_starts_when_a_step_first_asks_for_it(tmp_path):
    """Dagster initialises a run's resources before its steps: a resource that started Spark
    then would give every run and sensor that uses none a JVM (4 s and a GB). The session
    writes nothing in the directory the process started in (Spark's warehouse folder is in
    the system temp)."""
    done = subprocess.run(
        [sys.executable, "-c", LAZY_START],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["before", "False", "after", "True"]
    assert list(tmp_path.iterdir()) == []


def test_missing_delta_jars_are_named_with_how_to_get_them(tmp_path):
    (tmp_path / "delta-storage-4.0.1.jar").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"jars: delta-spark missing from .*make jars"):
        delta_jars(tmp_path)
    (tmp_path / "delta-spark_2.13-4.0.1.jar").write_bytes(b"")
    (tmp_path / "unrelated.jar").write_bytes(b"")
    assert [j.name for j in delta_jars(tmp_path)] == [
        "delta-spark_2.13-4.0.1.jar",
        "delta-storage-4.0.1.jar",
    ]


def test_the_s3_connector_needs_hadoop_aws_and_the_sdks_s3_and_sts(tmp_path):
    (tmp_path / "hadoop-aws-3.4.1.jar").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"connector: s3, sts missing from .*make jars"):
        s3a_jars(tmp_path)
    for name in ("s3-2.57.8.jar", "sts-2.57.8.jar", "auth-2.57.8.jar"):
        (tmp_path / name).write_bytes(b"")
    assert len(s3a_jars(tmp_path)) == 4


def test_counting_jobs_on_demand_starts_no_session_unless_the_block_asks(spark):
    started = []

    def start():
        started.append(spark)
        return spark

    with counting_jobs_on_demand(start, "idle") as (_, idle_jobs):
        pass
    assert started == [] and idle_jobs() == 0

    with counting_jobs_on_demand(start, "busy") as (session, jobs):
        session().range(3).count()
        session().range(5).collect()
    with counting_jobs(spark, "reference") as reference:
        spark.range(3).count()
        spark.range(5).collect()
    assert started == [spark], "started once, on the first ask"
    assert jobs() == reference() > 0
