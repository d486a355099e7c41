"""landing_sensor: ingest runs for the batch folders that are new or whose files changed."""

from __future__ import annotations

import hashlib
import json
from datetime import date

from dagster import (
    PartitionsDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from sessionize_assets.partitions import RANGE_END, RANGE_START, contiguous_ranges
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind
from sessionize_assets.sensors.requests import pipeline_sensor, runs_going
from sessionize_assets.settings import Settings


def build_landing_sensor(
    *, settings: Settings, ingest_job_name: str, received_days: PartitionsDefinition
) -> SensorDefinition:
    @pipeline_sensor(
        name="landing_sensor",
        job_name=ingest_job_name,
        settings=settings,
        description=(
            "Ingests every batch folder of the landing zone that is new or whose files changed "
            "(names, sizes, SHA-256), compared with what the lake records as ingested; an "
            "unchanged folder, re-delivered or not, requests nothing."
        ),
    )
    def landing_sensor(
        context: SensorEvaluationContext, lake: LakeResource, landing: LandingZoneResource
    ) -> SensorResult | SkipReason:
        # An ingest run records its batches when it ends: wait, or the tick would ask again.
        if runs_going(context, job_names=(ingest_job_name,)):
            return SkipReason("an ingest run is still going; waiting for it")
        # Received days run through today: a folder dated later waits for its day.
        last = received_days.get_last_partition_key()
        if last is None:
            return SkipReason("no received day has a partition yet")
        # The cursor only caches digests of files that differ from the lake's record by size or
        # time (a re-delivery), so they are not read again every tick; losing it costs a read.
        cached = {path: tuple(entry) for path, entry in json.loads(context.cursor or "{}").items()}
        behind = Behind(settings=settings, lake=lake.store(), landing=landing)
        comparison = behind.landing_batches(last=date.fromisoformat(last), cached=cached)
        if comparison.vanished:
            context.log.warning(
                f"batches ingested before have no folder any more (kept as ingested): "
                f"{', '.join(map(str, comparison.vanished))}"
            )
        cursor = json.dumps({path: list(e) for path, e in sorted(comparison.digests.items())})
        if not comparison.pending:
            return SensorResult(
                skip_reason=f"{len(comparison.unchanged)} batch folders, none new or changed",
                cursor=cursor,
            )
        pending = {batch.received: batch for batch in comparison.pending}
        requests = []
        for first, end in contiguous_ranges(
            sorted(pending), max_days=settings.max_partitions_per_run, bridge_gaps=False
        ):
            # The key names the content found and the content it replaces: the same folder
            # state is requested once, and content changed back to an earlier state again.
            states = "".join(
                f"{day}:{batch.found.digest}:{batch.ingested.digest if batch.ingested else ''};"
                for day, batch in sorted(pending.items())
                if first <= day <= end
            )
            requests.append(
                RunRequest(
                    run_key=f"landing-{first}-{end}-{hashlib.sha256(states.encode()).hexdigest()}",
                    tags={RANGE_START: first.isoformat(), RANGE_END: end.isoformat()},
                )
            )
        context.log.info(
            "batches to ingest: "
            + ", ".join(f"{b.received} ({b.why})" for b in comparison.pending)
            + f"; {len(requests)} run(s)"
        )
        return SensorResult(run_requests=requests, cursor=cursor)

    return landing_sensor
