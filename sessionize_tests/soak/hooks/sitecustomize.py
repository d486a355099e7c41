"""The soak's fault points, in every Python process of the `dagster dev` tree it starts.

Python imports `sitecustomize` at startup from the path; the soak puts this folder first on
the `PYTHONPATH` of `dagster dev`, whose run workers inherit it. With `SESSIONIZE_SOAK_FAULTS`
unset it does nothing. Set to a folder, it wraps the two library calls where a run's work
becomes durable, without replacing any of sessionize's own code:

- delta-rs's `DeltaTable.create_write_transaction`, every commit of the embedded store: the
  points `before-commit:<table>` (Spark has written the files, the log does not name them yet)
  and `after-commit:<table>` (the commit is made, the next one of the step is not);
- delta-rs's `DeltaTable.vacuum`, maintenance's: the point `vacuum:<table>`, where half the
  files the vacuum would delete are deleted first, as a vacuum killed half-way leaves them;
- Dagster's `DagsterInstance.handle_new_event`, through which a run worker writes its events:
  the points `step:<step key>`, a whole step.

A point is armed by a file `<folder>/armed/<point>`. The first process to reach an armed point
renames it to `<folder>/hit/<point>@<pid>` (a rename is atomic: one process wins) and sleeps
there until the soak kills it. A step's point does not pause at the step's start: the soak
kills the worker at a random moment after it (the delay it wrote in the armed file), and a step
that ends first pauses before its end is written (the hook appends `end` to the hit file), so
the kill lands in the step however short it is.

Installing the wrappers imports deltalake and dagster at every process's start: the soak's
tree is Dagster's processes, which import both anyway (the pipeline starts no Spark Python
workers, which would pay it too).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

FAULTS = os.environ.get("SESSIONIZE_SOAK_FAULTS")
FOLDER = Path(FAULTS) if FAULTS else Path()


def _pause_if_armed(point: str) -> None:
    if not _claim(point):
        return
    while True:  # until the soak's SIGKILL
        time.sleep(60)


def _claim(point: str) -> bool:
    """Claim an armed point for this process; whether it was armed."""
    try:
        (FOLDER / "armed" / point).rename(FOLDER / "hit" / f"{point}@{os.getpid()}")
    except FileNotFoundError:
        return False
    return True


def _pause_at_end_if_claimed(point: str) -> None:
    """The end of a claimed step the soak has not killed yet: pause before it is written."""
    hit = FOLDER / "hit" / f"{point}@{os.getpid()}"
    if not hit.exists():
        return
    with hit.open("a") as out:
        out.write(" end")
    while True:  # until the soak's SIGKILL
        time.sleep(60)


def _install_steps() -> None:
    from dagster import DagsterEventType, DagsterInstance

    handle = DagsterInstance.handle_new_event
    ends = {DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE}

    def handle_new_event(self: DagsterInstance, event: Any, *args: Any, **kwargs: Any) -> Any:
        happened = event.dagster_event
        if happened is None or happened.step_key is None:
            return handle(self, event, *args, **kwargs)
        point = f"step:{happened.step_key}"
        if happened.event_type in ends:
            _pause_at_end_if_claimed(point)
        result = handle(self, event, *args, **kwargs)
        if happened.event_type == DagsterEventType.STEP_START:
            _claim(point)  # after STEP_START is written: the step is going
        return result

    DagsterInstance.handle_new_event = handle_new_event  # type: ignore[method-assign,assignment]


def _install() -> None:
    from deltalake import DeltaTable

    commit, vacuum = DeltaTable.create_write_transaction, DeltaTable.vacuum

    def create_write_transaction(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
        table = self.table_uri.rstrip("/").rsplit("/", 1)[-1]
        _pause_if_armed(f"before-commit:{table}")
        result = commit(self, *args, **kwargs)
        _pause_if_armed(f"after-commit:{table}")
        return result

    def vacuum_half_way(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
        table = self.table_uri.rstrip("/").rsplit("/", 1)[-1]
        point = f"vacuum:{table}"
        if (FOLDER / "armed" / point).exists():
            doomed = vacuum(self, *args, **{**kwargs, "dry_run": True})
            root = self.table_uri.removeprefix("file://").rstrip("/")
            for name in doomed[: len(doomed) // 2]:
                Path(root, name).unlink(missing_ok=True)
            _pause_if_armed(point)
        return vacuum(self, *args, **kwargs)

    # The point of the hook: the library's own methods, wrapped in every process of the tree.
    DeltaTable.create_write_transaction = create_write_transaction  # type: ignore[method-assign]
    DeltaTable.vacuum = vacuum_half_way  # type: ignore[method-assign]


if FAULTS:
    _install()
    _install_steps()
