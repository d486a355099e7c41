"""The landing sensor asks for new and changed batch folders only."""

from __future__ import annotations

import json

from dagster import (
    instance_for_test,
)

from sessionize_assets.definitions import (
    INGEST_JOB,
    build_definitions,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_tests.sensors.support import land_batch, tick


def test_landing_sensor_asks_for_new_and_changed_folders_only(settings):
    land_batch(settings, "2026-01-02", ["2026-01-02T08:00:00Z"])
    land_batch(settings, "2026-01-03", ["2026-01-03T08:00:00Z", "2026-01-01T08:00:00Z"])
    land_batch(settings, "2026-01-05", ["2026-01-05T08:00:00Z"])
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("landing_sensor")
    job = defs.resolve_job_def(INGEST_JOB)

    def landing_tick(cursor=None):
        return tick(sensor, defs, instance, cursor=cursor)

    with instance_for_test() as instance:
        first = landing_tick()
        # Contiguous folders are one range run: the 2nd and 3rd, then the 5th.
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in first.run_requests] == [
            ("2026-01-02", "2026-01-03"),
            ("2026-01-05", "2026-01-05"),
        ]
        assert landing_tick().run_requests[0].run_key == first.run_requests[0].run_key
        for request in first.run_requests:
            assert job.execute_in_process(instance=instance, tags=request.tags).success
        done = landing_tick(first.cursor)
        assert done.skip_reason.skip_message == "3 batch folders, none new or changed"
        assert done.cursor == "{}"  # every file is vouched for by the lake's record

        # Re-delivered as it was (files written again): nothing to do, and no file read twice.
        land_batch(settings, "2026-01-03", ["2026-01-03T08:00:00Z", "2026-01-01T08:00:00Z"])
        same = landing_tick(done.cursor)
        assert same.run_requests == [] and same.skip_reason
        assert list(json.loads(same.cursor)) == [
            str(settings.landing_dir.absolute() / "received_date=2026-01-03" / "part.jsonl")
        ]
        # Re-delivered with other content: that batch again, under a new run key.
        land_batch(settings, "2026-01-03", ["2026-01-03T09:00:00Z"])
        changed = landing_tick(same.cursor)
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in changed.run_requests] == [
            ("2026-01-03", "2026-01-03")
        ]
        assert changed.run_requests[0].run_key not in {r.run_key for r in first.run_requests}
