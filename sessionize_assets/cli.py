"""`sessionize`: generate a landing zone, replay it through the Dagster definitions, rebuild."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from datetime import date
from pathlib import Path

from sessionize_assets.settings import Settings
from sessionize_assets.workspace import (
    CODE_LOCATION,
    DEFINITIONS_MODULE,
    code_server_workspace_yaml,
)


def _generate(args: argparse.Namespace) -> int:
    from sessionize_assets.generator import ZoneSpec, append_day, generate_landing_zone

    settings = Settings.from_env()
    zone = ZoneSpec(
        out=Path(args.out),
        start=args.start,
        users=args.users,
        seed=args.seed,
        late_share=args.late_share,
        late_shape=args.late_shape,
        bot_share=args.bot_share,
        duplicate_share=args.duplicate_share,
        invalid_share=args.invalid_share,
        gzip_share=args.gzip_share,
        pipeline_start=args.pipeline_start or settings.start_date,
    )
    report = append_day(zone) if args.append_day else generate_landing_zone(zone, days=args.days)
    print(report.summary())
    if args.start < settings.start_date:
        print(
            f"note: events before the pipeline start date {settings.start_date} will be "
            "rejected as before_start (set SESSIONIZE_START_DATE to change it)"
        )
    return 0


def _replay(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from sessionize_assets.replay.command import replay

    _quiet_dagster()

    settings = Settings.from_env()
    if args.landing:
        settings = settings.with_overrides(landing_dir=Path(args.landing))
    _default_dagster_home()
    # The instance first: it creates a new home's SQLite databases before the code server opens
    # the same home (two processes creating them at once can stamp a schema twice, which
    # Dagster then refuses to read: a replay over Spark Connect, with no JVM to start, hit it).
    with DagsterInstance.get() as instance, _code_server() as server:
        _start_spark_quietly(settings)
        summary = replay(settings=settings, instance=instance, echo=print, at_once=args.at_once)
        _hand_over_cursors(summary.sensor_cursors, server)
    return 0 if summary.ok else 1


def _rebuild(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from sessionize_assets.rebuild import rebuild

    _quiet_dagster()
    _default_dagster_home()
    settings = Settings.from_env()
    _start_spark_quietly(settings)
    with DagsterInstance.get() as instance:
        ok = rebuild(
            settings=settings,
            instance=instance,
            first=args.first,
            last=args.last,
            sessions_only=args.sessions_only,
        )
    return 0 if ok else 1


def _forget(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from sessionize_assets.forget import forget

    _quiet_dagster()
    _default_dagster_home()
    settings = Settings.from_env()
    _start_spark_quietly(settings)
    with DagsterInstance.get() as instance:
        ok = forget(settings=settings, instance=instance, keys=args.keys)
    return 0 if ok else 1


def _daily(args: argparse.Namespace) -> int:
    from sessionize_assets.definitions import build_resources
    from sessionize_assets.pipeline.daily import current_grace_period, latest_days

    settings = Settings.from_env()
    store = build_resources(settings, spark_ui=False)["lake"].store()
    grace = current_grace_period(store, settings)
    if grace is None:
        print("no batch ingested yet")
        return 0
    rows = latest_days(store, days=args.days)
    print(
        f"daily_sessions, the last {len(rows)} days (R = {grace.latest_received}, grace period "
        f"{grace.days} days, learned from {grace.reference_events} events of "
        f"{grace.first_reference}..{grace.last_reference}):"
    )
    print(f"{'date':<10}  {'sessions':>8}  {'users':>6}  {'conversions':>11}  status")
    for row in rows:
        print(
            f"{row['session_date']!s:<10}  {row['sessions']:>8}  {row['users']:>6}  "
            f"{row['conversions']:>11}  {row['status']} "
            f"({row['expected_completeness']:.1%} of its events expected in)"
        )
    return 0


def _spark_server(args: argparse.Namespace) -> int:
    from sessionize_assets.spark_server import running_server

    settings = Settings.from_env()
    with stopped_by_sigterm(), running_server(settings, log_path=None) as address:
        print(f"Spark Connect server up: SESSIONIZE_SPARK_MASTER={address}", flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()  # until SIGINT, or SIGTERM (`stopped_by_sigterm`)
    return 0


def _dev(args: argparse.Namespace) -> int:
    """`dagster dev` with its runs on a warm Spark Connect server, started before it and
    stopped after it (`spark_server.py`). With another master set, or the delta-spark backend
    (no Delta Connect server for Delta 4.0 on Maven Central), `dagster dev` alone."""
    from sessionize_assets.spark_server import running_server, serves

    settings = Settings.from_env()
    dagster = [str(Path(sys.executable).with_name("dagster")), "dev", *args.dagster_args]
    reason = "dagster dev --help" if "--help" in args.dagster_args else serves(settings)
    with stopped_by_sigterm(), ExitStack() as stack:
        env = dict(os.environ)
        if reason is None:
            _default_dagster_home()
            log = Path(os.environ["DAGSTER_HOME"]) / "spark-server.log"
            print(f"Starting a Spark Connect server for the runs (its output: {log})", flush=True)
            address = stack.enter_context(running_server(settings, log_path=log))
            env["SESSIONIZE_SPARK_MASTER"] = address
            print(f"Spark Connect server up: the runs use {address}", flush=True)
        else:
            print(f"No Spark Connect server: {reason}", flush=True)
        process = subprocess.Popen(dagster, env=env)
        try:
            return process.wait()
        except (KeyboardInterrupt, SystemExit):
            # dagster dev shares the terminal's SIGINT; a SIGTERM is passed on to it.
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            return process.wait()


def _serve(args: argparse.Namespace) -> int:
    """The deployment's supervisor in the foreground (`deployment/serve.py`), or `--status`,
    `--stop` of a running one."""
    from sessionize_assets.deployment.serve import control, prepare, supervisord_command
    from sessionize_assets.settings import DeploymentSettings

    deployment = DeploymentSettings.from_env()
    if args.status or args.stop:
        return control(deployment, ["status"] if args.status else ["shutdown"])
    prepared = prepare(
        settings=Settings.from_env(),
        deployment=deployment,
        instance_settings=Path(args.instance),
        working_dir=Path.cwd(),
        environ=os.environ,
    )
    url = f"http://{deployment.webserver_host}:{deployment.webserver_port}"
    print(
        f"Serving {', '.join(prepared.programs)} under supervisord ({prepared.conf}); the UI at "
        f"{url}; logs in {prepared.conf.parent / 'logs'}; stop with Ctrl-C or "
        "`sessionize serve --stop`",
        flush=True,
    )
    command = supervisord_command(prepared)
    os.execve(command[0], command, dict(prepared.environment))


def _after_postgres(args: argparse.Namespace) -> int:
    from sessionize_assets.deployment.serve import exec_after_postgres

    command = args.dagster_args[1:] if args.dagster_args[:1] == ["--"] else args.dagster_args
    exec_after_postgres(command, environ=os.environ)
    return 0  # not reached: the process became the command


@contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM ends the block as Ctrl-C does, so its servers are stopped on the way out."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quiet_dagster() -> None:
    """Progress lines are the output; Dagster's own notices stay in the runs' logs."""
    from dagster import BetaWarning

    warnings.filterwarnings("ignore", category=BetaWarning)
    logging.getLogger("dagster").setLevel(logging.WARNING)


def _start_spark_quietly(settings: Settings) -> None:
    """Start the Spark session the runs will share, with the JVM's own output (log4j notices,
    JDK warnings, Python worker errors) going to a file in DAGSTER_HOME: the command's output
    is its progress lines. The runs' logs stay in the Dagster instance."""
    from sessionize_assets.definitions import build_resources

    log = Path(os.environ["DAGSTER_HOME"]) / "spark-driver.log"
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 2)  # the JVM inherits it when it is launched, below
        try:
            build_resources(settings)["spark"].session()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    print(f"Spark started ({settings.spark_master}); its own output goes to {log}")


def _default_dagster_home() -> None:
    """The run history lives there, so `dagster dev` on the same folder shows the runs."""
    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = str(Path(".dagster_home").absolute())
        print(f"DAGSTER_HOME not set: using {os.environ['DAGSTER_HOME']}")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)


@contextmanager
def _code_server() -> Iterator[_CodeServer]:
    """A code server of the definitions, named as `workspace.yaml` names the location, on a
    socket in a private folder (`_CodeServer.workspace()` waits for it).

    Started before the replay, it loads the definitions while the batches run; the commands
    that hand the cursors over then load no code (each `dagster sensor` command loading the
    definitions itself starts a code server of its own: 13 s of a one-batch replay). It holds
    nothing, and is killed at the end.
    """
    dagster = str(Path(sys.executable).with_name("dagster"))
    with tempfile.TemporaryDirectory(prefix="sessionize-") as folder:
        socket = Path(folder) / "code.sock"
        workspace = Path(folder) / "workspace.yaml"
        workspace.write_text(code_server_workspace_yaml(socket))
        # Its output goes to a file: a pipe nobody reads while the batches run could fill up.
        log = Path(folder) / "code-server.log"
        with log.open("w") as output:
            server = subprocess.Popen(
                [dagster, "api", "grpc", "--module-name", DEFINITIONS_MODULE]
                + ["--location-name", CODE_LOCATION, "--socket", str(socket)],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            yield _CodeServer(server, socket, workspace, log)
        finally:
            server.kill()
            server.wait()


class _CodeServer:
    """A started code server: `workspace()` waits until it listens (it binds its socket once
    the definitions are loaded) and returns the workspace file, or what went wrong."""

    def __init__(
        self, server: subprocess.Popen[bytes], socket: Path, workspace: Path, log: Path
    ) -> None:
        self._server, self._socket, self._workspace, self._log = server, socket, workspace, log

    def workspace(self, *, timeout: float = 120.0) -> Path | str:
        deadline = time.monotonic() + timeout
        while not self._socket.exists():
            if self._server.poll() is not None:
                output = self._log.read_text(errors="replace")[-500:]
                return f"its code server exited ({self._server.returncode}): {output}"
            if time.monotonic() > deadline:
                return f"its code server did not listen within {timeout:.0f} s"
            time.sleep(0.05)
        return self._workspace


def _hand_over_cursors(cursors: dict[str, str], server: _CodeServer) -> None:
    """Store the sensors' cursors in the instance, so the daemon of a later `dagster dev`
    carries on after the last replayed batch instead of re-reading the whole history.

    The public way is the CLI: `dagster sensor cursor --set`, then `dagster sensor start`,
    since a cursor set on a sensor with no stored state is stored as STOPPED, which would
    override its RUNNING default. A sensor's state is kept per code location name, so both
    reach the location under the name `workspace.yaml` gives it (`_code_server`): with
    `-m MODULE` they would reach a location named after the module, which the daemon never
    reads. The sensors' two commands run in turn, the sensors side by side, and the outcome
    is printed in name order.
    """
    if not cursors:
        return
    dagster = str(Path(sys.executable).with_name("dagster"))
    workspace = server.workspace()

    def hand_over(name: str, cursor: str) -> str:
        if isinstance(workspace, str):
            return f"warning: could not hand {name} over: {workspace}"
        for command in (["cursor", name, "--set", cursor], ["start", name]):
            done = subprocess.run(
                [dagster, "sensor", *command, "-w", str(workspace)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                problem = done.stderr.strip()[-500:]
                return f"warning: could not hand {name} over ({command[0]}): {problem}"
        return f"{name}: cursor stored for the daemon ({cursor})"

    with ThreadPoolExecutor(max_workers=len(cursors)) as pool:
        outcomes = [pool.submit(hand_over, *item) for item in sorted(cursors.items())]
        for outcome in outcomes:
            print(outcome.result())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionize", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser(
        "generate",
        help="write a realistic landing zone",
        description="Write a realistic landing zone, or add its next day (--append-day, with "
        "the arguments it was generated with). The first N days are the same whatever --days is.",
    )
    generate.add_argument("--out", required=True, help="landing folder to write")
    generate.add_argument("--start", required=True, type=date.fromisoformat, help="first day")
    size = generate.add_mutually_exclusive_group(required=True)
    size.add_argument("--days", type=int, help="received days (batches)")
    size.add_argument(
        "--append-day",
        action="store_true",
        help="add the day after the zone's last batch: the batch --days N+1 would write",
    )
    generate.add_argument("--users", required=True, type=int)
    generate.add_argument("--seed", required=True, type=int)
    generate.add_argument("--late-share", type=float, default=0.05, help="share of late events")
    generate.add_argument(
        "--late-shape",
        choices=("recent", "uniform"),
        default="recent",
        help="recent: mostly 1-3 days late, a tail of months; uniform: spread evenly over the "
        "whole history (the worst case for incremental processing)",
    )
    generate.add_argument("--bot-share", type=float, default=0.01, help="share of bot users")
    generate.add_argument(
        "--duplicate-share", type=float, default=0.01, help="share of messages the SDK retries"
    )
    generate.add_argument(
        "--invalid-share", type=float, default=0.005, help="share of broken lines"
    )
    generate.add_argument("--gzip-share", type=float, default=0.3, help="share of gzip files")
    generate.add_argument(
        "--pipeline-start",
        type=date.fromisoformat,
        default=None,
        help="date before which events are rejected (default: SESSIONIZE_START_DATE)",
    )
    generate.set_defaults(run=_generate)

    replay = commands.add_parser(
        "replay",
        help="process every landing batch in received order through the Dagster definitions",
    )
    replay.add_argument("--landing", help="landing folder (default: SESSIONIZE_LANDING_DIR)")
    replay.add_argument(
        "--at-once",
        action="store_true",
        help="batches of consecutive days together, in one ingest range run followed through "
        "to the snapshot, as the daemon takes folders it finds at one tick (a first load, a "
        "backlog); by default each batch goes through alone, as it would have landed",
    )
    replay.set_defaults(run=_replay)

    rebuild = commands.add_parser(
        "rebuild",
        help="recompute events and sessions of chosen days from raw (rebuild_job), then the "
        "lifecycle snapshot from the earliest day that changed",
    )
    rebuild.add_argument("--from", dest="first", type=date.fromisoformat, help="first event day")
    rebuild.add_argument("--to", dest="last", type=date.fromisoformat, help="last event day")
    rebuild.add_argument(
        "--sessions-only",
        action="store_true",
        help="recompute only the sessions of those days, from events as they are (after a new "
        "SESSIONIZE_SESSION_GAP_MINUTES or SESSIONIZE_MAX_SESSION_HOURS)",
    )
    rebuild.set_defaults(run=_rebuild)

    forget = commands.add_parser(
        "forget",
        help="erase people on request (SPEC §8): their rows in every table and on disk, the "
        "anonymousIds stitched to them too, and what was derived from them",
    )
    forget.add_argument(
        "--user",
        dest="keys",
        action="append",
        required=True,
        metavar="KEY",
        help="a userId or anonymousId to erase (repeat for several)",
    )
    forget.set_defaults(run=_forget)

    daily = commands.add_parser(
        "daily",
        help="print the last days of daily_sessions: figures, and whether each is complete or "
        "still provisional (SPEC §9; docs/daily.md)",
    )
    daily.add_argument("--days", type=int, default=7, help="how many days (default: 7)")
    daily.set_defaults(run=_daily)

    server = commands.add_parser(
        "spark-server",
        help="run the Spark Connect server the runs share, until stopped (beside a daemon)",
        description="Run a local Spark Connect server from the installed pyspark, with the "
        "project's Spark settings, until SIGINT or SIGTERM. Runs reach it with "
        "SESSIONIZE_SPARK_MASTER=sc://HOST:PORT (SESSIONIZE_SPARK_SERVER_HOST, _PORT).",
    )
    server.set_defaults(run=_spark_server)

    serve = commands.add_parser(
        "serve",
        help="the deployment: dagster-webserver, dagster-daemon and a code server on Postgres, "
        "with the Spark Connect server, under supervisord (make serve; docs/deployment.md)",
    )
    serve.add_argument(
        "--instance",
        default="dagster.yaml",
        help="the instance settings (run queue, retries, monitoring) without storage; "
        "default: the project's dagster.yaml",
    )
    serve_control = serve.add_mutually_exclusive_group()
    serve_control.add_argument("--status", action="store_true", help="the programs' states")
    serve_control.add_argument("--stop", action="store_true", help="stop every program")
    serve.set_defaults(run=_serve)

    after_postgres = commands.add_parser(
        "after-postgres",
        add_help=False,
        help="run a command once DAGSTER_PG_URL's server accepts connections (what the "
        "deployment's supervisor starts Dagster's processes with)",
    )
    after_postgres.set_defaults(run=_after_postgres, passes_arguments=True)

    dev = commands.add_parser(
        "dev",
        add_help=False,
        help="dagster dev, its runs on a Spark Connect server started and stopped with it "
        "(make ui); the arguments go to dagster dev",
    )
    dev.set_defaults(run=_dev, passes_arguments=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passes_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.dagster_args = extra
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
