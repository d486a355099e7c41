"""A record writes its fields as metadata entries and reads them back as Dagster stores them."""

from __future__ import annotations

from typing import ClassVar

import pytest
from dagster import AssetMaterialization, MetadataValue

from sessionize_assets.typed_metadata import (
    RUN_PREFIX,
    URI_KEY,
    MetadataRecord,
    Shown,
    entry,
    metadata_record,
)


@metadata_record
class Day(MetadataRecord):
    rows: int
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    changed: bool
    share: float
    by_state: dict[str, int] = entry(keys={"new": "users_new", "active": "users_active"})
    dates: list[str] = entry(shown=Shown.JSON)
    summary: str = entry(shown=Shown.MARKDOWN)
    added: int | None = entry(default=None)


@metadata_record
class Run(MetadataRecord):
    prefix: ClassVar[str] = RUN_PREFIX
    rows_written: int
    spark_jobs: int | None


DAY = Day(
    rows=3,
    uri="/lake/t",
    changed=True,
    share=0.5,
    by_state={"new": 1, "active": 2},
    dates=["2026-01-01"],
    summary="**3** rows",
)


def stored(metadata: dict) -> dict:
    """The metadata as a materialization holds it (every entry a MetadataValue)."""
    return dict(AssetMaterialization(asset_key="t", metadata=metadata).metadata)


def test_a_record_writes_its_entries_in_order_and_reads_them_back():
    metadata = DAY.to_metadata()
    assert list(metadata) == [
        "rows",
        URI_KEY,
        "changed",
        "share",
        "users_new",
        "users_active",
        "dates",
        "summary",
    ]
    assert metadata[URI_KEY] == MetadataValue.path("/lake/t")
    assert metadata["summary"] == MetadataValue.md("**3** rows")
    assert metadata["dates"] == MetadataValue.json(["2026-01-01"])
    assert Day.from_metadata(stored(metadata)) == DAY == Day.from_metadata(metadata)


def test_an_entry_of_default_none_is_written_only_when_set():
    with_added = Day(**{**DAY.__dict__, "added": 4})
    assert with_added.to_metadata()["added"] == 4
    assert Day.from_metadata(stored(with_added.to_metadata())).added == 4
    # A None that is not a default is written: a count that was not taken.
    assert Run(rows_written=1, spark_jobs=None).to_metadata() == {
        "run_rows_written": 1,
        "run_spark_jobs": None,
    }


def test_run_figures_are_prefixed_and_found_only_where_written():
    run = Run(rows_written=7, spark_jobs=2)
    both = stored(DAY.to_metadata() | run.to_metadata())
    assert Run.in_metadata(both) == run and Day.from_metadata(both) == DAY
    assert Run.in_metadata(stored(DAY.to_metadata())) is None


def test_a_missing_entry_is_named():
    metadata = DAY.to_metadata()
    del metadata["changed"]
    with pytest.raises(KeyError, match="Day: the metadata has no entry 'changed'"):
        Day.from_metadata(metadata)
