"""`transforms/row_sets.py`: a multiset difference of Arrow rows."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from sessionize_assets.transforms.row_sets import rows_less

_CELLS = st.one_of(st.none(), st.integers(0, 2))


@given(
    rows=st.lists(st.tuples(_CELLS, _CELLS), max_size=12),
    less=st.lists(st.tuples(_CELLS, _CELLS), max_size=12),
)
def test_rows_less_is_a_multiset_difference_where_nulls_are_equal(rows, less):
    def table(values):
        return pa.table(
            {
                "n": pa.array([a for a, _ in values], pa.int64()),
                "s": pa.array([None if b is None else str(b) for _, b in values], pa.string()),
            }
        )

    left = Counter(tuple(r.values()) for r in table(less).to_pylist())
    kept = []
    for row in (tuple(r.values()) for r in table(rows).to_pylist()):
        if left[row]:
            left[row] -= 1
        else:
            kept.append(row)
    got = rows_less(table(rows), table(less))
    assert got.schema == table(rows).schema
    assert sorted(map(tuple, (r.values() for r in got.to_pylist())), key=repr) == sorted(
        kept, key=repr
    )
