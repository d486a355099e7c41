"""Shared fixtures: one local Spark session for the whole run, tmp lake and landing folders."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.resources.spark import SparkResource
from sessionize_assets.settings import Settings

TEST_START = date(2026, 1, 1)
TEST_SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}


@pytest.fixture(scope="session")
def spark_resource() -> SparkResource:
    return SparkResource(master="local[2]", conf=TEST_SPARK_CONF, ui_enabled=False)


@pytest.fixture(scope="session")
def spark(spark_resource: SparkResource) -> Iterator[SparkSession]:
    session = spark_resource.session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def make_settings(root: Path, **overrides: Any) -> Settings:
    """Settings for a landing zone and lake under `root`, on the tests' small local Spark."""
    values: dict[str, Any] = {
        "landing_dir": root / "landing",
        "lake_dir": root / "lake",
        "start_date": TEST_START,
        "spark_master": "local[2]",
        "spark_conf": TEST_SPARK_CONF,
        "maintenance_cron": None,  # off in tests: maintenance runs when a test asks for it
    }
    return Settings(**(values | overrides))


def settings_environment(settings: Settings) -> dict[str, str]:
    """The environment that gives a `sessionize` or `dagster dev` subprocess these settings."""
    return {
        "SESSIONIZE_LANDING_DIR": str(settings.landing_dir),
        "SESSIONIZE_LAKE_DIR": str(settings.lake_dir),
        "SESSIONIZE_START_DATE": settings.start_date.isoformat(),
        "SESSIONIZE_SPARK_MASTER": settings.spark_master,
        "SESSIONIZE_SPARK_CONF": ";".join(f"{k}={v}" for k, v in settings.spark_conf.items()),
        "SESSIONIZE_MAINTENANCE_CRON": settings.maintenance_cron or "off",
    }


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def store(spark: SparkSession, settings: Settings) -> EmbeddedDeltaStore:
    return EmbeddedDeltaStore(spark=spark, lake_dir=settings.lake_dir)
