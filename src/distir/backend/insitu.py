"""In situ: the rank interpreter's overheads applied to a profile, and checked against real
training steps.

The tight-loop microbenchmarks (``distir.backend.microbench``, ``distir.backend.commbench``)
time one op or one collective repeated on warm inputs; a training step run by ``distir run``
(``distir.backend.worker``) pays more per op and per message. ``distir.backend.dispatch``
measures those overheads directly (synthetic chains through the real worker loop); ``apply``
adds them to a profile: the per-op overhead to every launch time (``launch_overhead_us``, each
family's ``launch_us``), the per-send overhead to the point-to-point latency, and the
per-collective overhead to each collective's latency divided by the collective's latency
coefficient at 2 ranks (an all-reduce's alpha-beta formula counts 2α there, an all-gather's 1α),
so that a 2-rank collective pays it once per call.

``measure`` then runs a few small training-step programs (``PROGRAMS``: GPT sizes and batches
other than the one ``bench/bench_validate.py`` validates on; one rank, and two ranks with data,
tensor, pipeline parallelism and ZeRO-3) for real and simulates each on the profile: a check
of the profile, listed in its comments (nothing is fitted to them).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distir.hardware.fit import InSituSample, Overheads, link_coefficients
from distir.hardware.profile import Calibration, profile_toml

__all__ = ["PROGRAMS", "InSituSample", "Overheads", "apply", "measure", "with_overhead"]

# (model, strategy, batch): small steps unlike the validation GPT (layers=4, hidden=128, batch 8)
PROGRAMS: tuple[tuple[str, str, int], ...] = (
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d1.t1.p1.k1.1f1b", 4),
    ("gpt:layers=3,hidden=96,heads=3,seq=48,vocab=192", "d1.t1.p1.k1.1f1b", 4),
    ("gpt:layers=2,hidden=160,heads=4,seq=32,vocab=320", "d1.t1.p1.k1.1f1b", 2),
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d2.t1.p1.k1.1f1b", 4),
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d1.t2.p1.k1.1f1b", 4),
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d1.t1.p2.k2.1f1b", 4),
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d2.t1.p1.k1.1f1b.z3", 4),
    ("gpt:layers=3,hidden=96,heads=3,seq=48,vocab=192", "d2.t1.p1.k1.1f1b", 4),
)

_DELTA_S = 1e-6  # the launch time added to count the simulated ops


def with_overhead(cal: Calibration, overhead_s: float) -> Calibration:
    """``cal`` with ``overhead_s`` added to the launch time of every op (device and families)."""
    fams = {k: f._replace(launch_s=f.launch_s + overhead_s) for k, f in cal.families.items()}
    return cal._replace(launch_s=cal.launch_s + overhead_s, families=fams)


def apply(cal: Calibration, fit: Overheads) -> Calibration:
    """``cal`` with the overheads of ``fit`` added (see the module docstring) and recorded."""
    out = with_message_overhead(with_overhead(cal, fit.op_s), fit.collective_s, fit.p2p_s)
    return out._replace(insitu=fit)


def latency_coefficient(collective: str, group: int = 2) -> float:
    """How many link latencies one call of ``collective`` pays on ``group`` ranks of one node."""
    from distir.sim import collectives as coll

    return link_coefficients(coll.COLLECTIVES[collective], group, 0.0)[1]


def with_message_overhead(cal: Calibration, collective_s: float, p2p_s: float) -> Calibration:
    """``cal`` with ``p2p_s`` added to the point-to-point latency and ``collective_s`` per call
    to every collective's (over its latency coefficient at 2 ranks)."""
    from distir.hardware.specs import LinkSpec

    def plus(name: str, lf: Any) -> Any:
        extra = p2p_s if name == "p2p" else collective_s / max(latency_coefficient(name), 1.0)
        return lf._replace(link=LinkSpec(lf.link.bandwidth, lf.link.latency_s + extra))

    return cal._replace(links={k: plus(k, lf) for k, lf in cal.links.items()})


def with_link_overhead(cal: Calibration, overhead_s: float) -> Calibration:
    """``cal`` with ``overhead_s`` added to the latency of every link (collectives and p2p)."""
    from distir.hardware.specs import LinkSpec

    links = {
        k: lf._replace(link=LinkSpec(lf.link.bandwidth, lf.link.latency_s + overhead_s))
        for k, lf in cal.links.items()
    }
    return cal._replace(links=links)


def _simulated(cal: Calibration, model: str, strategy: str, batch: int) -> tuple[float, float, float]:
    """The simulated step on ``cal`` and its growth per second of launch time and per second of
    link latency."""
    from distir.backend.program import model_program
    from distir.hardware.cluster import load_cluster_file
    from distir.sim.cost import RooflineCostModel
    from distir.sim.simulate import simulate

    prog = model_program(model, strategy, batch)
    steps = []
    with tempfile.TemporaryDirectory(prefix="distir-insitu-") as d:
        for variant in (cal, with_overhead(cal, _DELTA_S), with_link_overhead(cal, _DELTA_S)):
            path = Path(d) / "profile.toml"
            path.write_text(profile_toml(variant), encoding="utf-8")
            cluster = load_cluster_file(path)
            sim = simulate(prog.module, cluster, None, RooflineCostModel(cluster, fuse=False), batch=batch)
            steps.append(sim.step_time_s)
    return steps[0], (steps[1] - steps[0]) / _DELTA_S, (steps[2] - steps[0]) / _DELTA_S


QUICK: tuple[tuple[str, str, int], ...] = (PROGRAMS[0], PROGRAMS[3])  # one rank, two ranks


def measure(
    cal: Calibration,
    steps: int = 6,
    tick: Callable[[str], None] | None = None,
    programs: Sequence[tuple[str, str, int]] = PROGRAMS,
) -> list[InSituSample]:
    """Run and simulate every program of ``programs``; a step's real time is its slowest rank's."""
    from distir.backend.launch import LaunchOptions, launch
    from distir.backend.program import model_program, rank_programs

    out: list[InSituSample] = []
    for model, strategy, batch in programs:
        jobs = rank_programs(model_program(model, strategy, batch), steps, False)
        results = [g[0] for g in launch([[j] for j in jobs], LaunchOptions(timeout_s=120.0))]
        per_step = [max(ts) for ts in zip(*(r.step_times for r in results), strict=True)]
        real = min(per_step[1:] or per_step)
        sim, ops, msgs = _simulated(cal, model, strategy, batch)
        out.append(InSituSample(f"{model} {strategy} batch {batch}", real, sim, ops, msgs))
        if tick is not None:
            tick(f"in situ {model}")
    return out
