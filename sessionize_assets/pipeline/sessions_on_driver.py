"""A small sessions run committed on the driver, with Arrow: no Spark job.

A daily batch's sessions run recomputes a few hundred (user, date) pairs. When the driver
built their sessions (`transforms/sessions_rows.py`), the rest of the run is done there too:
the scope's old rows read from the files that can hold them, the label stitching gives, the
diff against the old rows and its summary, the sessions rewrite, the corrections log and the
quarantine. On Spark these were one job of about a dozen stages, and the planning of the
frames it kept: about 4 s of the mid size's daily sessions step, 0.5-1 s of a small one's.

What is committed is what Spark's path commits, row for row:
`corrections.diff_session_rows` is held to `diff_sessions` by a property test, and the
end-to-end tests run both paths (`sessionize_tests/conftest.py`'s "join" placement sends every
run to Spark).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from sessionize_assets.lake.parquet_files import FILE_COLUMN
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import SESSION_QUARANTINE, SESSIONS, USER_IDENTITIES
from sessionize_assets.pipeline.corrections import diff_session_rows, log_commit
from sessionize_assets.pipeline.keyed_reads import pair_keys, pair_texts
from sessionize_assets.pipeline.sessions_diff import (
    EventsRead,
    SessionsCommitted,
    SessionsScope,
    pairs_table,
    summarise_rows,
)
from sessionize_assets.pipeline.stitching import Relabel, commit_relabel, relabelled_rows
from sessionize_assets.transforms.identities import stitch_rows
from sessionize_assets.transforms.sessions_rows import split_quarantine_rows


def fits_on_driver(
    store: DeltaStore, built: pa.Table, *, files: Sequence[str], relabel: Relabel
) -> bool:
    """Whether a run that built `built` on the driver commits there: the files that can hold
    its old rows (`files`, and the relabelled ones) and the rows fit `driver_write_bytes`, on
    the embedded backend (the delta-spark backend writes `sessions` with Delta Spark)."""
    return store.rewrites_on_driver(SESSIONS, built, files=[*files, *relabel.files])


def commit_on_driver(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    *,
    built: pa.Table,
    events: EventsRead,
    scope: SessionsScope,
    files: Sequence[str],
    relabel: Relabel,
    tags: dict[str, str],
    read_versions: tuple[int, int],
    run_id: str,
) -> SessionsCommitted:
    """Commit the sessions `built` (`sessions_with_quarantine_rows` of the scope's events) as
    `pipeline/sessions.py`'s Spark path does: the pairs whose rows differ from their old rows
    in `files` (with the relabelled pairs), their corrections, and the scope's quarantine.

    `scope.listed` must hold the touched pairs. `read_versions` are those of `sessions` and
    `session_quarantine` the run read, for the commits' conflict checks; `spark` only logs
    the versions a killed run left unlogged (`corrections.log_commit`)."""
    sessions_read, quarantine_read = read_versions
    built = built.filter(scope.mask(built))
    sessions, quarantine = split_quarantine_rows(stitch_rows(built, _identities(store, built)))
    old = store.read_files_arrow(
        SESSIONS, files, columns=SESSIONS.schema.fieldNames(), with_file=True
    )
    old = old.filter(scope.mask(old))
    diff = diff_session_rows(old, sessions)
    summary = summarise_rows(diff, events=events, flagged=quarantine.num_rows)
    changed_dates = sorted(summary.changes)
    files_total = len(store.live_files(SESSIONS, partitions=changed_dates))
    if changed_dates:
        changed = set(summary.changed_pairs or ())
        keys = pa.array(pair_texts(sorted(changed)), pa.string())
        new_rows = sessions.filter(_pairs_in(sessions, keys))
        extra = relabelled_rows(relabel, recomputed=changed)
        add = (
            new_rows if extra is None else pa.concat_tables([new_rows, extra.cast(new_rows.schema)])
        )
        # The files holding an old row of a changed pair, and the relabelled ones.
        held = old.filter(_pairs_in(old, keys))
        searched = sorted({*held[FILE_COLUMN].to_pylist(), *relabel.files})
        done = store.rewrite_arrow(
            SESSIONS,
            add=add,
            drop=pairs_table({*changed, *relabel.pairs}),
            files=searched,
            commit_metadata=tags,
            app_transaction=relabel.transaction,
            read_version=sessions_read,
        )
        log_commit(store, spark, diff, sessions_version=done.version or 0, run_id=run_id, tags=tags)
        committed = SessionsCommitted(
            summary=summary,
            files_total=files_total,
            rows_written=done.rows_written,
            files_rewritten=done.files_removed,
            files_searched=len(searched),
        )
    else:
        commit_relabel(store, relabel, tags=tags, read_version=sessions_read)
        committed = SessionsCommitted(summary=summary, files_total=files_total)
    _commit_quarantine(store, scope, quarantine, tags=tags, read_version=quarantine_read)
    return committed


def _identities(store: DeltaStore, sessions: pa.Table) -> pa.Table | None:
    """The (anonymous_id, user_id) rows of the sessions' user keys."""
    if not store.exists(USER_IDENTITIES):
        return None
    users = pc.unique(sessions["user_id"])
    return store.read_arrow(
        USER_IDENTITIES,
        columns=["anonymous_id", "user_id"],
        where=pc.field("anonymous_id").isin(users),
    )


def _commit_quarantine(
    store: DeltaStore,
    scope: SessionsScope,
    quarantine: pa.Table,
    *,
    tags: dict[str, str],
    read_version: int,
) -> None:
    """Replace the scope's quarantined sessions with `quarantine`: the old rows of its pairs
    are found in the files that can hold them (bots are rare: usually none)."""
    files = store.files_with_values(
        SESSION_QUARANTINE, column="user_id", values=scope.listed or {}, whole=scope.whole
    )
    held = store.read_files_arrow(
        SESSION_QUARANTINE, files, columns=["session_date", "user_id"], with_file=True
    )
    held = held.filter(scope.mask(held))
    if not held.num_rows and not quarantine.num_rows:
        return
    pairs = zip(held["session_date"].to_pylist(), held["user_id"].to_pylist(), strict=True)
    store.rewrite_arrow(
        SESSION_QUARANTINE,
        add=quarantine,
        drop=pairs_table(set(pairs)),
        files=sorted(set(held[FILE_COLUMN].to_pylist())),
        commit_metadata=tags,
        read_version=read_version,
    )


def _pairs_in(rows: pa.Table, keys: pa.Array) -> pa.ChunkedArray:
    return pc.is_in(pair_keys(rows, partition="session_date", key="user_id"), value_set=keys)
