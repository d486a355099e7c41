"""The one place that reads sessionize's settings from the environment.

Everything else receives a `Settings` object explicitly, so tests build their own and nothing
reads `os.environ` at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from pathlib import Path

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES
from sessionize_assets.transforms.completeness import Lateness

DEFAULT_START_DATE = date(2026, 1, 1)
# A longer landing line is rejected as line_too_long (kept whole in rejected_events).
DEFAULT_MAX_LINE_BYTES = 1 << 20
# Table maintenance runs daily at 03:00 UTC; "off" in the environment leaves it stopped.
DEFAULT_MAINTENANCE_CRON = "0 3 * * *"
DEFAULT_CONVERSION_EVENTS = ("Order Completed",)
# SPEC §9: the grace period is learned from the dates 28 to 55 days old, as the smallest lag
# by which 99% of their events had arrived.
DEFAULT_LATENESS_HORIZON_DAYS = 28
DEFAULT_LATENESS_WINDOW_DAYS = 28
DEFAULT_COMPLETENESS_TARGET = 0.99
# Yesterday's daily_sessions partition is due by 06:00 UTC (a cron in UTC).
DEFAULT_FRESHNESS_DEADLINE = "0 6 * * *"


# Where Delta commits are made (`resources/lake.py`): "embedded" (Spark writes Parquet, delta-rs
# commits; no jars) or "delta-spark" (Delta Lake's own Spark operations; needs its jars).
LAKE_BACKENDS = ("embedded", "delta-spark")
# The schemes of a lake on S3, which Spark reaches through hadoop-aws (`s3a_jars_dir`).
S3_SCHEMES = ("s3a", "s3")


class SettingsError(ValueError):
    """An environment variable holds a value sessionize cannot use."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Pipeline parameters (SPEC §1-§3) and where the data lives."""

    landing_dir: Path = Path("data/landing")
    # The lake's local folder: its tables (unless `lake_uri` names another place), and the
    # writer lock of the processes of this machine (`lake/writer_lock.py`).
    lake_dir: Path = Path("data/lake")
    # The tables' location when they are on an object store (`s3a://bucket/lake`;
    # docs/storage.md, Object storage). The delta-spark backend only: the embedded one
    # commits by renaming.
    lake_uri: str | None = None
    start_date: date = DEFAULT_START_DATE
    session_gap: timedelta = timedelta(minutes=30)
    max_session_length: timedelta = timedelta(hours=24)
    future_tolerance: timedelta = timedelta(minutes=5)
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    # The `event` names of track calls that count as a session's conversions (SPEC §3b).
    conversion_events: tuple[str, ...] = DEFAULT_CONVERSION_EVENTS
    # SPEC §9's H, W and q: how the grace period and each date's status are learned.
    lateness_horizon_days: int = DEFAULT_LATENESS_HORIZON_DAYS
    lateness_window_days: int = DEFAULT_LATENESS_WINDOW_DAYS
    completeness_target: float = DEFAULT_COMPLETENESS_TARGET
    # When a day's daily_sessions partition is due (cron, UTC): its freshness check fails
    # while the day is past it and not materialized.
    freshness_deadline: str = DEFAULT_FRESHNESS_DEADLINE
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # The Spark Connect server that `sessionize dev` (`make ui`) and `sessionize spark-server`
    # start (`spark_server.py`): the master its driver runs on, the interface and port it
    # listens at (loopback: a Connect server runs what any client sends), its Spark UI's port
    # (the runs count their jobs from its status API) and its driver's heap.
    spark_server_master: str = "local[*]"
    spark_server_host: str = "127.0.0.1"
    spark_server_port: int = 15002
    spark_server_ui_port: int = 4040
    spark_server_memory: str = "2g"
    lake_backend: str = "embedded"  # one of LAKE_BACKENDS
    # The Delta Lake jars the delta-spark backend loads (`make jars` fetches them there).
    delta_jars_dir: Path = Path("jars/delta")
    # Hadoop's S3 connector (hadoop-aws) and the AWS SDK modules it uses, loaded with the
    # Delta jars when `lake_uri` is on S3 (`make jars` fetches them there).
    s3a_jars_dir: Path = Path("jars/s3a")
    # The class archive the driver's JVM maps its classes from (`make jvm-archive` writes it;
    # `spark_config`); None, or no file there: the JVM loads every class from the jars.
    jvm_class_archive: Path | None = Path("jars/spark-driver.jsa")
    # An S3-compatible store's address (`AWS_ENDPOINT_URL`, which delta-rs and pyarrow read
    # themselves), handed to Spark's S3 connector; None: AWS's own endpoints.
    s3_endpoint: str | None = None
    # Snowplow calls it backfill_limit_days: the most days one run covers. An ingest run
    # counts received days; an events or sessions run counts days' worth of the events it
    # takes on, in the lake's typical day (`partitions.contiguous_ranges`), so a batch whose
    # late events reach every date of the history is one run.
    max_partitions_per_run: int = 120
    # A sensor asks again for dates a run left behind after this, doubled at each attempt.
    retry_backoff: timedelta = timedelta(minutes=1)
    # How often the daemon evaluates each sensor: how long a landed batch waits for each next
    # step. Automation on sessions, a backstop, ticks at four
    # times this (definitions.AUTOMATION_INTERVALS).
    sensor_interval: timedelta = timedelta(seconds=15)
    # Maintenance deletes files no table version younger than this reads (time travel window).
    retention: timedelta = timedelta(days=7)
    # When the maintenance schedule runs (cron, UTC); None: defined but stopped.
    maintenance_cron: str | None = DEFAULT_MAINTENANCE_CRON
    # Up to this estimated size (bytes of the plan's inputs, as Spark's optimizer reckons them)
    # the embedded backend collects a write's rows with Arrow and writes its Parquet files
    # from the driver: a daily batch's few thousand rows cost one collect instead of Spark's
    # writer job and commit protocol; a landing batch is collected up to four times this
    # much text (`pipeline.ingest.COLLECTED_TEXT_FACTOR`). Above it, and with no estimate,
    # Spark writes them (a backfill, a rebuild: the executors scale out). 0: Spark writes
    # everything.
    driver_write_bytes: int = DEFAULT_DRIVER_WRITE_BYTES

    def __post_init__(self) -> None:
        if self.session_gap <= timedelta(0):
            raise SettingsError(f"session gap must be positive, got {self.session_gap}")
        if self.max_session_length <= timedelta(0):
            raise SettingsError(
                f"max session length must be positive, got {self.max_session_length}"
            )
        if self.future_tolerance < timedelta(0):
            raise SettingsError(f"future tolerance must be >= 0, got {self.future_tolerance}")
        if self.max_line_bytes < 1:
            raise SettingsError(f"max line bytes must be at least 1, got {self.max_line_bytes}")
        if self.max_partitions_per_run < 1:
            raise SettingsError("max partitions per run must be at least 1")
        if self.retry_backoff < timedelta(0):
            raise SettingsError(f"retry backoff must be >= 0, got {self.retry_backoff}")
        if self.sensor_interval < timedelta(seconds=1):
            raise SettingsError(f"sensor interval must be at least 1 s, got {self.sensor_interval}")
        try:
            _lake_backend(self.lake_backend)
        except ValueError as exc:
            raise SettingsError(f"lake backend: {exc}") from exc
        if self.lake_uri is not None:
            if "://" not in self.lake_uri:
                raise SettingsError(
                    f"lake URI must name its scheme (s3a://...), got {self.lake_uri!r}"
                )
            if self.lake_backend != "delta-spark":
                raise SettingsError(
                    f"lake URI {self.lake_uri}: the {self.lake_backend} backend commits files by "
                    "renaming them, which object stores cannot do; set "
                    "SESSIONIZE_LAKE_BACKEND=delta-spark"
                )
        for name in ("spark_server_port", "spark_server_ui_port"):
            if not 0 < getattr(self, name) < 65536:
                raise SettingsError(f"{name.replace('_', ' ')} must be 1-65535")
        if self.lake_backend == "delta-spark" and self.spark_master.startswith("sc://"):
            raise SettingsError(
                f"Spark master {self.spark_master}: the delta-spark backend runs Delta's "
                "operations through Delta's Python API, which needs a Delta Connect server, and "
                "Delta 4.0 publishes none (docs/spark-server.md): give it a local or cluster master"
            )
        try:
            self.lateness  # noqa: B018 (checks the three settings)
        except ValueError as exc:
            raise SettingsError(str(exc)) from exc
        if self.retention < timedelta(0):
            raise SettingsError(f"retention must be >= 0, got {self.retention}")
        if self.driver_write_bytes < 0:
            raise SettingsError(f"driver write bytes must be >= 0, got {self.driver_write_bytes}")

    @property
    def lake(self) -> Location:
        """Where the tables live: `lake_uri`, or else `lake_dir`."""
        return Location.of(self.lake_uri or self.lake_dir)

    @property
    def lateness(self) -> Lateness:
        """SPEC §9's H, W and q (`transforms/completeness.py`)."""
        return Lateness(
            horizon_days=self.lateness_horizon_days,
            window_days=self.lateness_window_days,
            target=self.completeness_target,
        )

    @property
    def lake_on_s3(self) -> bool:
        """Whether Spark reaches the tables through Hadoop's S3 connector."""
        return self.lake.scheme in S3_SCHEMES

    @property
    def sensor_interval_seconds(self) -> int:
        """`sensor_interval` in whole seconds."""
        return int(self.sensor_interval.total_seconds())

    @property
    def sensor_minimum_interval_seconds(self) -> int:
        """`sensor_interval` as the sensors' `minimum_interval_seconds`: a second less.

        Dagster's sensor daemon checks every 5 s whether a sensor is due, counting from the
        start of its last tick, which comes a moment after the check that began it. A minimum
        of exactly 5 s (or 15) is that moment short at the next check, so the sensor would
        tick every 10 s (or 20); a second's slack keeps the interval set.
        """
        return max(1, self.sensor_interval_seconds - 1)

    def with_overrides(self, **changes: object) -> Settings:
        # Each change is checked against its field by the dataclass's own __post_init__.
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        defaults = cls()

        def read(name: str, parse, default):
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return parse(raw.strip())
            except ValueError as exc:
                raise SettingsError(f"{name}={raw!r}: {exc}") from exc

        spark_conf = read("SESSIONIZE_SPARK_CONF", _parse_spark_conf, {})
        return cls(
            landing_dir=read("SESSIONIZE_LANDING_DIR", Path, defaults.landing_dir),
            lake_dir=read("SESSIONIZE_LAKE_DIR", Path, defaults.lake_dir),
            lake_uri=read("SESSIONIZE_LAKE_URI", str, defaults.lake_uri),
            start_date=read("SESSIONIZE_START_DATE", date.fromisoformat, defaults.start_date),
            session_gap=read(
                "SESSIONIZE_SESSION_GAP_MINUTES",
                _positive_minutes,
                defaults.session_gap,
            ),
            max_session_length=read(
                "SESSIONIZE_MAX_SESSION_HOURS",
                lambda v: _positive_minutes(v) * 60,
                defaults.max_session_length,
            ),
            future_tolerance=read(
                "SESSIONIZE_FUTURE_TOLERANCE_MINUTES",
                lambda v: timedelta(minutes=float(v)),
                defaults.future_tolerance,
            ),
            max_line_bytes=read("SESSIONIZE_MAX_LINE_BYTES", int, defaults.max_line_bytes),
            conversion_events=read(
                "SESSIONIZE_CONVERSION_EVENTS", _names, defaults.conversion_events
            ),
            lateness_horizon_days=read(
                "SESSIONIZE_LATENESS_HORIZON_DAYS", int, defaults.lateness_horizon_days
            ),
            lateness_window_days=read(
                "SESSIONIZE_LATENESS_WINDOW_DAYS", int, defaults.lateness_window_days
            ),
            completeness_target=read(
                "SESSIONIZE_COMPLETENESS_TARGET", float, defaults.completeness_target
            ),
            freshness_deadline=read(
                "SESSIONIZE_FRESHNESS_DEADLINE", str, defaults.freshness_deadline
            ),
            spark_master=read("SESSIONIZE_SPARK_MASTER", str, defaults.spark_master),
            spark_conf=spark_conf,
            spark_server_master=read(
                "SESSIONIZE_SPARK_SERVER_MASTER", str, defaults.spark_server_master
            ),
            spark_server_host=read("SESSIONIZE_SPARK_SERVER_HOST", str, defaults.spark_server_host),
            spark_server_port=read("SESSIONIZE_SPARK_SERVER_PORT", int, defaults.spark_server_port),
            spark_server_ui_port=read(
                "SESSIONIZE_SPARK_SERVER_UI_PORT", int, defaults.spark_server_ui_port
            ),
            spark_server_memory=read(
                "SESSIONIZE_SPARK_SERVER_MEMORY", str, defaults.spark_server_memory
            ),
            lake_backend=read("SESSIONIZE_LAKE_BACKEND", _lake_backend, defaults.lake_backend),
            delta_jars_dir=read("SESSIONIZE_DELTA_JARS_DIR", Path, defaults.delta_jars_dir),
            s3a_jars_dir=read("SESSIONIZE_S3A_JARS_DIR", Path, defaults.s3a_jars_dir),
            jvm_class_archive=read(
                "SESSIONIZE_JVM_CLASS_ARCHIVE",
                lambda v: None if v.lower() == "off" else Path(v),
                defaults.jvm_class_archive,
            ),
            s3_endpoint=read(
                "AWS_ENDPOINT_URL_S3", str, read("AWS_ENDPOINT_URL", str, defaults.s3_endpoint)
            ),
            max_partitions_per_run=read(
                "SESSIONIZE_MAX_PARTITIONS_PER_RUN", int, defaults.max_partitions_per_run
            ),
            retry_backoff=read(
                "SESSIONIZE_RETRY_BACKOFF_SECONDS",
                lambda v: timedelta(seconds=float(v)),
                defaults.retry_backoff,
            ),
            sensor_interval=read(
                "SESSIONIZE_SENSOR_INTERVAL_SECONDS",
                _whole_seconds,
                defaults.sensor_interval,
            ),
            retention=read(
                "SESSIONIZE_RETENTION_DAYS",
                lambda v: timedelta(days=float(v)),
                defaults.retention,
            ),
            maintenance_cron=read(
                "SESSIONIZE_MAINTENANCE_CRON",
                lambda v: None if v.lower() == "off" else v,
                defaults.maintenance_cron,
            ),
            driver_write_bytes=read(
                "SESSIONIZE_DRIVER_WRITE_BYTES", _non_negative_int, defaults.driver_write_bytes
            ),
        )


@dataclass(frozen=True, kw_only=True)
class DeploymentSettings:
    """Where `sessionize serve`'s processes live and listen (`deployment/`, docs/deployment.md).

    Dagster's storage is `postgres_url` when one is given (`DAGSTER_PG_URL`, or Dagster's own
    `DAGSTER_PG_USERNAME`, `_PASSWORD`, `_HOST`, `_PORT` and `_DB`); else a Postgres cluster
    of the deployment's own, in `deploy_dir`, on `postgres_port`.
    """

    # The supervisor's config, socket and logs, Dagster's home, and the local Postgres cluster.
    deploy_dir: Path = Path(".deploy")
    # The webserver: loopback by default (it has no authentication of its own).
    webserver_host: str = "127.0.0.1"
    webserver_port: int = 3000
    # The code location's gRPC server, which the webserver and the daemon reach on loopback.
    code_server_port: int = 4266
    postgres_port: int = 5433
    postgres_url: str | None = None

    def __post_init__(self) -> None:
        for name in ("webserver_port", "code_server_port", "postgres_port"):
            if not 0 < getattr(self, name) < 65536:
                raise SettingsError(f"{name.replace('_', ' ')} must be 1-65535")
        if self.postgres_url is not None and not self.postgres_url.startswith(
            ("postgresql://", "postgres://", "postgresql+")
        ):
            raise SettingsError("DAGSTER_PG_URL must be a postgresql:// URL")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeploymentSettings:
        env = os.environ if environ is None else environ
        defaults = cls()

        def read(name: str, parse, default):
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return parse(raw)
            except ValueError as exc:
                raise SettingsError(f"{name}={raw!r}: {exc}") from exc

        return cls(
            deploy_dir=read("SESSIONIZE_DEPLOY_DIR", Path, defaults.deploy_dir),
            webserver_host=read("SESSIONIZE_WEBSERVER_HOST", str, defaults.webserver_host),
            webserver_port=read("SESSIONIZE_WEBSERVER_PORT", int, defaults.webserver_port),
            code_server_port=read("SESSIONIZE_CODE_SERVER_PORT", int, defaults.code_server_port),
            postgres_port=read("SESSIONIZE_POSTGRES_PORT", int, defaults.postgres_port),
            postgres_url=read("DAGSTER_PG_URL", str, None) or _postgres_url_of_parts(env),
        )


def _postgres_url_of_parts(env: Mapping[str, str]) -> str | None:
    """The URL Dagster's `postgres_db` settings name (`DAGSTER_PG_HOST` and the rest), built
    as dagster-postgres builds it from them."""
    from dagster_postgres.utils import get_conn_string

    host = env.get("DAGSTER_PG_HOST", "").strip()
    if not host:
        return None
    return get_conn_string(
        username=env.get("DAGSTER_PG_USERNAME", "postgres"),
        password=env.get("DAGSTER_PG_PASSWORD", ""),
        hostname=host,
        port=env.get("DAGSTER_PG_PORT", "5432").strip() or "5432",
        db_name=env.get("DAGSTER_PG_DB", "postgres"),
    )


def _parse_spark_conf(raw: str) -> dict[str, str]:
    """`key=value` pairs separated by `;` (Spark keys are case-sensitive, so no env mangling)."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _names(raw: str) -> tuple[str, ...]:
    """Comma-separated names, each stripped; empty ones are dropped."""
    names = tuple(sorted({name.strip() for name in raw.split(",") if name.strip()}))
    if not names:
        raise ValueError("expected comma-separated names")
    return names


def _lake_backend(raw: str) -> str:
    if raw not in LAKE_BACKENDS:
        raise ValueError(f"expected one of {', '.join(LAKE_BACKENDS)}, got {raw!r}")
    return raw


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"expected a whole number >= 0, got {raw}")
    return value


def _whole_seconds(raw: str) -> timedelta:
    value = int(raw)
    if value < 1:
        raise ValueError(f"expected a whole number of seconds >= 1, got {raw}")
    return timedelta(seconds=value)


def _positive_minutes(raw: str) -> timedelta:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be a positive number")
    return timedelta(minutes=value)
