"""The `delta-spark` backend: every change of a data table is one of Delta Lake's own Spark
operations (`store`), run one at a time with its bookkeeping on the session and its commit
found in the log (`commits`), from SQL and predicates built from names (`sql`)."""
