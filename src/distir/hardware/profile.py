"""A calibrated device profile: what ``distir calibrate`` fitted, written as a cluster file.

``Calibration`` holds the fits of ``distir.hardware.fit`` and where they were made;
``profile_toml`` renders it in the cluster-file format of ``distir.hardware.clusterfile`` (one
node type ``local`` and one node of it), so ``--cluster profile.toml`` simulates on the
measured machine. The file states its source on every figure group: ``source`` (the node),
``matmul_source`` (the GEMM curve) and ``runtime_memory_source`` say "calibrated on HOST, DATE,
by distir calibrate", and comments give each fit's median and max relative error. A ``--quick``
profile's sources say so (``QUICK``; ``is_quick`` finds it in a loaded cluster's nodes).

What is not measured is said so in the file: a dtype not in ``--dtypes`` takes the figure of a
measured one (named); ``tf32`` is ``fp32`` (no TF32 path on a CPU); the network between
machines (``inter_*``) is the measured point-to-point link (one machine has no network); families
not measured keep the cost model's defaults; on a CPU the runtime memory besides tensors is 0
(no CUDA context; tensors are tracked by bytes); a GPU keeps the CUDA runtime estimates of
``distir.hardware.presets.CUDA_RUNTIME``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import NamedTuple

from distir.hardware.fit import (
    FamilyFit,
    GemmFit,
    GemmSample,
    InSituSample,
    LinkFit,
    LinkSample,
    OpSample,
    Overheads,
    Quality,
)

QUICK = "--quick: a smoke test, its figures not for decisions"  # in a quick profile's setup


def is_quick(sources: Iterable[str]) -> bool:
    """Whether any of the node ``sources`` is a ``distir calibrate --quick`` profile's."""
    return any(QUICK in s for s in sources)


class Measurements(NamedTuple):
    """The timings the fits were made from (``distir calibrate --raw`` writes them as JSON)."""

    gemm: tuple[GemmSample, ...] = ()
    ops: tuple[OpSample, ...] = ()
    links: tuple[LinkSample, ...] = ()
    insitu: tuple[InSituSample, ...] = ()

    def as_json(self) -> dict[str, list[dict[str, object]]]:
        return {
            "gemm": [
                {"shape": list(s.shape), "dtype": s.dtype, "flops": s.flops, "seconds": s.seconds}
                for s in self.gemm
            ],
            "ops": [s._asdict() for s in self.ops],
            "links": [s._asdict() for s in self.links],
            "insitu": [s._asdict() for s in self.insitu],
        }


class Calibration(NamedTuple):
    """One machine's fitted figures. ``device``: the device's name (``cpu`` or the GPU's);
    ``ranks``: processes the communication ran on (the node's ``devices_per_node``);
    ``setup``: how it was measured (torch version, backend, threads); ``launch_s``: the
    smallest op's time; ``bandwidth``: memory bandwidth (B/s); ``links`` by collective name,
    ``p2p`` the point-to-point link; ``skipped``: collectives measured but not fitted, and why;
    ``measurements``: the timings fitted (and the in-situ check programs); ``insitu``: the rank
    interpreter's overheads (``distir.backend.dispatch``), already included in ``launch_s``,
    every family's launch time and the links' latencies (``distir.backend.insitu.apply``; 0: not
    measured)."""

    host: str
    date: str
    setup: str
    device: str
    ranks: int
    memory_bytes: int
    launch_s: float
    bandwidth: float
    gemm: GemmFit
    families: dict[str, FamilyFit]
    links: dict[str, LinkFit]
    skipped: dict[str, str]
    measurements: Measurements = Measurements()
    insitu: Overheads = Overheads(0.0)

    @property
    def stamp(self) -> str:
        return f"calibrated on {self.host}, {self.date}, by distir calibrate ({self.setup})"


def _q(q: Quality) -> str:
    return f"{q.samples} samples, median error {100 * q.median:.1f}%, max {100 * q.max:.1f}%"


def _num(x: float) -> str:
    return f"{x:.6g}"


def _peaks(cal: Calibration) -> tuple[dict[str, float], str]:
    """TFLOP/s per TOML key and a note on those not measured."""
    p = {k: v / 1e12 for k, v in cal.gemm.peak.items()}
    if "f32" not in p:
        raise ValueError("a profile needs f32 matrix products measured (add f32 to --dtypes)")
    bf16 = p.get("bf16", p.get("f16", p["f32"]))
    f16 = p.get("f16", bf16)
    notes = ["tf32 = fp32 (no TF32 path measured)"]
    if "bf16" not in p:
        notes.append("bf16 not measured: " + ("= fp16" if "f16" in p else "= fp32"))
    if "f16" not in p:
        notes.append("fp16 not measured: " + ("= bf16" if "bf16" in p else "= fp32"))
    out = {"fp32_tflops": p["f32"], "tf32_tflops": p["f32"], "fp16_tflops": f16, "bf16_tflops": bf16}
    return out, "; ".join(notes)


def _sources(cal: Calibration, peak_note: str) -> dict[str, str]:
    """The node's, the GEMM curve's and the runtime memory's source strings."""
    return {
        "source": f"{cal.stamp}; {peak_note}; inter-node link not measured (one machine): "
        "the point-to-point figures",
        "matmul_source": f"{cal.stamp}: the curve of distir.hardware.gemm fitted to timed matrix "
        "products (sm_count chosen by the fit; the peaks are its asymptote)",
        "runtime_memory_source": f"{cal.stamp}: none on a CPU (no CUDA context, no NCCL buffers; "
        "tensor bytes as tracked)",
    }


def profile_toml(cal: Calibration) -> str:
    """The cluster file of ``cal`` (see the module docstring)."""
    peaks, peak_note = _peaks(cal)
    src = _sources(cal, peak_note)
    p2p = cal.links["p2p"].link
    name = f"calibrated-{cal.host}"
    lines = [
        f"# {cal.stamp}",
        "# A cluster file (distir.hardware.clusterfile): use it as --cluster FILE. Fit quality:",
        f"#   GEMM curve: {_q(cal.gemm.quality)}",
        *(f"#   family {k}: {_q(f.quality)}" for k, f in cal.families.items()),
        *(f"#   {k}: {_q(f.quality)}" for k, f in cal.links.items()),
        *_insitu_lines(cal),
        *(f"#   {k}: not fitted, runs on the point-to-point link ({why})" for k, why in cal.skipped.items()),
        "",
        f"name = {json.dumps(name)}",
        "",
        "[types.local]",
        f"gpu = {json.dumps(f'{cal.device} @ {cal.host} (calibrated {cal.date})')}",
        f"node_name = {json.dumps(cal.host)}",
        f"devices_per_node = {cal.ranks}",
        *(f"{k} = {_num(v)}  # matrix-product asymptote" for k, v in peaks.items()),
        f"memory_bandwidth_gb_s = {_num(cal.bandwidth / 1e9)}  # the fastest Add's bytes per second",
        f"memory_gib = {_num(cal.memory_bytes / (1 << 30))}",
        f"launch_overhead_us = {_num(cal.launch_s * 1e6)}  # {_launch_note(cal)}",
        f"intra_bandwidth_gb_s = {_num(p2p.bandwidth / 1e9)}  # point-to-point (ping-pong)",
        f"intra_latency_us = {_num(p2p.latency_s * 1e6)}{_latency_note(cal)}",
        f"inter_bandwidth_gb_s = {_num(p2p.bandwidth / 1e9)}  # not measured (one machine): = intra",
        f"inter_latency_us = {_num(p2p.latency_s * 1e6)}",
        f"source = {json.dumps(src['source'])}",
        f"sm_count = {cal.gemm.sms}",
        f"matmul_efficiency = {_num(min(1.0, cal.gemm.anchor_factor))}",
        f"matmul_fp32_efficiency = {_num(min(1.0, cal.gemm.anchor_factor))}",
        f"matmul_anchor = [{', '.join(map(str, cal.gemm.anchor))}]",
        f"matmul_source = {json.dumps(src['matmul_source'])}",
    ]
    if cal.device.startswith("CPU"):  # a GPU keeps the CUDA runtime estimates (not measured)
        lines += [
            "cuda_context_mib = 0",
            "workspace_mib = 0",
            "comm_buffers_mib = 0",
            "allocator_fragmentation = 0",
            f"runtime_memory_source = {json.dumps(src['runtime_memory_source'])}",
        ]
    return "\n".join(lines + _measured_tables(cal))


def _measured(cal: Calibration) -> bool:
    return cal.insitu != Overheads(0.0)


def _latency_note(cal: Calibration) -> str:
    if not _measured(cal):
        return ""
    return f"  # ping-pong + {cal.insitu.p2p_s * 1e6:.3g} µs per send in the rank loop (dispatch)"


def _launch_note(cal: Calibration) -> str:
    if not _measured(cal):
        return "a 1-element Add"
    return f"a 1-element Add + {cal.insitu.op_s * 1e6:.3g} µs per op in the rank loop (dispatch)"


def _insitu_lines(cal: Calibration) -> list[str]:
    """Comments on the rank loop's overheads and the in-situ check programs."""
    out = []
    if _measured(cal):
        o = cal.insitu
        out += [
            f"#   rank loop (distir.backend.dispatch): {o.op_s * 1e6:.3g} µs per op added to every launch "
            "time (launch_overhead_us, each family's launch_us),",
            f"#     {o.p2p_s * 1e6:.3g} µs per send to the point-to-point latency, "
            f"{o.collective_s * 1e6:.3g} µs per collective call (2 ranks) to each collective's "
            "latency over its latency coefficient",
        ]
        if o.arrival_s > 0.0:
            out.append(
                f"#     a collective call one rank waits for, asleep: +{o.arrival_s * 1e6:.3g} µs "
                "(measured, not in the model: a step's ranks mostly enter a collective together)"
            )
    if cal.measurements.insitu:
        out.append(
            "#   in situ check (distir.backend.insitu; not fitted): real and simulated training steps:"
        )
        out += [
            f"#     {s.program}: real {s.real_s * 1e3:.2f} ms, simulated {s.sim_s * 1e3:.2f} ms "
            f"({100 * (s.sim_s / s.real_s - 1):+.0f}%)"
            for s in cal.measurements.insitu
        ]
    return out


def _measured_tables(cal: Calibration) -> list[str]:
    """The ``families`` and ``collectives`` tables and the one node."""
    lines: list[str] = []
    for fam, f in cal.families.items():
        unbounded = [w for w, b in (("flop", f.flop_bounded), ("memory", f.memory_bounded)) if not b]
        note = f"  # not bounded by the data: {', '.join(unbounded)}" if unbounded else ""
        lines += [
            "",
            f"[types.local.families.{fam}]{note}",
            f"flop_efficiency = {_num(f.flop)}",
            f"memory_efficiency = {_num(f.memory)}",
            f"launch_us = {_num(f.launch_s * 1e6)}",
        ]
    for coll, lf in cal.links.items():
        if coll == "p2p":
            continue
        lines += [
            "",
            f"[types.local.collectives.{coll}]",
            f"bandwidth_gb_s = {_num(lf.link.bandwidth / 1e9)}",
            f"latency_us = {_num(lf.link.latency_s * 1e6)}",
        ]
    return [*lines, "", "[[nodes]]", 'type = "local"', ""]
