"""Every asset's records read back what they write, keyed by their table."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from dagster import AssetMaterialization

from sessionize_assets.assets import reports
from sessionize_assets.assets.reports import CHANNEL_KEYS, STATE_KEYS, AssetRecord
from sessionize_assets.lake import tables

RECORDS = [
    value
    for value in vars(reports).values()
    if isinstance(value, type) and issubclass(value, AssetRecord) and "table" in vars(value)
]
SAMPLES = {int: 3, bool: True, float: 0.25, str: "text"}


def sample(record: type[AssetRecord]) -> AssetRecord:
    """`record` with a value of each field's type."""
    hints = typing.get_type_hints(record)
    values: dict[str, object] = {}
    for field in dataclasses.fields(record):
        kind = hints[field.name]
        keys = field.metadata.get("keys")
        if keys is not None:
            values[field.name] = dict.fromkeys(keys, 2)
        elif typing.get_origin(kind) is dict:
            values[field.name] = {"2026-01-01": 1}
        elif typing.get_origin(kind) is list:
            values[field.name] = ["2026-01-01"]
        else:
            values[field.name] = SAMPLES[
                typing.get_args(kind)[0] if typing.get_args(kind) else kind
            ]
    return record(**values)


@pytest.mark.parametrize("record", RECORDS, ids=lambda record: record.__name__)
def test_a_record_reads_back_what_it_writes(record):
    written = sample(record)
    stored = AssetMaterialization(asset_key=record.table.name, metadata=written.to_metadata())
    assert record.from_metadata(stored.metadata) == written
    assert record.table in vars(tables).values()


def test_channels_and_states_have_an_entry_each():
    assert len(set(CHANNEL_KEYS.values())) == len(CHANNEL_KEYS)
    assert set(STATE_KEYS.values()) == {
        "users_new",
        "users_active",
        "users_inactive",
        "users_dormant",
        "users_churned",
    }
