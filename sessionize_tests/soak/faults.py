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
# The hook's environment variable: the folder of armed and hit points.
FAULTS_VARIABLE = "SESSIONIZE_SOAK_FAULTS"
HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
_HIT = re.compile(r"(?P<point>.+)@(?P<pid>\d+)")


@dataclass(frozen=True)
class Hit:
    point: str
    pid: int


class FaultPoints:
    """The soak's side of the hook: arm a point, see which process reached it, kill it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "armed").mkdir(parents=True, exist_ok=True)
        (folder / "hit").mkdir(parents=True, exist_ok=True)

    def arm(self, point: str) -> None:
        assert point in FAULT_POINTS, point
        (self.folder / "armed" / point).touch()

    def disarm(self, point: str) -> None:
        (self.folder / "armed" / point).unlink(missing_ok=True)

    def hits(self) -> list[Hit]:
        """The processes paused at a point, not yet killed."""
        found = []
        for path in (self.folder / "hit").iterdir():
            match = _HIT.fullmatch(path.name)
            if match is not None:
                found.append(Hit(point=match["point"], pid=int(match["pid"])))
        return found

    def armed(self) -> list[str]:
        """The points armed and not reached yet."""
        return sorted(path.name for path in (self.folder / "armed").iterdir())

    def kill(self, hit: Hit) -> bool:
        """SIGKILL the paused run worker; False when it was gone already (a restart killed
        it first)."""
        (self.folder / "hit" / f"{hit.point}@{hit.pid}").unlink(missing_ok=True)
        try:
            os.kill(hit.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True
