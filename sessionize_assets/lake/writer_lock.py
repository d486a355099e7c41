"""One writer at a time on a lake: the daemon's runs, the UI's and the CLI's take turns.

Dagster's pool `lake` (dagster.yaml) queues the daemon's runs one at a time, but only on an
instance configured with it, and never the runs `sessionize replay` and `sessionize rebuild`
execute in their own process. The commit-time check (`WriteConflictError`) keeps a race from
doubling or losing rows, but the run that loses it fails and is asked for again. With this lock
writers wait for each other instead: every step that writes the lake holds it from its first
read to its last commit, and so does every asset check (its tables must agree with each other
while it reads them). The CLI holds it around each run it executes, so its runs and the
daemon's alternate, and says who it is waiting for.

The lock is a POSIX advisory lock (`flock`) on `<lake>/.writer.lock`. The kernel releases it
when its process ends, `kill -9` included, so a dead holder never blocks anyone. The file holds
one line naming the holder, which a waiter reports. Within a process the lock is re-entrant
for the thread that holds it (the CLI holds it around an in-process run whose steps take it
again); other threads wait as other processes do. It reaches the processes of one machine on
a local lake; a lake on object storage relies on the commit-time check alone.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

WRITER_LOCK_FILE = ".writer.lock"
# While it waits, a writer says who holds the lake at first, then at this interval.
WAIT_REPORT_SECONDS = 30.0
_POLL_SECONDS = 0.2

_held = threading.local()  # per thread: lock file path -> depth
_in_process: dict[str, threading.Lock] = {}
_in_process_guard = threading.Lock()


def holder_of(lake_dir: Path) -> str | None:
    """Who holds the lake's writer lock now (None: nobody), as the holder described itself."""
    path = Path(lake_dir).absolute() / WRITER_LOCK_FILE
    try:
        with path.open("r") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return handle.read().strip() or "another writer"
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
    except FileNotFoundError:
        return None


@contextmanager
def lake_writer(
    lake_dir: Path,
    *,
    holder: str,
    on_wait: Callable[[str], None],
    poll_seconds: float = _POLL_SECONDS,
) -> Iterator[None]:
    """Hold the writer lock of the lake at `lake_dir` for the block, waiting for it if need be.

    `holder` says who takes it (a run, a command); while the lock is someone else's,
    `on_wait` is told who holds it, at once and every `WAIT_REPORT_SECONDS`.
    """
    lake_dir = Path(lake_dir).absolute()
    key = str(lake_dir / WRITER_LOCK_FILE)
    depths: dict[str, int] = _held.__dict__.setdefault("depths", {})
    if depths.get(key):
        depths[key] += 1
        try:
            yield
        finally:
            depths[key] -= 1
        return
    lake_dir.mkdir(parents=True, exist_ok=True)
    with _in_process_guard:
        in_process = _in_process.setdefault(key, threading.Lock())
    handle = _acquire(Path(key), in_process, on_wait=on_wait, poll_seconds=poll_seconds)
    try:
        handle.seek(0)
        handle.truncate()
        since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        handle.write(f"{holder} (pid {os.getpid()}, since {since})\n")
        handle.flush()
        depths[key] = 1
        yield
    finally:
        depths[key] = 0
        handle.seek(0)
        handle.truncate()
        handle.close()  # releases the flock
        in_process.release()


def _acquire(
    path: Path,
    in_process: threading.Lock,
    *,
    on_wait: Callable[[str], None],
    poll_seconds: float,
) -> TextIO:
    """The open lock file, flock-ed, with this process's lock of it held."""
    reported_at: float | None = None
    while True:
        if in_process.acquire(blocking=False):
            handle = path.open("a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return handle
            except BlockingIOError:
                handle.close()
                in_process.release()
        now = time.monotonic()
        if reported_at is None or now - reported_at >= WAIT_REPORT_SECONDS:
            reported_at = now
            held_by = holder_of(path.parent) or "another writer of this process"
            on_wait(f"waiting for the lake {path.parent}: {held_by} holds its writer lock")
        time.sleep(poll_seconds)
