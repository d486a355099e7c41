"""The lake: where every Delta table lives and how commits are made."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetExecutionContext,
    ConfigurableResource,
    OpExecutionContext,
)
from pyspark.sql import SparkSession

from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.writer_lock import lake_writer
from sessionize_assets.resources.spark import SparkResource

# The store of each backend (`settings.LAKE_BACKENDS`).
STORES: dict[str, type[EmbeddedDeltaStore] | type[DeltaSparkStore]] = {
    "embedded": EmbeddedDeltaStore,
    "delta-spark": DeltaSparkStore,
}


class LakeResource(ConfigurableResource):
    """Delta tables under `lake` (a local folder or an object store's URI), written through
    the `backend` store: "embedded" (Spark writes the files, delta-rs commits them) or
    "delta-spark" (Delta Lake's own operations). The writer lock of this machine's processes
    is a file in the local folder `writer_lock_dir`."""

    lake: str
    writer_lock_dir: str
    backend: str = "embedded"
    # `Settings.driver_write_bytes`: the embedded backend writes smaller changes from the
    # driver with Arrow.
    driver_write_bytes: int = DEFAULT_DRIVER_WRITE_BYTES
    spark: SparkResource

    def store(self, *, spark: Callable[[], SparkSession] | None = None) -> DeltaStore:
        """The backend's store on the run's Spark session, `spark()` if given: started when
        the store first needs it."""
        return STORES[self.backend](
            spark=spark or self.spark.session,
            lake=self.lake,
            driver_write_bytes=self.driver_write_bytes,
        )

    def writer(
        self,
        context: AssetExecutionContext | AssetCheckExecutionContext | OpExecutionContext,
        *,
        step: str,
    ) -> AbstractContextManager[None]:
        """The lake's writer lock (`lake/writer_lock.py`) for a `step` of `context`'s run,
        from its first read to its last commit; the run's log says whom it waits for."""
        run = context.run
        return lake_writer(
            Path(self.writer_lock_dir),
            holder=f"run {run.run_id} of {run.job_name} ({step})",
            on_wait=context.log.info,
        )
