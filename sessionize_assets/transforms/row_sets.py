"""Rows as multisets: what a table holds less what another holds, on the driver with Arrow."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def rows_less(rows: pa.Table, less: pa.Table) -> pa.Table:
    """`rows` less one copy of each row of `less` (same columns): a multiset difference, as
    Spark's `exceptAll`, where nulls equal nulls.

    One hash aggregation over both sides (each row +1 or -1), no loop over the rows (a Python
    one cost about 5 s for a mid-size daily batch's 115,000 rewritten sessions): a value kept
    n times is taken n times from its first position in `rows` (its copies are equal in every
    column), in `rows`' order.
    """
    keys = rows.column_names
    both = pa.concat_tables(
        [
            rows.append_column("_first", pa.array(range(rows.num_rows), pa.int64())).append_column(
                "_net", pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows)
            ),
            less.select(keys)
            .cast(rows.schema)
            .append_column("_first", pa.nulls(less.num_rows, pa.int64()))
            .append_column("_net", pa.repeat(pa.scalar(-1, pa.int64()), less.num_rows)),
        ]
    )
    net = both.group_by(keys).aggregate([("_first", "min"), ("_net", "sum")])
    kept = net.filter(pc.greater(net.column("_net_sum"), 0))
    firsts = kept.column("_first_min").to_pylist()
    copies = kept.column("_net_sum").to_pylist()
    taken = sorted(first for first, n in zip(firsts, copies, strict=True) for _ in range(n))
    return rows.take(pa.array(taken, type=pa.int64()))
