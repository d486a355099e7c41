"""Screenshot the Dagster UI's asset graph with headless Chromium, against a real `dagster dev`.

Usage (after `make demo`, so the graph has history):
    .venv/bin/python scripts/screenshot_ui.py --out /tmp/sessionize-assets.png

It starts `dagster dev` on a free loopback port with the demo's DAGSTER_HOME, landing zone and
lake, waits for the webserver and daemons, then drives headless Chromium over the DevTools
protocol: load each page, wait for its data, click a toggle where the view needs one (the
snapshot's metadata Plots), save the PNG. It then stops the servers. The images are artifacts:
they are not committed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessionize_tests.dev_server import DagsterDev

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass(frozen=True)
class Page:
    path: str  # {day} is the demo's last day, yesterday (UTC)
    ready: str  # text the page shows once its data has loaded
    click: str | None = None  # then the button with this text is clicked, as a user would
    height: int = 1000


PAGES = {
    # The lineage around sessions, four steps each way: raw -> events -> sessions -> lifecycle,
    # with every asset drawn (the global graph starts with its groups collapsed). Ready once
    # the graph draws raw_events: long names are drawn shortened ("user_lif…_snapshot").
    "graph": Page(
        "/assets/sessions?view=lineage&lineageScope=neighbors&lineageDepth=4",
        ready="raw_events",
    ),
    "groups": Page("/asset-groups", ready="sessions"),
    "assets": Page("/assets", ready="sessions"),
    "partitions": Page("/assets/sessions?view=partitions", ready="Materialized"),
    "partition": Page("/assets/sessions?view=partitions&partition={day}", ready="row_count"),
    # The overview's metadata section, switched from Table to Plots: one point per partition.
    "plots": Page(
        "/assets/user_lifecycle_snapshot?view=overview",
        ready="users_new",
        click="Plots",
        height=2400,
    ),
    # SPEC §9's daily figures: yesterday's partition (its figures, status and expected
    # completeness), the figures plotted over the dates, the freshness check's latest result,
    # and the grace period in the arrivals' metadata.
    "daily_partition": Page(
        "/assets/daily_sessions?view=partitions&partition={day}", ready="expected_completeness"
    ),
    "daily_plots": Page(
        "/assets/daily_sessions?view=overview",
        ready="expected_completeness",
        click="Plots",
        height=2400,
    ),
    "freshness": Page("/assets/daily_sessions?view=checks", ready="freshness_check"),
    "arrivals": Page("/assets/arrivals?view=overview", ready="grace_period_days", height=1400),
    "sensors": Page("/automation", ready="landing_sensor"),
    "landing_sensor": Page("/locations/sessionize/sensors/landing_sensor", ready="runs requested"),
    # The runs the landing sensor launched (its Runs view).
    "landing_runs": Page(
        "/locations/sessionize/sensors/landing_sensor", ready="runs requested", click="Runs"
    ),
    "runs": Page("/runs", ready="ingest_batch_job"),
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


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4, JSON
    messages ended by NUL): enough to load a page, click a button and take a screenshot,
    with nothing but the standard library."""

    def __init__(self, browser: str, profile: str) -> None:
        to_browser, self._commands = os.pipe()
        self._responses, from_browser = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol's fds 3 and 4
            high_in, high_out = os.dup(to_browser), os.dup(from_browser)
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)
            for fd in {to_browser, from_browser, high_in, high_out} - {3, 4}:
                os.close(fd)

        self._process = subprocess.Popen(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            # The fds the child wires to 3 and 4 must survive exec: no fd closing after it.
            close_fds=False,
            preexec_fn=wire_pipes,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._responses, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the protocol pipe during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:  # events (no id) are not needed here
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # the pipe may close first
            self.call("Browser.close")
        self._process.wait(timeout=30)
        os.close(self._commands)
        os.close(self._responses)


def screenshot(*, browser: str, url: str, page: Page, out: Path, width: int, wait_ms: int) -> None:
    """Load `url`, wait for the page's data, click its button if it has one, save a PNG."""
    with tempfile.TemporaryDirectory(prefix="sessionize-chromium-") as profile:
        chromium = Chromium(browser, profile)
        try:
            target = chromium.call("Target.createTarget", url="about:blank")["targetId"]
            session = chromium.call("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            chromium.call(
                "Emulation.setDeviceMetricsOverride",
                session,
                width=width,
                height=page.height,
                deviceScaleFactor=1,
                mobile=False,
            )
            chromium.call("Page.navigate", session, url=url)
            _wait_for(chromium, session, f"document.body.innerText.includes({page.ready!r})", url)
            if page.click:
                clicked = _evaluate(
                    chromium,
                    session,
                    "(() => { const b = [...document.querySelectorAll('button')]"
                    f".find(e => e.textContent.trim() === {page.click!r});"
                    " if (b) { b.click(); return true; } return false; })()",
                )
                if not clicked:
                    sys.exit(f"error: no button {page.click!r} on {url}")
            time.sleep(wait_ms / 1000)  # let the charts and lists finish drawing
            data = chromium.call("Page.captureScreenshot", session, format="png")["data"]
        finally:
            chromium.close()
    out.write_bytes(base64.b64decode(data))


def _evaluate(chromium: Chromium, session: str, expression: str) -> Any:
    result = chromium.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
    return result.get("result", {}).get("value")


def _wait_for(chromium: Chromium, session: str, condition: str, url: str) -> None:
    deadline = time.monotonic() + 60
    while not _evaluate(chromium, session, f"!!document.body && {condition}"):
        if time.monotonic() > deadline:
            sys.exit(f"error: {url} did not show its data within 60 s ({condition})")
        time.sleep(0.5)


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
    parser.add_argument(
        "--wait-ms", type=int, default=3_000, help="after the data shows, before the shot"
    )
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
            url = server.url + PAGES[page].path.format(day=day)
            target = out if len(pages) == 1 else out.with_name(f"{out.stem}-{page}{out.suffix}")
            print(f"rendering {url}")
            screenshot(
                browser=browser,
                url=url,
                page=PAGES[page],
                out=target,
                width=args.width,
                wait_ms=args.wait_ms,
            )
            print(f"wrote {target} ({target.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
