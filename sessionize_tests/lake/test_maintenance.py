"""Table maintenance: compaction changes no row, a checkpoint is written, vacuum deletes only
what no version within the retention reads, and a reader of the current version is safe."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_tests.lake.test_store import D1, D2, SPEC, frame, rows

COMPACTED = replace(SPEC, name="small_files", compact=True)
# Each backend maintains its tables: delta-rs, or Delta Spark's OPTIMIZE and VACUUM.
ON_EACH_BACKEND = pytest.mark.parametrize(
    "backend", [EmbeddedDeltaStore, DeltaSparkStore], ids=["embedded", "delta-spark"]
)


def _content(table: DeltaTable) -> list[dict]:
    return sorted(pa.table(table.to_pyarrow_table()).to_pylist(), key=lambda r: r["id"])


def _age(path, *, days: int) -> None:
    old = time.time() - days * 86_400
    os.utime(path, (old, old))


@ON_EACH_BACKEND
def test_maintenance_compacts_checkpoints_and_vacuums_without_losing_a_row(
    spark, tmp_path, backend
):
    store = backend(spark=spark, lake=tmp_path)
    for i in range(3):  # three runs each add a small file to D1
        store.rewrite(COMPACTED, add=lambda i=i: frame(spark, rows((f"a{i}", D1, i))))
    store.replace_partitions(COMPACTED, frame(spark, rows(("b0", D2, 1))), partitions=[D2])
    store.replace_partitions(COMPACTED, frame(spark, rows(("b1", D2, 2))), partitions=[D2])
    root = store.path(COMPACTED).local_path()
    # A killed writer's leftovers: a file moved into the table but never committed, and a
    # staging folder, both older than the retention.
    live = sorted(root.glob("day=2026-01-01/*.parquet"))
    stray = live[0].with_name("part-killed-writer.parquet")
    shutil.copy(live[0], stray)
    staging = root / "_staging" / "dead"
    staging.mkdir(parents=True)
    _age(stray, days=30)
    _age(staging, days=30)
    before = DeltaTable(str(root))
    content = _content(before)

    kept = store.maintain(COMPACTED, retention=timedelta(days=7))

    assert (kept.files_compacted, kept.files_written) == (3, 1)  # D1's files; D2 has one
    assert kept.files_deleted == 1 and not stray.exists() and not staging.exists()
    # The replaced and compacted files are younger than the retention: the version read
    # before maintenance is still whole, and so is the current one.
    assert _content(before) == content == _content(DeltaTable(str(root)))
    assert list((root / "_delta_log").glob(f"{kept.version:020d}.checkpoint.parquet"))

    swept = store.maintain(COMPACTED, retention=timedelta(0))

    assert swept.files_compacted == 0 and swept.files_deleted == 4  # 3 compacted + 1 replaced
    current = DeltaTable(str(root))
    assert _content(current) == content
    on_disk = {p.resolve().as_uri() for p in root.glob("day=*/*.parquet")}
    assert on_disk == {
        Path(unquote(urlparse(u).path)).resolve().as_uri() for u in current.file_uris()
    }
    if backend is DeltaSparkStore:  # maintenance commits too are Delta Spark's own
        engines = {
            action["commitInfo"].get("engineInfo", "")
            for commit in (root / "_delta_log").glob("*.json")
            for action in map(json.loads, commit.read_text().splitlines())
            if "commitInfo" in action
        }
        assert all("Delta-Lake/4.0" in engine for engine in engines), engines


@ON_EACH_BACKEND
def test_a_deliberate_layout_is_not_compacted(spark, tmp_path, backend):
    store = backend(spark=spark, lake=tmp_path)
    for i in range(2):
        store.rewrite(SPEC, add=lambda i=i: frame(spark, rows((f"a{i}", D1, i))))
    result = store.maintain(SPEC, retention=timedelta(days=7))
    assert (result.files_compacted, result.files_deleted) == (0, 0)
    assert len(DeltaTable(str(store.path(SPEC))).file_uris()) == 2
