"""``distir run``: a global program run for real, one process per rank, checked and measured.

``execute(prog, ...)`` projects the program into rank programs, runs them (``launch``: spawned
local ranks; or this process's rank under ``torchrun``), checks every rank's outputs against the
reference executor (``verify``), and returns a ``RunReport``: whether it verified and the largest
absolute error, the step time (per step the slowest rank's wall time; the median over the steps
after the first, a warm-up), each rank's peak memory (and where it comes from: the CUDA
allocator's peak, or tracked live tensor bytes on CPU), the ops that ran their numpy reference
for lack of a torch implementation, and the trace written.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distir.backend.launch import LaunchOptions, default_backend, launch, torchrun_rank, under_torchrun
from distir.backend.program import GlobalProgram, rank_programs
from distir.backend.trace import write_trace
from distir.backend.verify import Verdict
from distir.backend.verify import verify as verify_outputs
from distir.backend.worker import RankResult
from distir.ir.types import Device


@dataclass(frozen=True, slots=True)
class RunReport:
    label: str
    backend: str
    launcher: str  # local (spawned ranks) or torchrun
    steps: int
    verdict: Verdict | None  # None: not verified (--no-verify)
    step_time_s: float
    step_time_s_per_rank: dict[Device, float]
    peak_memory_bytes: dict[Device, int]
    memory_source: str
    fallback_ops: list[str]
    trace: Path | None


def execute(
    prog: GlobalProgram,
    steps: int = 3,
    verify: bool = True,
    trace: Path | None = None,
    options: LaunchOptions | None = None,
) -> RunReport | None:
    """Run ``prog`` for real (see the module docstring). Under torchrun only rank 0 returns the
    report (None on the other ranks). Raises ``RunFailed`` (local) or ``RankFailure`` (torchrun)
    when a rank fails."""
    opts = options or LaunchOptions()
    jobs = rank_programs(prog, steps, trace is not None)
    torchrun = under_torchrun()
    gathered = torchrun_rank([[j] for j in jobs], opts) if torchrun else launch([[j] for j in jobs], opts)
    if gathered is None:
        return None
    results = [g[0] for g in gathered]
    verdict = None
    if verify:
        verdict = verify_outputs(prog.module, prog.args, {r.device: r.outputs for r in results})
    if trace is not None:
        write_trace(results, trace)
    return RunReport(
        prog.label,
        opts.backend or default_backend(),
        "torchrun" if torchrun else "local",
        steps,
        verdict,
        _step_time(results),
        {r.device: r.step_time_s for r in results},
        {r.device: r.peak_memory_bytes for r in results},
        results[0].memory_source,
        sorted({op for r in results for op in r.fallback_ops}),
        trace,
    )


def _step_time(results: list[RankResult]) -> float:
    """Per step, the slowest rank; the median over the steps after the warm-up."""
    per_step = [max(ts) for ts in zip(*(r.step_times for r in results), strict=True)]
    return float(statistics.median(per_step[1:] or per_step))


def report_dict(rep: RunReport) -> dict[str, Any]:
    v = rep.verdict
    return {
        "program": rep.label,
        "ranks": len(rep.peak_memory_bytes),
        "backend": rep.backend,
        "launcher": rep.launcher,
        "steps": rep.steps,
        "verified": v.verified if v is not None else None,
        "max_abs_error": v.max_abs_error if v is not None else None,
        "worst_output": v.worst if v is not None else None,
        "elements_outside_tolerance": v.outside if v is not None else None,
        "worst_output_size": v.size if v is not None else None,
        "tolerance": v.tolerance if v is not None else None,
        # units at a kink the run decided otherwise than exact arithmetic (distir.backend.verify)
        "kink_units_reversed": v.kinks if v is not None else None,
        "kink_max_distance": v.kink_distance if v is not None and v.kinks else None,
        "kink_bound": v.kink_bound if v is not None and v.kinks else None,
        "step_time_s": rep.step_time_s,
        "step_time_s_per_rank": {str(d): t for d, t in rep.step_time_s_per_rank.items()},
        "peak_memory_bytes": {str(d): b for d, b in rep.peak_memory_bytes.items()},
        "memory_source": rep.memory_source,
        "reference_fallback_ops": rep.fallback_ops,
        "trace": str(rep.trace) if rep.trace is not None else None,
    }
