"""Run configuration the assets share."""

from dagster import Config
from pydantic import Field


class RebuildConfig(Config):
    """`full_refresh` (like dbt's): recompute the selected days from raw instead of applying
    only what changed. Set it in the launchpad, or run `rebuild_job` / `sessionize rebuild`."""

    full_refresh: bool = Field(
        default=False, description="recompute the selected days from raw_events, every user"
    )
