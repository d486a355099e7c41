"""The lake: where every Delta table lives and how commits are made."""

from __future__ import annotations

from dagster import ConfigurableResource

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.resources.spark import SparkResource


class LakeResource(ConfigurableResource):
    """Delta tables under `lake_dir`, written through the embedded delta-rs + Spark backend."""

    lake_dir: str
    spark: SparkResource

    def store(self) -> DeltaStore:
        return EmbeddedDeltaStore(spark=self.spark.session(), lake_dir=self.lake_dir)
