"""The Spark session a run uses: local by default, a cluster or Spark Connect by one setting."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import SparkSession

# Correctness depends on these: event dates are UTC dates, and Delta readers expect
# microsecond Parquet timestamps (Spark's default INT96 is not what they read).
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}
DEFAULT_CONF = {
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    # Daily partitions are small; 200 shuffle partitions would mostly schedule empty tasks.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}
# Local mode only, where every job is scheduling overhead on the same few cores:
# - Reads name their files (from the Delta log), and Spark lists more than 32 paths with a
#   distributed job, one task per path: a few hundred tasks (seconds) to stat a few hundred
#   local files. On one machine the driver lists them itself.
# - Adaptive execution runs each shuffle stage of a query as a job of its own, to re-plan the
#   rest from its size: a daily batch went from about 55 Spark jobs to about 118 with it, for no
#   time saved (8 shuffle partitions leave it nothing to coalesce, and the joins that matter are
#   broadcast by hint). On a cluster Spark's default (on) stays, where skewed and mis-estimated
#   joins are worth the re-planning.
LOCAL_CONF = {
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.sql.adaptive.enabled": "false",
}


class SparkResource(ConfigurableResource):
    """Builds (or reuses) the process's SparkSession with sessionize's required settings."""

    master: str = Field(
        default="local[*]",
        description="local[*], spark://host:7077, yarn, k8s://..., or sc://host:15002 for Connect",
    )
    app_name: str = "sessionize"
    conf: dict[str, str] = Field(default_factory=dict, description="any extra Spark conf")
    ui_enabled: bool = True

    def session(self) -> SparkSession:
        clash = {k: v for k, v in self.conf.items() if k in REQUIRED_CONF and v != REQUIRED_CONF[k]}
        if clash:
            raise ValueError(f"sessionize needs {REQUIRED_CONF}; conf overrides {clash}")
        builder: Any = SparkSession.builder.appName(self.app_name)
        if self.master.startswith("sc://"):
            builder = builder.remote(self.master)
        else:
            builder = builder.master(self.master)
            settings = {**DEFAULT_CONF, "spark.ui.enabled": str(self.ui_enabled).lower()}
            if self.master.startswith("local"):
                settings |= LOCAL_CONF
                # Local Python workers must import this package: use the driver's interpreter
                # (PySpark reads the variable, not spark.pyspark.python, when it starts them).
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            for key, value in {**settings, **self.conf}.items():
                builder = builder.config(key, value)
        spark = builder.getOrCreate()
        # getOrCreate may hand back an existing session: enforce the runtime settings anyway.
        for key, value in REQUIRED_CONF.items():
            spark.conf.set(key, value)
        return spark


@contextmanager
def counting_jobs(spark: SparkSession, label: str) -> Iterator[Callable[[], int | None]]:
    """Tag the Spark jobs this thread starts inside the block with a job group of their own,
    and yield a function that counts them (what a run reports as `spark_jobs`).

    A job is every action: on small data each costs a fixed scheduling overhead, so their
    number is the first figure of a run's cost. The count is None on Spark Connect, whose
    client has no SparkContext. The thread's previous job group is restored on exit.
    """
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext on the client
        yield lambda: None
        return
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {key: context.getLocalProperty(key) for key in keys}
    group = f"{label}-{uuid.uuid4().hex}"
    context.setJobGroup(group, label)
    try:
        yield lambda: len(context.statusTracker().getJobIdsForGroup(group))
    finally:
        for key, value in previous.items():
            context.setLocalProperty(key, value)  # type: ignore[arg-type]
