"""In situ (``distir.backend.insitu``): the rank loop's overheads applied to every launch time and
link latency of a profile (a 2-rank collective pays its per-call overhead once, whatever its
formula's latency coefficient), and the simulated op count of a one-rank step against the
program's ops."""

from __future__ import annotations

import pytest

from distir.backend.insitu import InSituSample, Overheads, apply
from distir.hardware.cluster import cluster_from_toml
from distir.hardware.profile import profile_toml
from hardware.test_profile import _calibration  # tests/ is on sys.path (rootdir of package-less tests)


def test_the_overheads_reach_every_launch_time_and_link_of_the_profile() -> None:
    from distir.sim import collectives as coll

    base = _calibration()
    cal = apply(base, Overheads(25e-6, 400e-6, 300e-6))
    cal = cal._replace(
        measurements=cal.measurements._replace(insitu=(InSituSample("gpt:x d1 batch 2", 3e-3, 2e-3, 40.0),))
    )
    text = profile_toml(cal)
    assert "25 µs per op added to every launch time" in text
    assert "300 µs per send" in text and "400 µs per collective call" in text
    assert "gpt:x d1 batch 2: real 3.00 ms, simulated 2.00 ms (-33%)" in text
    cl = cluster_from_toml(text)
    node = cl.nodes[0]
    d = node.device
    p2p = base.links["p2p"].link
    assert node.intra.latency_s == pytest.approx(p2p.latency_s + 300e-6, rel=1e-5)
    assert node.intra.bandwidth == pytest.approx(p2p.bandwidth, rel=1e-5)
    # a 2-rank collective call pays the per-call overhead once: the all-reduce formula counts 2α
    # there (α + 200 µs), the all-gather's 1α (α + 400 µs)
    plain = cluster_from_toml(profile_toml(base))
    for name in ("allreduce", "allgather"):
        grown = coll.COLLECTIVES[name](cl, 1e5, [0, 1]) - coll.COLLECTIVES[name](plain, 1e5, [0, 1])
        assert grown == pytest.approx(400e-6, rel=1e-4)
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
