"""The landing zone: one folder of JSON-lines files per received day (SPEC §1)."""

from __future__ import annotations

import gzip
import re
import struct
import zlib
from collections.abc import Iterable
from datetime import date
from pathlib import Path

import pyarrow as pa
from dagster import ConfigurableResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructField, StructType

from sessionize_assets.lake.store import empty_frame

_BATCH = re.compile(r"^received_date=(\d{4}-\d{2}-\d{2})$")
# Spark's error when a file cannot be read or decompressed (a truncated .jsonl.gz).
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE[^\]]*\][^\n]*? reading file (\S+?)\.?\s")
# A blank line (ignored, SPEC §1) holds nothing but ASCII whitespace: space, tab, CR, LF,
# vertical tab, form feed (Java's `\s`; Spark's `trim` strips spaces only).
BLANK_LINE = r"^\s*$"
# BLANK_LINE in Python's engine, matched whole: Java's `$` also matches before a line
# terminator that ends the text (NEL, LS, PS: a line holds no LF, and a file read on the
# driver no CR).
_BLANK_ON_DRIVER = re.compile("[ \t\n\x0b\f\r]*[\u0085\u2028\u2029]?")
LINES_SCHEMA = StructType(
    [
        StructField("raw_line", StringType(), False),
        StructField("received_date", DateType(), False),
        StructField("source_file", StringType(), False),
    ]
)


# The gzip trailer's last field: the member's uncompressed size modulo 2**32 (RFC 1952).
_GZIP_SIZE = struct.Struct("<I")
_GZIP_HEADER_AND_TRAILER = 18


def text_bytes(path: Path) -> int | None:
    """The bytes of a batch file's text: its size, or a `.jsonl.gz`'s uncompressed size from
    its gzip trailer (no decompression). None when the trailer cannot say: a file too short
    to be gzip, or one smaller uncompressed than compressed (not one gzip member of text)."""
    size = path.stat().st_size
    if not path.name.endswith(".gz"):
        return size
    if size < _GZIP_HEADER_AND_TRAILER:
        return None
    with path.open("rb") as handle:
        handle.seek(size - _GZIP_SIZE.size)
        (uncompressed,) = _GZIP_SIZE.unpack(handle.read(_GZIP_SIZE.size))
    return uncompressed if uncompressed >= size else None


class BatchFileError(RuntimeError):
    """A batch file cannot be read (a truncated or corrupt `.jsonl.gz`): its batch fails whole."""


def unreadable_file(error: BaseException) -> str | None:
    """The file Spark names in `error` when reading it failed, else None."""
    match = _FAILED_READ.search(str(error))
    return match.group(1).removeprefix("file://") if match else None


class LandingZoneResource(ConfigurableResource):
    """Lists batches and reads their lines with Spark."""

    landing_dir: str

    @property
    def root(self) -> Path:
        return Path(self.landing_dir).absolute()

    def batch_dir(self, received_date: date) -> Path:
        return self.root / f"received_date={received_date.isoformat()}"

    def batches(self) -> list[date]:
        """Received days that have a batch folder, oldest first."""
        return self._scan()[0]

    def foreign_entries(self) -> list[str]:
        """Names in the landing zone that are no batch folder, such as a folder named
        `received_date=2024-13-45` (not a real day): reported and left alone, never fatal."""
        return self._scan()[1]

    def _scan(self) -> tuple[list[date], list[str]]:
        """(batch days, foreign names); hidden names (a writer's staging) are neither."""
        if not self.root.is_dir():
            return [], []
        found, foreign = [], []
        for child in sorted(self.root.iterdir()):
            day = _batch_day(child.name)
            if day is not None and child.is_dir():
                found.append(day)
            elif not child.name.startswith("."):
                foreign.append(child.name)
        return sorted(found), foreign

    def folders(self, first: date, last: date) -> dict[date, list[Path]]:
        """The batch folders of received days `first`..`last`, with their files."""
        return {day: self.batch_files(day) for day in self.batches() if first <= day <= last}

    def batch_files(self, received_date: date) -> list[Path]:
        """The batch's files (`*.jsonl`, `*.jsonl.gz`), by name; [] when it has no folder."""
        return [path for path in self._entries(received_date) if _is_batch_file(path)]

    def ignored_files(self, received_date: date) -> list[str]:
        """Names in the batch folder that are not batch files: listed in the run, not read."""
        return [path.name for path in self._entries(received_date) if not _is_batch_file(path)]

    def text_bytes(self, received_dates: Iterable[date]) -> int | None:
        """The bytes of text these batches' files hold (`text_bytes`); None when a gzipped
        file's trailer cannot say."""
        sizes = [text_bytes(path) for day in set(received_dates) for path in self.batch_files(day)]
        return None if None in sizes else sum(size for size in sizes if size is not None)

    def read_plain_lines(self, received_dates: Iterable[date]) -> pa.Table | None:
        """`read_lines` on the driver, with no Spark, when every file of these batches is
        UTF-8 text with no carriage return (Spark's text source also ends a line at one);
        None otherwise, or when a gzipped file cannot be read: Spark reads those batches
        (and reports the file it could not). The caller bounds the text it reads this way
        (`text_bytes`): it is held whole."""
        days, texts, files = [], [], []
        for day in sorted(set(received_dates)):
            for path in self.batch_files(day):
                try:
                    data = path.read_bytes()
                    if path.name.endswith(".gz"):
                        data = gzip.decompress(data)
                    text = data.decode("utf-8")
                except (OSError, EOFError, zlib.error, UnicodeDecodeError):
                    return None
                if "\r" in text:
                    return None
                lines = [line for line in text.split("\n") if not _BLANK_ON_DRIVER.fullmatch(line)]
                texts += lines
                days += [day] * len(lines)
                files += [f"received_date={day.isoformat()}/{path.name}"] * len(lines)
        return pa.table(
            {
                "raw_line": pa.array(texts, pa.string()),
                "received_date": pa.array(days, pa.date32()),
                "source_file": pa.array(files, pa.string()),
            }
        )

    def _entries(self, received_date: date) -> list[Path]:
        folder = self.batch_dir(received_date)
        return sorted(folder.iterdir()) if folder.is_dir() else []

    def read_lines(self, spark: SparkSession, received_dates: Iterable[date]) -> DataFrame:
        """Non-blank lines of these batches with their batch and source file (relative to the
        landing zone), in one Spark read however many batches there are. `raw_line` holds
        the line's bytes undecoded: validation rejects those that are not UTF-8."""
        files = [path for day in sorted(set(received_dates)) for path in self.batch_files(day)]
        if not files:
            return empty_frame(spark, LINES_SCHEMA)
        text = spark.read.text([str(path) for path in files])
        # The batch is the file's folder: .../received_date=YYYY-MM-DD/name.jsonl
        batch = F.regexp_extract(
            F.col("_metadata.file_path"), r"/received_date=(\d{4}-\d{2}-\d{2})/[^/]+$", 1
        )
        file_name = F.regexp_extract(F.col("_metadata.file_name"), r"[^/]+$", 0)
        return text.where(~F.col("value").rlike(BLANK_LINE)).select(
            F.col("value").alias("raw_line"),
            F.to_date(batch).alias("received_date"),
            F.concat(F.lit("received_date="), batch, F.lit("/"), file_name).alias("source_file"),
        )


def _is_batch_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith((".jsonl", ".jsonl.gz"))


def _batch_day(name: str) -> date | None:
    match = _BATCH.match(name)
    try:
        return date.fromisoformat(match.group(1)) if match else None
    except ValueError:  # received_date=2024-13-45
        return None
