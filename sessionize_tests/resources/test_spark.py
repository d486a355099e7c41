from __future__ import annotations

import pytest

from sessionize_assets.resources.spark import SparkResource


def test_session_runs_in_utc_with_micros_timestamps(spark_resource):
    spark = spark_resource.session()
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    row = spark.sql("select to_date(timestamp'2026-01-01 23:30:00') as d").first()
    assert str(row.d) == "2026-01-01"


def test_required_settings_cannot_be_overridden():
    resource = SparkResource(conf={"spark.sql.session.timeZone": "Europe/Berlin"})
    with pytest.raises(ValueError, match="timeZone"):
        resource.session()
