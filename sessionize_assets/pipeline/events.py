"""raw_events -> `events`: SPEC §2's duplicate rule across every date, paying for what arrived.

An input is one batch's rows of one event date; `events_manifest` says which inputs each date
has absorbed. A run reads the copies of its new inputs (and, for a date whose absorbed input
changed or vanished with a re-delivered batch, every input of that date) and settles each id
against all of its copies, on any date, that the id index (`event_ids`) holds:

- an id's winner is its copy in the earliest batch (ingestion keeps one copy per batch);
- a winning copy of this run's inputs is added to `events`;
- every other copy of this run's inputs becomes a `duplicate` rejection;
- a copy in `events` that is no longer its id's winner is *displaced*, whatever its date: only
  the files holding it are rewritten, and it becomes a `duplicate` rejection;
- a rejected copy that has become its id's winner (the copy that beat it vanished with a
  re-delivered batch) is *promoted*: its rejection is removed and it is added to `events`.

Most ids of a batch have no other copy: those are appended, and nothing else is read for
them. The few that do (*contested* ids) are settled on the driver, after one read of where
their copies stand in `events` and `rejected_events`. A copy of another batch that is in
neither table is left to the run that absorbs its input. A date whose inputs are recomputed
is compared row for row (a re-delivered copy can keep its id and change its content). A date
outside the request that a displacement or a promotion changed keeps the inputs it absorbed,
recorded at the new `events` version so its sessions follow (`EventsReport.also_changed`).
`full_refresh` recomputes every requested date from raw, and replaces those whose winners
differ from what `events` holds (`lake/fingerprints.py`): the rebuild path.

Rejections are committed first, then `events`, whose commit names the inputs it absorbed, then
the manifest. A run killed before its manifest commit is recorded from the `events` log by the
next run (`record_unrecorded`); one killed before its `events` commit is redone, and finds its
rejections already made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import CommitInfo, DeltaStore, empty_frame
from sessionize_assets.lake.tables import EVENTS, EVENTS_MANIFEST, REJECTED_EVENTS
from sessionize_assets.pipeline.event_ids import (
    index_missing_batches,
)
from sessionize_assets.pipeline.events_change import (
    EventsChange,
    held_on_driver,
    keys_frame,
    read_raw,
    replace_dates,
    settle,
)
from sessionize_assets.pipeline.events_on_driver import settle_on_driver
from sessionize_assets.pipeline.keyed_reads import keys_for_join
from sessionize_assets.pipeline.manifests import (
    ABSORBED_KEY,
    Inputs,
    Plan,
    absorbed_inputs,
    absorbed_metadata,
    batch_inputs,
    indexed_event_dates,
    indexed_rows,
    plan,
    record_absorbed,
    record_unrecorded,
)
from sessionize_assets.resources.spark import shuffle_partitions_for
from sessionize_assets.transforms.events import Copy
from sessionize_assets.transforms.validation import DEDUP


@dataclass(kw_only=True)
class EventsReport:
    requested: list[date]
    updated: list[date] = field(default_factory=list)
    recomputed: list[date] = field(default_factory=list)
    # Recomputed dates whose winners differed from what `events` held: written again.
    replaced: list[date] = field(default_factory=list)
    # Dates outside the request whose rows this run changed: a copy displaced from them or
    # promoted into them, because of a copy of the same id on a requested date.
    also_changed: list[date] = field(default_factory=list)
    batches_read: int = 0
    raw_rows_read: int = 0
    contested_ids: int = 0  # ids with a copy in another batch, settled on the driver
    new_events: int = 0  # rows added to `events` (winners, promoted copies, changed rows)
    displaced: int = 0  # copies removed from `events` because another copy of the id wins
    promoted: int = 0  # rejected copies that became their id's winner
    duplicates: int = 0  # duplicate rejections added
    rows_written: int = 0  # rows in the files the events commit added
    files_added: int = 0
    files_removed: int = 0
    # Per requested date: the batches holding its events, and those this run absorbed.
    batches_by_date: dict[date, int] = field(default_factory=dict)
    absorbed_by_date: dict[date, int] = field(default_factory=dict)
    events_version: int | None = None


def update_events(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    *,
    event_dates: Iterable[date],
    run_id: str,
    full_refresh: bool = False,
) -> EventsReport:
    """Bring `events` for these dates up to date with every batch ingested so far.

    Dates with nothing new are skipped; `full_refresh` recomputes all of them from raw. Other
    dates change only where a copy of an id settled here is displaced or promoted.

    The recipe: record what a killed run left unrecorded; plan each date's inputs (`_plan`);
    settle the new copies into a change (`events_change`, or `events_on_driver` for a daily
    batch that fits there, which never calls `spark`); commit the rejections, then `events`;
    record what each date absorbed; report.
    """
    dates = sorted(set(event_dates))
    report = EventsReport(requested=dates)
    record_unrecorded(store, run_id=run_id)
    # What this run reads: its commits are made against these versions (WriteConflictError).
    read_at = {
        spec: store.read_version(spec) for spec in (EVENTS, REJECTED_EVENTS, EVENTS_MANIFEST)
    }
    work = _plan(store, dates, full_refresh=full_refresh, report=report)
    if work is None:
        return report
    index_missing_batches(store, run_id=run_id)
    with ExitStack() as stack:
        # A run with no recomputed date reads only its new inputs (`raw_rows` of them).
        change = (
            None
            if full_refresh or work.recompute
            else settle_on_driver(store, work.new_inputs, rows=work.raw_rows)
        )
        if change is None:
            # Shuffles sized for the run's raw rows: a rebuild's winners over 20 M copies, in
            # the local session's two shuffle partitions, spilled 856 MB.
            stack.enter_context(shuffle_partitions_for(spark(), rows=work.raw_rows))
            change = _change(store, spark(), work, full_refresh=full_refresh)
        stack.callback(change.release)
        also_changed = sorted(change.dates_touched - set(dates))
        unchanged = _left_as_they_were(work, change)
        manifest = {
            d: work.available[d] for d in (*work.incremental, *work.recompute) if d not in unchanged
        }
        # A date outside the request keeps the inputs it absorbed, now held by this version.
        manifest |= absorbed_inputs(store, partitions=also_changed)
        tags = {"dagster_run_id": run_id}
        _commit_rejections(
            store,
            spark,
            change,
            tags={**tags, "table": REJECTED_EVENTS.name},
            read_version=read_at[REJECTED_EVENTS],
        )
        commit = _commit_events(
            store,
            spark,
            change,
            tags={**tags, "table": EVENTS.name, ABSORBED_KEY: absorbed_metadata(manifest)},
            read_version=read_at[EVENTS],
        )
    record_absorbed(
        store,
        absorbed=manifest,
        events_version=commit.version,
        run_id=run_id,
        read_version=read_at[EVENTS_MANIFEST],
        read=[*work.new_inputs, *work.all_inputs],
    )
    report.also_changed = also_changed
    _report_run(store, report, work, change, commit)
    return report


@dataclass(frozen=True, kw_only=True)
class _Work:
    """What a run reads: each date's available and absorbed inputs, the dates recomputed from
    all their inputs and those that absorb only new ones, and the batches involved."""

    available: dict[date, Inputs]
    plans: dict[date, Plan]
    recompute: list[date]
    incremental: list[date]
    new_inputs: Inputs
    all_inputs: Inputs
    involved: list[date]  # batches whose rejections of the recomputed dates are written again
    raw_rows: int  # raw rows behind `new_inputs` and `all_inputs` (the index's count)
    # `full_refresh` of every date the index lists: the run's raw rows hold every copy.
    whole_history: bool


def _plan(
    store: DeltaStore, dates: list[date], *, full_refresh: bool, report: EventsReport
) -> _Work | None:
    """Each date's inputs against what it absorbed (`manifests.plan`); None: nothing new."""
    available = batch_inputs(store, dates)
    absorbed = absorbed_inputs(store, partitions=dates)
    plans = {d: plan(available[d], absorbed[d]) for d in dates}
    report.batches_by_date = {d: len({r for _, r in available[d]}) for d in dates}
    if full_refresh:
        recompute, incremental = dates, []
    else:
        recompute = [d for d in dates if plans[d].needs_recompute]
        incremental = [d for d in dates if plans[d].pending and d not in recompute]
    if not recompute and not incremental:
        return None
    new_inputs = {k: v for d in incremental for k, v in plans[d].new.items()}
    all_inputs = {k: v for d in recompute for k, v in available[d].items()}
    return _Work(
        available=available,
        plans=plans,
        recompute=recompute,
        incremental=incremental,
        new_inputs=new_inputs,
        all_inputs=all_inputs,
        involved=sorted({r for d in recompute for _, r in (*available[d], *absorbed[d])}),
        raw_rows=indexed_rows(store, [*new_inputs, *all_inputs]),
        whole_history=full_refresh and set(dates) >= indexed_event_dates(store),
    )


def _change(
    store: DeltaStore, spark: SparkSession, work: _Work, *, full_refresh: bool
) -> EventsChange:
    """The run's change: its inputs' copies read from raw (not persisted: each use reads only
    the columns and rows it needs; a backlog's raw lines held in the driver's heap did not fit
    its defaults), settled against every copy of their ids."""
    own = read_raw(store, {**work.new_inputs, **work.all_inputs})
    if full_refresh:
        return replace_dates(
            store,
            own,
            dates=work.recompute,
            involved=work.involved,
            every_copy=work.whole_history,
        )
    # The recomputed dates' ids are settled too: counted from the log, only when there are
    # some (a daily batch's run loads no `events` log for it).
    recomputed = store.row_counts(EVENTS, partitions=work.recompute) if work.recompute else {}
    new_rows = indexed_rows(store, work.new_inputs)
    return settle(
        store,
        spark,
        own,
        recompute=work.recompute,
        involved=work.involved,
        new_rows=new_rows,
        held_rows=work.raw_rows + sum(recomputed.values()),
        # A daily batch's copies, listed on the driver, are looked up there.
        listed=None if work.recompute else held_on_driver(store, work.new_inputs, rows=new_rows),
    )


def _left_as_they_were(work: _Work, change: EventsChange) -> set[date]:
    """The dates a full refresh recomputed and did not write (their winners are what `events`
    holds) whose inputs are the ones the manifest records: their manifest rows say all there
    is, and the `events` commit leaves them as they were."""
    if change.replaced is None:
        return set()
    return {d for d in work.recompute if d not in change.replaced and not work.plans[d].pending}


def _report_run(
    store: DeltaStore, report: EventsReport, work: _Work, change: EventsChange, commit: CommitInfo
) -> None:
    """What the run brought up to date, read and wrote."""
    report.updated = sorted([*work.incremental, *work.recompute])
    report.recomputed = work.recompute
    report.replaced = change.replaced or []
    report.absorbed_by_date = {
        d: len(work.available[d]) if d in work.recompute else len(work.plans[d].new)
        for d in report.updated
    }
    report.batches_read = len({r for _, r in (*work.new_inputs, *work.all_inputs)})
    report.raw_rows_read = work.raw_rows
    report.contested_ids = change.contested
    report.new_events = change.added
    report.displaced = change.displaced
    report.promoted = change.promoted
    report.duplicates = change.rejected
    report.rows_written = commit.rows_written
    report.files_added = commit.files_added
    report.files_removed = commit.files_removed
    report.events_version = commit.version


def _commit_rejections(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    change: EventsChange,
    *,
    tags: dict[str, str],
    read_version: int | None,
) -> CommitInfo | None:
    """Duplicate rejections: the recomputed dates' written again, the others added and
    removed by copy. Nothing is committed when nothing changes."""
    if change.on_driver is not None:
        if not change.rejections_drop and change.rejections_add is None:
            return None
        assert not isinstance(change.rejections_add, DataFrame)
        return store.rewrite_arrow(
            REJECTED_EVENTS,
            add=change.rejections_add,
            drop=_keys_table(change.rejections_drop, id_column="message_id").append_column(
                "origin", pa.array([DEDUP] * len(change.rejections_drop), pa.string())
            ),
            files=change.on_driver.rejections,
            commit_metadata=tags,
            read_version=read_version,
        )
    drop, keys, batches = None, None, {r for _, _, r in change.rejections_drop}
    if change.rejections_replaced is not None:
        replaced_batches, dates = change.rejections_replaced
        drop = (F.col("origin") == DEDUP) & F.col("event_date").isin(dates)
        batches |= set(replaced_batches)
    if change.rejections_drop:
        keys = keys_for_join(
            keys_frame(spark(), change.rejections_drop).select(
                "event_date",
                F.col("event_id").alias("message_id"),
                "received_date",
                F.lit(DEDUP).alias("origin"),
            ),
            rows=len(change.rejections_drop),
        )
    if drop is None and keys is None and change.rejections_add is None:
        return None
    rows = change.rejections_add
    assert not isinstance(rows, pa.Table)
    return store.rewrite(
        REJECTED_EVENTS,
        partitions=sorted(batches),
        drop=drop,
        drop_keys=keys,
        add=lambda: rows if rows is not None else empty_frame(spark(), REJECTED_EVENTS.schema),
        commit_metadata=tags,
        read_version=read_version,
    )


def _commit_events(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    change: EventsChange,
    *,
    tags: dict[str, str],
    read_version: int | None,
) -> CommitInfo:
    rows = change.events_add
    if change.on_driver is not None:
        assert isinstance(rows, pa.Table)
        return store.rewrite_arrow(
            EVENTS,
            add=rows,
            drop=_keys_table(change.events_drop, id_column="event_id"),
            files=change.on_driver.events,
            commit_metadata=tags,
            read_version=read_version,
        )
    assert isinstance(rows, DataFrame)
    if change.replaced is not None:
        return store.replace_partitions(
            EVENTS,
            rows,
            partitions=change.replaced,
            commit_metadata=tags,
            read_version=read_version,
        )
    drop = change.events_drop
    keys = None
    if drop:
        keys = keys_for_join(keys_frame(spark(), drop), rows=len(drop))
    return store.rewrite(
        EVENTS,
        partitions=sorted({d for d, _, _ in drop}),
        drop_keys=keys,
        add=lambda: rows,
        commit_metadata=tags,
        read_version=read_version,
    )


def _keys_table(copies: list[Copy], *, id_column: str) -> pa.Table:
    """These copies' COPY_KEY as Arrow rows, the id named `id_column` (what `rewrite_arrow`
    drops the rows equal to)."""
    return pa.table(
        {
            "event_date": pa.array([d for d, _, _ in copies], pa.date32()),
            id_column: pa.array([i for _, i, _ in copies], pa.string()),
            "received_date": pa.array([r for _, _, r in copies], pa.date32()),
        }
    )
