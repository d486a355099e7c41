"""events -> `user_identities` (SPEC §3c), absorbing only the events that changed.

The table records, as a Delta transaction id (`ABSORBED`) in the commit that writes it, the
`events` version it has absorbed. A run reads the `events` files added and removed since
then (from the Delta log) and keeps their identifying events (both ids set):
- rows in a removed file and in an added one are the same event, rewritten: nothing changed;
- an event only added merges into its id's row exactly: the row keeps its first and latest
  identifying events, so an earlier one moves `identified_at` and a later one `user_id`;
- an event only removed matters when it was one of those two: that id is recomputed from
  every event it has (one Spark job, for the rare event that a duplicate's winner displaced).
All of this is read and merged on the driver (the changed files and the rows of the changed
ids): a batch adds no Spark job. A first run, one whose `events` history is gone, or one
whose change is larger than `MERGE_ON_DRIVER_BYTES` (a backlog's range run, a rebuild) builds
the table from every event with Spark, which spills where the driver would not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import AppTransaction, DeltaStore, FileChange, TableSpec
from sessionize_assets.lake.tables import EVENTS, USER_IDENTITIES
from sessionize_assets.transforms.identities import (
    IDENTITY_EVENT_COLUMNS,
    identities_from_events,
)

ABSORBED = "sessionize.user_identities.events_version"
_KEY = "anonymous_id"
# The merge on the driver holds the identity columns of the changed `events` files, about 2.3
# bytes of driver memory per byte of their Parquet (+245 MB for the 106 MB of a mid-size
# events range run over 39 days, 530,000 events). Above this many bytes of changed files the
# table is built again with Spark instead: 256 MiB is about 1.3 M events, ten times a
# full-size daily batch's, with a driver peak near 600 MB.
MERGE_ON_DRIVER_BYTES = 256 << 20


@dataclass(kw_only=True)
class IdentitiesReport:
    """What a run did to `user_identities`."""

    events_version: int | None = None  # the events version the table has absorbed now
    updated: bool = False  # this run absorbed events (False: it was up to date)
    # built from every event (a first run, the history was gone, or too large a change)
    rebuilt: bool = False
    events_read: int = 0  # identifying events read from the changed `events` files
    ids_new: int = 0  # anonymous ids mapped for the first time
    ids_remapped: int = 0  # mapped to another user than before
    ids_unmapped: int = 0  # no longer identified (their identifying events were displaced)
    ids_recomputed: int = 0  # recomputed from all their events (a first or latest one removed)
    identities_version: int | None = None

    @property
    def ids_changed(self) -> int:
        return self.ids_new + self.ids_remapped + self.ids_unmapped


def update_identities(
    store: DeltaStore, *, run_id: str, merge_on_driver_bytes: int = MERGE_ON_DRIVER_BYTES
) -> IdentitiesReport:
    """Bring `user_identities` up to date with `events`; a no-op (no Spark job, nothing
    committed) when it has absorbed the current version. A change of more than
    `merge_on_driver_bytes` of `events` files is absorbed by building the table again."""
    report = IdentitiesReport()
    events_version = store.version(EVENTS)
    if events_version is None:
        return report
    absorbed = store.applied_version(USER_IDENTITIES, ABSORBED)
    report.events_version = events_version
    if absorbed is not None and absorbed >= events_version:
        report.events_version = absorbed
        report.identities_version = store.version(USER_IDENTITIES)
        return report
    read_version = store.read_version(USER_IDENTITIES)
    write = {
        "commit_metadata": {"dagster_run_id": run_id, "table": USER_IDENTITIES.name},
        "app_transaction": AppTransaction(app_id=ABSORBED, version=events_version),
        "read_version": read_version,
    }
    changes = (
        None
        if absorbed is None
        else store.changes(EVENTS, since_version=absorbed, through_version=events_version)
    )
    if changes is None or _changed_bytes(changes) > merge_on_driver_bytes:
        _rebuild(store, report, write)
    else:
        _merge(store, report, write, changes)
    report.updated = True
    report.identities_version = store.version(USER_IDENTITIES)
    return report


def _rebuild(store: DeltaStore, report: IdentitiesReport, write: dict) -> None:
    """Every row from every event, in one write; old rows, if any, compared in one job."""
    new = identities_from_events(store.read(EVENTS).select(*IDENTITY_EVENT_COLUMNS)).persist()
    try:
        old = store.read(USER_IDENTITIES) if store.exists(USER_IDENTITIES) else None
        if old is not None:
            joined = old.select(_KEY, F.col("user_id").alias("_old")).join(
                new.select(_KEY, F.col("user_id").alias("_new")), on=_KEY, how="full_outer"
            )
            figures = joined.agg(
                F.count(F.when(F.col("_old").isNull(), 1)).alias("new"),
                F.count(F.when(F.col("_new").isNull(), 1)).alias("unmapped"),
                F.count(F.when(F.col("_old") != F.col("_new"), 1)).alias("remapped"),
            ).first()
            assert figures is not None  # an aggregate has one row
            report.ids_new, report.ids_unmapped = figures["new"], figures["unmapped"]
            report.ids_remapped = figures["remapped"]
        commit = store.rewrite(USER_IDENTITIES, drop=F.lit(True), add=lambda: new, **write)
        if old is None:  # every row is new
            report.ids_new = commit.rows_written
    finally:
        new.unpersist()
    report.rebuilt = True


def _merge(
    store: DeltaStore,
    report: IdentitiesReport,
    write: dict,
    changes: Sequence[FileChange],
) -> None:
    identifying = changed_rows(
        store, EVENTS, changes, columns=IDENTITY_EVENT_COLUMNS, where=_identifying
    )
    report.events_read = identifying.read
    fresh, gone = identifying.added, identifying.removed
    ids = sorted(set(pc.unique(fresh[_KEY]).to_pylist()) | set(pc.unique(gone[_KEY]).to_pylist()))
    stored, files = stored_identities(store, ids)
    old = {row[_KEY]: row for row in stored.to_pylist()}
    recompute = sorted(
        {
            row[_KEY]
            for row in gone.to_pylist()
            if row[_KEY] in old and _order(row) in _ends(old[row[_KEY]])
        }
    )
    report.ids_recomputed = len(recompute)
    rows = dict(old)
    for event in sorted(_first_and_latest(fresh).to_pylist(), key=_order):
        if event[_KEY] not in recompute:
            rows[event[_KEY]] = _absorb(rows.get(event[_KEY]), event)
    if recompute:
        rows = {key: row for key, row in rows.items() if key not in recompute}
        events = store.read(EVENTS).select(*IDENTITY_EVENT_COLUMNS)
        rebuilt = identities_from_events(events.where(F.col(_KEY).isin(recompute))).toArrow()
        rows.update({row[_KEY]: row for row in rebuilt.to_pylist()})
    changed = sorted(key for key in ids if rows.get(key) != old.get(key))
    report.ids_new = sum(1 for key in changed if key not in old)
    report.ids_unmapped = sum(1 for key in changed if key not in rows)
    report.ids_remapped = sum(
        1
        for key in changed
        if key in old and key in rows and rows[key]["user_id"] != old[key]["user_id"]
    )
    schema = to_arrow_schema(USER_IDENTITIES.schema)
    store.rewrite_arrow(
        USER_IDENTITIES,
        add=pa.Table.from_pylist([rows[key] for key in changed if key in rows], schema=schema),
        drop=pa.table({_KEY: pa.array(changed, pa.string())}),
        files=files,
        **write,
    )


@dataclass(frozen=True, kw_only=True)
class ChangedRows:
    """What commits changed in a table, row by row."""

    added: pa.Table  # rows of the files they added that no file they removed held
    removed: pa.Table  # rows of the files they removed that no file they added holds
    read: int  # rows read on both sides


def changed_rows(
    store: DeltaStore,
    spec: TableSpec,
    changes: Iterable[FileChange],
    *,
    columns: Sequence[str],
    where: Callable[[pa.Table], pa.ChunkedArray] | None = None,
) -> ChangedRows:
    """`columns` of the rows `changes` added and removed (those `where` keeps), read on the
    driver. A file's rewrite keeps most of its rows: they are on both sides, and cancel."""
    added, removed = net_files(changes)
    sides = []
    for paths in (added, removed):
        rows = store.read_files_arrow(spec, paths, columns=columns)
        sides.append(rows if where is None else rows.filter(where(rows)))
    arriving, leaving = sides
    keys = list(columns)
    return ChangedRows(
        added=arriving.join(leaving, keys=keys, join_type="left anti"),
        removed=leaving.join(arriving, keys=keys, join_type="left anti"),
        read=arriving.num_rows + leaving.num_rows,
    )


def _changed_bytes(changes: Sequence[FileChange]) -> int:
    """The bytes of the files `changes` added and removed, net (`net_files`); a removed file
    the log gives no size for counts nothing (its rows are mostly in an added one)."""
    sizes = {change.path: change.size or 0 for change in changes}
    added, removed = net_files(changes)
    return sum(sizes[path] for path in (*added, *removed))


def net_files(changes: Iterable[FileChange]) -> tuple[list[str], list[str]]:
    """The files live at the end of `changes` but not before (added), and those live before
    but not at the end (removed); a file both added and removed within them is neither."""
    first: dict[str, bool] = {}
    last: dict[str, bool] = {}
    for change in changes:
        first.setdefault(change.path, change.added)
        last[change.path] = change.added
    added = sorted(path for path, now in last.items() if now and first[path])
    removed = sorted(path for path, now in last.items() if not now and not first[path])
    return added, removed


def stored_identities(store: DeltaStore, ids: Sequence[str]) -> tuple[pa.Table, list[str]]:
    """The rows of these anonymous ids, and the files searched for them (those whose log
    statistics can hold one): read on the driver."""
    if not ids or not store.exists(USER_IDENTITIES):
        return pa.Table.from_pylist([], schema=to_arrow_schema(USER_IDENTITIES.schema)), []
    wanted = sorted(set(ids))
    partitions = store.row_counts(USER_IDENTITIES)
    files = store.files_with_values(
        USER_IDENTITIES, column=_KEY, values=dict.fromkeys(partitions, wanted)
    )
    rows = store.read_files_arrow(
        USER_IDENTITIES, files, columns=USER_IDENTITIES.schema.fieldNames()
    )
    return rows.filter(pc.is_in(rows[_KEY], pa.array(wanted, pa.string()))), files


def _first_and_latest(events: pa.Table) -> pa.Table:
    """Each anonymous id's first and latest identifying events of `events`, by (`event_ts`,
    `event_id`): all that `_absorb` keeps of them. A large range run's changed files hold
    millions of identifying events, which as Python rows held hundreds of bytes each on the
    driver (the full size's 10.9 GB peak); their ids number thousands."""
    if events.num_rows == 0:
        return events
    ordered = events.sort_by(
        [(_KEY, "ascending"), ("event_ts", "ascending"), ("event_id", "ascending")]
    )
    keys = ordered[_KEY].combine_chunks()
    differs = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
    first = pa.concat_arrays([pa.array([True]), differs])
    latest = pa.concat_arrays([differs, pa.array([True])])
    return ordered.filter(pc.or_(first, latest))


def _identifying(events: pa.Table) -> pa.ChunkedArray:
    """Which events identify an anonymous id: both ids set."""
    return pc.and_(pc.is_valid(events[_KEY]), pc.is_valid(events["segment_user_id"]))


def _order(event: dict) -> tuple[datetime, str]:
    return event["event_ts"], event["event_id"]


def _ends(row: dict) -> tuple[tuple[datetime, str], tuple[datetime, str]]:
    return (row["identified_at"], row["first_event_id"]), (row["latest_at"], row["latest_event_id"])


def _absorb(row: dict | None, event: dict) -> dict:
    """`row` (None: the id's first identifying event) with one more identifying event."""
    at = _order(event)
    if row is None:
        return {
            _KEY: event[_KEY],
            "user_id": event["segment_user_id"],
            "identified_at": event["event_ts"],
            "identified_date": event["event_ts"].date(),
            "first_event_id": event["event_id"],
            "latest_at": event["event_ts"],
            "latest_event_id": event["event_id"],
        }
    first, latest = _ends(row)
    row = dict(row)
    if at < first:
        row.update(
            identified_at=event["event_ts"],
            identified_date=event["event_ts"].date(),
            first_event_id=event["event_id"],
        )
    if at > latest:
        row.update(
            user_id=event["segment_user_id"],
            latest_at=event["event_ts"],
            latest_event_id=event["event_id"],
        )
    return row
