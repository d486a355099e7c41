"""raw_events / rejected_events through a real Dagster instance and real Delta tables."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from collections import Counter
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance, instance_for_test
from deltalake import DeltaTable

from sessionize_assets.definitions import INGEST_JOB, build_definitions
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_assets.pipeline import ingest as ingest_module
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.validation import REASONS
from sessionize_tests.conftest import make_settings

DAY = date(2026, 1, 5)
LAKE_INGEST_TABLES = ("raw_events", "rejected_events", "batch_event_dates", "landing_batches")


# A small batch is collected once and written from the driver, a large one (or any, on the
# delta-spark backend) by Spark (`Settings.driver_write_bytes`): the same tests, either way.
PLACEMENTS = pytest.mark.parametrize(
    "driver_write_bytes", [DEFAULT_DRIVER_WRITE_BYTES, 0], ids=["driver", "spark"]
)


@pytest.fixture(params=[DEFAULT_DRIVER_WRITE_BYTES, 0], ids=["driver", "spark"])
def settings(request, tmp_path: Path) -> Settings:
    return make_settings(tmp_path, driver_write_bytes=request.param)


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def ingest(settings: Settings, instance: DagsterInstance, day: date):
    job = build_definitions(settings, spark_ui=False).resolve_job_def(INGEST_JOB)
    result = job.execute_in_process(partition_key=day.isoformat(), instance=instance)
    assert result.success
    return {
        event.materialization.asset_key.to_user_string(): {
            k: v.value for k, v in event.materialization.metadata.items()
        }
        for event in result.get_asset_materialization_events()
    }


def delta_rows(settings: Settings, table: str, day: date) -> list[dict]:
    dt = DeltaTable(str(settings.lake_dir / table))
    rows = pa.table(dt.to_pyarrow_table()).to_pylist()
    return [r for r in rows if r["received_date"] == day]


def non_blank_lines(folder: Path) -> list[str]:
    lines = []
    for path in sorted(folder.iterdir()):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            lines += [line.rstrip("\n") for line in handle if line.strip()]
    return lines


def write_batch(settings: Settings, day: date, lines: list[str], name: str = "part.jsonl"):
    folder = settings.landing_dir / f"received_date={day.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def message(mid: str, **changes: object) -> str:
    base = {
        "messageId": mid,
        "userId": "u1",
        "timestamp": "2026-01-05T10:00:00Z",
        "receivedAt": "2026-01-05T10:00:01Z",
        "type": "track",
        "event": "Viewed",
    }
    return json.dumps({k: v for k, v in {**base, **changes}.items() if v is not None})


def test_generated_batch_lands_in_readable_delta_tables(settings, instance):
    generate_landing_zone(
        ZoneSpec(out=settings.landing_dir, start=date(2026, 1, 3), users=40, seed=3), days=3
    )
    day = date(2026, 1, 5)
    metadata = ingest(settings, instance, day)

    raw = delta_rows(settings, "raw_events", day)
    rejected = delta_rows(settings, "rejected_events", day)
    lines = non_blank_lines(settings.landing_dir / f"received_date={day}")
    assert len(raw) + len(rejected) == len(lines) > 0
    assert Counter(r["raw_line"] for r in rejected) <= Counter(lines)
    assert {r["source_file"].split("/")[0] for r in raw} == {f"received_date={day}"}
    assert len({r["message_id"] for r in raw}) == len(raw)

    meta = metadata["raw_events"]
    assert meta["lines"] == len(lines)
    assert meta["accepted"] == len(raw) == meta["dagster/row_count"]
    assert sum(meta["event_dates"].values()) == len(raw)
    assert meta["late_events"] == sum(1 for r in raw if r["event_date"] < day)
    assert sum(metadata["rejected_events"]["rejected_by_reason"].values()) == len(rejected)


def test_every_rejection_reason_and_line_accounting(settings, instance):
    lines = [
        message("ok-1"),
        message("ok-2", userId="", anonymousId="anon-7"),
        "{not json",
        "[1, 2, 3]",
        message("", userId="u2"),
        message("no-user", userId="", anonymousId=""),
        message("bad-ts", timestamp="yesterday"),
        message("bad-recv", receivedAt="later"),
        message("future", timestamp="2026-01-05T11:00:00Z"),
        message("old", timestamp="2025-12-31T23:00:00Z"),
        message("ok-1", receivedAt="2026-01-05T10:00:09Z"),  # a retry of ok-1, received later
        "",
        "   ",
    ]
    write_batch(settings, DAY, lines)
    metadata = ingest(settings, instance, DAY)

    rejected = delta_rows(settings, "rejected_events", DAY)
    reasons = Counter(r["reason"] for r in rejected)
    assert reasons == {
        "malformed_json": 2,
        "missing_message_id": 1,
        "missing_user": 1,
        "bad_timestamp": 1,
        "bad_received_at": 1,
        "future_timestamp": 1,
        "before_start": 1,
        "duplicate": 1,
    }
    # The two byte-level reasons have their own test (hostile lines), and `erased` its own
    # (pipeline/test_forget.py).
    assert set(reasons) == set(REASONS) - {"invalid_encoding", "line_too_long", "erased"}
    raw = delta_rows(settings, "raw_events", DAY)
    assert sorted(r["message_id"] for r in raw) == ["ok-1", "ok-2"]
    assert {r["message_id"]: r["user_id"] for r in raw}["ok-2"] == "anon-7"
    duplicate = next(r for r in rejected if r["reason"] == "duplicate")
    assert "10:00:09" in duplicate["raw_line"]  # the later copy lost
    assert all(r["source_file"] == f"received_date={DAY}/part.jsonl" for r in rejected)
    assert metadata["raw_events"]["lines"] == 11 == len(raw) + len(rejected)


def test_rerun_and_redelivery_replace_the_partition(settings, instance):
    write_batch(settings, DAY, [message("a"), message("b"), "oops"])
    ingest(settings, instance, DAY)
    first = delta_rows(settings, "raw_events", DAY)
    version = DeltaTable(str(settings.lake_dir / "raw_events")).version()

    ingest(settings, instance, DAY)  # the same batch again: same rows, new version
    again = delta_rows(settings, "raw_events", DAY)
    assert sorted(map(str, again)) == sorted(map(str, first))
    assert DeltaTable(str(settings.lake_dir / "raw_events")).version() == version + 1

    write_batch(settings, DAY, [message("b"), message("c")], name="redelivered.jsonl.gz")
    gz = settings.landing_dir / f"received_date={DAY}" / "redelivered.jsonl.gz"
    gz.write_bytes(gzip.compress((message("b") + "\n" + message("c") + "\n").encode()))
    ingest(settings, instance, DAY)
    assert sorted(r["message_id"] for r in delta_rows(settings, "raw_events", DAY)) == ["b", "c"]
    assert delta_rows(settings, "rejected_events", DAY) == []


def test_batches_do_not_touch_each_other(settings, instance):
    other = date(2026, 1, 6)
    write_batch(settings, DAY, [message("a")])
    write_batch(settings, other, [message("b", receivedAt="2026-01-06T00:00:01Z")], name="x.jsonl")
    ingest(settings, instance, other)
    ingest(settings, instance, DAY)
    ingest(settings, instance, other)
    assert [r["message_id"] for r in delta_rows(settings, "raw_events", DAY)] == ["a"]
    assert [r["message_id"] for r in delta_rows(settings, "raw_events", other)] == ["b"]


def test_a_day_without_a_batch_folder_is_empty_not_an_error(settings, instance):
    metadata = ingest(settings, instance, DAY)
    assert metadata["raw_events"]["lines"] == 0
    assert delta_rows(settings, "raw_events", DAY) == []


@PLACEMENTS
def test_hostile_lines_each_get_their_outcome(tmp_path, instance, driver_write_bytes):
    settings = make_settings(tmp_path, max_line_bytes=400, driver_write_bytes=driver_write_bytes)
    latin1 = message("latin1", event="Café").replace("\\u00e9", "é").encode("latin-1")
    long_line = message("long", properties={"blob": "x" * 400})
    folder = settings.landing_dir / f"received_date={DAY}"
    folder.mkdir(parents=True)
    (folder / "part.jsonl").write_bytes(
        b"\n".join([message("ok").encode(), latin1, b"\t", b" \t \x0b\x0c\r", long_line.encode()])
        + b"\n"
    )
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / "notes.txt").write_text("not a batch file")
    (folder / "empty.jsonl").write_bytes(b"")

    metadata = ingest(settings, instance, DAY)

    assert [r["message_id"] for r in delta_rows(settings, "raw_events", DAY)] == ["ok"]
    rejected = {r["reason"]: r for r in delta_rows(settings, "rejected_events", DAY)}
    assert set(rejected) == {"invalid_encoding", "line_too_long"}  # the blank lines are ignored
    assert rejected["invalid_encoding"]["raw_bytes"] == latin1
    assert rejected["invalid_encoding"]["raw_line"] == latin1.decode("utf-8", errors="replace")
    assert rejected["line_too_long"]["raw_line"] == long_line  # kept whole
    assert rejected["line_too_long"]["raw_bytes"] is None
    assert metadata["raw_events"]["lines"] == 3
    assert metadata["raw_events"]["files"] == 2
    assert metadata["raw_events"]["ignored_files"] == ["_SUCCESS", "notes.txt"]


def test_a_corrupt_gzip_fails_its_batch_naming_the_file_and_commits_nothing(settings, instance):
    write_batch(settings, DAY, [message("a"), message("b")])
    ingest(settings, instance, DAY)
    versions = {t: DeltaTable(str(settings.lake_dir / t)).version() for t in LAKE_INGEST_TABLES}
    packed = gzip.compress("".join(message(f"m{i}") + "\n" for i in range(2000)).encode())
    bad = settings.landing_dir / f"received_date={DAY}" / "late.jsonl.gz"
    bad.write_bytes(packed[: len(packed) // 2])

    job = build_definitions(settings, spark_ui=False).resolve_job_def(INGEST_JOB)
    result = job.execute_in_process(
        partition_key=DAY.isoformat(), instance=instance, raise_on_error=False
    )

    assert not result.success
    (failure,) = result.get_step_failure_events()
    message_text = failure.step_failure_data.error.cause.message
    assert f"cannot read batch file {bad}" in message_text
    assert {t: DeltaTable(str(settings.lake_dir / t)).version() for t in versions} == versions
    assert sorted(r["message_id"] for r in delta_rows(settings, "raw_events", DAY)) == ["a", "b"]


def test_a_vanished_folder_keeps_what_was_ingested(settings, instance):
    other = date(2026, 1, 6)
    write_batch(settings, DAY, [message("a"), "oops"])
    write_batch(settings, other, [message("b", receivedAt="2026-01-06T00:00:01Z")])
    job = build_definitions(settings, spark_ui=False).resolve_job_def(INGEST_JOB)
    tags = {RANGE_START: DAY.isoformat(), RANGE_END: other.isoformat()}
    assert job.execute_in_process(instance=instance, tags=tags).success
    shutil.rmtree(settings.landing_dir / f"received_date={DAY}")  # landing retention

    result = job.execute_in_process(instance=instance, tags=tags)  # a backfill over both

    assert result.success
    assert [r["message_id"] for r in delta_rows(settings, "raw_events", DAY)] == ["a"]
    assert len(delta_rows(settings, "rejected_events", DAY)) == 1
    reported = {e.materialization.partition for e in result.get_asset_materialization_events()}
    assert reported == {other.isoformat()}  # the kept day is not reported as rewritten
    warnings = [
        e.message
        for e in instance.all_logs(result.run_id)
        if e.level >= logging.WARNING and "is gone" in e.message
    ]
    assert len(warnings) == 1 and str(DAY) in warnings[0]


def test_materializations_are_recorded_per_partition(settings, instance):
    write_batch(settings, DAY, [message("a")])
    ingest(settings, instance, DAY)
    for key in ("raw_events", "rejected_events"):
        record = instance.get_latest_materialization_event(AssetKey(key))
        assert record is not None and record.asset_materialization.partition == DAY.isoformat()


def test_a_range_of_batches_is_one_run_reporting_each_partition(settings, instance):
    second = date(2026, 1, 6)
    write_batch(settings, DAY, [message("a"), message("b"), "not json"])
    write_batch(settings, second, [message("c", receivedAt="2026-01-06T10:00:00Z")])
    job = build_definitions(settings, spark_ui=False).resolve_job_def(INGEST_JOB)
    result = job.execute_in_process(
        instance=instance,
        tags={RANGE_START: DAY.isoformat(), RANGE_END: second.isoformat()},
    )
    assert result.success
    reported = {
        (event.asset_key.to_user_string(), event.materialization.partition): {
            k: v.value for k, v in event.materialization.metadata.items()
        }
        for event in result.get_asset_materialization_events()
    }
    for day in (DAY, second):
        for table in ("raw_events", "rejected_events"):
            rows = delta_rows(settings, table, day)
            assert reported[(table, day.isoformat())]["dagster/row_count"] == len(rows)
    assert reported[("raw_events", DAY.isoformat())]["touched_event_dates"] == [DAY.isoformat()]
    assert reported[("raw_events", second.isoformat())]["lines"] == 1
    assert reported[("rejected_events", DAY.isoformat())]["dagster/row_count"] == 1


def _landed(
    settings: Settings, instance: DagsterInstance, name: str, content: bytes
) -> tuple[int, list[list[tuple[str, str]]]]:
    """Land `content` as the file `name` of DAY's batch and ingest it: the run's Spark jobs,
    and the (messageId, line) of `raw_events` and of `rejected_events`."""
    folder = settings.landing_dir / f"received_date={DAY.isoformat()}"
    folder.mkdir(parents=True)
    (folder / name).write_bytes(content)
    jobs = ingest(settings, instance, DAY)["raw_events"]["run_spark_jobs"]
    return jobs, [
        sorted((r["message_id"] or "", r["raw_line"]) for r in delta_rows(settings, table, DAY))
        for table in ("raw_events", "rejected_events")
    ]


def test_a_batch_of_much_text_is_handed_to_the_driver_in_partitions_of_bounded_text(
    tmp_path, instance, monkeypatch
):
    """A gzipped batch that Spark reads (its lines end in CR LF) and whose text needs more
    partitions than Spark's shuffle gives is spread over enough of them
    (COLLECTED_TEXT_PER_PARTITION, lowered here to a few lines' worth): still one Spark job,
    the same rows and rejections as in the two shuffle partitions."""
    lines = [message(f"m{i}", userId=f"u{i % 7}") for i in range(300)]
    lines += [message("m0", receivedAt="2026-01-05T10:00:00Z"), "not json"]  # a copy, a reject
    text = ("\r\n".join(lines) + "\r\n").encode()
    rows, jobs = {}, {}
    for spread, per_partition in (("shuffle", len(text)), ("many", 2_000)):
        monkeypatch.setattr(ingest_module, "COLLECTED_TEXT_PER_PARTITION", per_partition)
        settings = make_settings(tmp_path / spread)
        jobs[spread], rows[spread] = _landed(
            settings, instance, "part.jsonl.gz", gzip.compress(text)
        )
    assert jobs == {"shuffle": 1, "many": 1}
    assert rows["many"] == rows["shuffle"]
    assert [len(found) for found in rows["many"]] == [300, 2]


def test_a_batch_is_read_on_the_driver_or_collected_to_it_by_its_text(tmp_path, instance):
    """A batch of plain UTF-8 text within `driver_write_bytes` is read and parsed on the
    driver, with no Spark job; past that, but within COLLECTED_TEXT_FACTOR times it, it is
    collected to the driver in one Spark job; past that, Spark's executors write it. The same
    rows in each way."""
    lines = [message(f"m{i}", userId=f"u{i % 7}") for i in range(200)]
    lines += [message("m0", receivedAt="2026-01-05T10:00:00Z"), "not json"]  # a copy, a reject
    text = ("\n".join(lines) + "\n").encode()
    factor = ingest_module.COLLECTED_TEXT_FACTOR
    rows, jobs = {}, {}
    for path, bound in (
        ("driver", len(text)),
        ("collected", len(text) - 1),
        ("spark", len(text) // factor - 1),
    ):
        settings = make_settings(tmp_path / path, driver_write_bytes=bound)
        jobs[path], rows[path] = _landed(settings, instance, "part.jsonl", text)
    assert jobs["driver"] == 0 and jobs["collected"] == 1 and jobs["spark"] > 1
    assert rows["driver"] == rows["collected"] == rows["spark"]
    assert [len(found) for found in rows["driver"]] == [200, 2]
