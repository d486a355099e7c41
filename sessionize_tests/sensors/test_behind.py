"""What is behind, from the lake and the instance."""

from __future__ import annotations

from datetime import date

from dagster import (
    instance_for_test,
)

from sessionize_tests.sensors.support import land_batch, report


def test_the_lifecycle_catches_up_with_a_batch_the_lake_ingested_but_dagster_never_saw(
    settings, store
):
    """An ingest run killed after its last commit (the landing record) has ingested its batch
    for good: the landing sensor will not ask for it again, though Dagster never recorded the
    materialization. The lifecycle's latest day is the lake's."""
    from sessionize_assets.pipeline.landing import fingerprint, record_ingested
    from sessionize_assets.resources.landing import LandingZoneResource
    from sessionize_assets.sensors.behind import Behind

    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    batches = []
    for received in ("2026-01-01", "2026-01-02", "2026-01-03"):
        land_batch(settings, received, [f"{received}T10:00:00Z"])
        day = date.fromisoformat(received)
        batches.append(fingerprint(day, landing.batch_files(day)))
    record_ingested(store, batches, ingest_version=0, run_id="killed")
    with instance_for_test() as instance:
        for received in ("2026-01-01", "2026-01-02"):
            report(instance, "raw_events", received)
            report(instance, "user_lifecycle_snapshot", received)
        behind = Behind(settings=settings, lake=store, landing=landing)
        assert behind.lifecycle_catch_up(instance) == (date(2026, 1, 3), date(2026, 1, 3))
