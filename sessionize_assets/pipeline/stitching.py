"""`user_identities` -> `sessions.stitched_user_id` on every date (SPEC §3c).

A sessions run builds the sessions it recomputes with the identities as they are
(`transforms.identities.stitch`). The sessions it does not recompute carry the mapping of an
earlier run: when a sign-in maps an anonymous id for the first time, or to another user,
that id's sessions on every date are relabelled here, before the sessions are brought up to
date, and nothing else is touched:
- the ids whose mapping changed are read from the `user_identities` files added and removed
  since the identities version the sessions last applied (a Delta transaction id,
  `IDENTITIES_APPLIED`, on the sessions commit that applied it);
- their sessions are found, on any date, in the files whose `user_id` statistics can hold
  one (files are user ranges within a date, as for late events), read on the driver;
- the rows whose `stitched_user_id` differs are rewritten in one commit, which records the
  identities version applied. No Spark job.
A relabel changes no session's boundaries: the corrections log records none (it marks the
commit as logged), and the lifecycle is not corrected for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_IDENTITIES
from sessionize_assets.pipeline.corrections import mark_logged
from sessionize_assets.pipeline.identities import changed_rows

IDENTITIES_APPLIED = "sessionize.sessions.identities_version"
# Commit metadata of a relabel's two commits (sessions, and the corrections log's mark): driver
# writes, committed by delta-rs on either backend.
RELABEL_COMMIT = {"sessionize_step": "relabel stitched_user_id"}


@dataclass(kw_only=True)
class RelabelReport:
    identities_version: int | None = None  # the identities version the sessions now carry
    ids_changed: int = 0  # anonymous ids whose mapping changed since the last applied one
    files_searched: int = 0  # sessions files that could hold their sessions
    rows_relabelled: int = 0
    files_rewritten: int = 0
    by_date: dict[date, int] = field(default_factory=dict)  # rows relabelled per session date


def relabel_sessions(store: DeltaStore, *, tags: Mapping[str, str]) -> RelabelReport:
    """Give every session of an anonymous id whose mapping changed its new stitched id."""
    report = RelabelReport()
    version = store.version(USER_IDENTITIES)
    applied = store.applied_version(SESSIONS, IDENTITIES_APPLIED)
    report.identities_version = applied
    if version is None or (applied is not None and applied >= version):
        return report
    if not store.exists(SESSIONS):
        return report  # the first sessions run stitches what it builds; nothing to relabel
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
    held = store.read_files_arrow(SESSIONS, files, columns=SESSIONS.schema.fieldNames())
    held = held.filter(pc.is_in(held["user_id"], pa.array(ids, pa.string())))
    stitched = pa.array(
        [mapping[user] or user for user in held["user_id"].to_pylist()], pa.string()
    )
    differs = pc.invert(pc.fill_null(pc.equal(held["stitched_user_id"], stitched), False))
    old = held.filter(differs)
    new = old.set_column(
        old.schema.get_field_index("stitched_user_id"), "stitched_user_id", stitched.filter(differs)
    )
    commit = store.rewrite_arrow(
        SESSIONS,
        add=new,
        drop=old.select(["session_date", "session_id"]),  # a session's row (no null column)
        files=files,
        commit_metadata={**tags, **RELABEL_COMMIT},
        app_transaction=AppTransaction(app_id=IDENTITIES_APPLIED, version=version),
        read_version=store.read_version(SESSIONS),
    )
    if commit.version is not None:
        mark_logged(store, sessions_version=commit.version, tags={**tags, **RELABEL_COMMIT})
    report.identities_version = version
    report.rows_relabelled = old.num_rows
    report.files_rewritten = commit.files_removed
    counts = pc.value_counts(old["session_date"]).to_pylist() if old.num_rows else []
    report.by_date = {item["values"]: item["counts"] for item in counts}
    return report


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
