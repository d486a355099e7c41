"""The lake's writer lock: one writer at a time, whoever it is, and never held by the dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sessionize_assets.lake.writer_lock import holder_of, lake_writer

HOLD = """
import select, sys
from pathlib import Path
from sessionize_assets.lake.writer_lock import lake_writer
with lake_writer(Path(sys.argv[1]), holder=sys.argv[2], on_wait=print):
    print("held", flush=True)
    select.select([sys.stdin], [], [], float(sys.argv[3]))
"""


def hold_in_another_process(lake: Path, *, holder: str, seconds: float) -> subprocess.Popen:
    """A process that holds the lake's writer lock, once it has it, for `seconds` or until
    `let_go` tells it to."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lake), holder, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def let_go(process: subprocess.Popen) -> None:
    """Tell a process of `hold_in_another_process` to let the lock go now."""
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()


def test_a_writer_waits_for_another_process_and_says_who_holds_the_lake(tmp_path):
    other = hold_in_another_process(tmp_path, holder="run 42 of sessions_job", seconds=1.5)
    assert holder_of(tmp_path).startswith(f"run 42 of sessions_job (pid {other.pid}, since")
    waited: list[str] = []
    started = time.monotonic()
    with lake_writer(tmp_path, holder="me", on_wait=waited.append):
        assert time.monotonic() - started > 0.5
        assert other.poll() is not None  # it let go first
        assert holder_of(tmp_path).startswith(f"me (pid {os.getpid()}, since")
    assert holder_of(tmp_path) is None
    assert len(waited) == 1
    assert waited[0].startswith(f"waiting for the lake {tmp_path}: run 42 of sessions_job")
    assert waited[0].endswith("holds its writer lock")
    other.wait()


def test_a_killed_holder_blocks_nobody(tmp_path):
    other = hold_in_another_process(tmp_path, holder="doomed", seconds=600)
    os.kill(other.pid, signal.SIGKILL)
    other.wait()
    started = time.monotonic()
    with lake_writer(tmp_path, holder="next", on_wait=lambda _: None):
        pass
    assert time.monotonic() - started < 5


def test_reentrant_for_its_thread_and_exclusive_for_other_threads(tmp_path):
    order: list[str] = []
    inside = threading.Event()

    def other_thread() -> None:
        inside.wait()
        with lake_writer(tmp_path, holder="thread", on_wait=lambda m: order.append("waited")):
            order.append("thread")

    thread = threading.Thread(target=other_thread)
    thread.start()
    with lake_writer(tmp_path, holder="outer", on_wait=order.append):
        with lake_writer(tmp_path, holder="inner (a step of the run)", on_wait=order.append):
            inside.set()
            time.sleep(0.5)
            order.append("inner")
        time.sleep(0.3)
        order.append("outer")
    thread.join()
    assert order == ["waited", "inner", "outer", "thread"]
