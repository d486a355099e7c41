from __future__ import annotations

from sessionize_assets.cli import main


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
