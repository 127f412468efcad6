"""In-situ calibration: the per-op overhead of the rank interpreter, measured by running
training steps through the real worker loop.

The tight-loop microbenchmarks (``distir.backend.microbench``) time one op repeated on warm
inputs; a training step run by ``distir run`` (``distir.backend.worker``) also pays, per op, the
interpreter's bookkeeping (live-bytes tracking, progress, shape checks) and colder caches. This
pass measures that gap on this machine: it runs a few small training-step programs
(``PROGRAMS``: GPT sizes and a batch other than those ``bench/bench_validate.py`` validates on,
one rank, no communication) for real and simulates each on the profile fitted so far, and fits

    real step = simulated step + overhead × ops

where ``ops`` is how much the simulated step grows per second added to every op's launch time
(the ops on the simulated critical path, as the simulator counts them: measured, not counted by
name). ``overhead`` is the median over the programs of ``(real - simulated) / ops``, at least 0;
the profile adds it to the launch time of every op (``launch_overhead_us`` and each family's
``launch_us``) and says so in its source text.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from distir.hardware.fit import InSituSample, fit_overhead
from distir.hardware.profile import Calibration, profile_toml

__all__ = ["PROGRAMS", "InSituSample", "fit_overhead", "measure", "with_overhead"]

# (model, strategy, batch): small steps unlike the validation GPT (layers=4, hidden=128, batch 8)
PROGRAMS: tuple[tuple[str, str, int], ...] = (
    ("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "d1.t1.p1.k1.1f1b", 4),
    ("gpt:layers=3,hidden=96,heads=3,seq=48,vocab=192", "d1.t1.p1.k1.1f1b", 4),
    ("gpt:layers=2,hidden=160,heads=4,seq=32,vocab=320", "d1.t1.p1.k1.1f1b", 2),
)

_DELTA_S = 1e-6  # the launch time added to count the simulated ops


def with_overhead(cal: Calibration, overhead_s: float, note: str = "") -> Calibration:
    """``cal`` with ``overhead_s`` added to the launch time of every op (device and families)."""
    fams = {k: f._replace(launch_s=f.launch_s + overhead_s) for k, f in cal.families.items()}
    setup = cal.setup + (f"; {note}" if note else "")
    return cal._replace(launch_s=cal.launch_s + overhead_s, families=fams, setup=setup)


def _simulated(cal: Calibration, model: str, strategy: str, batch: int) -> tuple[float, float]:
    """The simulated step on ``cal`` and its growth per second of launch time."""
    from distir.backend.program import model_program
    from distir.hardware.clusterfile import load_cluster_file
    from distir.sim.cost import RooflineCostModel
    from distir.sim.simulate import simulate

    prog = model_program(model, strategy, batch)
    steps = []
    with tempfile.TemporaryDirectory(prefix="distir-insitu-") as d:
        for extra in (0.0, _DELTA_S):
            path = Path(d) / "profile.toml"
            path.write_text(profile_toml(with_overhead(cal, extra)), encoding="utf-8")
            cluster = load_cluster_file(path)
            sim = simulate(prog.module, cluster, None, RooflineCostModel(cluster, fuse=False), batch=batch)
            steps.append(sim.step_time_s)
    return steps[0], (steps[1] - steps[0]) / _DELTA_S


def measure(
    cal: Calibration, steps: int = 6, tick: Callable[[str], None] | None = None
) -> list[InSituSample]:
    """Run and simulate every program of ``PROGRAMS`` (one rank each)."""
    from distir.backend.launch import LaunchOptions, launch
    from distir.backend.program import model_program, rank_programs

    out: list[InSituSample] = []
    for model, strategy, batch in PROGRAMS:
        jobs = rank_programs(model_program(model, strategy, batch), steps, False)
        result = launch([[j] for j in jobs], LaunchOptions(timeout_s=120.0))[0][0]
        real = min(result.step_times[1:] or result.step_times)
        sim, ops = _simulated(cal, model, strategy, batch)
        out.append(InSituSample(f"{model} {strategy} batch {batch}", real, sim, ops))
        if tick is not None:
            tick(f"in situ {model}")
    return out
