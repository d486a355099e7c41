"""`sessionize replay`, killed with SIGKILL at one of its Delta commits: the fault injector.

    python -m sessionize_tests.fault_runner AT WHEN

kills the process group (the JVM with it, as a crash would) just `before` or `after` the
AT-th commit to any table, counting from 1; with AT = 0 it kills nothing and prints the
number of commits last. Every commit of the embedded store goes through delta-rs's
`create_write_transaction`, so that is where the count is kept: nothing of the project's own
code is replaced. The settings come from the environment, as for the `sessionize` command.
"""

from __future__ import annotations

import os
import signal
import sys

from deltalake import DeltaTable

COMMITS_LINE = "fault_runner commits: "


def _kill() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> int:
    at, when = int(argv[0]), argv[1]
    assert when in ("before", "after"), when
    commit = DeltaTable.create_write_transaction
    count = 0

    def counted(self: DeltaTable, *args: object, **kwargs: object) -> object:
        nonlocal count
        count += 1
        if count == at and when == "before":
            _kill()
        result = commit(self, *args, **kwargs)
        if count == at and when == "after":
            _kill()
        return result

    DeltaTable.create_write_transaction = counted  # type: ignore[method-assign]
    from sessionize_assets.cli import main as sessionize

    code = sessionize(["replay"])
    print(f"{COMMITS_LINE}{count}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
