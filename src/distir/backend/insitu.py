"""In-situ calibration: the per-op overhead of the rank interpreter, measured by running
training steps through the real worker loop.

The tight-loop microbenchmarks (``distir.backend.microbench``) time one op repeated on warm
inputs; a training step run by ``distir run`` (``distir.backend.worker``) also pays, per op, the
interpreter's bookkeeping (live-bytes tracking, progress, shape checks) and colder caches. This
pass measures that gap on this machine: it runs a few small training-step programs
(``PROGRAMS``: GPT sizes and batches other than the one ``bench/bench_validate.py`` validates
on; one rank, and two ranks with data, tensor, pipeline parallelism and ZeRO-3) for real and
simulates each on the profile fitted so far, and fits

    real step = simulated step + op overhead × ops + message overhead × messages

where ``ops`` (``messages``) is how much the simulated step grows per second added to every op's
launch time (to every link's latency): the ops and messages on the simulated critical path, as
the simulator counts them, not counted by name. Two-rank steps pay, per collective or send, the
rank interpreter's dispatch and the wait for the other rank (gloo runs them synchronously), which
the ping-pong benchmarks do not. ``distir.hardware.fit.fit_overhead`` takes the per-op overhead
from the one-rank programs and the per-message overhead from the rest (medians); the profile
adds them to every launch time (``launch_overhead_us``, each family's ``launch_us``) and every
link latency, and lists the programs and figures in its comments.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from distir.hardware.fit import InSituSample, Overheads, fit_overhead
from distir.hardware.profile import Calibration, profile_toml

__all__ = ["PROGRAMS", "InSituSample", "Overheads", "apply", "fit_overhead", "measure", "with_overhead"]

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


def apply(cal: Calibration, fit: Overheads, samples: Sequence[InSituSample]) -> Calibration:
    """``cal`` with both overheads of ``fit`` added, recorded with the samples they came from."""
    out = with_link_overhead(with_overhead(cal, fit.op_s), fit.message_s)
    return out._replace(insitu=fit, measurements=cal.measurements._replace(insitu=tuple(samples)))


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
