"""In-situ calibration (``distir.backend.insitu``): the per-op overhead fit, its application to
every launch time of a profile, and the simulated-ops count against the simulator itself."""

from __future__ import annotations

import pytest

from distir.backend.insitu import InSituSample, fit_overhead, with_overhead
from distir.hardware.clusterfile import cluster_from_toml
from distir.hardware.profile import profile_toml
from tests.hardware.test_profile import _calibration


def test_overhead_is_the_median_gap_per_simulated_op() -> None:
    # gaps per op: 10 µs, 20 µs, 40 µs -> median 20 µs
    samples = [
        InSituSample("a", real_s=1e-3 + 100 * 10e-6, sim_s=1e-3, ops=100),
        InSituSample("b", real_s=2e-3 + 50 * 20e-6, sim_s=2e-3, ops=50),
        InSituSample("c", real_s=5e-4 + 10 * 40e-6, sim_s=5e-4, ops=10),
    ]
    assert fit_overhead(samples) == pytest.approx(20e-6)


def test_a_faster_real_step_adds_no_overhead() -> None:
    assert fit_overhead([InSituSample("a", real_s=1e-3, sim_s=2e-3, ops=10)]) == 0.0
    with pytest.raises(ValueError, match="at least one program"):
        fit_overhead([])


def test_the_overhead_reaches_every_launch_time_of_the_profile() -> None:
    base = _calibration()
    cal = with_overhead(base, 25e-6)._replace(
        insitu_overhead_s=25e-6,
        measurements=base.measurements._replace(insitu=(InSituSample("gpt:x d1 batch 2", 3e-3, 2e-3, 40.0),)),
    )
    text = profile_toml(cal)
    assert "25 µs per op added to every launch time" in text
    assert "gpt:x d1 batch 2: real 3.00 ms, simulated 2.00 ms, 40 ops" in text
    d = cluster_from_toml(text).nodes[0].device
    assert d.launch_overhead_s == pytest.approx(base.launch_s + 25e-6, rel=1e-5)
    for fam, f in base.families.items():
        rates = d.family_rates(fam)
        assert rates is not None and rates.launch_s == pytest.approx(f.launch_s + 25e-6, rel=1e-5)
    assert cal.measurements.as_json()["insitu"][0]["ops"] == 40.0


def test_simulated_ops_count_the_charged_ops_of_a_one_rank_step() -> None:
    """One rank, no fusion, no communication: the step is the sum of its ops' times, so adding δ
    to every launch adds δ per op charged — at least one per program op that does work, and no
    more than the program's ops."""
    from distir.backend.insitu import _simulated
    from distir.backend.program import model_program

    model, strategy, batch = "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=64", "d1.t1.p1.k1.1f1b", 2
    sim, ops = _simulated(_calibration(), model, strategy, batch)
    n = sum(1 for _ in model_program(model, strategy, batch).module.entry.ops())
    assert sim > 0 and 0.5 * n <= ops <= n + 0.5
