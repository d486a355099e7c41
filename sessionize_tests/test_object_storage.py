"""The lake on an object store: the delta-spark backend with its tables on S3, against the
embedded backend's replay of the same zone on the local disk.

The store is moto's S3 server (`s3_server.py`); Spark reaches it through Hadoop's S3 connector
(`make jars`), delta-rs and pyarrow through the `AWS_*` environment. Nothing of the lake is on
the local disk but the writer lock.
"""

from __future__ import annotations

import uuid
from datetime import date

import pytest
from dagster import instance_for_test
from deltalake import DeltaTable

from sessionize_assets.forget import forget
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.delta_rs.log_files import commit_actions, table_path
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.tables import (
    ALL_TABLES,
    EVENT_IDS,
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_IDENTITIES,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.pipeline.forget import data_files_on_disk
from sessionize_assets.pipeline.stitching import RELABEL_COMMIT
from sessionize_assets.replay.command import replay
from sessionize_assets.resources.lake import STORES
from sessionize_tests.conftest import TEST_SPARK_CONF, make_settings
from sessionize_tests.full_recompute import differences
from sessionize_tests.reference import without_erased_lines
from sessionize_tests.s3_server import s3_server, spark_credentials
from sessionize_tests.test_replay import assert_tables_equal_the_full_recompute

# A replay over the network: minutes.
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
# What the delta-spark backend writes with Delta's own operations, and what tells two replays'
# tables apart though their content is the same: table versions and runs.
SPARK_WRITTEN = (RAW_EVENTS, REJECTED_EVENTS, EVENT_IDS, EVENTS, SESSIONS, SESSION_QUARANTINE)
RUN_COLUMNS = {"ingest_version", "commit_version", "run_id", "changed_at"}


def test_a_replay_with_the_lake_on_s3_equals_the_embedded_one_and_the_full_recompute(
    spark, tmp_path
):
    """`SESSIONIZE_LAKE_BACKEND=delta-spark` with `SESSIONIZE_LAKE_URI=s3a://...`: a replay,
    batch by batch with late events, leaves tables equal to the full recompute and, row for
    row, to the embedded backend's replay of the same zone on the local disk, the corrections
    log and the lifecycle included; an erasure deletes its files there; each table is a Delta
    table on the store, which delta-rs reads there, with Delta Spark's commits; the local lake
    folder holds no table."""
    zone = tmp_path / "landing"
    generate_landing_zone(
        ZoneSpec(out=zone, start=START, users=100, seed=5, late_share=0.1), days=4
    )
    embedded = make_settings(tmp_path / "embedded", landing_dir=zone, start_date=START)
    with instance_for_test() as instance:
        assert replay(settings=embedded, instance=instance, echo=lambda _: None).ok
    bucket = f"sessionize-{uuid.uuid4().hex[:12]}"
    with s3_server(bucket=bucket) as endpoint:
        settings = make_settings(
            tmp_path,
            landing_dir=zone,
            start_date=START,
            lake_backend="delta-spark",
            lake_uri=f"s3a://{bucket}/lake",
            s3_endpoint=endpoint,
            spark_conf={**TEST_SPARK_CONF, **spark_credentials()},
        )
        with instance_for_test() as instance:
            summary = replay(settings=settings, instance=instance, echo=lambda _: None)
            assert summary.ok and len(summary.batches) == 4
            assert_tables_equal_the_full_recompute(settings, spark)
            for spec in (
                *SPARK_WRITTEN,
                SESSION_CHANGES,
                USER_LIFECYCLE_STATE,
                USER_LIFECYCLE_SNAPSHOT,
            ):
                on_s3 = _content(str(table_path(settings.lake, spec)))
                assert on_s3 == _content(str(embedded.lake_dir / spec.name)), spec.name

            # SPEC §8 on the store: an erasure finds, reads and deletes its files there.
            store = STORES[settings.lake_backend](spark=spark, lake=settings.lake)
            identities = store.read_arrow(USER_IDENTITIES).to_pylist()
            person = min(row["user_id"] for row in identities)
            erased = {person, *(r["anonymous_id"] for r in identities if r["user_id"] == person)}
            said: list[str] = []
            assert forget(settings=settings, instance=instance, keys=[person], echo=said.append)
            assert any("data files that held the keys deleted" in line for line in said), said
            assert not any(
                key.encode() in _read(path)
                for spec in ALL_TABLES
                for path in data_files_on_disk(table_path(settings.lake, spec))
                for key in erased
            )
            without = tmp_path / "without"
            without_erased_lines(settings.landing_dir, without, erased, START)
            found = differences(settings.with_overrides(landing_dir=without), spark, start=START)
            assert not found, "\n".join(found)
        for spec in ALL_TABLES:
            path = table_path(settings.lake, spec)
            assert str(path).startswith(f"s3a://{bucket}/lake/"), path
            assert DeltaTable(str(path)).version() >= 0, spec.name
        for spec in (*SPARK_WRITTEN, SESSION_CHANGES):
            path = table_path(settings.lake, spec)
            engines = {
                action["commitInfo"].get("engineInfo")
                for version in range(DeltaTable(str(path)).version() + 1)
                for action in commit_actions(path, version) or []
                # A relabel of stitched ids is a driver write (delta-rs), on either backend.
                if "commitInfo" in action and not _is_relabel(action["commitInfo"])
            }
            assert engines and all("Delta-Lake/4.0" in (e or "") for e in engines), (spec, engines)
    local = [p.name for p in settings.lake_dir.rglob("*") if p.is_file()]
    assert not any(name.endswith((".parquet", ".json")) for name in local), local


def _is_relabel(commit_info: dict) -> bool:
    return all(commit_info.get(key) == value for key, value in RELABEL_COMMIT.items())


def _content(path: str) -> list[tuple]:
    """A table's rows as delta-rs reads them, in order, without the columns that name table
    versions and runs (the same content, written by other runs at other versions)."""
    table = DeltaTable(path).to_pyarrow_table()
    keep = [name for name in table.column_names if name not in RUN_COLUMNS]
    return sorted(tuple(map(str, row.values())) for row in table.select(keep).to_pylist())


def _read(path: str) -> bytes:
    filesystem, where = Location.of(path).filesystem()
    with filesystem.open_input_stream(where) as stream:
        return stream.read()
