"""The short soak (`make soak`'s, small): batches dropped under the real `sessionize dev` while
run workers are killed at named fault points and the whole tree is killed and started again;
the tables end equal to the full recompute, and no failed run is left without a retry."""

from __future__ import annotations

import pytest

from sessionize_tests.soak.driver import Soak, SoakPlan

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

SHORT = SoakPlan(
    seed=4,
    batches=4,
    users=30,
    worker_kills=3,
    daemon_kills=0,
    server_kills=0,
    restarts=1,
    backfills=0,
    converge_timeout=600.0,
)


def test_a_short_soak_ends_equal_to_the_full_recompute(tmp_path, spark):
    lines: list[str] = []
    report = Soak(SHORT, root=tmp_path, echo=lines.append).run(spark=spark)
    text = "\n".join([*lines, *report.lines()])
    assert report.ok, text
    assert not report.missed, text
    kills = [fault for fault in report.faults if fault.startswith(("point:", "step:"))]
    assert len(kills) == SHORT.worker_kills, text
    assert sum(fault.startswith("restart:") for fault in report.faults) == 1, text
