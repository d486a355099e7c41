"""The corrections log (`session_changes`): what each sessions commit removed and added.

`sessions` and `session_changes` are two tables, so their commits cannot be one. The log
commit carries a Delta transaction id, `SESSIONS_LOGGED`, set to the sessions version it
logs: the log's own table says which sessions versions it holds. A run that died between the
two commits leaves a sessions version above that, and the next sessions run logs it first,
from the Delta log of `sessions` (the rows the commit removed against the rows it added:
versions against versions). Comparing rows could not find that change again, since the
sessions table already holds it.

The log records sessions: what identity stitching relabels (`stitched_user_id`, see
pipeline/stitching.py) is not a change of a session. Rows are compared without that column,
so relabelled rows that ride on a sessions commit leave no entry, and a relabel committed
alone is only marked as logged (`mark_logged`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from sessionize_assets.lake.store import AppTransaction, CommitInfo, DeltaStore, LakeError
from sessionize_assets.lake.tables import SESSION_CHANGES, SESSION_PICKS, SESSIONS
from sessionize_assets.pipeline.versions import signed_rows
from sessionize_assets.sql_text import sql_identifier, sql_string, sql_struct
from sessionize_assets.transforms.row_sets import rows_less

SESSIONS_LOGGED = "sessionize.session_changes.sessions_version"
_CONTENT = ("session_id", "user_id", "session_date", "session_start", "session_end", "event_count")
# What a session is, for the log: every column but the label stitching gives it and where its
# attributes were picked from.
_LOGGED_COLUMNS = tuple(
    name
    for name in SESSIONS.schema.fieldNames()
    if name != "stitched_user_id" and name not in SESSION_PICKS
)
# The rows of `diff_session_rows`: the logged columns, and the change.
DIFF_ROWS_SCHEMA = to_arrow_schema(
    StructType(
        [*(SESSIONS.schema[name] for name in _LOGGED_COLUMNS), StructField("change", StringType())]
    )
)


def diff_sessions(
    old: DataFrame, new: DataFrame, *, columns: Sequence[str] = _LOGGED_COLUMNS
) -> DataFrame:
    """Old rows that are gone or changed (`removed`), new rows that are new or changed.

    Rows are matched by session_id (unique: a hash of the user and the session's start) in
    one join, and a pair that differs in any column yields both sides. An old session_id held
    twice (writers that raced without a conflict check) differs too: rewriting its pair leaves
    one row. Only `columns` are compared and returned: by default a session's, not the
    label stitching gives it.

    The expressions are SQL text over the column names (constants of the schema, quoted), a
    few JVM calls in all: built column by column, the logged columns of `sessions` cost some
    2,000 calls, half a second of driver time on every sessions run.
    """
    row = sql_struct(columns)
    held = old.groupBy("session_id").agg(
        F.expr(f"min({row})").alias("_old"), F.count(F.lit(1)).alias("_copies")
    )
    added = new.select("session_id", F.expr(row).alias("_new"))
    joined = held.join(added, on="session_id", how="full_outer")
    differs = joined.where(
        ~F.col("_old").eqNullSafe(F.col("_new")) | (F.coalesce(F.col("_copies"), F.lit(1)) > 1)
    )

    def entry(name: str, change: str) -> str:
        fields = ", ".join(f"{name}.{sql_identifier(c)} AS {sql_identifier(c)}" for c in columns)
        tagged = f"struct({fields}, {sql_string(change)} AS change)"
        return f"CASE WHEN {name} IS NOT NULL THEN {tagged} END"

    entries = f"array({entry('_old', 'removed')}, {entry('_new', 'added')})"
    return differs.selectExpr(f"inline(filter({entries}, e -> e IS NOT NULL))")


def diff_session_rows(old: pa.Table, new: pa.Table) -> pa.Table:
    """`diff_sessions` of rows on the driver: the same rows, in `DIFF_ROWS_SCHEMA`.

    A session_id held once on each side is compared whole, as a multiset difference of the
    two sides' rows (session_id is part of the row, so a row left over differs from the other
    side's row of its id, or has none). A session_id held twice in `old` yields its least copy
    in Spark's order of the row (nulls first) as removed, and its new row as added.
    """
    logged = pa.schema(list(DIFF_ROWS_SCHEMA)[:-1])
    old, new = old.select(_LOGGED_COLUMNS).cast(logged), new.select(_LOGGED_COLUMNS).cast(logged)
    counts = old.group_by("session_id").aggregate([("session_id", "count")])
    twice = counts.filter(pc.greater(counts["session_id_count"], 1))["session_id"]
    held_twice, new_twice = pc.is_in(old["session_id"], twice), pc.is_in(new["session_id"], twice)
    old_once, new_once = old.filter(pc.invert(held_twice)), new.filter(pc.invert(new_twice))
    least: dict[str, dict[str, Any]] = {}
    for row in old.filter(held_twice).to_pylist():
        held = least.get(row["session_id"])
        if held is None or _spark_order(row) < _spark_order(held):
            least[row["session_id"]] = row
    removed = pa.concat_tables(
        [
            rows_less(old_once, new_once),
            pa.Table.from_pylist(sorted(least.values(), key=_spark_order), schema=old.schema),
        ]
    )
    added = pa.concat_tables([rows_less(new_once, old_once), new.filter(new_twice)])
    return pa.concat_tables([_tagged(removed, "removed"), _tagged(added, "added")])


def _spark_order(row: Mapping[str, Any]) -> tuple[tuple[bool, Any], ...]:
    """A row's place in Spark's ascending order of a struct: field by field, nulls first."""
    return tuple((row[name] is not None, row[name]) for name in _LOGGED_COLUMNS)


def _tagged(rows: pa.Table, change: str) -> pa.Table:
    return rows.append_column(
        DIFF_ROWS_SCHEMA.field("change"), pa.repeat(pa.scalar(change, pa.string()), rows.num_rows)
    )


def _change_rows_arrow(diff: pa.Table, *, commit_version: int, run_id: str) -> pa.Table:
    """`_change_rows` of a diff made on the driver."""
    n = diff.num_rows
    now = datetime.now(UTC)
    schema = to_arrow_schema(SESSION_CHANGES.schema)
    columns = {
        "change": diff["change"],
        **{name: diff[name] for name in _CONTENT},
        "commit_version": pa.repeat(pa.scalar(commit_version, pa.int64()), n),
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n),
        "changed_at": pa.repeat(pa.scalar(now, schema.field("changed_at").type), n),
    }
    return pa.table([columns[name] for name in schema.names], schema=schema)


def _change_rows(diff: DataFrame, *, commit_version: int, run_id: str) -> DataFrame:
    """`session_changes` rows of a diff, for the sessions commit `commit_version`."""
    now = datetime.now(UTC).replace(tzinfo=None)
    return diff.select(
        "change",
        *_CONTENT,
        F.lit(commit_version).cast("long").alias("commit_version"),
        F.lit(run_id).alias("run_id"),
        F.lit(now).cast("timestamp").alias("changed_at"),
    )


def log_commit(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    diff: DataFrame | pa.Table,
    *,
    sessions_version: int,
    run_id: str,
    tags: Mapping[str, str],
) -> None:
    """Log the sessions commit `sessions_version`, whose rows changed by `diff` (a diff made
    on the driver is written there too).

    The log holds versions in order: when it does not hold the one before (another run
    committed in between and has not logged yet), every unlogged version is logged from the
    Delta log instead, this one included.
    """
    read = store.read_version(SESSION_CHANGES)
    if _logged_through(store) == sessions_version - 1:
        rows = (
            _change_rows_arrow(diff, commit_version=sessions_version, run_id=run_id)
            if isinstance(diff, pa.Table)
            else _change_rows(diff, commit_version=sessions_version, run_id=run_id)
        )
        _log_changes(
            store, rows, sessions_version=sessions_version, commit_metadata=tags, read_version=read
        )
    else:
        log_unlogged_versions(store, spark, run_id=run_id, tags=tags)


def _log_changes(
    store: DeltaStore,
    changes: DataFrame | pa.Table,
    *,
    sessions_version: int,
    commit_metadata: Mapping[str, str],
    read_version: int,
) -> CommitInfo:
    """Append the `session_changes` rows of the sessions commit `sessions_version`, marking
    the log as holding every sessions version through it.

    Made against `read_version`, the log's version when its mark was read: a run that logged
    in between (the same versions, or a later mark) fails it with `WriteConflictError`.
    Rows made on the driver are written there."""
    transaction = AppTransaction(app_id=SESSIONS_LOGGED, version=sessions_version)
    if isinstance(changes, pa.Table):
        return store.rewrite_arrow(
            SESSION_CHANGES,
            add=changes,
            commit_metadata=commit_metadata,
            app_transaction=transaction,
            read_version=read_version,
        )
    return store.rewrite(
        SESSION_CHANGES,
        add=lambda: changes,
        commit_metadata=commit_metadata,
        app_transaction=transaction,
        read_version=read_version,
    )


def mark_logged(store: DeltaStore, *, sessions_version: int, tags: Mapping[str, str]) -> None:
    """Mark the sessions commit `sessions_version`, which changed no session, as logged (no
    rows). When the log does not hold the version before, the next sessions run logs the
    versions in between from the Delta log (`log_unlogged_versions`), this one with them."""
    read = store.read_version(SESSION_CHANGES)
    if _logged_through(store) == sessions_version - 1:
        _log_changes(
            store,
            to_arrow_schema(SESSION_CHANGES.schema).empty_table(),
            sessions_version=sessions_version,
            commit_metadata=tags,
            read_version=read,
        )


def log_unlogged_versions(
    store: DeltaStore, spark: Callable[[], SparkSession], *, run_id: str, tags: Mapping[str, str]
) -> list[int]:
    """Log every sessions version the log does not hold yet; the versions with a change
    (`spark` is called only when there is one to log)."""
    current = store.version(SESSIONS)
    if current is None:
        return []
    read = store.read_version(SESSION_CHANGES)
    logged = _logged_through(store)
    found = []
    for version in range(logged + 1, current + 1):
        rows = signed_rows(store, spark(), SESSIONS, since=version - 1, through=version)
        if rows is None:
            raise LakeError(
                f"sessions version {version} is not in the corrections log, and its Delta log "
                "or files are gone: rebuild the sessions (rebuild_job) to carry on"
            )
        columns = _LOGGED_COLUMNS
        diff = diff_sessions(
            rows.where(F.col("sign") < 0).select(*columns),
            rows.where(F.col("sign") > 0).select(*columns),
        )
        changed = diff.limit(1).count() > 0
        if changed:
            found.append(version)
        # The last version is marked even without a change (a maintenance commit, say).
        if changed or version == current:
            logged_now = _log_changes(
                store,
                _change_rows(diff, commit_version=version, run_id=run_id),
                sessions_version=version,
                commit_metadata=tags,
                read_version=read,
            )
            read = read if logged_now.version is None else logged_now.version  # its own commit
    return found


def _logged_through(store: DeltaStore) -> int:
    """The last sessions version the log holds (-1: none). A log written before the
    transaction id existed holds every version through its highest `commit_version`."""
    marked = store.applied_version(SESSION_CHANGES, SESSIONS_LOGGED)
    if marked is not None:
        return marked
    top = store.read(SESSION_CHANGES).agg(F.max("commit_version")).first()
    return -1 if top is None or top[0] is None else int(top[0])
