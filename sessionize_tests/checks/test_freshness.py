"""The freshness check of the daily figures (SPEC §9), run by Dagster on a real instance."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    DefaultSensorStatus,
    instance_for_test,
)

from sessionize_assets.checks.freshness import FRESHNESS_SENSOR, build_freshness_checks
from sessionize_assets.definitions import build_definitions
from sessionize_assets.settings import SettingsError

DAILY = AssetKey("daily_sessions")


def _check_passes(defs, instance) -> bool:
    """Run the freshness check as its sensor's runs do, and read its result."""
    (check_key,) = _check_keys(defs)
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_check_selection={check_key})
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


def _check_keys(defs) -> list[AssetCheckKey]:
    graph = defs.resolve_asset_graph()
    return [key for key in graph.asset_check_keys if key.asset_key == DAILY]


def test_yesterdays_figures_are_due_by_the_deadline(settings):
    """With an every-minute deadline the partition due is yesterday's: the check fails while
    it has no materialization, where the UI shows it (an ERROR check), and passes once it has."""
    settings = settings.with_overrides(freshness_deadline="* * * * *")
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def(FRESHNESS_SENSOR)
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    with instance_for_test() as instance:
        # An older day's figures do not make yesterday's fresh.
        older = (datetime.now(UTC) - timedelta(days=3)).date().isoformat()
        instance.report_runless_asset_event(AssetMaterialization(DAILY, partition=older))
        assert not _check_passes(defs, instance)
        instance.report_runless_asset_event(AssetMaterialization(DAILY, partition=yesterday))
        assert _check_passes(defs, instance)


def test_a_deadline_that_is_not_a_cron_string_is_refused_by_name(settings):
    with pytest.raises(SettingsError, match="SESSIONIZE_FRESHNESS_DEADLINE='at six'"):
        build_freshness_checks(settings=settings.with_overrides(freshness_deadline="at six"))
