"""A single-machine deployment: Dagster's webserver, daemon and code server on Postgres, with
the Spark Connect server, under a supervisor (`sessionize serve`, docs/deployment.md)."""
