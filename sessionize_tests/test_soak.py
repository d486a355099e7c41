"""The short soak (`make soak`'s, small): batches dropped under the real `sessionize dev` while
run workers are killed at named fault points and the whole tree is killed and started again;
the tables end equal to the full recompute, and no failed run is left without a retry."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from sessionize_tests.soak.driver import Soak, SoakPlan, add_one_event, one_event_more

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
    pids = re.findall(r"\(pid (\d+)", "\n".join(kills))
    assert len(set(pids)) == len(kills), text  # each kill a worker of its own
    assert sum(fault.startswith("restart:") for fault in report.faults) == 1, text


def test_the_changed_redelivery_copies_an_event_past_hostile_lines():
    """Seed 3's 30-batch soak stopped at its re-delivery: the file's first lines were not
    UTF-8. The copy skips them, and does not glue itself to a last line without a newline."""
    event = {"messageId": "m1", "type": "track", "userId": "u1"}
    content = b"\xe9t\xe9 not json\n" + json.dumps(event).encode() + b"\n{truncated"
    lines = one_event_more(content).split(b"\n")
    assert lines[:3] == content.split(b"\n")
    assert json.loads(lines[3]) == {**event, "messageId": "m1-redelivered"}
    with pytest.raises(ValueError):
        one_event_more(b"\xff\n")


def test_the_changed_redelivery_takes_a_gzip_file_when_the_folder_has_no_other(tmp_path):
    """Seed 12's 30-batch soak stopped at its re-delivery: the folder held gzip files alone."""
    event = {"messageId": "m1", "type": "track", "userId": "u1"}
    (tmp_path / "part-00000.jsonl.gz").write_bytes(b"not gzip")  # skipped: broken
    (tmp_path / "part-00001.jsonl.gz").write_bytes(gzip.compress(json.dumps(event).encode()))

    changed = add_one_event(tmp_path)

    assert changed.name == "part-00001.jsonl.gz"
    lines = gzip.decompress(changed.read_bytes()).splitlines()
    assert [json.loads(line)["messageId"] for line in lines] == ["m1", "m1-redelivered"]
    assert (tmp_path / "part-00000.jsonl.gz").read_bytes() == b"not gzip"
