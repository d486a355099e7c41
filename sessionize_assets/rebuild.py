"""`sessionize rebuild`: recompute events and sessions of chosen days from raw, then correct
the lifecycle snapshot (reported again from the first rebuilt day) and bring the summaries
(`arrivals`, `daily_sessions`) up to date.

The same `rebuild_job` runs from the UI (select days of `events` or `sessions`, launch it as a
backfill); this is the command-line way, in-process, recorded in the Dagster instance.

A new session gap or cap changes sessions only: `--sessions-only` recomputes them from
`events` as they are (`sessions_job` with `full_refresh`), and leaves `events` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from dagster import DagsterInstance, Definitions

from sessionize_assets.assets.keys import SNAPSHOT_KEY
from sessionize_assets.assets.reports import EventDateMetadata, SessionDateMetadata
from sessionize_assets.definitions import (
    LIFECYCLE_JOB,
    REBUILD_CONFIG,
    REBUILD_JOB,
    SESSIONS_JOB,
    SESSIONS_REBUILD_CONFIG,
    SUMMARIES_JOB,
    build_definitions,
    resource_of,
)
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, RAW_EVENTS
from sessionize_assets.lake.writer_lock import lake_writer
from sessionize_assets.partitions import (
    RANGE_END,
    RANGE_START,
    daily_figure_partitions,
    last_partition_through,
    lifecycle_range,
)
from sessionize_assets.replay.command import announce_daemon
from sessionize_assets.replay.driver import QUIET
from sessionize_assets.replay.results import failed_checks, flagged_partitions, run_succeeded
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.sensors.behind import Behind, latest_materialized_day
from sessionize_assets.settings import Settings


def rebuild(
    *,
    settings: Settings,
    instance: DagsterInstance,
    first: date | None = None,
    last: date | None = None,
    sessions_only: bool = False,
    echo: Callable[[str], None] = print,
) -> bool:
    """Rebuild event days first..last (default: every day the lake holds events for): events
    from raw and sessions from them, or with `sessions_only` the sessions of those days from
    `events` as they are."""
    defs = build_definitions(settings)
    store = resource_of(defs, "lake", LakeResource).store()
    event_dates = store.read_arrow(BATCH_EVENT_DATES).column("event_date").to_pylist()
    if not event_dates:
        echo("nothing to rebuild: no batch has been ingested")
        return True
    first = max(first or settings.start_date, settings.start_date)
    last = last or max(event_dates)
    if sessions_only:
        echo(f"rebuilding sessions for {first}..{last} from events")
        job, config = SESSIONS_JOB, SESSIONS_REBUILD_CONFIG
    else:
        echo(f"rebuilding events and sessions for {first}..{last} from raw_events")
        job, config = REBUILD_JOB, REBUILD_CONFIG
    announce_daemon(instance, lake_dir=settings.lake_dir, echo=echo)
    with lake_writer(
        settings.lake_dir, holder=f"sessionize rebuild ({first}..{last})", on_wait=echo
    ):
        result = defs.resolve_job_def(job).execute_in_process(
            instance=instance,
            run_config={**QUIET, **config},
            raise_on_error=False,
            tags={RANGE_START: first.isoformat(), RANGE_END: last.isoformat()},
        )
    if not run_succeeded(result):
        why = failed_checks(result) or "see it in the Dagster UI"
        echo(f"rebuild run {result.run_id} failed: {why}")
        return False

    events = flagged_partitions(result, EventDateMetadata, lambda m: m.recomputed)
    sessions = flagged_partitions(result, SessionDateMetadata, lambda m: m.recomputed)
    echo(f"recomputed {len(events)} event days and {len(sessions)} session days")
    if not sessions_only:
        replaced = flagged_partitions(result, EventDateMetadata, lambda m: m.replaced)
        echo(f"events changed on {len(replaced)} days")
    changed = flagged_partitions(result, SessionDateMetadata, lambda m: m.changed)
    echo(f"sessions changed on {len(changed)} days")
    received = [date.fromisoformat(day) for day in store.row_counts(RAW_EVENTS)]
    span = lifecycle_range(
        # The run materialized every sessions date of its range, changed or not.
        sessions_reported=[first],
        through=latest_materialized_day(instance, SNAPSHOT_KEY),
        latest=max(received, default=None),
        start=settings.start_date,
    )
    if span is None:
        echo("the lifecycle snapshot needs no correction")
    else:
        echo(
            f"correcting the lifecycle snapshot in a run over {span[0]}..{span[1]}, "
            "which reports each of its days"
        )
        if not _run(defs, LIFECYCLE_JOB, span, settings=settings, instance=instance, echo=echo):
            return False
    summaries = daily_figure_partitions(settings)
    behind = Behind(
        settings=settings, lake=store, landing=resource_of(defs, "landing", LandingZoneResource)
    ).summary_dates(instance, daily_days=summaries)
    key = last_partition_through(summaries, behind[-1]) if behind else None
    if key is None:
        return True
    echo(f"bringing arrivals and daily_sessions up to date on {len(behind)} dates")
    day = date.fromisoformat(key)
    return _run(defs, SUMMARIES_JOB, (day, day), settings=settings, instance=instance, echo=echo)


def _run(
    defs: Definitions,
    job: str,
    span: tuple[date, date],
    *,
    settings: Settings,
    instance: DagsterInstance,
    echo: Callable[[str], None],
) -> bool:
    """Run `job` over `span` in this process, holding the lake; say why if it failed."""
    with lake_writer(
        settings.lake_dir,
        holder=f"sessionize rebuild ({job} {span[0]}..{span[1]})",
        on_wait=echo,
    ):
        result = defs.resolve_job_def(job).execute_in_process(
            instance=instance,
            run_config=QUIET,
            raise_on_error=False,
            tags={RANGE_START: span[0].isoformat(), RANGE_END: span[1].isoformat()},
        )
    if not run_succeeded(result):
        why = failed_checks(result) or "see it in the Dagster UI"
        echo(f"{job} run {result.run_id} failed: {why}")
        return False
    return True
