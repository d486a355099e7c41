"""The UI's way to forget: forget_job with the keys as run config, the runs that follow a
changed batch, then erasure_sensor asks for finish_erasures_job once nothing is behind."""

from __future__ import annotations

from dagster import RunRequest, instance_for_test

from sessionize_assets.assets.reports import ErasureBegunMetadata, RawBatchMetadata
from sessionize_assets.definitions import INGEST_JOB, build_definitions
from sessionize_assets.erasure_jobs import FINISH_ERASURES_JOB, FORGET_JOB
from sessionize_assets.replay.driver import BatchDriver
from sessionize_assets.replay.results import op_output, reported
from sessionize_tests.sensors.support import land_batch, tick


def test_an_erasure_launched_from_the_ui_is_finished_once_what_it_put_behind_caught_up(settings):
    land_batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-19T08:00:00Z"])
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("erasure_sensor")
    with instance_for_test() as instance:
        driver = BatchDriver(defs=defs, instance=instance, settings=settings)
        assert tick(sensor, defs, instance).skip_message == "no erasure is going"
        ingest = defs.resolve_job_def(INGEST_JOB)
        assert ingest.execute_in_process(partition_key="2026-01-20", instance=instance).success
        caught_up = driver.catch_up()
        assert caught_up is not None and caught_up.succeeded

        forget = defs.resolve_job_def(FORGET_JOB).execute_in_process(
            instance=instance, run_config={"ops": {"forget_keys": {"config": {"keys": ["u"]}}}}
        )
        begun = op_output(forget, ErasureBegunMetadata)
        assert begun is not None and begun.rows_removed["events"] == 2
        assert begun.event_dates_behind == ["2026-01-19", "2026-01-20"]
        # The batch ingested again is reported with what its partition now holds.
        (batch,) = reported(forget, RawBatchMetadata)
        assert (batch.row_count, batch.lines) == (0, 0)
        waiting = tick(sensor, defs, instance).skip_message
        assert waiting == "an erasure waits for event dates behind to catch up"

        caught_up = driver.catch_up()
        assert caught_up is not None and caught_up.succeeded
        request = tick(sensor, defs, instance)
        assert isinstance(request, RunRequest)
        finish = defs.resolve_job_def(FINISH_ERASURES_JOB)
        assert finish.execute_in_process(instance=instance, tags=request.tags).success
        assert tick(sensor, defs, instance).skip_message == "no erasure is going"
