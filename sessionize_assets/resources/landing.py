"""The landing zone: one folder of JSON-lines files per received day (SPEC §1)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import date
from pathlib import Path

from dagster import ConfigurableResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructField, StructType

log = logging.getLogger(__name__)

_BATCH = re.compile(r"^received_date=(\d{4}-\d{2}-\d{2})$")
LINES_SCHEMA = StructType(
    [
        StructField("raw_line", StringType(), False),
        StructField("received_date", DateType(), False),
        StructField("source_file", StringType(), False),
    ]
)


class LandingZoneResource(ConfigurableResource):
    """Lists batches and reads their lines with Spark."""

    landing_dir: str

    @property
    def root(self) -> Path:
        return Path(self.landing_dir).absolute()

    def batch_dir(self, received_date: date) -> Path:
        return self.root / f"received_date={received_date.isoformat()}"

    def batches(self) -> list[date]:
        """Received days that have a batch folder, oldest first (a folder whose name is not a
        real date, such as `received_date=2024-13-45`, is no batch: it is logged and left)."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            match = _BATCH.match(child.name)
            if not (match and child.is_dir()):
                continue
            try:
                found.append(date.fromisoformat(match.group(1)))
            except ValueError:
                log.warning("landing folder %s is not a received day: ignored", child)
        return sorted(found)

    def folders(self, first: date, last: date) -> dict[date, list[Path]]:
        """The batch folders of received days `first`..`last`, with their files."""
        return {day: self.batch_files(day) for day in self.batches() if first <= day <= last}

    def batch_files(self, received_date: date) -> list[Path]:
        folder = self.batch_dir(received_date)
        if not folder.is_dir():
            return []
        return sorted(
            path
            for path in folder.iterdir()
            if path.is_file() and path.name.endswith((".jsonl", ".jsonl.gz"))
        )

    def read_lines(self, spark: SparkSession, received_dates: Iterable[date]) -> DataFrame:
        """Non-blank lines of these batches with their batch and source file (relative to the
        landing zone), in one Spark read however many batches there are."""
        files = [path for day in sorted(set(received_dates)) for path in self.batch_files(day)]
        if not files:
            return spark.createDataFrame([], LINES_SCHEMA)
        text = spark.read.text([str(path) for path in files])
        # The batch is the file's folder: .../received_date=YYYY-MM-DD/name.jsonl
        batch = F.regexp_extract(
            F.col("_metadata.file_path"), r"/received_date=(\d{4}-\d{2}-\d{2})/[^/]+$", 1
        )
        file_name = F.regexp_extract(F.col("_metadata.file_name"), r"[^/]+$", 0)
        return text.where(F.trim(F.col("value")) != "").select(
            F.col("value").alias("raw_line"),
            F.to_date(batch).alias("received_date"),
            F.concat(F.lit("received_date="), batch, F.lit("/"), file_name).alias("source_file"),
        )
