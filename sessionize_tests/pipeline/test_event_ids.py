"""The id index's lookup of a run's copies: on the driver as by Spark."""

from __future__ import annotations

from datetime import date, timedelta

import pyarrow as pa
from hypothesis import HealthCheck, example, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import EVENT_IDS
from sessionize_assets.pipeline.event_ids import other_copies, other_copies_on_driver
from sessionize_assets.transforms.id_hash import xxhash64

FIRST = date(2026, 1, 5)
# A batch's copies: one per id (ingestion keeps one), each on a date near the batch's.
_BATCH = st.dictionaries(
    st.sampled_from([f"m{i}" for i in range(8)]), st.integers(-2, 0), max_size=6
)


@given(
    batches=st.dictionaries(st.integers(0, 4), _BATCH, min_size=1, max_size=5),
    held=st.sets(st.integers(0, 4), min_size=1, max_size=2),
)
# x is held alone in the batch where another held id, y, has a copy: x is no contested id.
@example(batches={0: {"x": 0, "y": 0}, 1: {"y": -1}}, held={0, 1})
@examples(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_the_driver_finds_the_other_copies_spark_finds(spark, tmp_path_factory, batches, held):
    store = EmbeddedDeltaStore(spark=spark, lake=tmp_path_factory.mktemp("lake"))
    copies = {
        (FIRST + timedelta(days=batch + offset), event_id, FIRST + timedelta(days=batch))
        for batch, ids in batches.items()
        for event_id, offset in ids.items()
    }
    for received in sorted({r for _, _, r in copies}):
        rows = sorted(c for c in copies if c[2] == received)
        store.replace_partitions_arrow(
            EVENT_IDS,
            pa.table(
                {
                    "id_hash": [xxhash64(event_id) for _, event_id, _ in rows],
                    "event_id": [event_id for _, event_id, _ in rows],
                    "event_date": [event_date for event_date, _, _ in rows],
                    "received_date": [received for _ in rows],
                }
            ),
            partitions=[received],
        )
    # The run's copies: every copy of its batches.
    mine = {c for c in copies if (c[2] - FIRST).days in held}

    by_spark = other_copies(
        store,
        spark.createDataFrame(sorted(mine), "event_date date, event_id string, received_date date"),
        rows=len(mine) + 1,
    )
    on_driver = other_copies_on_driver(store, mine)

    assert on_driver == by_spark
    # What it means: an id of the run is contested when another batch holds a copy of it.
    contested = {c[1] for c in mine if any(o[1] == c[1] and o[2] != c[2] for o in copies)}
    assert set(on_driver.copies) == contested
