"""Dagster metadata as typed records: a frozen dataclass whose fields are the entries of a
materialization's (or a check result's) metadata, which writes them and reads them back.

What a run did is written by the assets through these records and read by `replay`, `rebuild`
and the benchmarks through the same records: an entry's key is written once, as its field's
name (or the `key` its `entry` gives), and a reader gets typed values or a KeyError that
names the missing entry, never a silent 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar, Self, TypeVar, dataclass_transform

from dagster import MetadataValue

# Dagster's own entries: the UI shows them as the partition's row count and the table's place.
ROW_COUNT_KEY = "dagster/row_count"
URI_KEY = "dagster/uri"
# A range run's figures over all its partitions: written on one of its materializations only,
# each key prefixed so that no partition shows the run's totals as its own.
RUN_PREFIX = "run_"


class Shown(Enum):
    """How the UI shows an entry."""

    VALUE = "value"  # as the number, flag or text it is
    PATH = "path"
    MARKDOWN = "markdown"
    JSON = "json"


_WRITERS: dict[Shown, Callable[[Any], Any]] = {
    Shown.VALUE: lambda value: value,
    Shown.PATH: MetadataValue.path,
    Shown.MARKDOWN: MetadataValue.md,
    Shown.JSON: MetadataValue.json,
}


def entry(
    *,
    key: str | None = None,
    shown: Shown = Shown.VALUE,
    keys: Mapping[str, str] | None = None,
    default: Any = dataclasses.MISSING,
) -> Any:
    """A record's field as metadata: the entry `key` (default: the field's name), shown as
    `shown`. With `keys`, the field is a mapping written as one entry per name, `keys[name]`,
    in the order of `keys` (sessions by channel, users by state). A field whose default is
    None is left out of the metadata while it is None (an entry some partitions have)."""
    return dataclasses.field(default=default, metadata={"key": key, "shown": shown, "keys": keys})


R = TypeVar("R", bound="MetadataRecord")


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(entry,))
def metadata_record(cls: type[R]) -> type[R]:
    """A record class (a subclass of `MetadataRecord`): a frozen dataclass of keyword-only
    fields, each an `entry` or a plain entry named as the field."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetadataRecord:
    """The base of the records: `to_metadata` writes the fields in their order, as entries
    prefixed by `prefix`; `from_metadata` reads them back."""

    prefix: ClassVar[str] = ""

    def to_metadata(self) -> dict[str, Any]:
        """The entries, ready for `MaterializeResult`, `AssetMaterialization` or
        `AssetCheckResult` metadata."""
        metadata: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.default is None:
                continue
            write = _WRITERS[field.metadata.get("shown", Shown.VALUE)]
            if field.metadata.get("keys") is not None:
                for name, key in field.metadata["keys"].items():
                    metadata[self.prefix + key] = write(value[name])
            else:
                metadata[self._key(field)] = write(value)
        return metadata

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Self:
        """The record `to_metadata` wrote into `metadata` (entries as Dagster stores them, or
        as written); entries of others are ignored. Raises KeyError naming an entry the
        record needs and `metadata` lacks."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.metadata.get("keys") is not None:
                values[field.name] = {
                    name: _read(metadata, cls.prefix + key, cls)
                    for name, key in field.metadata["keys"].items()
                }
            # An entry that is absent while its field is None is left at None.
            elif cls._key(field) in metadata or field.default is not None:
                values[field.name] = _read(metadata, cls._key(field), cls)
        return cls(**values)

    @classmethod
    def in_metadata(cls, metadata: Mapping[str, Any]) -> Self | None:
        """The record if `metadata` holds its first entry (run figures are on one of a run's
        materializations only), else None."""
        first = dataclasses.fields(cls)[0]
        keys = first.metadata.get("keys")
        key = cls.prefix + next(iter(keys.values())) if keys else cls._key(first)
        return cls.from_metadata(metadata) if key in metadata else None

    @classmethod
    def _key(cls, field: dataclasses.Field[Any]) -> str:
        return cls.prefix + (field.metadata.get("key") or field.name)


def _read(metadata: Mapping[str, Any], key: str, record: type[MetadataRecord]) -> Any:
    if key not in metadata:
        raise KeyError(f"{record.__name__}: the metadata has no entry {key!r}")
    value = metadata[key]
    return value.value if isinstance(value, MetadataValue) else value
