"""A table's rows as delta-rs reads them: what the tests compare with the full recompute.

A comparison after every batch read each table through the store, as Spark jobs: eight of them
a batch, about 1.6 s of the 10 s a property-test batch took. delta-rs reads a test's few
hundred rows on the driver in milliseconds, and it is another engine than the one that wrote
most of them: the tables are compared as any Delta reader sees them.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import Row

from sessionize_assets.lake.store import DeltaStore, TableSpec


def table_rows(store: DeltaStore, spec: TableSpec) -> list[Row]:
    """Every row of `spec` in `store`'s lake (none before its first commit), as Spark's
    `collect()` returns them: fields by name or attribute, timestamps naive in UTC."""
    try:
        # On an object store, delta-rs takes its credentials from the `AWS_*` environment.
        table = DeltaTable(store.uri(spec)).to_pyarrow_table()
    except TableNotFoundError:
        return []
    naive = pa.schema(
        pa.field(field.name, pa.timestamp("us")) if pa.types.is_timestamp(field.type) else field
        for field in table.schema
    )
    return [Row(**row) for row in table.cast(naive).to_pylist()]
