"""The late-data sensor asks for every event date behind its batches, again after a failure."""

from __future__ import annotations

import time
from datetime import timedelta

from dagster import (
    SensorResult,
    SkipReason,
    instance_for_test,
)

from sessionize_tests.sensors.support import land_batch, late_data_jobs, ranges


def test_late_data_sensor_asks_for_every_event_date_behind_its_batches(settings):
    """In range runs of at most `max_partitions_per_run` days' worth of events: whole days
    are cut at the limit; a batch's few late events on more dates than that are one run."""
    settings = settings.with_overrides(max_partitions_per_run=2)

    def day(d: str, n: int) -> list[str]:
        return [f"2026-01-{d}T08:0{i}:00Z" for i in range(n)]

    land_batch(settings, "2026-01-20", day("19", 4) + day("20", 4))
    land_batch(settings, "2026-01-21", day("21", 4))
    ingest, events, ticks = late_data_jobs(settings)
    with instance_for_test() as instance:
        tick = ticks(instance)

        assert isinstance(tick(), SkipReason)
        for key in ("2026-01-20", "2026-01-21"):
            assert ingest.execute_in_process(partition_key=key, instance=instance).success
        result = tick()

        assert isinstance(result, SensorResult)
        # Three whole days (4 events each), two days a run.
        assert ranges(result) == [("2026-01-19", "2026-01-20"), ("2026-01-21", "2026-01-21")]
        assert [r.run_key for r in tick().run_requests] == [r.run_key for r in result.run_requests]
        for request in result.run_requests:
            assert events.execute_in_process(instance=instance, tags=request.tags).success
        assert tick().skip_message == "every event date has absorbed the batches that hold it"

        # The next batch: one late event on each earlier date, a fifth of a typical day each.
        land_batch(
            settings, "2026-01-22", day("19", 1) + day("20", 1) + day("21", 1) + day("22", 1)
        )
        assert ingest.execute_in_process(partition_key="2026-01-22", instance=instance).success
        assert ranges(tick()) == [("2026-01-19", "2026-01-22")]


def test_a_failed_events_run_is_asked_for_again_after_a_backoff(settings):
    """Its dates stay behind in the lake's bookkeeping, whatever the run's metadata says."""
    settings = settings.with_overrides(retry_backoff=timedelta(seconds=2))
    land_batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-19T08:00:00Z"])
    ingest, events, ticks = late_data_jobs(settings)
    with instance_for_test() as instance:
        tick = ticks(instance)

        assert ingest.execute_in_process(partition_key="2026-01-20", instance=instance).success
        (request,) = tick().run_requests
        # The batch's raw file is unreadable while the run reads it: the run fails.
        (raw_file,) = (settings.lake_dir / "raw_events").glob("received_date=*/*.parquet")
        good = raw_file.read_bytes()
        raw_file.write_bytes(b"not parquet")
        failed = events.execute_in_process(
            instance=instance, tags=request.tags, raise_on_error=False
        )
        assert not failed.success

        waiting = tick()  # within the backoff: not yet
        assert waiting.skip_message.startswith("2026-01-19..2026-01-20: 1 events_job run(s)")
        time.sleep(2.5)
        (retry,) = tick().run_requests
        assert ranges(tick()) == [("2026-01-19", "2026-01-20")]
        assert retry.run_key != request.run_key  # a new attempt at the same state
        raw_file.write_bytes(good)
        assert events.execute_in_process(instance=instance, tags=retry.tags).success
        assert isinstance(tick(), SkipReason)
