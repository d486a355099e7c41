"""Where a write's rows are turned into Parquet files: on the driver or on Spark's executors.

A light module of its own, so that `settings` reads the default without importing Spark.
"""

# The embedded backend collects a write whose plan Spark's optimizer estimates at most this
# size (bytes of its inputs) with Arrow and writes it from the driver
# (`Settings.driver_write_bytes`, `EmbeddedDeltaStore._stage`).
DEFAULT_DRIVER_WRITE_BYTES = 16 << 20
