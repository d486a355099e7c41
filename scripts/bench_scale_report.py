"""The scale benchmark's figures of a batch, and its report: the tables it prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bench_printing import table

from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    SESSIONS_JOB,
)
from sessionize_assets.replay.results import JOB_REPORTERS

STEPS = (("ingest", INGEST_JOB), ("events", EVENTS_JOB), ("sessions", SESSIONS_JOB))
SNAPSHOT = ("snapshot", LIFECYCLE_JOB)


@dataclass(kw_only=True)
class BatchFigures:
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

    def value(self, asset: str, key: str) -> int:
        return int(self.metadata.get(asset, {}).get(key, 0) or 0)


def report(
    figures: list[BatchFigures],
    recompute: dict[str, dict[str, float]],
    *,
    histories: list[int],
    users: int,
) -> None:
    print()
    print(f"machine: {os.cpu_count()} cores; {users:,} users; histories {histories} days")
    for shape, full in recompute.items():
        print(
            f"[{shape}] lake after {histories[-1] + 1} days: {full['events']:,.0f} events, "
            f"{full['sessions']:,.0f} sessions; user_lifecycle_state {full['state_rows']:,.0f} "
            f"interval rows, against {full['user_days']:,.0f} user-days "
            f"({full['state_rows'] / max(full['user_days'], 1):.1%})"
        )
    print()
    print("(a) full recompute and (b) floor, seconds: (b) sessions from events, (b2) from raw")
    print(
        table(
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
    )
    print()
    print("(c) one daily batch end to end through the Dagster definitions, seconds")
    rows = []
    for f in figures:
        rebuild = recompute[f.shape]["rebuild"]
        base = next(g for g in figures if g.shape == f.shape and g.history == histories[0])
        rows.append(
            [
                f.shape,
                str(f.history),
                *(f"{f.step(name):.1f}" for name, _ in (*STEPS, SNAPSHOT)),
                f"{f.pipeline:.1f}",
                f"{100 * f.pipeline / rebuild:.1f}%",
                f"{f.pipeline / base.pipeline:.2f}",
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
            ]
        )
    print(
        table(
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
    )
    print()
    print("(c2) Spark jobs the batch's runs started, per step (each action is one)")
    print(
        table(
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
    )
    print()
    print("(d) rows read and written by the batch, per table")
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
    print(
        table(
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
    )
    print()
    print("(f) the lifecycle step: users restated and changed, rows written against the bound")
    print("    bound = 3 x (users whose state changed + 5 x snapshot days written)")
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
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
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
    print(
        table(
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
    )
    print()
    print("(e) peak driver memory, MB")
    print(
        table(
            ["backend:shape", "python driver", "JVM (driver + local executors)"],
            [
                [shape, f"{full['peak_python_mb']:.0f}", f"{full['peak_jvm_mb']:.0f}"]
                for shape, full in recompute.items()
            ],
        )
    )


# -- helpers ---------------------------------------------------------------------------------


def _looked_up(f: BatchFigures, asset: str, keys: str, dates: str) -> str:
    """Keys pushed down to Parquet, and over how many dates."""
    return f"{f.value(asset, keys):,} in {f.value(asset, dates)}d"
