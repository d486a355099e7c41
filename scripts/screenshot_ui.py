"""Screenshot the Dagster UI's asset graph with headless Chromium, against a real `dagster dev`.

Usage (after `make demo`, so the graph has history):
    .venv/bin/python scripts/screenshot_ui.py --out /tmp/sessionize-assets.png

It starts `dagster dev` on a free loopback port with the demo's DAGSTER_HOME, landing zone and
lake, waits for the webserver and daemons, lets Chromium render the page, then stops the
servers. The image is an artifact: it is not committed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sessionize_assets.dev_server import DagsterDev

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# {day} is the demo's last day, yesterday (UTC).
PAGES = {
    # The lineage around sessions, four steps each way: raw -> events -> sessions -> lifecycle,
    # with every asset drawn (the global graph starts with its groups collapsed).
    "graph": "/assets/sessions?view=lineage&lineageScope=neighbors&lineageDepth=4",
    "groups": "/asset-groups",
    "assets": "/assets",
    "partitions": "/assets/sessions?view=partitions",
    "partition": "/assets/sessions?view=partitions&partition={day}",
    "plots": "/assets/user_lifecycle_snapshot?view=plots",
    "sensors": "/automation",
    "landing_sensor": "/locations/sessionize/sensors/landing_sensor",
    "runs": "/runs",
}


def find_browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    sys.exit(
        "error: no Chromium found; install it (e.g. 'apt-get install chromium') or use "
        "'make screenshot', which does"
    )


def screenshot(*, browser: str, url: str, out: Path, width: int, height: int, wait_ms: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sessionize-chromium-") as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            # Virtual time lets the single-page app fetch and lay out the graph before the shot.
            f"--virtual-time-budget={wait_ms}",
            f"--screenshot={out}",
            url,
        ]
        subprocess.run(command, check=True, capture_output=True, timeout=180)
    if not out.exists() or out.stat().st_size == 0:
        sys.exit(f"error: Chromium wrote no screenshot to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "sessionize.png",
        help="the PNG; with several pages, PAGE is added to its name (sessionize-PAGE.png)",
    )
    parser.add_argument(
        "--page", choices=sorted(PAGES), action="append", help="repeat for several (one server)"
    )
    parser.add_argument("--dagster-home", type=Path, default=ROOT / ".dagster_home")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--wait-ms", type=int, default=20_000)
    args = parser.parse_args()

    browser = find_browser()
    env = {
        "SESSIONIZE_LANDING_DIR": os.environ.get(
            "SESSIONIZE_LANDING_DIR", str(ROOT / "data" / "landing")
        ),
        "SESSIONIZE_LAKE_DIR": os.environ.get("SESSIONIZE_LAKE_DIR", str(ROOT / "data" / "lake")),
    }
    pages = args.page or ["graph"]
    out = args.out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    day = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    with (
        tempfile.TemporaryDirectory(prefix="sessionize-ui-") as workdir,
        DagsterDev(workdir=Path(workdir), dagster_home=args.dagster_home, env=env) as server,
    ):
        # Dismiss the one-off community dialog the UI shows on loopback, as a click would.
        server.graphql("mutation { setNuxSeen }")
        for page in pages:
            url = server.url + PAGES[page].format(day=day)
            target = out if len(pages) == 1 else out.with_name(f"{out.stem}-{page}{out.suffix}")
            print(f"rendering {url}")
            screenshot(
                browser=browser,
                url=url,
                out=target,
                width=args.width,
                height=args.height,
                wait_ms=args.wait_ms,
            )
            print(f"wrote {target} ({target.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
