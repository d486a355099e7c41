"""Write the class archive the driver's JVM maps its classes from (`make jvm-archive`).

Java 17 writes a CDS archive of the classes a JVM loaded when it exits with
`-XX:ArchiveClassesAtExit`. This replays a small generated zone with `sessionize replay` (the
production Spark settings, the classes a run loads) with that option, waits until the JVM has
exited and written it, and moves it into place. `spark_config` adds the archive to every driver
JVM that starts afterwards (`class_archive_options`; `SESSIONIZE_JVM_CLASS_ARCHIVE`).

    python -m scripts.jvm_class_archive jars/spark-driver.jsa
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from sessionize_assets.generator import generate_landing_zone
from sessionize_assets.resources.spark import DEFAULT_CONF, DRIVER_OPTIONS

START = date(2026, 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path, help="where the archive goes")
    args = parser.parse_args()
    target: Path = args.archive.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sessionize-jsa-") as folder:
        root = Path(folder)
        generate_landing_zone(
            out=root / "landing", start=START, days=1, users=20, seed=5, late_share=0.1
        )
        written = root / "spark-driver.jsa"
        options = f"{DEFAULT_CONF[DRIVER_OPTIONS]} -XX:ArchiveClassesAtExit={written}"
        env = {
            **os.environ,
            "DAGSTER_HOME": str(root / "dagster_home"),
            "SESSIONIZE_LANDING_DIR": str(root / "landing"),
            "SESSIONIZE_LAKE_DIR": str(root / "lake"),
            "SESSIONIZE_START_DATE": START.isoformat(),
            "SESSIONIZE_MAINTENANCE_CRON": "off",
            "SESSIONIZE_JVM_CLASS_ARCHIVE": "off",
            "SESSIONIZE_SPARK_CONF": f"{DRIVER_OPTIONS}={options}",
        }
        (root / "dagster_home").mkdir()
        sessionize = Path(sys.executable).with_name("sessionize")
        started = time.monotonic()
        # Its own process group: the JVM writes the archive after the replay's Python exits.
        replay = subprocess.Popen(
            [str(sessionize), "replay"],
            env=env,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        output, _ = replay.communicate()
        if replay.returncode != 0:
            print(output[-3000:], file=sys.stderr)
            print(f"the training replay failed ({replay.returncode})", file=sys.stderr)
            return 1
        replayed = time.monotonic()
        _wait_until_group_is_gone(replay.pid, timeout=300.0)
        if not written.is_file():
            print(output[-3000:], file=sys.stderr)
            print(f"the JVM wrote no archive at {written}", file=sys.stderr)
            return 1
        os.replace(written, target)
    size = target.stat().st_size / 2**20
    print(
        f"{target}: {size:.0f} MiB, the replay {replayed - started:.0f} s, "
        f"the JVM's writing {time.monotonic() - replayed:.0f} s"
    )
    return 0


def _wait_until_group_is_gone(pgid: int, *, timeout: float) -> None:
    """Until no process of group `pgid` is left (the JVM writing the archive is one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise TimeoutError(f"process group {pgid} still running after {timeout:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
