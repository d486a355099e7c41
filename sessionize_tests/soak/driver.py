"""`make soak`: a month of real operation under `sessionize dev`, with its processes killed.

    python -m sessionize_tests.soak.driver --seed 7 --batches 30 --worker-kills 20 \
        --daemon-kills 1 --server-kills 1 --restarts 2 --backfills 2

It generates a landing zone, starts `sessionize dev` (the Spark Connect server and `dagster
dev` with the project's dagster.yaml) on a Dagster home of its own, and drops the zone's batch
folders one by one, as a collector does. On the way, from the seed it prints:

- it drops two folders at once, and re-delivers an earlier folder changed (one line added);
- it kills run workers with SIGKILL: at each named fault point once (`faults.FAULT_POINTS`,
  paused there by `hooks/sitecustomize.py`), the rest at a random moment of a step, every
  asset's step in turn (ingest, events, identities, sessions, snapshot, checks, maintenance),
  seen by the same hook;
- it kills the daemon (`dagster dev` goes down with it, and is started again), the Spark
  Connect server (`sessionize dev` starts it again), and the whole process tree, then starts
  `sessionize dev` again;
- it launches backfills of overlapping dates through the webserver's GraphQL API, as the
  UI's Partitions tab does.

With `--serve` it runs the deployment instead (`sessionize serve`: Postgres, the Spark server,
the code server, webserver and daemon under supervisord), and kills the daemon alone, the
webserver, the code server and Postgres's postmaster too (`--webserver-kills`,
`--code-server-kills`, `--postgres-kills`: one each by default), each started again by the
supervisor; the whole tree's kill takes the supervisor and Postgres with it, and the soak
starts `sessionize serve` again, as a machine's service manager would.

Then it waits until nothing is queued or running and the lake says nothing is behind, stops
`sessionize dev`, and compares every table with the full recompute. It prints the faults
injected, the runs failed and retried, the seconds to converge and every difference, and exits
non-zero on a difference, on a failed run that nothing took up again, on a fault it could not
inject, or when it does not converge.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

from dagster import DagsterRunStatus, RunsFilter
from pyspark.sql import SparkSession

from sessionize_assets.cli import stopped_by_sigterm
from sessionize_assets.definitions import SESSIONS_JOB, build_definitions, resource_of
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.resources.spark import SparkResource
from sessionize_assets.schedules import MAINTENANCE_JOB
from sessionize_assets.sensors.behind import Behind
from sessionize_tests.conftest import make_settings, settings_environment, wait_until_group_is_gone
from sessionize_tests.dev_server import (
    DagsterDev,
    DevServerError,
    ServedDeployment,
    free_port,
    land_folder,
)
from sessionize_tests.full_recompute import differences
from sessionize_tests.soak import processes
from sessionize_tests.soak.faults import (
    FAULT_POINTS,
    FAULTS_VARIABLE,
    HOOKS_DIR,
    STEPS,
    FaultPoints,
    Hit,
)

START = date(2026, 1, 1)
PROJECT = Path(__file__).resolve().parents[2]
SESSION_ASSETS = ["sessions", "session_quarantine", "session_changes"]
# The faults that kill a run's worker, armed as the batch lands (`faults.FaultPoints`).
WORKER_KILLS = ("point", "step")
# The points only a maintenance run reaches (on a daily schedule: the soak launches it).
MAINTENANCE_POINTS = ("vacuum:sessions", "step:maintain_tables")
SENSOR_INTERVAL = timedelta(seconds=5)
# A state a run left behind is asked for again after this, doubled at each attempt.
RETRY_BACKOFF_SECONDS = 10
# A step's worker is killed this many seconds into the step at most (drawn from the seed); a
# step that ends sooner is killed at its end, before its success is written.
STEP_KILL_WITHIN = 3.0
# How long the first restart waits for a run in STARTING.
STARTING_TIMEOUT = 180.0


@dataclass(frozen=True, kw_only=True)
class SoakPlan:
    seed: int
    batches: int = 30
    users: int = 40
    worker_kills: int = 20
    daemon_kills: int = 1
    server_kills: int = 1
    restarts: int = 2
    backfills: int = 2
    # Seconds to wait for the tables to converge after the last batch and fault.
    converge_timeout: float = 1800.0
    # The deployment (`sessionize serve`) instead of `sessionize dev`, and the kills of its own
    # programs, each restarted by its supervisor.
    serve: bool = False
    webserver_kills: int = 0
    code_server_kills: int = 0
    postgres_kills: int = 0


@dataclass(frozen=True)
class Fault:
    batch: int
    kind: str  # point | step | daemon | server | restart | webserver | code-server | postgres
    target: str = ""


@dataclass
class SoakReport:
    plan: SoakPlan
    faults: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    failed_not_taken_up: list[str] = field(default_factory=list)
    converge_seconds: float | None = None
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.converge_seconds is not None
            and not self.differences
            and not self.failed_not_taken_up
            and not self.missed
        )

    def lines(self) -> Iterator[str]:
        plan = self.plan
        yield (
            f"soak seed {plan.seed}: {plan.batches} batches, {plan.users} users, "
            f"{self.seconds:.0f} s in all"
        )
        kinds = Counter(line.split(":", 1)[0] for line in self.faults)
        by_kind = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
        yield f"faults injected: {len(self.faults)} ({by_kind})"
        yield from (f"  {line}" for line in self.faults)
        if self.missed:
            yield f"faults not injected: {len(self.missed)}"
            yield from (f"  {line}" for line in self.missed)
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(self.runs.items()))
        yield f"runs: {sum(self.runs.values())} ({statuses}); {self.retries} were retries"
        if self.failed_not_taken_up:
            yield f"failed runs nothing took up again: {len(self.failed_not_taken_up)}"
            yield from (f"  {line}" for line in self.failed_not_taken_up)
        converged = self.converge_seconds
        yield (
            f"converged {converged:.0f} s after the last batch and fault"
            if converged is not None
            else f"did not converge within {plan.converge_timeout:.0f} s"
        )
        yield f"differences from the full recompute: {len(self.differences)}"
        yield from (f"  {line}" for line in self.differences)
        yield "SOAK PASSED" if self.ok else "SOAK FAILED"


def schedule(plan: SoakPlan) -> list[Fault]:
    """The faults, each at a batch drawn from the seed: every named point once (fewer worker
    kills than points: some of them), the other worker kills at the steps in turn, and the
    daemon, server and tree kills."""
    draw = random.Random(plan.seed)
    later = range(1, plan.batches)  # the first batch lands on a tree that has not been hurt
    points = list(FAULT_POINTS)
    if plan.worker_kills < len(points):  # a short soak: some of the points
        points = draw.sample(points, plan.worker_kills)
    faults = [Fault(draw.choice(later), "point", point) for point in points]
    steps = [STEPS[i % len(STEPS)] for i in range(plan.worker_kills - len(points))]
    faults += [Fault(draw.choice(later), "step", step) for step in steps]
    for kind, count in (
        ("daemon", plan.daemon_kills),
        ("server", plan.server_kills),
        ("restart", plan.restarts),
        ("webserver", plan.webserver_kills),
        ("code-server", plan.code_server_kills),
        ("postgres", plan.postgres_kills),
    ):
        faults += [Fault(draw.choice(later), kind) for _ in range(count)]
    return sorted(faults, key=lambda fault: (fault.batch, fault.kind, fault.target))


def one_event_more(content: bytes) -> bytes:
    """A batch file's `content` with one line added: a copy of its first event under a new
    messageId. The zone's hostile lines need not be JSON nor UTF-8, and its last line need
    not end with a newline."""
    for line in content.splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            continue
        if isinstance(event, dict) and event.get("messageId"):
            event["messageId"] = f"{event['messageId']}-redelivered"
            ending = b"" if content.endswith(b"\n") else b"\n"
            return content + ending + json.dumps(event).encode() + b"\n"
    raise ValueError("no event with a messageId to copy")


def add_one_event(folder: Path) -> Path:
    """Add `one_event_more` to the first batch file of `folder` that has an event to copy, gzip
    or not (a zone's folder may hold only gzip files: seed 12's 30-batch soak stopped there);
    returns the file changed."""
    for path in sorted(folder.iterdir()):
        zipped = path.name.endswith(".jsonl.gz")
        if not (zipped or path.name.endswith(".jsonl")):
            continue
        try:
            content = gzip.decompress(path.read_bytes()) if zipped else path.read_bytes()
            changed = one_event_more(content)
        except (OSError, EOFError, ValueError):  # a broken gzip file, or no event in it
            continue
        path.write_bytes(gzip.compress(changed) if zipped else changed)
        return path
    raise ValueError(f"no batch file in {folder} has an event to copy")


class Soak:
    def __init__(self, plan: SoakPlan, *, root: Path, echo: Callable[[str], None] = print):
        self.plan, self.root, self.echo = plan, root, echo
        self.draw = random.Random(plan.seed + 1)
        self.report = SoakReport(plan=plan)
        self.settings = make_settings(
            root,
            start_date=START,
            sensor_interval=SENSOR_INTERVAL,
            retry_backoff=timedelta(seconds=RETRY_BACKOFF_SECONDS),
            spark_server_master="local[2]",
            spark_server_port=free_port(),
            spark_server_ui_port=free_port(),
        )
        self.generated = root / "generated"
        self.home = root / "dagster_home"
        self.points = FaultPoints(root / "faults")
        env = settings_environment(self.settings)
        self.env = env | {
            FAULTS_VARIABLE: str(self.points.folder),
            "PYTHONPATH": f"{HOOKS_DIR}:{PROJECT}",
        }
        self.dev: DagsterDev = (
            ServedDeployment(workdir=root, env=self.env)
            if plan.serve
            else DagsterDev(
                workdir=root, dagster_home=self.home, env=self.env, program="sessionize"
            )
        )
        self.started = time.monotonic()
        self._backfills_from: int | None = None
        self._seen: dict[tuple[str, int], float] = {}  # (point, pid): when first seen
        self._killed_pids: set[int] = set()
        self.restarts = 0
        # When the last folder landed or the last fault was injected.
        self.last_change = time.monotonic()
        self.defs = build_definitions(self.settings)
        self.behind = Behind(
            settings=self.settings,
            lake=resource_of(self.defs, "lake", LakeResource).store(),
            landing=resource_of(self.defs, "landing", LandingZoneResource),
        )

    # -- the soak ------------------------------------------------------------------------

    def run(self, *, spark: SparkSession | None = None) -> SoakReport:
        """The soak; its tables are compared on `spark` (default: a session of its own)."""
        plan = self.plan
        generate_landing_zone(
            ZoneSpec(
                out=self.generated, start=START, users=plan.users, seed=plan.seed, late_share=0.3
            ),
            days=plan.batches,
        )
        if not plan.serve:  # the deployment writes its own
            self.home.mkdir(parents=True)
            shutil.copy(PROJECT / "dagster.yaml", self.home / "dagster.yaml")
        faults = schedule(plan)
        together = self.draw.randrange(1, plan.batches - 1) if plan.batches > 2 else None
        redeliver = self.draw.randrange(2, plan.batches) if plan.batches > 2 else None
        backfill_at = sorted(
            self.draw.sample(range(1, plan.batches), min(plan.backfills, plan.batches - 1))
        )
        self.dev.start()
        try:
            with self.dev.instance() as instance:
                self.instance = instance
                batch = 0
                while batch < plan.batches:
                    days = [batch, batch + 1] if batch == together else [batch]
                    self._arm([f for f in faults if f.batch in days and f.kind in WORKER_KILLS])
                    for day in days:
                        self._deliver(day)
                    self.echo(
                        f"[{self._elapsed()}] delivered batch {', '.join(str(d + 1) for d in days)}"
                    )
                    if redeliver in days:
                        self._redeliver_changed(self.draw.randrange(0, batch))
                    if any(day in backfill_at for day in days):
                        self._backfill(days[-1])
                    for fault in (
                        f for f in faults if f.batch in days and f.kind not in WORKER_KILLS
                    ):
                        self._inject(fault)
                    self._settle()
                    batch += len(days)
                self._disarm_all()
                self.report.converge_seconds = self._converge(since=self.last_change)
                self._count_runs()
        finally:
            self.dev.close()
        self.report.differences = self._compare(spark)
        self.report.seconds = time.monotonic() - self.started
        return self.report

    # -- deliveries ----------------------------------------------------------------------

    def _deliver(self, day: int) -> None:
        self.last_change = time.monotonic()
        folder = f"received_date={(START + timedelta(days=day)).isoformat()}"
        land_folder(self.generated / folder, self.settings.landing_dir)

    def _redeliver_changed(self, day: int) -> None:
        """The folder of `day` again, with one line added: a copy of its first event under a
        new messageId (a collector's late flush)."""
        name = f"received_date={(START + timedelta(days=day)).isoformat()}"
        changed = self.root / "changed" / name
        shutil.rmtree(changed, ignore_errors=True)
        shutil.copytree(self.generated / name, changed)
        add_one_event(changed)
        land_folder(changed, self.settings.landing_dir)
        self.last_change = time.monotonic()
        self.echo(f"[{self._elapsed()}] re-delivered batch {day + 1} changed")

    def _backfill(self, batch: int) -> None:
        """A backfill of the sessions assets through the batch's day, from two days before
        the first backfill's end (the backfills' dates overlap)."""
        if self._backfills_from is None:
            self._backfills_from = max(0, batch - 2)
        first = START + timedelta(days=self._backfills_from)
        last = START + timedelta(days=batch)
        partitions = [
            (first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)
        ]
        backfill = self.dev.launch_backfill(assets=SESSION_ASSETS, partitions=partitions)
        self.report.faults.append(f"backfill: sessions {first}..{last} ({backfill})")
        self.echo(f"[{self._elapsed()}] launched backfill {backfill}: sessions {first}..{last}")

    # -- faults --------------------------------------------------------------------------

    def _arm(self, faults: list[Fault]) -> None:
        """Arm the batch's worker kills; a point not reached in the batch stays armed for the
        next run that reaches it."""
        for fault in faults:
            point = f"step:{fault.target}" if fault.kind == "step" else fault.target
            delay = self.draw.uniform(0.0, STEP_KILL_WITHIN) if fault.kind == "step" else 0.0
            self._arm_point(point, delay=delay)

    def _arm_point(self, point: str, *, delay: float) -> None:
        self.points.arm(point, delay=delay)
        if point in MAINTENANCE_POINTS:  # no sensor launches maintenance: the soak does
            self.dev.launch_job(MAINTENANCE_JOB)

    def _disarm_all(self) -> None:
        for point in self.points.armed():
            self.report.missed.append(f"{point}: no run reached it")
            self.points.disarm(point)

    def _kill_hits(self) -> None:
        """Kill the workers at the points they reached: at once where they pause, a step's
        `delay` seconds after it was first seen in it (or at its end)."""
        now = time.monotonic()
        for hit in self.points.hits():
            seen = self._seen.setdefault((hit.point, hit.pid), now)
            if not hit.at_end and now < seen + hit.delay:
                continue
            self.last_change = now
            # One worker can claim two points (a step's and a commit's in it): the second
            # finds it dead, or a zombie its parent has not reaped yet, which a kill reaches.
            killed_before = hit.pid in self._killed_pids
            if not self.points.kill(hit) or killed_before:  # the next run's turn
                self._arm_point(hit.point, delay=hit.delay)
                self.echo(f"[{self._elapsed()}] {hit.point}'s worker died first: armed again")
                continue
            self._killed_pids.add(hit.pid)
            self.report.faults.append(self._killed(hit, now - seen))
            self.echo(f"[{self._elapsed()}] killed the run worker at {hit.point}")

    @staticmethod
    def _killed(hit: Hit, after: float) -> str:
        if not hit.point.startswith("step:"):
            return f"point: {hit.point} (pid {hit.pid})"
        when = "at its end" if hit.at_end else f"{after:.1f} s in"
        return f"step: {hit.point.removeprefix('step:')} (pid {hit.pid}, {when})"

    def _inject(self, fault: Fault) -> None:
        if fault.kind == "restart" and not self.restarts:
            # The first restart while a run starts (its worker up, RUN_START not yet written):
            # the batch's ingest run, a few seconds after its folder landed.
            self._wait(self._run_starting, seconds=STARTING_TIMEOUT, every=0.1)
        else:
            # Somewhere in the batch's runs: after a few seconds of them.
            self._wait(lambda: None, seconds=self.draw.uniform(2.0, 15.0))
        if fault.kind == "daemon" and isinstance(self.dev, ServedDeployment):
            # The daemon alone: its supervisor starts it again.
            self._note(fault, processes.kill(self.dev.program_pid("daemon")), "the daemon")
        elif fault.kind == "daemon":
            killed = processes.kill(processes.daemon_pid(self.dev.session))
            self._note(fault, killed, "the daemon")
            self._restart_if_down()
        elif fault.kind in ("webserver", "code-server", "postgres"):
            assert isinstance(self.dev, ServedDeployment), f"{fault.kind}: a deployment's"
            program = "Postgres's postmaster" if fault.kind == "postgres" else f"the {fault.kind}"
            self._note(fault, processes.kill(self.dev.program_pid(fault.kind)), program)
        elif fault.kind == "server":
            killed = processes.kill(processes.spark_server_pid(self.settings.spark_server_port))
            self._note(fault, killed, "the Spark Connect server")
        elif fault.kind == "restart":
            self.restarts += 1
            self._kill_tree()
            self._note(fault, True, "the whole process tree")
            self.dev.start()

    def _note(self, fault: Fault, killed: bool, what: str) -> None:
        self.last_change = time.monotonic()
        if killed:
            self.report.faults.append(f"{fault.kind}: {what}")
            self.echo(f"[{self._elapsed()}] killed {what}")
        else:
            self.report.missed.append(f"{fault.kind}: {what} was not running")

    def _run_starting(self) -> bool:
        return bool(self.instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING])))

    def _kill_tree(self) -> None:
        """SIGKILL every process of `sessionize dev`, its Spark server too (in a session of
        its own), as a machine's crash does; return once they are gone."""
        session = self.dev.session
        server = processes.spark_server_pid(self.settings.spark_server_port)
        # A deployment's supervisor gives each program a process group of its own.
        members = processes.session_members(session)
        os.killpg(session, signal.SIGKILL)
        for pid in members:
            processes.kill(pid)
        processes.kill(server)
        wait_until_group_is_gone(session)
        while any(processes.alive(pid) for pid in [*members, server] if pid):
            time.sleep(0.2)
        self.dev.stop()  # reaps it

    def _restart_if_down(self) -> None:
        """`dagster dev` ends when its daemon dies (and `sessionize dev` with it): start it
        again once it has ended, as a supervisor (systemd, a container's restart policy)
        would."""
        deadline = time.monotonic() + 60
        while self.dev.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.dev.running():
            return  # it lives on: nothing to start
        self.dev.stop()
        self.dev.start()
        self.report.faults.append("supervisor: sessionize dev started again after it ended")

    # -- waiting -------------------------------------------------------------------------

    def _wait(self, done: Callable[[], object], *, seconds: float, every: float = 0.5) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._kill_hits()
            if done():
                return True
            time.sleep(every)
        return False

    def _settle(self) -> None:
        """Until the batch's runs are done (or 5 minutes: the next batch lands regardless)."""
        self._wait(self._quiet, seconds=300, every=0.2)

    def _quiet(self) -> bool:
        if not self.dev.running():
            self._restart_if_down()
        try:
            return self.dev.idle() and not self._behind()
        except DevServerError:
            return False

    def _behind(self) -> list[str]:
        behind = self.behind
        last = START + timedelta(days=self.plan.batches)
        found = [f"batch {b}" for b in behind.landing_batches(last=last).pending]
        found += [f"events {d}" for d in behind.event_dates()]
        days = self.defs.resolve_job_def(SESSIONS_JOB).partitions_def
        assert days is not None
        found += [f"sessions {d}" for d in behind.session_dates(self.instance, session_days=days)]
        if behind.lifecycle_catch_up(self.instance) is not None:
            found.append("the lifecycle")
        return found

    def _converge(self, *, since: float) -> float | None:
        """Seconds from `since` until quiet, and still quiet three sensor intervals later (or
        None)."""
        deadline = since + self.plan.converge_timeout
        while time.monotonic() < deadline:
            if self._wait(self._quiet, seconds=deadline - time.monotonic()):
                quiet_at = time.monotonic()
                time.sleep(3 * SENSOR_INTERVAL.total_seconds())
                if self._quiet():
                    return quiet_at - since
        return None

    def _count_runs(self) -> None:
        """The runs by status, the retries, and the failed runs nothing took up again: no
        retry of them, and no success of their job created after them."""
        records = self.instance.get_run_records()
        runs = [record.dagster_run for record in records]
        self.report.runs = Counter(run.status.value for run in runs)
        retried = {run.tags.get("dagster/parent_run_id") for run in runs}
        self.report.retries = sum("dagster/parent_run_id" in run.tags for run in runs)
        succeeded_later: dict[str, float] = {}
        for record in records:
            run, created = record.dagster_run, record.create_timestamp.timestamp()
            if run.status == DagsterRunStatus.SUCCESS:
                succeeded_later[run.job_name] = max(succeeded_later.get(run.job_name, 0.0), created)
        for record in records:
            run, created = record.dagster_run, record.create_timestamp.timestamp()
            failed = run.status == DagsterRunStatus.FAILURE and run.run_id not in retried
            if failed and succeeded_later.get(run.job_name, 0.0) < created:
                self.report.failed_not_taken_up.append(f"{run.job_name} {run.run_id}")

    def _compare(self, spark: SparkSession | None) -> list[str]:
        if spark is not None:
            return differences(self.settings, spark, start=START)
        own = resource_of(self.defs, "spark", SparkResource).session()
        try:
            return differences(self.settings, own, start=START)
        finally:
            own.stop()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:6.0f}s"


@contextmanager
def soak_folder(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="sessionize-soak-") as folder:
        yield Path(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--worker-kills", type=int, default=20)
    parser.add_argument("--daemon-kills", type=int, default=1)
    parser.add_argument("--server-kills", type=int, default=1)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--backfills", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder, kept")
    parser.add_argument(
        "--serve", action="store_true", help="the deployment (sessionize serve) on Postgres"
    )
    for program in ("webserver", "code-server", "postgres"):
        parser.add_argument(
            f"--{program}-kills", type=int, default=None, help="with --serve; default 1"
        )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    plan = SoakPlan(
        seed=seed,
        batches=args.batches,
        users=args.users,
        worker_kills=args.worker_kills,
        daemon_kills=args.daemon_kills,
        server_kills=args.server_kills,
        restarts=args.restarts,
        backfills=args.backfills,
        serve=args.serve,
        **{
            f"{program}_kills": (1 if args.serve else 0) if count is None else count
            for program, count in (
                ("webserver", args.webserver_kills),
                ("code_server", args.code_server_kills),
                ("postgres", args.postgres_kills),
            )
        },
    )
    print(f"soak seed {seed} (again: --seed {seed})", flush=True)
    # SIGTERM (a CI's timeout, `kill`) stops the deployment on the way out, as Ctrl-C does.
    with stopped_by_sigterm(), soak_folder(args.keep) as root:
        report = Soak(plan, root=root, echo=lambda line: print(line, flush=True)).run()
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
