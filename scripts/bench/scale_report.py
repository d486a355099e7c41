"""What the scale benchmark measured, and its tables.

The figures of one daily batch come back from the Dagster instance: each step's run wall, and
the metadata its materializations carry (what each step read and wrote, summed over the
partitions). `report` prints them with the full recompute and the floors, one table a question:
(a)/(b) the recompute against the floors, (c) the batch by step, (c2) its Spark jobs, (d) its rows
read and written, (f) the lifecycle's rows against their bound, (e) peak memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from dagster import DagsterInstance, RunsFilter

from scripts.bench.printing import print_table
from sessionize_assets.definitions import EVENTS_JOB, INGEST_JOB, LIFECYCLE_JOB, SESSIONS_JOB
from sessionize_assets.replay import JOB_REPORTERS, REPLAY_BATCH_TAG

STEPS = (("ingest", INGEST_JOB), ("events", EVENTS_JOB), ("sessions", SESSIONS_JOB))
SNAPSHOT = ("snapshot", LIFECYCLE_JOB)


@dataclass(kw_only=True)
class BatchFigures:
    """One daily batch at one history length: each step's seconds and its assets' metadata."""

    shape: str
    history: int
    seconds: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)

    def step(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def pipeline(self) -> float:
        """ingest + events + sessions: what the per-batch targets are about."""
        return sum(self.step(name) for name, _ in STEPS)

    @property
    def snapshot_ratio(self) -> float:
        """The snapshot step's seconds over the events and sessions steps' (snap/(e+s))."""
        return self.step("snapshot") / max(self.step("events") + self.step("sessions"), 1e-9)

    def value(self, asset: str, key: str) -> int:
        return int(self.metadata.get(asset, {}).get(key, 0) or 0)


def report(
    figures: list[BatchFigures],
    recompute: dict[str, dict[str, float]],
    *,
    histories: list[int],
    users: int,
) -> None:
    """Print the machine, the lakes' sizes and the tables (a) to (f)."""
    print()
    print(f"machine: {os.cpu_count()} cores; {users:,} users; histories {histories} days")
    for shape, full in recompute.items():
        print(
            f"[{shape}] lake after {histories[-1] + 1} days: {full['events']:,.0f} events, "
            f"{full['sessions']:,.0f} sessions; user_lifecycle_state {full['state_rows']:,.0f} "
            f"interval rows, against {full['user_days']:,.0f} user-days "
            f"({full['state_rows'] / max(full['user_days'], 1):.1%})"
        )
    _recompute_table(recompute)
    _batch_table(figures, recompute, histories=histories)
    _jobs_table(figures)
    _rows_table(figures)
    _lifecycle_table(figures)
    _memory_table(recompute)


def _recompute_table(recompute: dict[str, dict[str, float]]) -> None:
    """(a) and (b): the full recompute and the sessions-only rebuild against their floors."""
    print_table(
        "(a) full recompute and (b) floor, seconds: (b) sessions from events, (b2) from raw",
        [
            "backend:shape",
            "rebuild events",
            "rebuild sessions",
            "(a) rebuild",
            "(b2) raw floor",
            "(a)/(b2)",
            "(a2) sessions only",
            "(b) floor",
            "(a2)/(b)",
        ],
        [
            [
                shape,
                f"{full.get('events_step', 0):.1f}",
                f"{full.get('sessionize_step', 0):.1f}",
                f"{full['rebuild']:.1f}",
                f"{full['raw_floor']:.1f}",
                f"{full['rebuild'] / full['raw_floor']:.2f}",
                f"{full['sessions_rebuild']:.1f}",
                f"{full['floor']:.1f}",
                f"{full['sessions_rebuild'] / full['floor']:.2f}",
            ]
            for shape, full in recompute.items()
        ],
    )


def _batch_table(
    figures: list[BatchFigures], recompute: dict[str, dict[str, float]], *, histories: list[int]
) -> None:
    """(c): each step's seconds, the batch against the full recompute and the first history."""
    rows = []
    for f in figures:
        full = recompute[f.shape]["rebuild"]
        base = next(g for g in figures if g.shape == f.shape and g.history == histories[0])
        rows.append(
            [
                f.shape,
                str(f.history),
                *(f"{f.step(name):.1f}" for name, _ in (*STEPS, SNAPSHOT)),
                f"{f.pipeline:.1f}",
                f"{100 * f.pipeline / full:.1f}%",
                f"{f.pipeline / base.pipeline:.2f}",
                f"{f.snapshot_ratio:.2f}",
            ]
        )
    print_table(
        "(c) one daily batch end to end through the Dagster definitions, seconds",
        [
            "backend:shape",
            "history",
            "ingest",
            "events",
            "sessions",
            "snapshot",
            "i+e+s",
            "of (a)",
            f"vs {histories[0]}d",
            "snap/(e+s)",
        ],
        rows,
    )


def _jobs_table(figures: list[BatchFigures]) -> None:
    """(c2): the Spark jobs each step's run reported."""
    print_table(
        "(c2) Spark jobs the batch's runs started, per step (each action is one)",
        [
            "backend:shape",
            "history",
            "ingest",
            "events",
            "identities",
            "sessions",
            "snapshot",
            "i+e+id+s",
        ],
        [
            [
                f.shape,
                str(f.history),
                *(str(f.value(asset, "run_spark_jobs")) for asset in JOB_REPORTERS),
                str(sum(f.value(asset, "run_spark_jobs") for asset in JOB_REPORTERS[:-1])),
            ]
            for f in figures
        ],
    )


def _rows_table(figures: list[BatchFigures]) -> None:
    """(d): what the events and sessions steps read and wrote, against what changed."""
    rows = []
    for f in figures:
        new_events = f.value("events", "run_new_events")
        changed = sum(
            f.value("sessions", k)
            for k in ("sessions_inserted", "sessions_removed", "sessions_replaced")
        )
        written = f.value("events", "run_rows_written") + f.value("sessions", "run_rows_written")
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.value('raw_events', 'accepted'):,}",
                f"{f.value('events', 'run_raw_rows_read'):,}",
                f"{f.value('events', 'run_contested_ids'):,}",
                f"{f.value('events', 'run_dates_also_changed')}",
                f"{new_events:,}",
                f"{f.value('events', 'run_rows_written'):,}",
                f"{f.value('events', 'run_files_removed')}",
                _looked_up(f, "sessions", "run_users_looked_up", "run_dates_searched_by_user"),
                f"{f.value('sessions', 'run_events_rows_scanned'):,}",
                f"{f.value('sessions', 'run_events_read'):,}",
                f"{f.value('sessions', 'run_pairs_recomputed'):,}",
                f"{changed:,}",
                f"{f.value('sessions', 'run_rows_written'):,}",
                f"{f.value('sessions', 'run_files_rewritten')}/"
                f"{f.value('sessions', 'run_files_before')}",
                f"{written / max(new_events + changed, 1):.2f}",
            ]
        )
    print_table(
        "(d) rows read and written by the batch, per table",
        [
            "backend:shape",
            "history",
            "batch events",
            "raw read",
            "contested ids",
            "other dates changed",
            "new events",
            "events written",
            "events files rewr.",
            "sessions: users looked up",
            "events rows scanned",
            "events read",
            "pairs",
            "sessions changed",
            "sessions written",
            "sessions files rewr.",
            "written/(new+changed)",
        ],
        rows,
    )


def _lifecycle_table(figures: list[BatchFigures]) -> None:
    """(f): the lifecycle step's rows written against its bound."""
    rows = []
    for f in figures:
        state = "user_lifecycle_state"
        days = f.value(state, "run_snapshot_days_written")
        changed_users = f.value(state, "run_users_changed")
        logical = f.value(state, "run_interval_rows_added") + 5 * days
        physical = f.value(state, "run_interval_rows_written") + 5 * days
        bound = 3 * (changed_users + 5 * days)
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.step('snapshot'):.1f}",
                f"{f.snapshot_ratio:.2f}",
                f"{days}",
                f"{f.value(state, 'run_users_restated'):,}",
                f"{changed_users:,}",
                f"{f.value(state, 'run_interval_rows_removed'):,}",
                f"{f.value(state, 'run_interval_rows_added'):,}",
                f"{logical:,}",
                f"{bound:,}",
                f"{logical / max(bound, 1):.2f}",
                f"{physical:,}",
                f"{f.value(state, 'run_interval_files_rewritten')}",
                f"{f.value(state, 'run_interval_rows'):,}",
            ]
        )
    print_table(
        "(f) the lifecycle step: users restated and changed, rows written against the bound\n"
        "    bound = 3 x (users whose state changed + 5 x snapshot days written)",
        [
            "backend:shape",
            "history",
            "snapshot s",
            "snap/(e+s)",
            "days written",
            "users restated",
            "users changed",
            "intervals removed",
            "intervals added",
            "rows written",
            "bound",
            "written/bound",
            "rows in files written",
            "interval files rewr.",
            "interval rows",
        ],
        rows,
    )


def _memory_table(recompute: dict[str, dict[str, float]]) -> None:
    """(e): the driver's peak memory, Python's and the JVM's."""
    print_table(
        "(e) peak driver memory, MB",
        ["backend:shape", "python driver", "JVM (driver + local executors)"],
        [
            [shape, f"{full['peak_python_mb']:.0f}", f"{full['peak_jvm_mb']:.0f}"]
            for shape, full in recompute.items()
        ],
    )


def _looked_up(f: BatchFigures, asset: str, keys: str, dates: str) -> str:
    """Keys pushed down to Parquet, and over how many dates."""
    return f"{f.value(asset, keys):,} in {f.value(asset, dates)}d"


def batch_figures(
    instance: DagsterInstance, received: date, *, shape: str, history: int
) -> BatchFigures:
    """The figures of the batch received on `received`, from the runs replay tagged with it."""
    figures = BatchFigures(shape=shape, history=history)
    runs = instance.get_runs(RunsFilter(tags={REPLAY_BATCH_TAG: received.isoformat()}))
    names = {job: name for name, job in (*STEPS, SNAPSHOT)}
    for run in runs:
        stats = instance.get_run_stats(run.run_id)
        name = names[run.job_name]
        figures.seconds[name] = figures.seconds.get(name, 0.0) + (
            (stats.end_time or 0) - (stats.start_time or 0)
        )
        for record in instance.get_records_for_run(run.run_id).records:
            event = record.event_log_entry.dagster_event
            if event is None or not event.is_step_materialization:
                continue
            # Each partition carries its own figures, and a range run's `run_*` figures are on
            # one partition only: summing over the materializations counts everything once.
            materialization = event.step_materialization_data.materialization
            key = materialization.asset_key.to_user_string()
            values = {k: v.value for k, v in materialization.metadata.items()}
            merged = figures.metadata.setdefault(key, {})
            for k, v in values.items():
                if isinstance(v, int | float) and isinstance(merged.get(k), int | float):
                    merged[k] += v
                else:
                    merged.setdefault(k, v)
    return figures


def step_seconds(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    """A run's steps' seconds (`<step>_step`) and the whole run's (`rebuild`)."""
    seconds = {
        f"{step.step_key}_step": (step.end_time or 0) - (step.start_time or 0)
        for step in instance.get_run_step_stats(run_id)
    }
    stats = instance.get_run_stats(run_id)
    seconds["rebuild"] = (stats.end_time or 0) - (stats.start_time or 0)
    return seconds
