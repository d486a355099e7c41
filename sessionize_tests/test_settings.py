from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest

from sessionize_assets.settings import Settings, SettingsError


def test_defaults_follow_the_spec():
    s = Settings.from_env({})
    assert s.landing_dir == Path("data/landing") and s.lake_dir == Path("data/lake")
    assert s.session_gap == timedelta(minutes=30)
    assert s.max_session_length == timedelta(hours=24)
    assert s.future_tolerance == timedelta(minutes=5)
    assert s.spark_master == "local[*]"
    assert s.sensor_interval == timedelta(seconds=15)
    assert s.lake_backend == "embedded" and s.delta_jars_dir == Path("jars/delta")


def test_environment_overrides():
    s = Settings.from_env(
        {
            "SESSIONIZE_LANDING_DIR": "/in",
            "SESSIONIZE_LAKE_DIR": "/lake",
            "SESSIONIZE_START_DATE": "2026-03-01",
            "SESSIONIZE_SESSION_GAP_MINUTES": "45",
            "SESSIONIZE_MAX_SESSION_HOURS": "12",
            "SESSIONIZE_SPARK_MASTER": "spark://host:7077",
            "SESSIONIZE_SPARK_CONF": "spark.executor.memory=4g; spark.sql.shuffle.partitions=64",
            "SESSIONIZE_SENSOR_INTERVAL_SECONDS": "3",
            "SESSIONIZE_LAKE_BACKEND": "delta-spark",
            "SESSIONIZE_DELTA_JARS_DIR": "/opt/delta",
            "SESSIONIZE_DRIVER_WRITE_BYTES": "0",
            "SESSIONIZE_SPARK_SERVER_MASTER": "local[4]",
            "SESSIONIZE_SPARK_SERVER_HOST": "0.0.0.0",
            "SESSIONIZE_SPARK_SERVER_PORT": "15010",
            "SESSIONIZE_SPARK_SERVER_UI_PORT": "4050",
            "SESSIONIZE_SPARK_SERVER_MEMORY": "6g",
        }
    )
    assert (s.spark_server_master, s.spark_server_host) == ("local[4]", "0.0.0.0")
    assert (s.spark_server_port, s.spark_server_ui_port) == (15010, 4050)
    assert s.spark_server_memory == "6g"
    assert s.driver_write_bytes == 0
    assert s.lake_backend == "delta-spark" and s.delta_jars_dir == Path("/opt/delta")
    assert s.landing_dir == Path("/in") and s.lake_dir == Path("/lake")
    assert s.start_date == date(2026, 3, 1)
    assert s.session_gap == timedelta(minutes=45)
    assert s.max_session_length == timedelta(hours=12)
    assert s.spark_master == "spark://host:7077"
    assert s.sensor_interval == timedelta(seconds=3) and s.sensor_interval_seconds == 3
    assert s.spark_conf == {
        "spark.executor.memory": "4g",
        "spark.sql.shuffle.partitions": "64",
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SESSIONIZE_START_DATE", "01/03/2026"),
        ("SESSIONIZE_SESSION_GAP_MINUTES", "thirty"),
        ("SESSIONIZE_SESSION_GAP_MINUTES", "0"),
        ("SESSIONIZE_MAX_SESSION_HOURS", "-1"),
        ("SESSIONIZE_SPARK_CONF", "no-equals-sign"),
        ("SESSIONIZE_SENSOR_INTERVAL_SECONDS", "0"),
        ("SESSIONIZE_SENSOR_INTERVAL_SECONDS", "2.5"),
        ("SESSIONIZE_LAKE_BACKEND", "delta"),
        ("SESSIONIZE_DRIVER_WRITE_BYTES", "-1"),
        ("SESSIONIZE_DRIVER_WRITE_BYTES", "16MB"),
        ("SESSIONIZE_SPARK_SERVER_PORT", "fifteen"),
    ],
)
def test_bad_values_say_which_variable(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_a_lake_on_s3_is_the_delta_spark_backends_with_the_endpoint_for_spark():
    s = Settings.from_env(
        {
            "SESSIONIZE_LAKE_DIR": "/lake",
            "SESSIONIZE_LAKE_URI": "s3a://bucket/lake/",
            "SESSIONIZE_LAKE_BACKEND": "delta-spark",
            "SESSIONIZE_S3A_JARS_DIR": "/opt/s3a",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        }
    )
    assert str(s.lake) == "s3a://bucket/lake" and s.lake_on_s3
    assert s.s3a_jars_dir == Path("/opt/s3a") and s.s3_endpoint == "http://127.0.0.1:9000"
    assert Settings(lake_dir=Path("/lake")).lake.local_path() == Path("/lake")
    assert not Settings(lake_dir=Path("/lake")).lake_on_s3


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"lake_uri": "s3a://bucket/lake"}, "SESSIONIZE_LAKE_BACKEND=delta-spark"),
        ({"lake_uri": "bucket/lake", "lake_backend": "delta-spark"}, "scheme"),
        ({"spark_master": "sc://host:15002", "lake_backend": "delta-spark"}, "Delta Connect"),
        ({"spark_server_port": 70000}, "spark server port must be 1-65535"),
    ],
)
def test_settings_the_backend_or_a_server_cannot_use_are_refused(changes, says):
    with pytest.raises(SettingsError, match=says):
        Settings(**changes)


def test_conversion_events_are_comma_separated_names():
    assert Settings().conversion_events == ("Order Completed",)
    s = Settings.from_env({"SESSIONIZE_CONVERSION_EVENTS": " Signed Up,Order Completed,, "})
    assert s.conversion_events == ("Order Completed", "Signed Up")
    with pytest.raises(SettingsError, match="SESSIONIZE_CONVERSION_EVENTS"):
        Settings.from_env({"SESSIONIZE_CONVERSION_EVENTS": " , ,"})
