"""`user_identities` -> `sessions.stitched_user_id` on every date (SPEC §3c).

A sessions run builds the sessions it recomputes with the identities as they are
(`transforms.identities.stitch`). The sessions it does not recompute carry the mapping of an
earlier run: when a sign-in maps an anonymous id for the first time, or to another user,
that id's sessions on every date are relabelled, and nothing else is touched:
- the ids whose mapping changed are read from the `user_identities` files added and removed
  since the identities version the sessions last applied (a Delta transaction id,
  `IDENTITIES_APPLIED`, on the sessions commit that applied it);
- their sessions are found, on any date, in the files whose `user_id` statistics can hold
  one (files are user ranges within a date, as for late events), read on the driver;
- the (user, date) pairs holding a session whose `stitched_user_id` differs are rewritten
  with their rows relabelled, in the same commit as the run's recomputed sessions (one
  MERGE on the delta-spark backend, with the transaction id): no Spark job of their own, and
  no commit of another engine between Delta Spark's (which would cost Delta a rebuild of
  the table's state). A run that commits no recomputed sessions commits them alone, on the
  driver (`commit_relabel`).
A relabel changes no session's boundaries: the corrections log records none of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from sessionize_assets.lake.parquet_files import FILE_COLUMN
from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_IDENTITIES
from sessionize_assets.pipeline.corrections import mark_logged
from sessionize_assets.pipeline.identities import changed_rows
from sessionize_assets.pipeline.keyed_reads import pair_keys, pair_texts

IDENTITIES_APPLIED = "sessionize.sessions.identities_version"
# Commit metadata of a relabel committed alone (sessions, and the corrections log's mark): a
# driver write, committed by delta-rs on either backend.
RELABEL_COMMIT = {"sessionize_step": "relabel stitched_user_id"}


@dataclass(kw_only=True)
class RelabelReport:
    identities_version: int | None = None  # the identities version the sessions now carry
    ids_changed: int = 0  # anonymous ids whose mapping changed since the last applied one
    files_searched: int = 0  # sessions files that could hold their sessions
    rows_relabelled: int = 0  # sessions whose stitched_user_id the run changes
    files_rewritten: int = 0  # files holding them, which the run's commit rewrites
    by_date: dict[date, int] = field(default_factory=dict)  # rows relabelled per session date


@dataclass(kw_only=True)
class Relabel:
    """What a sessions run must change in the sessions it does not recompute.

    `rows` are every session of the (session_date, user_id) `pairs` that hold a stale label,
    relabelled: the commit drops those pairs' rows from `files` and adds `rows` (but for the
    pairs it recomputes). `transaction` records the identities version applied, None when the
    sessions carry it already."""

    report: RelabelReport
    transaction: AppTransaction | None = None
    rows: pa.Table | None = None
    pairs: list[tuple[date, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def dates(self) -> list[date]:
        return sorted({day for day, _ in self.pairs})


def plan_relabel(store: DeltaStore) -> Relabel:
    """The sessions to relabel for the identities as they are, read on the driver; nothing is
    written. A first sessions run (no table yet) stitches all it builds: only the version."""
    report = RelabelReport()
    version = store.version(USER_IDENTITIES)
    applied = store.applied_version(SESSIONS, IDENTITIES_APPLIED)
    report.identities_version = applied
    if version is None or (applied is not None and applied >= version):
        return Relabel(report=report)
    report.identities_version = version
    transaction = AppTransaction(app_id=IDENTITIES_APPLIED, version=version)
    if not store.exists(SESSIONS):
        return Relabel(report=report, transaction=transaction)
    mapping = _changed_mapping(store, since=applied, through=version)
    report.ids_changed = len(mapping)
    ids = sorted(mapping)
    dates = store.row_counts(SESSIONS)
    files = (
        store.files_with_values(SESSIONS, column="user_id", values=dict.fromkeys(dates, ids))
        if ids
        else []
    )
    report.files_searched = len(files)
    held = store.read_files_arrow(
        SESSIONS, files, columns=SESSIONS.schema.fieldNames(), with_file=True
    )
    held = held.filter(pc.is_in(held["user_id"], pa.array(ids, pa.string())))
    stitched = pa.array(
        [mapping[user] or user for user in held["user_id"].to_pylist()], pa.string()
    )
    differs = pc.invert(pc.fill_null(pc.equal(held["stitched_user_id"], stitched), False))
    stale = held.filter(differs)
    days, users = stale["session_date"].to_pylist(), stale["user_id"].to_pylist()
    pairs = sorted(set(zip(days, users, strict=True)))
    in_pairs = pc.is_in(
        pair_keys(held, partition="session_date", key="user_id"),
        pa.array(pair_texts(pairs), pa.string()),
    )
    rows = held.set_column(
        held.schema.get_field_index("stitched_user_id"), "stitched_user_id", stitched
    ).filter(in_pairs)
    report.rows_relabelled = stale.num_rows
    report.files_rewritten = len(set(stale[FILE_COLUMN].to_pylist()))
    counts = pc.value_counts(stale["session_date"]).to_pylist() if stale.num_rows else []
    report.by_date = {item["values"]: item["counts"] for item in counts}
    return Relabel(
        report=report,
        transaction=transaction,
        rows=rows.drop_columns([FILE_COLUMN]),
        pairs=pairs,
        files=sorted(set(rows[FILE_COLUMN].to_pylist())),
    )


def relabelled_rows(relabel: Relabel, *, recomputed: set[tuple[date, str]]) -> pa.Table | None:
    """The relabelled rows of the pairs outside `recomputed` (whose new rows carry the new
    label already); None when there are none."""
    if relabel.rows is None or not relabel.rows.num_rows:
        return None
    keys = pa.array(pair_texts(sorted(recomputed)), pa.string())
    rows = relabel.rows.filter(
        pc.invert(pc.is_in(pair_keys(relabel.rows, partition="session_date", key="user_id"), keys))
    )
    return rows if rows.num_rows else None


def commit_relabel(
    store: DeltaStore, relabel: Relabel, *, tags: Mapping[str, str], read_version: int | None
) -> None:
    """Commit `relabel` alone (a run that commits no recomputed sessions), on the driver, and
    mark the commit as logged: it changes no session."""
    if relabel.transaction is None:
        return
    rows = relabel.rows
    commit = store.rewrite_arrow(
        SESSIONS,
        add=rows,
        drop=None if rows is None else rows.select(["session_date", "session_id"]),
        files=relabel.files,
        commit_metadata={**tags, **RELABEL_COMMIT},
        app_transaction=relabel.transaction,
        read_version=read_version,
    )
    if commit.version is not None:
        mark_logged(store, sessions_version=commit.version, tags={**tags, **RELABEL_COMMIT})


def _changed_mapping(
    store: DeltaStore, *, since: int | None, through: int
) -> dict[str, str | None]:
    """The anonymous ids whose (anonymous_id, user_id) changed after `since` through
    `through`, with their user now (None: no longer mapped).

    With no applied version, or its history gone, every id that is mapped now or that a
    session carries a stitched id for is taken (one Spark job over `sessions`).
    """
    columns = ["anonymous_id", "user_id"]
    changes = (
        None
        if since is None
        else store.changes(USER_IDENTITIES, since_version=since, through_version=through)
    )
    if changes is None:
        now = store.read_arrow(USER_IDENTITIES, columns=columns)
        labelled = (
            store.read(SESSIONS)
            .where(F.col("stitched_user_id") != F.col("user_id"))
            .select("user_id")
            .distinct()
            .toArrow()
        )
        mapping: dict[str, str | None] = dict.fromkeys(labelled["user_id"].to_pylist())
        mapping.update(zip(*(now[c].to_pylist() for c in columns), strict=True))
        return mapping
    changed = changed_rows(store, USER_IDENTITIES, changes, columns=columns)
    mapping = dict.fromkeys(changed.removed["anonymous_id"].to_pylist())
    mapping.update(zip(*(changed.added[c].to_pylist() for c in columns), strict=True))
    return mapping
