from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from sessionize_assets.cli import build_parser, main


def test_generate_writes_a_landing_zone(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SESSIONIZE_START_DATE", "2026-01-01")
    out = tmp_path / "landing"
    args = [
        "generate",
        "--start",
        "2026-01-01",
        "--days",
        "2",
        "--users",
        "20",
        "--seed",
        "1",
        "--out",
    ]
    code = main([*args, str(out)])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "received_date=2026-01-01",
        "received_date=2026-01-02",
    ]
    assert "lines" in capsys.readouterr().out


def test_generate_appends_a_day(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SESSIONIZE_START_DATE", "2026-01-01")
    zone = ["--start", "2026-01-01", "--users", "30", "--seed", "2", "--late-shape", "uniform"]
    grown, longer = tmp_path / "grown", tmp_path / "longer"
    assert main(["generate", *zone, "--days", "2", "--out", str(grown)]) == 0
    assert main(["generate", *zone, "--append-day", "--out", str(grown)]) == 0
    assert "the zone now holds 3" in capsys.readouterr().out
    assert main(["generate", *zone, "--days", "3", "--out", str(longer)]) == 0
    files = sorted(p.relative_to(grown) for p in grown.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(longer) for p in longer.rglob("*") if p.is_file())
    assert all((grown / f).read_bytes() == (longer / f).read_bytes() for f in files)


def test_generate_needs_days_or_append_day(tmp_path):
    zone = ["generate", "--start", "2026-01-01", "--users", "3", "--seed", "1"]
    with pytest.raises(SystemExit):
        main([*zone, "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main([*zone, "--days", "2", "--append-day", "--out", str(tmp_path)])


def test_replay_takes_batches_one_by_one_unless_at_once():
    parser = build_parser()
    assert parser.parse_args(["replay"]).at_once is False
    assert parser.parse_args(["replay", "--at-once"]).at_once is True


def test_dev_hands_its_arguments_to_dagster_dev_and_other_commands_refuse_unknown_ones():
    args, extra = build_parser().parse_known_args(["dev", "-h", "127.0.0.1", "-p", "3000"])
    assert args.command == "dev" and extra == ["-h", "127.0.0.1", "-p", "3000"]
    with pytest.raises(SystemExit):
        main(["replay", "--bogus"])


def test_forget_takes_one_user_or_more_and_needs_one():
    parser = build_parser()
    assert parser.parse_args(["forget", "--user", "a", "--user", "b"]).keys == ["a", "b"]
    with pytest.raises(SystemExit):
        parser.parse_args(["forget"])


def test_sigterm_ends_a_stopped_by_sigterm_block_through_its_cleanup():
    """`sessionize serve`'s foreground, `spark-server` and the soak driver stop their servers
    on SIGTERM as on Ctrl-C: without it, Python dies at once and its children are orphaned."""
    program = textwrap.dedent(
        """
        import time
        from sessionize_assets.cli import stopped_by_sigterm
        try:
            with stopped_by_sigterm():
                print("ready", flush=True)
                time.sleep(60)
        finally:
            print("cleaned up", flush=True)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        rest = process.stdout.read()
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert rest == "cleaned up\n"
