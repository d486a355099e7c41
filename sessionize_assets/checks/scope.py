"""What a check reads: the whole table, or what the run it belongs to wrote.

A check that runs with a materialization verifies what that run changed, so a daily batch
pays for its own rows, not for the history nor for every row of the dates it touched. The
Delta log says what a run wrote: each commit carries `dagster_run_id`, and its add and remove
actions name the files. An invariant of single rows (well-formed sessions) then reads the rows
the run wrote: those of the files it added, for `sessions` less the rows it copied over
unchanged from the files it removed (a rewritten sessions file keeps its other users' rows).
One that relates a row to others (unique ids, overlaps, the quarantine) reads those rows' keys
and finds the rows they can conflict with by key: rows the run did not change were checked by
the run that wrote them.

A run whose files hold at most `Settings.driver_write_bytes` (a daily batch's) has them read on
the driver with Arrow (`changed_rows`): the keys come from there, and the rows they conflict
with are read there too where a rule can be checked on the driver (`sessions_near_rows`);
others reach the rules' one Spark job with its query (`frame_of`). A larger run's are read by
Spark.

Run on its own (the UI's "Execute checks" on an asset), a check has no partitions and reads
the whole table. A partitioned run that wrote nothing, or whose files the log no longer
names, checks its own partition range.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date

import pyarrow as pa
from dagster import AssetCheckExecutionContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.partitions import days_around, days_between
from sessionize_assets.pipeline.keyed_reads import (
    PUSHED_KEYS_TOTAL,
    keys_by_partition,
    pair_filter,
)
from sessionize_assets.transforms.row_sets import rows_less

# A run commits to a table a few times, so its commits are among the table's latest ones.
RECENT_COMMITS = 50
# Up to this many (date, key) pairs of written rows come to the driver to choose, from the
# log's statistics, the files that can hold the rows they conflict with; a run that wrote more
# (a range run, a rebuild) has its checks read the written dates whole instead.
KEYED_CHECK_PAIRS = 200_000


@dataclass(frozen=True, kw_only=True)
class RunWrites:
    """What one run's commits changed in one table."""

    dates: list[date]  # partitions where files were added or removed
    added: list[str]  # files added, relative to the table root
    removed: list[str]  # files removed (still on disk until vacuumed)
    # The bytes of those files together; None when the log does not say for one of them.
    bytes: int | None = None

    def within(self, limit: int) -> bool:
        """Whether its files hold at most `limit` bytes together: few enough to be read on
        the driver (`Settings.driver_write_bytes`, the size a change is written from there)."""
        return self.bytes is not None and self.bytes <= limit


def run_writes(store: DeltaStore, spec: TableSpec, run_id: str) -> RunWrites | None:
    """The files this run's commits added to and removed from `spec`, from the Delta log.

    None when the run did not commit to the table, or the log no longer names its files.
    """
    dates: set[date] = set()
    added: set[str] = set()
    removed: set[str] = set()
    sizes: dict[str, int | None] = {}
    committed = False
    for commit in store.history(spec, limit=RECENT_COMMITS):
        if commit.get("dagster_run_id") != run_id:
            continue
        version = int(commit["version"])
        changes = store.changes(spec, since_version=version - 1, through_version=version)
        if changes is None:
            return None
        committed = True
        for change in changes:
            dates.add(date.fromisoformat(change.partition))
            (added if change.added else removed).add(change.path)
            if sizes.get(change.path) is None:
                sizes[change.path] = change.size
    if not committed:
        return None
    # A file a later commit of the same run replaced is not in the table any more.
    live = added - removed
    known = [sizes[path] for path in sorted(live | removed)]
    return RunWrites(
        dates=sorted(dates),
        added=sorted(live),
        removed=sorted(removed),
        bytes=None if None in known else sum(size for size in known if size is not None),
    )


def written(
    context: AssetCheckExecutionContext, store: DeltaStore, spec: TableSpec
) -> RunWrites | None:
    """What the check's run wrote to `spec`; None for a check run alone."""
    return run_writes(store, spec, context.run.run_id) if in_run(context) else None


def sessions_near(
    store: DeltaStore,
    pairs: DataFrame | Mapping[date, Collection[str]],
    *,
    before: int,
    after: int,
) -> DataFrame | None:
    """The sessions of the users of (session_date, user_id) `pairs` on the days around those
    dates, read from the files whose user range (log statistics) can hold them; past
    PUSHED_KEYS_TOTAL such (date, user) pairs, every session of those files (a superset).

    `pairs` is a frame, which a Spark job brings to the driver, or already there: the users
    of each date. None when there are more than KEYED_CHECK_PAIRS pairs: read the dates whole
    instead.
    """
    by_date = (
        {day: sorted(set(users)) for day, users in pairs.items() if users}
        if isinstance(pairs, Mapping)
        else keys_by_partition(
            pairs, partition="session_date", key="user_id", limit=KEYED_CHECK_PAIRS
        )
    )
    near = _around(by_date, before=before, after=after)
    if near is None:
        return None
    return _near_rows(store.read_files(SESSIONS, _files_near(store, near)), near)


def _near_rows(rows: DataFrame, near: Mapping[date, set[str]]) -> DataFrame:
    """The rows of the users of each date of `near` among `rows` (read by Spark)."""
    if sum(map(len, near.values())) > PUSHED_KEYS_TOTAL:
        # More pairs than a hash set in the query is built for (`pair_filter`; a range run's,
        # a backlog's: each text is built here and planned by Spark, about 40 us a pair): the
        # files' rows whole. They are the looked-up users' files of those dates, so the rows
        # are what is read anyway; the other users' sessions in them make a superset, which
        # finds no overlap or quarantine mismatch the lake does not hold.
        return rows
    # A hash set of the exact (date, user) pairs in the query, evaluated on each row read: no
    # broadcast job. The files were chosen by their user range already; a `user_id IN` list
    # pushed to the Parquet reader would be checked again file by file, which costs more than
    # the hash set with thousands of users.
    wanted = [(day, user) for day, found in sorted(near.items()) for user in sorted(found)]
    return rows.where(pair_filter(wanted, partition="session_date", key="user_id"))


def sessions_near_rows(
    store: DeltaStore,
    pairs: Mapping[date, Collection[str]],
    *,
    before: int,
    after: int,
    columns: Sequence[str],
) -> pa.Table | None:
    """`sessions_near` for pairs on the driver, read there: `columns` of the sessions of
    exactly those users on the days around those dates, from the files whose user range can
    hold them, read with Arrow and matched by a join, for the rules to check there
    (`rules.*_rows`). At the full size a daily batch's 8,155 changed pairs chose 2,891 files
    (627,511 sessions) for a tenth of their rows, which Spark's rules' job read twice (two
    rules read them). None when there are more than KEYED_CHECK_PAIRS pairs."""
    near = _around(pairs, before=before, after=after)
    if near is None:
        return None
    rows = store.read_files_arrow(SESSIONS, _files_near(store, near), columns=columns)
    listed = [(day, user) for day, found in sorted(near.items()) for user in sorted(found)]
    return rows_matching(rows, ["session_date", "user_id"], listed).select(list(columns))


def _around(
    pairs: Mapping[date, Collection[str]] | None, *, before: int, after: int
) -> dict[date, set[str]] | None:
    """The users of each date's `pairs` on the days from `before` days before it to `after`
    days after it; None for no pairs given or more than KEYED_CHECK_PAIRS."""
    if pairs is None or sum(map(len, pairs.values())) > KEYED_CHECK_PAIRS:
        return None
    near: dict[date, set[str]] = {}
    for day, users in pairs.items():
        for around in days_around([day], before=before, after=after):
            near.setdefault(around, set()).update(users)
    return near


def _files_near(store: DeltaStore, near: Mapping[date, set[str]]) -> list[str]:
    """The sessions files whose user range (log statistics) can hold these users' rows."""
    return store.files_with_values(
        SESSIONS, column="user_id", values={d: sorted(u) for d, u in sorted(near.items())}
    )


def changed_rows(
    store: DeltaStore, spec: TableSpec, writes: RunWrites, columns: Sequence[str]
) -> pa.Table:
    """`columns` of the rows of the files a run added, less one copy of each row of the files
    it removed (`rows_less`), read on the driver: for a run whose files `RunWrites.within` the
    driver's limit."""
    added = store.read_files_arrow(spec, writes.added, columns=columns)
    removed = store.read_files_arrow(spec, writes.removed, columns=columns)
    return rows_less(added, removed)


def counts_changed(added: pa.Table, removed: pa.Table, columns: Sequence[str]) -> set[tuple]:
    """The values of `columns` that the rows of the files a run `added` and of those it
    `removed` (read on the driver) hold a different number of times: where a count by them can
    have changed (a file rewritten with its other rows copied over changes no count of
    theirs)."""

    def counts(rows: pa.Table) -> dict[tuple, int]:
        grouped = rows.group_by(list(columns)).aggregate([([], "count_all")])
        keys = zip(*(grouped.column(name).to_pylist() for name in columns), strict=True)
        return dict(zip(keys, grouped.column("count_all").to_pylist(), strict=True))

    before, after = counts(removed), counts(added)
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def rows_matching(rows: pa.Table, keys: Sequence[str], values: Sequence[tuple]) -> pa.Table:
    """The rows of `rows` (read on the driver) whose `keys` columns hold one of `values`
    (tuples in `keys`' order): a semi join, the values typed as the rows' columns."""
    wanted = pa.table(
        {
            name: pa.array([value[i] for value in values], rows.schema.field(name).type)
            for i, name in enumerate(keys)
        }
    )
    return rows.join(wanted, keys=list(keys), join_type="left semi")


def frame_of(spark: SparkSession, spec: TableSpec, rows: pa.Table) -> DataFrame:
    """Rows of `spec` read on the driver, as a frame a rule can read (no Spark job: they
    travel with the query that reads them)."""
    schema = StructType([spec.schema[name] for name in rows.column_names])
    return spark.createDataFrame(rows, schema=schema)


def pairs_of(rows: pa.Table) -> dict[date, set[str]]:
    """The users of each session date in `rows`."""
    pairs: dict[date, set[str]] = {}
    for day, user in zip(
        rows.column("session_date").to_pylist(), rows.column("user_id").to_pylist(), strict=True
    ):
        pairs.setdefault(day, set()).add(user)
    return pairs


def in_run(context: AssetCheckExecutionContext) -> bool:
    """Whether the check runs in a partitioned run (False: alone, on the whole table)."""
    return context.has_partition_key or context.has_partition_key_range


def run_dates(context: AssetCheckExecutionContext) -> list[date]:
    """The run's partitions: what a check covers when the run wrote nothing it can name."""
    keys = context.partition_key_range
    return days_between(date.fromisoformat(keys.start), date.fromisoformat(keys.end))


def covered_dates(
    context: AssetCheckExecutionContext, writes: list[RunWrites | None]
) -> list[date] | None:
    """Partitions a date-scoped check covers: None (the whole table) for a check run alone;
    in a run that wrote these `writes` (from `written`), the partitions they touched;
    otherwise the run's partitions."""
    if not in_run(context):
        return None
    dates = {day for write in writes if write for day in write.dates}
    return sorted(dates) if dates else run_dates(context)
