"""The benchmarks, each a module run from the repository's root (the Makefile's targets):

- `python -m scripts.bench.small_batch` (`make bench-small`): a batch of about 1,000 lines
  against a bare PySpark recompute of its whole zone, and the batch by phase;
- `python -m scripts.bench.daemon` (`make bench-daemon`): the UI's runs under `sessionize dev`
  against the same batches in one process;
- `python -m scripts.bench.scale` (`make bench`): one daily batch against a full recompute as
  the history grows, per lateness shape and backend; its tables are in `scale_report`.

They share how they print (`printing`) and the bare PySpark scripts they compare with
(`floors`). They print their figures and assert nothing.
"""

from datetime import date

# The first day of every benchmark's generated zone: the same zone for the same arguments.
START = date(2026, 1, 1)
