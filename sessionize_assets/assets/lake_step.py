"""What every asset body that writes the lake starts with: the lake's writer lock for its step,
its store, the run's partitions, and the count of the Spark jobs its work starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date

from dagster import AssetExecutionContext, OpExecutionContext
from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import counting_jobs_on_demand
from sessionize_assets.resources.spark_capacity import capacity_failure


class LakeStep:
    """One asset step of a run, holding the lake: `store` reads and writes it on the run's
    Spark session (`spark`, started on first use), and `counting_jobs` counts the Spark jobs
    of the step's work, which its metadata reports (`spark_jobs`)."""

    def __init__(
        self,
        *,
        context: AssetExecutionContext | OpExecutionContext,
        lake: LakeResource,
        step: str,
    ) -> None:
        self._context = context
        self._lake = lake
        self._step = step
        self._counted: Callable[[], SparkSession] | None = None
        self._spark_jobs: Callable[[], int | None] = lambda: 0
        self.store: DeltaStore = lake.store(spark=self.spark)

    @property
    def run_id(self) -> str:
        return self._context.run.run_id

    @property
    def dates(self) -> list[date]:
        """The run's partitions (one, or a range run's), as dates."""
        return [date.fromisoformat(key) for key in self._context.partition_keys]

    def spark(self) -> SparkSession:
        """The run's Spark session (started on first use); inside `counting_jobs`, its jobs
        are counted from the first use on."""
        return self._counted() if self._counted else self._lake.spark.session()

    @contextmanager
    def counting_jobs(self, *, on_demand: bool = False) -> Iterator[None]:
        """Count the Spark jobs the block starts (`resources/spark.py`'s `counting_jobs`): the
        step's work, not the reads that report it. The session starts here, or with
        `on_demand` when the block first uses it (a block whose work is done with Arrow
        starts none, and counts 0)."""
        with counting_jobs_on_demand(self._lake.spark.session, self._step) as (session, jobs):
            self._counted, self._spark_jobs = session, jobs
            try:
                if not on_demand:
                    session()
                yield
            finally:
                self._counted = None

    def spark_jobs(self) -> int | None:
        """The jobs `counting_jobs` counted (None on Spark Connect when the server's status
        API does not answer)."""
        return self._spark_jobs()


@contextmanager
def lake_step(
    context: AssetExecutionContext | OpExecutionContext, lake: LakeResource, *, step: str
) -> Iterator[LakeStep]:
    """The lake's writer lock for `step` of `context`'s run (from its first read to its last
    commit), and the step's hold on the lake (`LakeStep`). Spark running out of room fails
    the step with what to change (`resources/spark_capacity.py`)."""
    with lake.writer(context, step=step):
        held = LakeStep(context=context, lake=lake, step=step)
        try:
            yield held
        except Exception as error:
            partitioned = context.has_partition_key or context.has_partition_key_range
            dates = held.dates if partitioned else []
            failure = capacity_failure(
                error, step=step, dates=dates, spark_config=lake.spark.spark_config
            )
            if failure is None:
                raise
            raise failure from error
