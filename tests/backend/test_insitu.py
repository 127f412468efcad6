"""In-situ calibration (``distir.backend.insitu``): the per-op and per-message overhead fit
(closed-form samples), their application to every launch time and link latency of a profile,
and the simulated op count of a one-rank step against the program's ops."""

from __future__ import annotations

import pytest

from distir.backend.insitu import InSituSample, Overheads, apply, fit_overhead
from distir.hardware.cluster import cluster_from_toml
from distir.hardware.profile import profile_toml
from hardware.test_profile import _calibration  # tests/ is on sys.path (rootdir of package-less tests)


def test_overheads_are_the_median_gaps_per_simulated_op_and_message() -> None:
    # one rank: gaps per op 10 µs, 20 µs, 40 µs -> median 20 µs
    samples = [
        InSituSample("a", real_s=1e-3 + 100 * 10e-6, sim_s=1e-3, ops=100),
        InSituSample("b", real_s=2e-3 + 50 * 20e-6, sim_s=2e-3, ops=50),
        InSituSample("c", real_s=5e-4 + 10 * 40e-6, sim_s=5e-4, ops=10),
        # two ranks: after 20 µs per op, 300 µs and 500 µs per message -> median 400 µs
        InSituSample("d", real_s=1e-3 + 80 * 20e-6 + 10 * 300e-6, sim_s=1e-3, ops=80, messages=10),
        InSituSample("e", real_s=1e-3 + 60 * 20e-6 + 4 * 500e-6, sim_s=1e-3, ops=60, messages=4),
    ]
    fit = fit_overhead(samples)
    assert fit.op_s == pytest.approx(20e-6) and fit.message_s == pytest.approx(400e-6)


def test_a_faster_real_step_adds_no_overhead() -> None:
    fit = fit_overhead([InSituSample("a", real_s=1e-3, sim_s=2e-3, ops=10)])
    assert fit == Overheads(0.0, 0.0)
    with pytest.raises(ValueError, match="on one rank"):
        fit_overhead([InSituSample("d", real_s=1e-3, sim_s=1e-3, ops=10, messages=3)])


def test_the_overheads_reach_every_launch_time_and_link_of_the_profile() -> None:
    base = _calibration()
    cal = apply(base, Overheads(25e-6, 300e-6), [InSituSample("gpt:x d1 batch 2", 3e-3, 2e-3, 40.0)])
    text = profile_toml(cal)
    assert "25 µs per op added to every launch time" in text and "300 µs per message" in text
    assert "gpt:x d1 batch 2: real 3.00 ms, simulated 2.00 ms, 40 ops, 0 messages" in text
    node = cluster_from_toml(text).nodes[0]
    d = node.device
    p2p, allreduce = base.links["p2p"].link, base.links["allreduce"].link
    assert node.intra.latency_s == pytest.approx(p2p.latency_s + 300e-6, rel=1e-5)
    assert node.intra.bandwidth == pytest.approx(p2p.bandwidth, rel=1e-5)
    assert node.intra_for("allreduce").latency_s == pytest.approx(allreduce.latency_s + 300e-6, rel=1e-5)
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
    sim, ops, messages = _simulated(_calibration(), model, strategy, batch)
    n = sum(1 for _ in model_program(model, strategy, batch).module.entry.ops())
    assert sim > 0 and 0.5 * n <= ops <= n + 0.5 and messages == pytest.approx(0.0, abs=1e-6)


def test_a_data_parallel_step_counts_its_messages() -> None:
    from distir.backend.insitu import _simulated

    model = "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=64"
    _, ops, messages = _simulated(_calibration(), model, "d2.t1.p1.k1.1f1b", 2)
    assert ops > 0 and messages >= 1
