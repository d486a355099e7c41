"""A Spark failure for lack of room says what to change (`resources/spark_capacity.py`), and
the sensors repeat it once they stop asking again (`run_health.next_attempt`)."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from dagster import (
    DagsterRunStatus,
    Failure,
    RunsFilter,
    instance_for_test,
    job,
    op,
)

from sessionize_assets.resources.spark_capacity import capacity_failure
from sessionize_assets.run_health import MAX_ATTEMPTS, RUN_STATE_TAG, next_attempt

DATES = [date(2026, 1, 1), date(2026, 2, 28)]
LOCAL = {"spark.master": "local[*]"}
CONNECT = {"spark.remote": "sc://127.0.0.1:15002"}

# The errors as Spark raised them in the backlog that failed (issue: months of history at once).
BROADCAST = (
    "An error occurred while calling o4736.collectToPython.\n"
    ": org.apache.spark.SparkException: Not enough memory to build and broadcast the table "
    "to all worker nodes. As a workaround, you can either disable broadcast by setting "
    "spark.sql.autoBroadcastJoinThreshold to -1"
)
HEAP = (
    "An error occurred while calling o4736.collectToPython.\n: org.apache.spark.SparkException:"
    " [FAILED_READ_FILE.NO_HINT] Encountered error while reading file part-00001.parquet\n"
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotReadFilesError\n"
    "Caused by: java.lang.OutOfMemoryError: Java heap space"
)
# A 30-day sessions range at the bench's full size, before the window's in-memory buffer grew.
ACQUIRE = (
    "An error occurred while calling o1833.collectToPython.\n: org.apache.spark.SparkException: "
    "Job aborted due to stage failure: Task 0 in stage 34.0 failed 1 times, most recent "
    "failure: Lost task 0.0 in stage 34.0 (TID 469) (192.0.2.2 executor driver): "
    "org.apache.spark.memory.SparkOutOfMemoryError: [UNABLE_TO_ACQUIRE_MEMORY] Unable to "
    "acquire 16384 bytes of memory, got 0. SQLSTATE: 53200"
)
PROTOBUF = "Error parsing message with type 'spark.connect.Expression'"
SERVER_DIED = (
    "<_InactiveRpcError of RPC that terminated with: status = StatusCode.INTERNAL details = "
    '"Cannot call methods on a stopped SparkContext."'
)


def test_out_of_memory_on_a_local_driver_names_its_memory_and_the_dates_per_run():
    for text in (BROADCAST, HEAP, ACQUIRE):
        failure = capacity_failure(
            RuntimeError(text), step="events", dates=DATES, spark_config=LOCAL
        )
        assert isinstance(failure, Failure)
        said = failure.description or ""
        assert said.startswith("The events step over 2026-01-01..2026-02-28 (2 dates) failed:")
        assert "Spark ran out of memory" in said
        assert 'SESSIONIZE_SPARK_CONF="spark.driver.memory=8g"' in said
        assert "(now 1g, Spark's default)" in said
        assert "SESSIONIZE_MAX_PARTITIONS_PER_RUN, under 2" in said
        # What Spark said, its telling line, is in the metadata the UI shows.
        spark_said = failure.metadata["spark said"].value
        assert any(s in spark_said for s in ("OutOfMemoryError", "Not enough memory"))
    sized = capacity_failure(
        RuntimeError(HEAP),
        step="events",
        dates=DATES,
        spark_config={**LOCAL, "spark.driver.memory": "4g"},
    )
    assert sized is not None and "(now 4g)" in (sized.description or "")


def test_a_local_driver_stopped_by_running_out_of_memory_says_so_and_what_spark_said():
    """The step's cleanup meets the stopped driver and raises over the OutOfMemoryError that
    stopped it (the full size's 180-date sessions run at `4bf1600`): the failure names the
    local driver's memory and Spark's own first words."""
    try:
        try:
            raise RuntimeError(HEAP)
        finally:
            raise RuntimeError("An error occurred while calling o14396.unpersist.\n" + SERVER_DIED)
    except RuntimeError as error:
        failure = capacity_failure(error, step="sessions", dates=DATES, spark_config=LOCAL)
    assert failure is not None
    said = failure.description or ""
    assert "Spark ran out of memory (its Spark driver stopped)" in said
    assert "spark.driver.memory" in said and "SERVER_MEMORY" not in said
    assert "OutOfMemoryError" in failure.metadata["spark said"].value


@pytest.mark.parametrize(
    ("text", "says", "names", "does_not_name"),
    [
        # A Connect server that died names the server's memory.
        (
            SERVER_DIED,
            "its Spark Connect server stopped",
            "SESSIONIZE_SPARK_SERVER_MEMORY",
            "spark.driver.memory",
        ),
        # A plan too large for Spark Connect names the dates per run, not memory.
        (
            PROTOBUF,
            "a query too large for Spark Connect's messages",
            "SESSIONIZE_MAX_PARTITIONS_PER_RUN",
            "MEMORY",
        ),
    ],
)
def test_a_spark_connect_failure_names_what_to_change(text, says, names, does_not_name):
    failure = capacity_failure(RuntimeError(text), step="ingest", dates=DATES, spark_config=CONNECT)
    assert failure is not None
    said = failure.description or ""
    assert says in said
    assert names in said and does_not_name not in said


def test_any_other_failure_is_left_as_it_is():
    for error in (ValueError("a rule broke"), RuntimeError("WriteConflictError: events")):
        assert capacity_failure(error, step="events", dates=DATES, spark_config=LOCAL) is None


@op
def events() -> None:
    failure = capacity_failure(
        RuntimeError(BROADCAST), step="events", dates=DATES, spark_config=LOCAL
    )
    assert failure is not None
    raise failure


@job
def events_job() -> None:
    events()


def test_the_sensors_stop_asking_and_say_which_step_failed_on_what():
    """Each attempt fails the same way; once MAX_ATTEMPTS ran, the sensor's reason (its tick
    in the UI) says which step failed, on what, and what to change."""
    state = "behind-1"
    with instance_for_test() as instance:
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                found, reason = next_attempt(
                    instance, job_name="events_job", state=state, backoff=timedelta(0)
                )
                assert found == attempt, reason
            result = events_job.execute_in_process(
                instance=instance, tags={RUN_STATE_TAG: state}, raise_on_error=False
            )
            assert not result.success
        failed = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        assert len(failed) == MAX_ATTEMPTS
        found, reason = next_attempt(
            instance, job_name="events_job", state=state, backoff=timedelta(0)
        )
    assert found is None
    assert reason.startswith(f"{MAX_ATTEMPTS} events_job runs left the same dates behind, ")
    assert "the last in step events: The events step over 2026-01-01..2026-02-28" in reason
    assert 'SESSIONIZE_SPARK_CONF="spark.driver.memory=8g"' in reason
    assert reason.endswith("then re-execute the last one from the UI")
