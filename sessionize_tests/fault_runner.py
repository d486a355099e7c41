"""`sessionize replay` (or another command), killed with SIGKILL at one of its Delta commits:
the fault injector.

    python -m sessionize_tests.fault_runner AT WHEN [COMMAND ...]

runs `sessionize COMMAND ...` (`replay` when none is given) and kills the process group (the
JVM with it, as a crash would) just `before` or `after` the AT-th commit to any table, counting
from 1; with AT = 0 it kills nothing and prints the number of commits last. The count is kept
where the libraries commit, so nothing of the project's own code is replaced: every commit of
the embedded store, and the delta-spark store's commits of small tables, go through delta-rs's
`create_write_transaction`; the delta-spark store's other commits are Delta Spark's
`DataFrameWriter.save`, `DeltaMergeBuilder.execute` and `DeltaTableBuilder.execute`. The
settings come from the environment, as for the `sessionize` command.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from delta.tables import DeltaMergeBuilder, DeltaTableBuilder
from deltalake import DeltaTable
from pyspark.sql import DataFrameWriter

COMMITS_LINE = "fault_runner commits: "


def _kill() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> int:
    at, when = int(argv[0]), argv[1]
    assert when in ("before", "after"), when
    count = 0

    def counting(commit: Callable[..., object]) -> Callable[..., object]:
        def counted(*args: object, **kwargs: object) -> object:
            nonlocal count
            count += 1
            if count == at and when == "before":
                _kill()
            result = commit(*args, **kwargs)
            if count == at and when == "after":
                _kill()
            return result

        return counted

    for owner, name in (
        (DeltaTable, "create_write_transaction"),
        (DataFrameWriter, "save"),
        (DeltaMergeBuilder, "execute"),
        (DeltaTableBuilder, "execute"),
    ):
        setattr(owner, name, counting(getattr(owner, name)))
    from sessionize_assets.cli import main as sessionize

    code = sessionize(argv[2:] or ["replay"])
    print(f"{COMMITS_LINE}{count}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
