"""Every partitions definition and mapping of the asset graph."""

from __future__ import annotations

from dagster import DailyPartitionsDefinition

from sessionize_assets.settings import Settings

PARTITION_FORMAT = "%Y-%m-%d"


def received_day_partitions(settings: Settings) -> DailyPartitionsDefinition:
    """One partition per landing batch (the UTC day events were received)."""
    return DailyPartitionsDefinition(
        start_date=settings.start_date.isoformat(), timezone="UTC", fmt=PARTITION_FORMAT
    )
