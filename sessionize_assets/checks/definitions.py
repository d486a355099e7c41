"""Asset checks: the SPEC's invariants (`rules.py`), verified on the Delta tables as they are.

The lifecycle's checks run inside its asset (`assets/lifecycle.py`), on what each run wrote.

With a materialization a check reads what its run wrote; alone, the whole table (`scope.py`).
The checks of a table run as one step (`events_checks`, `sessions_checks`): they read the
run's writes from the Delta log once, find the rows they need by key in one lookup, and their
rules are counted in one Spark job (`rules.evaluate`). A small run's writes (within
`Settings.driver_write_bytes`) are read on the driver with Arrow, the keys its checks look up
come from them (`scope.changed_rows`, `event_ids.index_copies`), the rows those keys find are
read there too, and its rules are checked there (`rules.*_rows`): no Spark job. Each can
still be run alone.

Every check is blocking: when it fails, its run fails (and what depends on the asset in that
run is not computed), so neither a run nor `sessionize replay` passes it for a success. It
also marks the dates of the offending rows to be derived again from their inputs
(`manifests.recompute_event_dates` / `recompute_session_dates`): the sensors then ask for
them, and the recompute heals them. A check step holds the lake's writer lock while it reads, so no
run commits between its reads of tables that must agree.
"""

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    AssetKey,
    multi_asset_check,
)
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.checks.rules import (
    SESSION_CHECK_COLUMNS,
    Finding,
    Violations,
    duplicate_event_ids,
    duplicate_event_ids_rows,
    evaluate,
    malformed_sessions,
    malformed_sessions_rows,
    overlapping_sessions,
    overlapping_sessions_rows,
    quarantine_mismatch,
    quarantine_mismatch_rows,
    unaccounted_lines,
    unaccounted_lines_rows,
)
from sessionize_assets.checks.scope import (
    RunWrites,
    changed_rows,
    counts_changed,
    covered_dates,
    frame_of,
    pairs_of,
    rows_matching,
    sessions_near,
    sessions_near_rows,
    written,
)
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
)
from sessionize_assets.partitions import days_around
from sessionize_assets.pipeline.event_ids import index_copies
from sessionize_assets.pipeline.keyed_reads import PUSHED_KEYS_TOTAL
from sessionize_assets.pipeline.manifests import (
    InputKey,
    batch_inputs,
    inputs_read,
    recompute_event_dates,
    recompute_session_dates,
)
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import counting_jobs_on_demand
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.events import COPY_KEY
from sessionize_assets.transforms.validation import DEDUP
from sessionize_assets.typed_metadata import MetadataRecord, Shown, entry, metadata_record


@dataclass(frozen=True)
class LakeCheck:
    """One invariant: the asset it is on, what it verifies, and what a violation is called."""

    asset: str
    description: str
    violation: str


EVENTS_CHECKS = {
    "unique_event_ids": LakeCheck(
        "events", "Every event id appears once in events, over every date.", "duplicated event ids"
    ),
    "every_line_accounted": LakeCheck(
        "events",
        "Per batch and event date, lines = events + rejected: each valid line is an event or a "
        "cross-batch duplicate.",
        "inputs whose rows do not add up",
    ),
}
SESSIONS_CHECKS = {
    "no_overlapping_sessions": LakeCheck(
        "sessions", "No two sessions of a user overlap.", "overlapping sessions"
    ),
    "sessions_well_formed": LakeCheck(
        "sessions",
        "start <= end, event_count > 0, no session longer than L, date of start.",
        "malformed sessions",
    ),
    "quarantine_matches_flag": LakeCheck(
        "session_quarantine",
        "Quarantine rows are exactly the sessions flagged is_quarantined.",
        "session ids in one place only",
    ),
}


# The sessions checks read the `SESSION_CHECK_COLUMNS` of a run's files, a small share of their
# bytes (the attributes are most of them): they read them on the driver (`scope.changed_rows`,
# `scope.sessions_near_rows`), and check them there, for a run whose sessions and quarantine
# files hold up to this many times `Settings.driver_write_bytes`. A full-size daily batch
# rewrote 57 MB of sessions files (docs/benchmarks.md): its changed rows were read there in
# 1.6 s (the process's peak 636 MB), where Spark took two jobs and 20 s.
SESSION_CHECK_BYTES_FACTOR = 4
# The columns of the rows a small run added to `events` that its checks read on the driver:
# the ids `unique_event_ids` looks up, the inputs `every_line_accounted` counts.
ADDED_EVENT_COLUMNS = ["event_date", "event_id", "received_date"]


@dataclass(frozen=True, kw_only=True)
class CheckStep:
    """What a step's rules are given: the run's context, the lake, its Spark session (started
    when first asked for), the checks selected in the run, and `cache`, for a frame read more
    than once (released after the evaluation)."""

    context: AssetCheckExecutionContext
    store: DeltaStore
    spark: Callable[[], SparkSession]  # started on first use
    selected: set[str]
    cache: Callable[[DataFrame], DataFrame]


# The violations of a step's selected checks, by check name.
Rules = Callable[[CheckStep], Mapping[str, Violations | Finding]]


def lake_checks(
    *, name: str, checks: dict[str, LakeCheck], recompute: Callable[..., None]
) -> Callable[[Rules], AssetChecksDefinition]:
    """A step of blocking checks of the lake, evaluated together in one Spark job, or on the
    driver for rows read there (`rules.evaluate`), holding the lake's writer lock while it
    reads.

    Each check can run alone (the step is subsettable). A failed check marks the dates of its
    violations to be derived again (`recompute`: `recompute_event_dates` or
    `recompute_session_dates`). Each result reports the Spark jobs of the step (`spark_jobs`),
    which its checks share.
    """
    specs = [
        AssetCheckSpec(key, asset=check.asset, description=check.description, blocking=True)
        for key, check in checks.items()
    ]

    def decorate(rules: Rules) -> AssetChecksDefinition:
        @multi_asset_check(
            name=name,
            specs=specs,
            can_subset=True,
            required_resource_keys={"lake"},
            description=rules.__doc__,
        )
        def step(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
            lake: LakeResource = context.resources.lake
            selected = {key.name for key in context.selected_asset_check_keys}
            # The session starts when a rule first asks for it: a daily batch's rules read
            # its few rows with Arrow, and its checks start none.
            with (
                lake.writer(context, step=f"checks {name}"),
                counting_jobs_on_demand(lake.spark.session, name) as (spark, spark_jobs),
            ):
                store = lake.store(spark=spark)
                cached: list[DataFrame] = []

                def cache(frame: DataFrame) -> DataFrame:
                    cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
                    return cached[-1]

                try:
                    findings = evaluate(
                        rules(
                            CheckStep(
                                context=context,
                                store=store,
                                spark=spark,
                                selected=selected,
                                cache=cache,
                            )
                        )
                    )
                finally:
                    for frame in cached:
                        frame.unpersist()
                dates = sorted({day for finding in findings.values() for day in finding.dates})
                if dates:
                    recompute(store, dates, run_id=context.run.run_id)
            jobs = spark_jobs()
            for check, finding in sorted(findings.items()):
                what = checks[check].violation
                if finding.dates:
                    context.log.warning(
                        f"{check}: {finding.violations} {what} on {len(finding.dates)} dates "
                        f"({finding.dates[0]}..{finding.dates[-1]}): marked to be recomputed "
                        "from their inputs; the sensors ask for them"
                    )
                yield check_result(
                    finding,
                    what,
                    spark_jobs=jobs,
                    check_name=check,
                    asset_key=AssetKey(checks[check].asset),
                )

        return step

    return decorate


@metadata_record
class CheckMetadata(MetadataRecord):
    """What a check result reports: how many rows break its rule, a sample of them, what
    they are, and the dates marked to be derived again."""

    violations: int
    sample: list[str] = entry(shown=Shown.JSON)
    what: str
    dates: list[str] = entry(shown=Shown.JSON)
    # The Spark jobs of the check's step, which its checks share (absent where none is
    # counted: the lifecycle's checks, Spark Connect without its status API).
    spark_jobs: int | None = entry(default=None)


def check_result(
    finding: Finding, what: str, *, spark_jobs: int | None = None, **kwargs: Any
) -> AssetCheckResult:
    """A check's outcome with its violation count and a sample (kwargs: check_name, ...)."""
    return AssetCheckResult(
        **kwargs,
        passed=finding.passed,
        metadata=CheckMetadata(
            violations=finding.violations,
            sample=finding.sample,
            what=what,
            dates=[day.isoformat() for day in finding.dates],
            spark_jobs=spark_jobs,
        ).to_metadata(),
    )


def build_checks(*, settings: Settings) -> list[AssetChecksDefinition]:
    # A session reaches at most L into the days after its start.
    reach = math.ceil(settings.max_session_length / timedelta(days=1))

    @lake_checks(name="events_checks", checks=EVENTS_CHECKS, recompute=recompute_event_dates)
    def events_checks(step: CheckStep) -> dict[str, Violations | Finding]:
        """The events invariants: unique ids over every date, every line accounted for."""
        context, store, selected = step.context, step.store, step.selected
        writes = written(context, store, EVENTS)
        # A small run's added rows, read on the driver once for both rules.
        added = (
            store.read_files_arrow(EVENTS, writes.added, columns=ADDED_EVENT_COLUMNS)
            if writes and writes.added and writes.within(settings.driver_write_bytes)
            else None
        )
        rules: dict[str, Violations | Finding] = {}
        if "unique_event_ids" in selected:
            if writes and writes.added and added is not None:
                rules["unique_event_ids"] = duplicate_event_ids_rows(
                    _ids_near_added(step, writes, added=added)
                )
            else:
                # Alone, the dates covered; a run whose files outgrow the driver (a backlog, a
                # large re-delivery) is not looked up: finding its copies would read every hash
                # of the id index and then the ids of every date holding one, in Spark jobs of
                # their own; every id of `events`, read whole in the rules' job, costs about
                # that read alone, and checks a superset.
                rules["unique_event_ids"] = duplicate_event_ids(
                    store.read(EVENTS).select("event_date", "event_id")
                    if writes and writes.added
                    else store.read(EVENTS, partitions=covered_dates(context, [writes]))
                )
        if "every_line_accounted" in selected:
            rules["every_line_accounted"] = _accounted(step, writes, added=added)
        return rules

    def _accounted(
        step: CheckStep, writes: RunWrites | None, *, added: pa.Table | None
    ) -> Violations | Finding:
        """`every_line_accounted` of the raw rows, events and duplicate rejections of every
        input (batch, event date) the run read or changed the count of, on the driver, when
        its manifest commit names what it read and its files fit the driver (a daily
        batch's); otherwise of every input of the dates it wrote, or of the whole tables
        alone, by Spark."""
        context, store = step.context, step.store
        dates = covered_dates(context, [writes])
        if dates is None:
            return unaccounted_lines(
                store.read(RAW_EVENTS), store.read(EVENTS), store.read(REJECTED_EVENTS)
            )
        inputs = _inputs_counted(step, writes, added=added)
        if inputs is not None:
            return unaccounted_lines_rows(*_input_rows(store, inputs))
        # The batches holding events of these dates (from the index), those dates only.
        held = batch_inputs(store, dates).values()
        batches = sorted({received for inputs in held for _, received in inputs})
        on_dates = F.col("event_date").isin(dates)
        return unaccounted_lines(
            store.read(RAW_EVENTS, partitions=batches).where(on_dates),
            store.read(EVENTS, partitions=dates),
            store.read(REJECTED_EVENTS, partitions=batches).where(on_dates),
        )

    def _inputs_counted(
        step: CheckStep, writes: RunWrites | None, *, added: pa.Table | None
    ) -> set[InputKey] | None:
        """The inputs (event date, batch) whose count can have changed in this run: those it
        read, and those whose rows it added to or removed from `events`, or as duplicates
        from `rejected_events` (a displaced or promoted copy of another batch). Any other
        input holds what the runs before left, which their checks counted. None when the run
        does not name what it read, or wrote more than the driver reads."""
        store = step.store
        read = inputs_read(store, run_id=step.context.run.run_id)
        rejected = written(step.context, store, REJECTED_EVENTS)
        limit = settings.driver_write_bytes
        if read is None or not all(w is None or w.within(limit) for w in (writes, rejected)):
            return None
        inputs = set(read)
        if writes is not None:
            columns = ["event_date", "received_date"]
            if added is None:  # the run only removed rows
                added = store.read_files_arrow(EVENTS, writes.added, columns=columns)
            removed = store.read_files_arrow(EVENTS, writes.removed, columns=columns)
            inputs |= counts_changed(added.select(columns), removed, columns)
        if rejected is not None:
            columns = ["event_date", "received_date", "origin"]
            changed = counts_changed(
                store.read_files_arrow(REJECTED_EVENTS, rejected.added, columns=columns),
                store.read_files_arrow(REJECTED_EVENTS, rejected.removed, columns=columns),
                columns,
            )
            inputs |= {(day, received) for day, received, origin in changed if origin == DEDUP}
        return inputs if len(inputs) <= PUSHED_KEYS_TOTAL else None

    @lake_checks(name="sessions_checks", checks=SESSIONS_CHECKS, recompute=recompute_session_dates)
    def sessions_checks(step: CheckStep) -> dict[str, Violations | Finding]:
        """The sessions invariants: no overlaps, well formed, the quarantine matches the flag."""
        context, store, selected = step.context, step.store, step.selected
        sessions_written = written(context, store, SESSIONS)
        quarantine_written = written(context, store, SESSION_QUARANTINE)
        # A small run's writes are read on the driver, and the keys the rules look up come
        # from them with no Spark job; a large run's are read by Spark.
        writes = (sessions_written, quarantine_written)
        limit = SESSION_CHECK_BYTES_FACTOR * settings.driver_write_bytes
        on_driver = bool(sessions_written and sessions_written.added) and all(
            write is None or write.within(limit) for write in writes
        )
        # The rows the run changed, as the rules see them (`SESSION_CHECK_COLUMNS`). A
        # rewritten file also holds the rows it copied over as they were (the file's other
        # users), and a row whose attributes alone changed is, for the rules, the row it
        # replaced: the runs that wrote those checked them. The difference counts copies, so
        # a row the run wrote twice stays in it.
        changed: DataFrame | None = None
        rows_changed: pa.Table | None = None  # on the driver
        if on_driver and sessions_written is not None:
            rows_changed = changed_rows(store, SESSIONS, sessions_written, SESSION_CHECK_COLUMNS)
        elif sessions_written and sessions_written.added:
            changed = step.cache(
                store.read_files(SESSIONS, sessions_written.added)
                .select(*SESSION_CHECK_COLUMNS)
                .exceptAll(
                    store.read_files(SESSIONS, sessions_written.removed).select(
                        *SESSION_CHECK_COLUMNS
                    )
                )
            )
        rules: dict[str, Violations | Finding] = {}
        if "sessions_well_formed" in selected:
            max_length = settings.max_session_length
            if rows_changed is not None:
                rules["sessions_well_formed"] = malformed_sessions_rows(
                    rows_changed, max_length=max_length
                )
            else:
                rows = changed
                if rows is None:
                    dates = covered_dates(context, [sessions_written])
                    rows = store.read(SESSIONS, partitions=dates)
                rules["sessions_well_formed"] = malformed_sessions(rows, max_length=max_length)
        pair = ["session_date", "user_id"]
        # The (date, user) pairs whose sessions the other two checks read, found by user in
        # one lookup: a changed session's user can overlap its sessions within reach; a
        # quarantine mismatch the run made involves a quarantine row of a date it wrote (there
        # are few), one it removed, or a flagged session it changed.
        checks_overlap = "no_overlapping_sessions" in selected and (
            changed is not None or rows_changed is not None
        )
        wanted: list[DataFrame] = []
        wanted_on_driver: dict[date, set[str]] = {}
        if checks_overlap:
            if rows_changed is not None:
                wanted_on_driver = pairs_of(rows_changed)
            elif changed is not None:
                wanted.append(changed.select(*pair))
        quarantine: DataFrame | pa.Table | None = None
        listed = False
        quarantine_dates = covered_dates(context, [sessions_written, quarantine_written])
        if "quarantine_matches_flag" in selected:
            removed = quarantine_written.removed if quarantine_written else []
            if rows_changed is not None:
                columns = ["session_id", "session_date", "user_id"]
                quarantine = store.read_arrow(
                    SESSION_QUARANTINE, partitions=quarantine_dates, columns=columns
                )
                flagged = rows_changed.filter(rows_changed.column("is_quarantined"))
                for rows in (
                    quarantine,
                    store.read_files_arrow(SESSION_QUARANTINE, removed, columns=columns),
                    flagged,
                ):
                    for day, users in pairs_of(rows).items():
                        wanted_on_driver.setdefault(day, set()).update(users)
                listed = True
            else:
                quarantine = store.read(SESSION_QUARANTINE, partitions=quarantine_dates)
                if sessions_written or quarantine_written:
                    wanted.append(
                        quarantine.select(*pair).unionByName(
                            store.read_files(SESSION_QUARANTINE, removed).select(*pair)
                        )
                    )
                    if changed is not None:
                        wanted.append(changed.where("is_quarantined").select(*pair))
                    listed = True
        # The sessions near those pairs: on the driver for a run checked there, and the rules
        # that read them checked there too; otherwise by Spark, for the rules' job.
        near: DataFrame | None = None
        near_rows: pa.Table | None = None
        if rows_changed is not None and (checks_overlap or listed):
            near_rows = sessions_near_rows(
                store, wanted_on_driver, before=reach, after=reach, columns=SESSION_CHECK_COLUMNS
            )
        elif wanted:
            near = sessions_near(
                store, reduce(DataFrame.unionByName, wanted), before=reach, after=reach
            )
        if "no_overlapping_sessions" in selected:
            if near_rows is not None and checks_overlap:
                rules["no_overlapping_sessions"] = overlapping_sessions_rows(near_rows)
            elif near is not None and checks_overlap:
                rules["no_overlapping_sessions"] = overlapping_sessions(near)
            else:  # alone, or too many pairs to look up: the dates whole
                dates = covered_dates(context, [sessions_written])
                around = None if dates is None else days_around(dates, before=reach, after=reach)
                rules["no_overlapping_sessions"] = overlapping_sessions(
                    store.read(SESSIONS, partitions=around), dates=dates
                )
        if quarantine is not None:
            # The looked-up users' sessions on the quarantine's dates: every listed pair's
            # (their dates are among them), and any other flagged one of those users is
            # compared with the quarantine of its date too.
            looked_up = listed and quarantine_dates is not None
            if isinstance(quarantine, pa.Table) and near_rows is not None and looked_up:
                on_dates = pc.is_in(
                    near_rows.column("session_date"),
                    pa.array(quarantine_dates, near_rows.schema.field("session_date").type),
                )
                rules["quarantine_matches_flag"] = quarantine_mismatch_rows(
                    near_rows.filter(on_dates), quarantine
                )
            else:
                if isinstance(quarantine, pa.Table):  # too many pairs to look up on the driver
                    quarantine = frame_of(step.spark(), SESSION_QUARANTINE, quarantine)
                if near is not None and looked_up:
                    sessions = near.where(F.col("session_date").isin(quarantine_dates))
                else:  # alone, or too many pairs to look up: the dates whole
                    sessions = store.read(SESSIONS, partitions=quarantine_dates)
                rules["quarantine_matches_flag"] = quarantine_mismatch(sessions, quarantine)
        return rules

    return [events_checks, sessions_checks]


def _ids_near_added(step: CheckStep, writes: RunWrites, *, added: pa.Table) -> pa.Table:
    """The `event_date` and `event_id` of the `events` rows that can share an id with a row
    the run added (`added`, read on the driver): every row of the live files it added, and of
    the other files, the rows of the ids' copies that the id index places in them; read on
    the driver.

    A row in a file the run did not write came from a copy in the index: on the copy's event
    date, with the copy's batch as its `received_date`. So the run's ids are looked up in the
    index by hash there (`index_copies`, no Spark job), and each copy, and each added row, is
    looked for in the files of its date whose min..max `received_date` in the log's
    statistics holds its batch (no data read). A daily batch's own copies are then in the
    files it added alone, as every other file holds older batches; an id with a copy in
    another batch, or a batch delivered again, leads to the files of that copy's date. Before,
    every date a copy is on was read by id: at the full size, the `event_id` of all 21 M rows
    (docs/benchmarks.md).
    """
    store = step.store
    columns = ["event_date", "event_id"]
    # The added rows count as copies too, for a row whose batch the index lacks.
    copies = index_copies(store, added.column("event_id").to_pylist()) | set(
        zip(*(added.column(name).to_pylist() for name in COPY_KEY), strict=True)
    )
    batches = _batches_by_date((day, batch) for day, _, batch in copies)
    # Live files only (the added rows are copies, so the run's live files are among them): a
    # file the run added that a later run replaced is read as its replacement, once.
    found = set(store.files_with_values(EVENTS, column="received_date", values=batches))
    mine = [path for path in writes.added if path in found]
    others = found - set(mine)
    # The added rows were read already; read again only when a later run replaced one of the
    # run's files.
    rows = (
        added.select(columns)
        if len(mine) == len(writes.added)
        else store.read_files_arrow(EVENTS, mine, columns=columns)
    )
    if not others:
        return rows
    # The dates of those files: their copies' (date, id) pairs are looked for there.
    held = {
        day
        for day, paths in store.partition_files(EVENTS, partitions=list(batches)).items()
        if not others.isdisjoint(paths)
    }
    pairs = sorted({(day, event_id) for day, event_id, _ in copies if day.isoformat() in held})
    near = store.read_files_arrow(EVENTS, sorted(others), columns=columns)
    looked_up = rows_matching(near, columns, pairs).select(columns)
    return pa.concat_tables([rows, looked_up.cast(rows.schema)])


def _input_rows(store: DeltaStore, inputs: set[InputKey]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The raw rows, events and duplicate rejections (`received_date`, `event_date`, and the
    rejections' `origin`) of these inputs (event date, batch), read on the driver. Of
    `events`, the files whose `received_date` statistics can hold one of the inputs' batches
    on its date: a daily batch's are the files it added, where reading the dates it reached
    opened every file of the history (1,256 at the full size)."""
    key = ["received_date", "event_date"]
    listed = sorted((received, day) for day, received in inputs)
    batches = sorted({received for received, _ in listed})
    on_dates = pc.field("event_date").isin(
        pa.array(sorted({day for _, day in listed}), pa.date32())
    )
    files = store.files_with_values(EVENTS, column="received_date", values=_batches_by_date(inputs))
    read = (
        store.read_arrow(RAW_EVENTS, partitions=batches, columns=key, where=on_dates),
        store.read_files_arrow(EVENTS, files, columns=key),
        store.read_arrow(
            REJECTED_EVENTS, partitions=batches, columns=[*key, "origin"], where=on_dates
        ),
    )
    raw, events, rejected = (rows_matching(rows, key, listed) for rows in read)
    return raw, events, rejected


def _batches_by_date(inputs: Iterable[tuple[date, date]]) -> dict[date, set[str]]:
    """The batches (ISO text) of these (event date, batch) pairs, by date: the values
    `DeltaStore.files_with_values` looks for in `received_date`'s statistics."""
    found: dict[date, set[str]] = {}
    for day, batch in inputs:
        found.setdefault(day, set()).add(batch.isoformat())
    return found
