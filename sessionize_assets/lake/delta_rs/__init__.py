"""What both backends share, made with delta-rs on the driver: the log's reads (`log_files`),
the tables' reads (`reads`), the commits of staged Parquet files (`log_commits`, `writes`).
Nothing here needs the Delta jars."""
