"""`distir validate`: the strategy pool, and a 2-strategy run against the simulator (2 ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.backend.validate import candidates
from distir.cli import app
from distir.hardware.fit import FamilyFit, GemmFit, LinkFit, Quality
from distir.hardware.gemm import GemmShape, shape_factor
from distir.hardware.profile import QUICK, Calibration, profile_toml
from distir.hardware.specs import LinkSpec


def test_candidates_use_every_rank_and_cover_the_strategy_kinds() -> None:
    pool = candidates(2)
    assert len(pool) == len(set(pool)) >= 20
    assert all(s.d * s.t * s.p == 2 for s in pool)
    assert all(s.k >= 2 for s in pool if s.p > 1)
    assert {s.schedule for s in pool if s.p > 1} == {"gpipe", "1f1b", "interleaved", "zb1"}
    assert {s.zero for s in pool if s.d > 1} == {0, 1, 2, 3}
    assert any(s.sp for s in pool) and {s.recompute for s in pool} == {"none", "full", "selective"}


def _profile(tmp_path: Path, setup: str = "synthetic") -> Path:
    q = Quality(0.0, 0.0, 1)
    gemm = GemmFit({"f32": 50e9}, 1, (256, 256, 256), shape_factor(GemmShape(1, 256, 256, 256), 1), q)
    cal = Calibration(
        "host", "2026-01-01 00:00 UTC", setup, "CPU", 2, 8 << 30, 2e-6, 20e9, gemm,
        {"elementwise": FamilyFit(0.1, 0.5, 2e-6, True, True, q)},
        {"p2p": LinkFit(LinkSpec(1e9, 100e-6), q)}, {},
    )  # fmt: skip
    path = tmp_path / "profile.toml"
    path.write_text(profile_toml(cal), encoding="utf-8")
    return path


@pytest.mark.slow
def test_validate_runs_and_simulates_two_strategies(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    plot = tmp_path / "v.png"
    args = ["validate", "--model", "mlp:layers=4,hidden=6", "--samples", "2", "--batch", "4"]
    args += ["--cluster", str(_profile(tmp_path)), "--plot", str(plot), "--steps", "2", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["samples"] == 2 and len(d["points"]) == 2 and -1 <= d["spearman_rho_throughput"] <= 1
    for p in d["points"]:
        assert p["real_step_s"] > 0 and p["sim_step_s"] > 0
        assert p["real_peak_bytes"] > 0 and p["sim_peak_bytes"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validate_needs_enough_devices(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app, ["validate", "--cluster", str(_profile(tmp_path)), "--nproc", "4", "--samples", "2"]
    )
    assert r.exit_code == 2 and "fewer than --nproc 4" in r.stderr


@pytest.mark.slow
def test_validate_runs_the_strategies_asked_for_and_prints_each(tmp_path: Path) -> None:
    """`--strategy` (a search's winner): exactly that strategy is run and simulated, and the
    text says per strategy how far the simulation is from the run."""
    pytest.importorskip("torch")
    args = ["validate", "--model", "mlp:layers=4,hidden=6", "--strategy", "d1.t1.p2.k2.1f1b", "--batch", "4"]
    profile = str(_profile(tmp_path))
    args += ["--cluster", profile, "--plot", str(tmp_path / "v.png"), "--steps", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.stderr
    assert "1 strategy," in r.stdout and "n/a (one strategy)" in r.stdout
    (row,) = [line for line in r.stdout.splitlines() if line.strip().startswith("d1.t1.p2.k2.1f1b")]
    assert row.count(" ms") == 2 and row.count("MiB") == 2 and row.count("%") == 2
    r = CliRunner().invoke(app, [*args, "--json"])
    d = json.loads(r.stdout)
    assert [p["strategy"] for p in d["points"]] == ["d1.t1.p2.k2.1f1b"]
    assert d["spearman_rho_throughput"] is None
    assert d["cluster"] == profile and not d["quick_profile"]  # --cluster as given, as simulate's


@pytest.mark.parametrize(
    ("strategy", "words"),
    [("d4.t1.p2.k1.zb1", "runs on 8 ranks, not --nproc 2"), ("d2.x", "unknown part 'x'")],
)
def test_validate_refuses_a_strategy_that_cannot_run_here(tmp_path: Path, strategy: str, words: str) -> None:
    r = CliRunner().invoke(
        app, ["validate", "--cluster", str(_profile(tmp_path)), "--strategy", strategy, "--nproc", "2"]
    )
    assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("quick", [True, False])
def test_validate_on_a_quick_profile_warns_first(tmp_path: Path, quick: bool) -> None:
    """A profile of `distir calibrate --quick` is a smoke test: validate says so before it runs
    (here the model then fails to build)."""
    path = _profile(tmp_path, f"gloo, {QUICK}" if quick else "gloo")
    args = ["validate", "--cluster", str(path), "--strategy", "d2.t1.p1.k1", "--nproc", "2"]
    r = CliRunner().invoke(app, [*args, "--model", "no-such-model"])
    assert r.exit_code == 2 and "unknown model" in r.stderr
    assert (f"warning: {path} was calibrated with --quick" in r.stderr) == quick
