"""Bookkeeping of what each asset partition has absorbed (Snowplow-style manifests).

`events`: an input is one batch's rows for one event date, (event_date, received_date) at
the raw_events version that wrote the batch. Comparing what is available with what a
partition has absorbed says exactly what to do: new inputs are read incrementally; an
absorbed input that changed or vanished (a re-delivered batch) recomputes that date.

`sessions`: a partition records the `events` table version it has absorbed and the session
definition (gap, cap) it was computed with. What changed since is read from the Delta log of
`events` (the files added and removed after that version), so the work follows the change.
The events manifest records, per event date, the `events` version that holds what it
absorbed: a sessions date is behind when an event date of its window holds a newer one.

Bookkeeping tables are tiny, so they are read and written on the driver with delta-rs, and
filtered in Arrow before anything becomes a Python object.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS,
    EVENTS_MANIFEST,
    SESSIONS_MANIFEST,
)
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.settings import Settings

InputKey = tuple[date, date]  # (event_date, received_date)
Inputs = dict[InputKey, int]  # -> ingest_version


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one partition must do."""

    available: Inputs
    new: Inputs = field(default_factory=dict)
    gone: Inputs = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return bool(self.new or self.gone)

    @property
    def needs_recompute(self) -> bool:
        return bool(self.gone)


def plan(available: Inputs, absorbed: Inputs) -> Plan:
    new = {k: v for k, v in available.items() if absorbed.get(k) != v}
    gone = {k: v for k, v in absorbed.items() if available.get(k) != v}
    return Plan(available=available, new=new, gone=gone)


def event_dates_behind(index: pa.Table, manifest: pa.Table) -> dict[date, Plan]:
    """The event dates whose `events` partition has not absorbed exactly the batch inputs the
    index holds for it (new ones, or absorbed ones that changed or vanished), with their plans.

    Read from the two bookkeeping tables' rows (`batch_event_dates`, `events_manifest`), so it
    says what is stale whatever happened to earlier runs: a run that failed, or died before
    its manifest commit, leaves its dates behind here.
    """
    available: dict[date, Inputs] = {}
    for row in index.select(["event_date", "received_date", "ingest_version"]).to_pylist():
        available.setdefault(row["event_date"], {})[(row["event_date"], row["received_date"])] = (
            row["ingest_version"]
        )
    absorbed: dict[date, Inputs] = {}
    columns = ["partition_date", "event_date", "received_date", "ingest_version"]
    for row in manifest.select(columns).to_pylist():
        absorbed.setdefault(row["partition_date"], {})[
            (row["event_date"], row["received_date"])
        ] = row["ingest_version"]
    plans = {
        day: plan(available.get(day, {}), absorbed.get(day, {})) for day in {*available, *absorbed}
    }
    return {day: p for day, p in sorted(plans.items()) if p.pending}


def _events_by_input(index: pa.Table) -> dict[InputKey, int]:
    columns = ["event_date", "received_date", "events"]
    return {
        (row["event_date"], row["received_date"]): row["events"]
        for row in index.select(columns).to_pylist()
    }


def _typical_day(by_input: Mapping[InputKey, int]) -> float:
    """The median of the events the index holds per event date (at least 1): the unit a run's
    load is counted in, so `SESSIONIZE_MAX_PARTITIONS_PER_RUN` keeps meaning days."""
    per_date: dict[date, int] = {}
    for (event_date, _), events in by_input.items():
        per_date[event_date] = per_date.get(event_date, 0) + events
    totals = sorted(per_date.values())
    return float(max(1, totals[len(totals) // 2])) if totals else 1.0


def event_date_loads(index: pa.Table, plans: Mapping[date, Plan]) -> dict[date, float]:
    """Per event date of `plans`, the events its run reads, in typical days of the index
    (`partitions.contiguous_ranges` cuts range runs by them): every input of a date that is
    recomputed, the new inputs otherwise."""
    by_input = _events_by_input(index)
    unit = _typical_day(by_input)
    return {
        day: sum(by_input.get(key, 0) for key in (p.available if p.needs_recompute else p.new))
        / unit
        for day, p in plans.items()
    }


def session_date_loads(
    index: pa.Table, events_manifest: pa.Table, sessions_manifest: pa.Table
) -> dict[date, float]:
    """Per session date, the events of its own event date it has not absorbed, in typical
    days of the index: the inputs the events manifest holds at a newer `events` version than
    the date's sessions absorbed (all of them for a date never computed). Summed over a range,
    each changed event counts once, although a date reads the days around it too."""
    by_input = _events_by_input(index)
    unit = _typical_day(by_input)
    absorbed = _sessions_absorbed(sessions_manifest)
    loads: dict[date, float] = {}
    columns = ["partition_date", "event_date", "received_date", "events_version"]
    for row in events_manifest.select(columns).to_pylist():
        day, version = row["partition_date"], row["events_version"]
        if day in absorbed and version is not None and version <= absorbed[day]:
            continue
        events = by_input.get((row["event_date"], row["received_date"]), 0)
        loads[day] = loads.get(day, 0.0) + events / unit
    return loads


def _index_rows(store: DeltaStore, event_dates: Iterable[date]) -> list[dict]:
    """Index rows of these event dates only (filtered in Arrow)."""
    wanted = sorted(set(event_dates))
    if not wanted:
        return []
    index = store.read_arrow(BATCH_EVENT_DATES)
    return index.filter(
        pc.is_in(index.column("event_date"), value_set=pa.array(wanted))
    ).to_pylist()


def batch_inputs(store: DeltaStore, event_dates: Iterable[date]) -> dict[date, Inputs]:
    """Per event date, the batches that hold events for it (the received -> event index)."""
    wanted = set(event_dates)
    out: dict[date, Inputs] = {d: {} for d in wanted}
    for row in _index_rows(store, wanted):
        key = (row["event_date"], row["received_date"])
        out[row["event_date"]][key] = row["ingest_version"]
    return out


def indexed_event_dates(store: DeltaStore) -> set[date]:
    """Every event date the received -> event index lists, in any batch."""
    index = store.read_arrow(BATCH_EVENT_DATES, columns=["event_date"])
    return set(index.column("event_date").to_pylist())


def indexed_rows(store: DeltaStore, inputs: Iterable[InputKey]) -> int:
    """Raw rows behind these inputs, from the index (no scan)."""
    wanted = set(inputs)
    return sum(
        row["events"]
        for row in _index_rows(store, {e for e, _ in wanted})
        if (row["event_date"], row["received_date"]) in wanted
    )


def batch_event_dates(store: DeltaStore, received: Iterable[date]) -> dict[date, list[date]]:
    """Event dates the index holds for each of these batches."""
    out: dict[date, set[date]] = {}
    for row in store.read_arrow(BATCH_EVENT_DATES, partitions=sorted(set(received))).to_pylist():
        out.setdefault(row["received_date"], set()).add(row["event_date"])
    return {day: sorted(dates) for day, dates in sorted(out.items())}


def absorbed_inputs(store: DeltaStore, *, partitions: Iterable[date]) -> dict[date, Inputs]:
    """Per events partition, the inputs it has absorbed."""
    wanted = sorted(set(partitions))
    out: dict[date, Inputs] = {d: {} for d in wanted}
    for row in store.read_arrow(EVENTS_MANIFEST, partitions=wanted).to_pylist():
        key = (row["event_date"], row["received_date"])
        out[row["partition_date"]][key] = row["ingest_version"]
    return out


def record_absorbed(
    store: DeltaStore,
    *,
    absorbed: Mapping[date, Inputs],
    events_version: int | None,
    run_id: str,
    read_version: int | None = None,
    read: Collection[InputKey] = (),
) -> None:
    """Replace the events manifest of `absorbed`'s partitions with exactly these inputs, held
    by `events` at `events_version` (see `WriteConflictError` for `read_version`). The commit
    names the inputs the run `read` (`inputs_read`), up to READ_INPUTS_RECORDED of them.

    An input a partition held already keeps the version it was absorbed at when the partition
    gains inputs and loses or changes none: so each session date's unabsorbed events can be
    counted (`session_date_loads`), and a partition's newest version, its new inputs', is
    still what it holds (`session_dates_behind`). A partition recorded with the inputs it
    held was written at `events_version` all the same (a copy of one of its ids moved, or it
    was recomputed and differed): every input is then at that version, so its sessions follow
    it and `record_unrecorded` finds it recorded. A caller does not record a partition it left
    as it was."""
    if not absorbed:
        return
    held_since = _held_since(store, absorbed)
    metadata = {}
    if 0 < len(read) <= READ_INPUTS_RECORDED:
        by_batch: dict[str, set[str]] = {}
        for event_date, received_date in read:
            by_batch.setdefault(received_date.isoformat(), set()).add(event_date.isoformat())
        metadata[READ_INPUTS_KEY] = json.dumps(
            {batch: sorted(dates) for batch, dates in sorted(by_batch.items())},
            separators=(",", ":"),
        )
    now = datetime.now(UTC)
    rows = [
        {
            "partition_date": partition,
            "event_date": event_date,
            "received_date": received_date,
            "ingest_version": version,
            "run_id": run_id,
            "processed_at": now,
            "events_version": held_since.get(
                (partition, event_date, received_date), events_version
            ),
        }
        for partition, inputs in sorted(absorbed.items())
        for (event_date, received_date), version in sorted(inputs.items())
    ]
    _replace(
        store,
        EVENTS_MANIFEST,
        rows,
        partitions=sorted(absorbed),
        run_id=run_id,
        read_version=read_version,
        metadata=metadata,
    )


def _held_since(
    store: DeltaStore, absorbed: Mapping[date, Inputs]
) -> dict[tuple[date, date, date], int]:
    """(partition, event date, received date) -> the events version that absorbed the input,
    for the inputs the manifest records unchanged in the partitions of `absorbed` that gain
    inputs and lose or change none (`record_absorbed`)."""
    previous: dict[date, dict[InputKey, tuple[int, int | None]]] = {}
    for row in store.read_arrow(EVENTS_MANIFEST, partitions=sorted(absorbed)).to_pylist():
        previous.setdefault(row["partition_date"], {})[
            (row["event_date"], row["received_date"])
        ] = (row["ingest_version"], row["events_version"])
    since = {}
    for partition, inputs in absorbed.items():
        before = previous.get(partition, {})
        if any(inputs.get(key) != ingest for key, (ingest, _) in before.items()):
            continue  # an input gone or changed: the partition was recomputed whole
        if inputs.keys() == before.keys():
            continue  # no input gained: the partition was written again as a whole
        for key, (_, version) in before.items():
            if version is not None:
                since[(partition, *key)] = version
    return since


# An events run's manifest commit names the inputs the run read (received_date -> event
# dates): what its check `every_line_accounted` covers, beside the inputs whose rows it
# changed. Past READ_INPUTS_RECORDED inputs (a rebuild), none are named and the check covers
# the dates the run wrote, whole.
READ_INPUTS_KEY = "sessionize.read_inputs"
READ_INPUTS_RECORDED = 5_000


def inputs_read(store: DeltaStore, *, run_id: str) -> set[InputKey] | None:
    """The inputs the events run `run_id` read, from its manifest commits (`record_absorbed`);
    None when none of its commits names them (it absorbed nothing, or too much to name)."""
    found: set[InputKey] | None = None
    for commit in store.history(EVENTS_MANIFEST, limit=RECENT_EVENTS_COMMITS):
        if commit.get("dagster_run_id") != run_id or READ_INPUTS_KEY not in commit:
            continue
        found = found or set()
        for batch, dates in json.loads(commit[READ_INPUTS_KEY]).items():
            found |= {(date.fromisoformat(day), date.fromisoformat(batch)) for day in dates}
    return found


# An `events` commit names, in its commit info, the inputs its partitions then hold (as
# `record_absorbed` takes them), so a run killed between it and its manifest commit is
# recorded from the Delta log by the next run (`record_unrecorded`), never redone.
ABSORBED_KEY = "sessionize.absorbed"
# The newest `events` commits searched for one the manifest lacks: a run's are its last.
RECENT_EVENTS_COMMITS = 50


def absorbed_metadata(absorbed: Mapping[date, Inputs]) -> str:
    """`absorbed` as the commit-info value `record_unrecorded` reads back."""
    return json.dumps(
        {
            partition.isoformat(): [
                [event_date.isoformat(), received_date.isoformat(), version]
                for (event_date, received_date), version in sorted(inputs.items())
            ]
            for partition, inputs in sorted(absorbed.items())
        },
        separators=(",", ":"),
    )


def record_unrecorded(store: DeltaStore, *, run_id: str) -> list[int]:
    """Record what the recent `events` commits absorbed where the manifest does not hold it
    yet (their run died before its manifest commit); returns those commits' versions.

    A partition is behind a commit when the manifest's `events_version` for it is older: a
    later run that recorded the partition again is not undone.
    """
    held: dict[date, int] = {}
    rows = store.read_arrow(EVENTS_MANIFEST, columns=["partition_date", "events_version"])
    for row in rows.to_pylist():
        version = -1 if row["events_version"] is None else row["events_version"]
        held[row["partition_date"]] = max(held.get(row["partition_date"], -1), version)
    recorded = []
    commits = store.history(EVENTS, limit=RECENT_EVENTS_COMMITS)
    for commit in sorted(commits, key=lambda c: int(c["version"])):
        if ABSORBED_KEY not in commit:
            continue
        version = int(commit["version"])
        behind = {
            date.fromisoformat(partition): {
                (date.fromisoformat(e), date.fromisoformat(r)): int(v) for e, r, v in inputs
            }
            for partition, inputs in json.loads(commit[ABSORBED_KEY]).items()
            if held.get(date.fromisoformat(partition), -1) < version
        }
        if behind:
            record_absorbed(store, absorbed=behind, events_version=version, run_id=run_id)
            held.update(dict.fromkeys(behind, version))
            recorded.append(version)
    return recorded


# The ingest version recorded for the inputs of an event date that failed an invariant check:
# no batch has it, so the date's plan finds every input changed, and its next run recomputes it
# from raw (a partition derived again from its inputs heals whatever a race left in it).
UNVERIFIED = -1


def recompute_event_dates(store: DeltaStore, event_dates: Iterable[date], *, run_id: str) -> None:
    """Make the next events run of these dates recompute them from raw, and the late-data
    sensor ask for them: their manifest rows keep their `events` version, with every input
    at `UNVERIFIED`."""
    dates = sorted(set(event_dates))
    read = store.read_version(EVENTS_MANIFEST)
    rows = store.read_arrow(EVENTS_MANIFEST, partitions=dates)
    if not rows.num_rows:  # never absorbed: already asked for, and derived whole
        return
    index = rows.schema.get_field_index("ingest_version")
    unverified = pa.array([UNVERIFIED] * rows.num_rows, rows.schema.field(index).type)
    _replace(
        store,
        EVENTS_MANIFEST,
        rows.set_column(index, "ingest_version", unverified).to_pylist(),
        partitions=sorted(set(rows.column("partition_date").to_pylist())),
        run_id=run_id,
        read_version=read,
    )


@dataclass(frozen=True, kw_only=True)
class SessionsProgress:
    """What one sessions partition has absorbed."""

    events_version: int
    definition: str


def sessions_progress(
    store: DeltaStore, *, partitions: Iterable[date]
) -> dict[date, SessionsProgress]:
    """Per sessions partition ever computed: the events version and definition it absorbed."""
    rows = store.read_arrow(SESSIONS_MANIFEST, partitions=sorted(set(partitions))).to_pylist()
    return {
        row["partition_date"]: SessionsProgress(
            events_version=row["events_version"], definition=row["definition"]
        )
        for row in rows
    }


def session_dates_behind(
    events_manifest: pa.Table, sessions_manifest: pa.Table, *, settings: Settings
) -> dict[date, int]:
    """The sessions dates that have not absorbed the `events` version holding an event date of
    their window (see the module docstring), or were never computed although one has; each
    with that version (-1: not recorded), in date order.

    Read from the two manifests' rows, so it says what is stale whatever happened to earlier
    runs: a sessions run that failed, or died before its manifest commit, leaves its dates
    behind here. A changed session definition is not "behind": the UI shows those dates
    stale by code version, for a backfill.
    """
    # Per event date, the newest events version holding it (-1: not recorded, an old lake).
    held: dict[date, int] = {}
    for row in events_manifest.select(["partition_date", "events_version"]).to_pylist():
        version = -1 if row["events_version"] is None else row["events_version"]
        held[row["partition_date"]] = max(held.get(row["partition_date"], -1), version)
    needed: dict[date, int] = {}
    for event_date, version in held.items():
        for day in session_dates_for([event_date], settings):
            needed[day] = max(needed.get(day, -1), version)
    absorbed = _sessions_absorbed(sessions_manifest)
    return {
        day: version
        for day, version in sorted(needed.items())
        if day >= settings.start_date and (day not in absorbed or absorbed[day] < version)
    }


def _sessions_absorbed(sessions_manifest: pa.Table) -> dict[date, int]:
    """Per sessions partition, the `events` version it absorbed."""
    columns = ["partition_date", "events_version"]
    return {
        row["partition_date"]: row["events_version"]
        for row in sessions_manifest.select(columns).to_pylist()
    }


def record_sessions_progress(
    store: DeltaStore,
    *,
    partitions: Iterable[date],
    progress: SessionsProgress,
    run_id: str,
    read_version: int | None = None,
) -> None:
    now = datetime.now(UTC)
    dates = sorted(set(partitions))
    rows = [
        {
            "partition_date": day,
            "events_version": progress.events_version,
            "definition": progress.definition,
            "run_id": run_id,
            "processed_at": now,
        }
        for day in dates
    ]
    _replace(
        store, SESSIONS_MANIFEST, rows, partitions=dates, run_id=run_id, read_version=read_version
    )


def recompute_session_dates(
    store: DeltaStore, session_dates: Iterable[date], *, run_id: str
) -> None:
    """Make the next sessions run of these dates recompute every user's sessions from `events`,
    and the sensors ask for them: the dates' progress is withdrawn, as if never computed."""
    dates = sorted(set(session_dates))
    _replace(
        store,
        SESSIONS_MANIFEST,
        [],
        partitions=dates,
        run_id=run_id,
        read_version=store.read_version(SESSIONS_MANIFEST),
    )


def _replace(
    store: DeltaStore,
    spec: TableSpec,
    rows: list[dict],
    *,
    partitions: list[date],
    run_id: str,
    read_version: int | None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    if not partitions:
        return
    store.replace_partitions_arrow(
        spec,
        pa.Table.from_pylist(rows, schema=to_arrow_schema(spec.schema)),
        partitions=partitions,
        commit_metadata={"dagster_run_id": run_id, "table": spec.name, **(metadata or {})},
        read_version=read_version,
    )
