"""Where a run can die, named, and how the soak makes a run die there (`hooks/sitecustomize.py`
pauses it; the soak kills it).

Each point is where the lake holds one more durable thing than before and the run has not yet
written the next; a run killed there leaves exactly that. The lake's bookkeeping (the batch
index, the manifests, the corrections log's versions) is what makes the next run finish the
work, and the soak proves it does.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

# Point -> what a run killed there has done and not done.
FAULT_POINTS: dict[str, str] = {
    "before-commit:raw_events": "ingest: Spark wrote the batch's files, the log does not name them",
    "before-commit:events": "events: Spark wrote the new files, the commit is not made",
    "after-commit:events": "between events and identities: events committed, identities not",
    "before-commit:sessions": "sessions: Spark wrote the new files, the commit is not made",
    "after-commit:sessions": "between the sessions commit and its corrections-log entry",
    "after-commit:user_lifecycle_state": "lifecycle: the intervals committed, the snapshot not",
    "vacuum:sessions": "inside maintenance's vacuum: half the files it deletes are gone",
}
# Every asset's step, as its run's step key: the soak kills a worker in each in turn, at the
# point `step:<key>`, a random moment of the step.
STEPS = (
    "ingest_batch",
    "events",
    "identities",
    "sessionize",
    "user_lifecycle",
    "sessions_checks",
    "maintain_tables",
)
# The hook's environment variable: the folder of armed and hit points.
FAULTS_VARIABLE = "SESSIONIZE_SOAK_FAULTS"
HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
_HIT = re.compile(r"(?P<point>.+)@(?P<pid>\d+)")


@dataclass(frozen=True)
class Hit:
    point: str
    pid: int
    # A step's: seconds after its start to kill it, and whether it paused at its end first.
    delay: float = 0.0
    at_end: bool = False


class FaultPoints:
    """The soak's side of the hook: arm a point, see which process reached it, kill it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "armed").mkdir(parents=True, exist_ok=True)
        (folder / "hit").mkdir(parents=True, exist_ok=True)

    def arm(self, point: str, *, delay: float = 0.0) -> None:
        """Arm `point`; a step's is killed `delay` seconds into the step (or at its end)."""
        assert point in FAULT_POINTS or point.removeprefix("step:") in STEPS, point
        (self.folder / "armed" / point).write_text(f"{delay:.2f}")

    def disarm(self, point: str) -> None:
        (self.folder / "armed" / point).unlink(missing_ok=True)

    def hits(self) -> list[Hit]:
        """The processes paused at a point, not yet killed."""
        found = []
        for path in (self.folder / "hit").iterdir():
            match = _HIT.fullmatch(path.name)
            if match is None:
                continue
            try:
                delay, *end = path.read_text().split()
            except (FileNotFoundError, ValueError):  # killed meanwhile
                continue
            point, pid = match["point"], int(match["pid"])
            found.append(Hit(point=point, pid=pid, delay=float(delay), at_end=bool(end)))
        return found

    def armed(self) -> list[str]:
        """The points armed and not reached yet."""
        return sorted(path.name for path in (self.folder / "armed").iterdir())

    def kill(self, hit: Hit) -> bool:
        """SIGKILL the run worker at the point; False when it was gone already (a restart
        killed it first). The hit is removed after the kill: a step's worker could otherwise
        write its end marker into a new file."""
        try:
            os.kill(hit.pid, signal.SIGKILL)
            killed = True
        except ProcessLookupError:
            killed = False
        (self.folder / "hit" / f"{hit.point}@{hit.pid}").unlink(missing_ok=True)
        return killed
