"""The daily figures' freshness (SPEC §9): yesterday's `daily_sessions` partition is due by
`SESSIONIZE_FRESHNESS_DEADLINE`, checked with Dagster's own time-partition freshness check.

At each tick of the deadline cron (UTC), the check expects the partition of the day that is
over by then (`daily_sessions` is partitioned by the days that are over,
`partitions.daily_figure_partitions`) to have a materialization, and fails, with the time of
the asset's latest one, when it has none: the day's batch did not land, or its runs did not
finish. Its sensor runs it after each deadline, so the asset's page shows the result.

Dagster 1.13 marks this check superseded by `FreshnessPolicy`, but a policy judges an asset's
latest materialization of any partition: a late batch of last month would make the asset
fresh while yesterday's figures are missing. SPEC §9 asks about the day's partition, which is
what this check answers.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from dagster import (
    AssetChecksDefinition,
    AssetCheckSeverity,
    DefaultSensorStatus,
    SensorDefinition,
    SupersessionWarning,
    build_sensor_for_freshness_checks,
    build_time_partition_freshness_checks,
)

from sessionize_assets.lake.tables import DAILY_SESSIONS
from sessionize_assets.settings import Settings, SettingsError

FRESHNESS_SENSOR = "daily_freshness_sensor"


def build_freshness_checks(
    *, settings: Settings
) -> tuple[Sequence[AssetChecksDefinition], SensorDefinition]:
    """The freshness check of `daily_sessions` at `settings.freshness_deadline`, and the
    sensor that runs it (running by default)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)  # module docstring
        try:
            checks = build_time_partition_freshness_checks(
                assets=[DAILY_SESSIONS.name],
                deadline_cron=settings.freshness_deadline,
                timezone="UTC",
                severity=AssetCheckSeverity.ERROR,
            )
        except Exception as error:  # Dagster's own check of the cron string
            raise SettingsError(
                f"SESSIONIZE_FRESHNESS_DEADLINE={settings.freshness_deadline!r} is not a cron "
                f"string ({error})"
            ) from error
        sensor = build_sensor_for_freshness_checks(
            freshness_checks=checks,
            name=FRESHNESS_SENSOR,
            default_status=DefaultSensorStatus.RUNNING,
        )
    return checks, sensor
