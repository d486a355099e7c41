"""The stale-sessions sensor asks for automation's dates at once and heals a failed run."""

from __future__ import annotations

import time
from datetime import timedelta

from dagster import (
    instance_for_test,
)

from sessionize_assets.definitions import (
    SESSIONS_JOB,
    build_definitions,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_tests.sensors.support import land_batch, late_data_jobs, tick


def test_the_stale_sessions_sensor_asks_for_automations_dates_and_heals_a_failed_run(settings):
    """Once an events run has ended the sensor asks for every session date around its range
    (what automation asks for a tick later) as one range run. Automation counts a failed run
    as handled; the lake's manifests and the instance still say its dates are behind, and the
    sensor asks for them again, after a backoff once its own attempt has failed."""
    settings = settings.with_overrides(retry_backoff=timedelta(seconds=2))
    land_batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-20T08:10:00Z"])
    ingest, events, ticks = late_data_jobs(settings)
    defs = build_definitions(settings, spark_ui=False)
    sessions = defs.resolve_job_def(SESSIONS_JOB)
    sensor = defs.resolve_sensor_def("stale_sessions_sensor")
    with instance_for_test() as instance:

        def stale():
            return tick(sensor, defs, instance)

        assert ingest.execute_in_process(partition_key="2026-01-20", instance=instance).success
        (request,) = ticks(instance)().run_requests
        assert events.execute_in_process(instance=instance, tags=request.tags).success
        (events_file,) = (settings.lake_dir / "events").glob("event_date=*/*.parquet")
        good = events_file.read_bytes()
        events_file.write_bytes(b"not parquet")
        (first,) = stale().run_requests
        window = ("2026-01-18", "2026-01-21")  # around the events run's 2026-01-19..20
        assert (first.tags[RANGE_START], first.tags[RANGE_END]) == window
        failed = sessions.execute_in_process(
            instance=instance, tags=first.tags, raise_on_error=False
        )
        assert not failed.success

        waiting = stale()  # its own attempt failed: within the backoff, not yet
        assert "retrying after" in waiting.skip_message
        time.sleep(2.5)
        (heal,) = stale().run_requests
        assert (heal.tags[RANGE_START], heal.tags[RANGE_END]) == window
        assert heal.run_key != first.run_key
        events_file.write_bytes(good)
        assert sessions.execute_in_process(instance=instance, tags=heal.tags).success
        assert stale().skip_message == (
            "every session date has absorbed the events its window holds"
        )
