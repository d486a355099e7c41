"""Process a landing zone's new and changed batches one by one through the project's own
Definitions, as the daemon would: what a user runs each day when no daemon is kept up.

The batches are those the landing sensor would ingest (see `pipeline/landing.py`). For each,
one run ingests it; the late-data sensor (evaluated as the daemon would) asks for range runs
over the event dates the batch touched; the declarative automation conditions (evaluated as
the daemon would) then request the sessions those dates decide, run as ranges; the lifecycle
sensor finally asks for one snapshot run through the batch's day, which corrects every day from
the earliest changed session date on. Range runs skip partitions with nothing new, so a batch
costs four runs unless its late events span more than `max_partitions_per_run` days. Runs go
into the given Dagster instance, so `dagster dev` on the same DAGSTER_HOME shows them.

`at_once` takes a backlog as the daemon does when it finds several folders at one tick: the
batches of consecutive days in one ingest range run, followed through together (four runs for
all of them).
"""

from __future__ import annotations

import fcntl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from dagster import DagsterInstance, RunsFilter

from sessionize_assets.batch_driver import (
    REPLAY_BATCH_TAG,
    BatchDriver,
    BatchOutcome,
    batch_label,
)
from sessionize_assets.definitions import INGEST_JOB, build_definitions
from sessionize_assets.lake.summary import describe_lake
from sessionize_assets.partitions import ONE_DAY, contiguous_ranges
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.run_health import UNFINISHED, fail_dead_runs
from sessionize_assets.sensors import landing_comparison
from sessionize_assets.settings import Settings


@dataclass(kw_only=True)
class ReplaySummary:
    batches: list[BatchOutcome] = field(default_factory=list)
    skipped: list[date] = field(default_factory=list)
    # The runs that brought up to date what the lake held behind before the first batch
    # (a killed replay's, a failed run's): None when nothing was behind.
    caught_up: BatchOutcome | None = None
    # Where the plain sensors stopped, for the daemon to carry on from (sensor name -> cursor).
    sensor_cursors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        outcomes = [*self.batches, *([self.caught_up] if self.caught_up else [])]
        return all(outcome.succeeded for outcome in outcomes)

    def lines(self) -> list[str]:
        def total(name: str) -> int:
            return sum(getattr(b, name) for b in self.batches)

        runs = [b.runs for b in self.batches]
        failed = [b for b in self.batches if not b.succeeded]
        days = sum((b.received[1] - b.received[0]).days + 1 for b in self.batches if b.received)
        out = [
            f"batches: {days} processed, {len(self.skipped)} skipped, {len(failed)} failed",
            *(f"  FAILED {batch_label(b.received)} in {b.failed_job}: {b.error}" for b in failed),
            f"lines: {total('lines')} = {total('accepted')} accepted + "
            f"{total('rejected')} rejected at ingestion; late events: {total('late_events')}",
            f"sessions recomputed for {total('pairs_recomputed')} (user, day) pairs of "
            f"{total('users_recomputed')} users over the batches",
            f"lifecycle snapshot: {total('lifecycle_days')} days written over the batches "
            "(each batch extends it to its day and corrects from its earliest changed session)",
        ]
        if runs:
            out.append(f"runs per batch (or batches at once): max {max(runs)}, total {sum(runs)}")
        return out


class ReplayBusyError(RuntimeError):
    """Another `sessionize replay` holds the lake."""


@contextmanager
def replay_lock(lake_dir: Path) -> Iterator[None]:
    """One replay per lake at a time: a second one stops at once instead of interleaving."""
    lake_dir.mkdir(parents=True, exist_ok=True)
    path = lake_dir / ".replay.lock"
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReplayBusyError(
                f"another sessionize replay is running on {lake_dir} (it holds {path})"
            ) from None
        yield  # the lock goes with the file handle, also when the process is killed


# A daemon whose latest heartbeat is this recent is running.
_DAEMON_ALIVE_SECONDS = 120


def announce_daemon(
    instance: DagsterInstance, *, lake_dir: Path, echo: Callable[[str], None]
) -> None:
    """Say so when a dagster-daemon runs on this instance: its runs and this command's take
    turns on the lake (`lake/writer_lock.py`), and the command says whom it waits for."""
    beats = instance.get_daemon_heartbeats().values()
    if any(time.time() - beat.timestamp < _DAEMON_ALIVE_SECONDS for beat in beats):
        echo(
            f"a dagster-daemon is running on this Dagster instance: its runs and this "
            f"command's take turns writing {lake_dir} (each run waits for the one before)"
        )


def replay(
    *,
    settings: Settings,
    instance: DagsterInstance,
    echo: Callable[[str], None] = print,
    at_once: bool = False,
) -> ReplaySummary:
    """Process the landing zone's new and changed batches, oldest first, each through to the
    snapshot; a batch whose content was ingested already is not touched (as the landing
    sensor decides), so a second replay of the same zone does nothing.

    With `at_once`, the batches of consecutive received days go together, as the daemon's
    landing sensor asks for them when it finds them at one tick (a first load, a backlog):
    one ingest range run of at most `max_partitions_per_run` days, followed through to the
    snapshot together. The tables end the same; the runs' fixed costs are paid once, and
    late events no longer show as corrections of what an earlier batch wrote.

    It holds the lake's replay lock throughout. It starts by reporting failed the runs a
    killed replay (or a dead run worker) left unfinished, so nothing waits on them."""
    with replay_lock(settings.lake_dir.absolute()):
        announce_daemon(instance, lake_dir=settings.lake_dir, echo=echo)
        fail_dead_runs(
            instance,
            instance.get_runs(RunsFilter(statuses=UNFINISHED)),
            log=echo,
            # Only a replay runs its runs; holding the lock, none of theirs is still going.
            abandoned=lambda run: REPLAY_BATCH_TAG in run.tags,
        )
        return _replay(settings=settings, instance=instance, echo=echo, at_once=at_once)


def _replay(
    *,
    settings: Settings,
    instance: DagsterInstance,
    echo: Callable[[str], None],
    at_once: bool,
) -> ReplaySummary:
    defs = build_definitions(settings)
    resources = defs.resources or {}
    landing: LandingZoneResource = resources["landing"]
    driver = BatchDriver(defs=defs, instance=instance, settings=settings, echo=echo)
    last_key = driver.received_days.get_last_partition_key()
    last = date.fromisoformat(last_key) if last_key else settings.start_date - ONE_DAY
    comparison = landing_comparison(settings, last=last)
    summary = ReplaySummary(
        skipped=[day for day in landing.batches() if not settings.start_date <= day <= last]
    )
    pending = comparison.pending
    echo(
        f"{len(pending)} new or changed batches in {landing.root}, "
        f"{len(comparison.unchanged)} unchanged since they were ingested"
    )
    for day in summary.skipped:
        echo(f"{day}: outside the received-day partitions {settings.start_date}..{last}, skipped")
    for day in comparison.vanished:
        echo(f"{day}: ingested before, its folder is gone; what was ingested stays")
    for name in landing.foreign_entries():
        echo(f"{name}: not a batch folder (received_date=YYYY-MM-DD), ignored")
    # First what an earlier replay or run left behind: the lake says which partitions.
    summary.caught_up = driver.catch_up()
    if summary.caught_up is not None:
        outcome = summary.caught_up
        echo(
            f"caught up with what the lake held behind: {outcome.runs} runs, "
            f"{'ok' if outcome.succeeded else 'FAILED'}; event dates updated "
            f"{outcome.event_dates_updated}, session dates updated "
            f"{outcome.session_dates_updated}, lifecycle days {outcome.lifecycle_days}"
        )
        if not outcome.succeeded:
            echo(f"stopping: {outcome.failed_job} failed ({outcome.error}); see its runs in the UI")
            pending = []
    why = {batch.received: batch.why for batch in pending}
    groups = (
        contiguous_ranges(sorted(why), max_days=settings.max_partitions_per_run, bridge_gaps=False)
        if at_once
        else [(day, day) for day in sorted(why)]
    )
    for index, (first, last) in enumerate(groups, start=1):
        key = batch_label((first, last))
        reasons = Counter(why[day] for day in why if first <= day <= last)
        said = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        prefix = f"[{index}/{len(groups)}] {key} ({said if first != last else why[first]}):"
        outcome = driver.batches(first, last)
        summary.batches.append(outcome)
        echo(
            f"{prefix} {'ok' if outcome.succeeded else 'FAILED'} in {outcome.seconds:.1f}s, "
            f"runs={outcome.runs}, spark jobs={outcome.spark_jobs}, "
            f"lines={outcome.lines} (accepted {outcome.accepted}, "
            f"rejected {outcome.rejected}, late {outcome.late_events}); "
            f"event dates updated {outcome.event_dates_updated}, session dates updated "
            f"{outcome.session_dates_updated}, (user, day) pairs recomputed "
            f"{outcome.pairs_recomputed} of {outcome.users_recomputed} users; "
            f"lifecycle days {outcome.lifecycle_days}"
        )
        if outcome.failed_job == INGEST_JOB:
            # Nothing of the batch was committed, and later batches do not depend on it.
            echo(f"{prefix} not ingested ({outcome.error}); going on with the next batches")
        elif not outcome.succeeded:
            echo(f"stopping: batch {key} failed in {outcome.failed_job}; see its runs in the UI")
            break
    summary.sensor_cursors = driver.sensor_cursors()
    for line in summary.lines():
        echo(line)
    lake: LakeResource = resources["lake"]
    store = lake.store()
    for line in describe_lake(store, lake=settings.lake):
        echo(line)
    return summary
