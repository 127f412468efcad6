"""Messages a new user meets first: ``distir validate`` without a calibrated profile (the default
``profile.toml``, not written yet, named with the command that writes it) and ``distir`` without
a command; each one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app


def test_a_missing_default_profile_names_calibrate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256"
    r = CliRunner().invoke(app, ["validate", "--model", model, "--batch", "8", "--samples", "2"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "profile.toml: no such file; validate simulates on the profile distir calibrate writes "
        "(run distir calibrate --out profile.toml first) or on the cluster --cluster names"
    )


def test_a_missing_named_profile_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "mine.toml"
    r = CliRunner().invoke(
        app, ["validate", "--model", "mlp:layers=2,hidden=8", "--samples", "2", "--cluster", str(missing)]
    )
    assert r.exit_code == 2 and r.stderr.strip() == f"{missing}: no such file"


def test_no_command_prints_the_help_and_asks_for_one(capsys: pytest.CaptureFixture[str]) -> None:
    """``distir`` alone: the commands on stdout, then one line saying what is missing, exit 2
    (not an empty ``distir:`` line)."""
    from distir.cli import main

    with pytest.raises(SystemExit) as got:
        main([])
    out, err = capsys.readouterr()
    assert got.value.code == 2 and "simulate" in out
    assert err.strip() == "distir: give a command (listed above)"


def test_simulate_shows_its_phases_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a large program and simulating it can take tens of seconds: a transient spinner
    names the phase on a terminal's stderr; piped, stderr stays empty."""
    import io

    from rich.console import Console

    import distir.cli as cli

    args = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--strategy", "d2.t2"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0 and r.stderr == ""
    seen = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=seen, force_terminal=True, width=100))
    with cli._status("building gpt2-117m:layers=2 under d2.t2"):
        pass
    assert "building gpt2-117m:layers=2 under d2.t2…" in seen.getvalue()


def test_a_strategy_on_some_of_the_clusters_gpus_says_how_many() -> None:
    """d4 on 16 GPUs runs on 4 of them, the others idle: the report's title says so."""
    args = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100:2", "--strategy", "d4"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith("on dgx-a100:2 (4 of its 16 GPUs)")
    r = CliRunner().invoke(app, [*args[:-3], "dgx-a100", "--strategy", "d8"])
    assert r.exit_code == 0 and r.stdout.splitlines()[0].endswith("on dgx-a100")
