"""A simulation's summary as plain data (the ``--json`` keys) and as a rich table."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from distir.sim.simulate import SimResult

GIB = float(1 << 30)


def summary_dict(r: SimResult) -> dict[str, Any]:
    """JSON keys: step_time_s, throughput, throughput_unit, mfu (model FLOPs; null for a program
    file), hfu (all FLOPs executed), flops, model_flops, bubble_fraction, ops,
    peak_memory_bytes, runtime_memory_bytes, parameter_bytes and capacity_bytes (per program
    device: its GPU's figure; the peak includes the runtime memory: CUDA context, workspaces,
    communication buffers and the allocator's reserve), reserved_memory_bytes (per program
    device: its GPU's caching-allocator reserved peak with the runtime memory's fixed part,
    ``distir.sim.allocator``; null when not simulated: ``simulate(..., allocator=True)``,
    ``distir simulate --reserved``), oom (bool), oom_devices, devices (per slot: devices, gpu,
    stream, kind, busy_s, comm_s, idle_s)."""
    t = r.step_time_s
    gpu_of = {d: s.gpu for s, devs in zip(r.slots, r.slot_devices, strict=True) for d in devs}
    devices = []
    for slot, devs, b, c in zip(r.slots, r.slot_devices, r.busy_s, r.comm_s, strict=True):
        devices.append(
            {
                "devices": [str(d) for d in devs],
                "gpu": slot.gpu,
                "stream": slot.stream,
                "kind": r.cluster.device_spec(slot.gpu).name if r.cluster is not None else None,
                "busy_s": b,
                "comm_s": c,
                "idle_s": max(t - b - c, 0.0),
            }
        )
    oom = r.oom_gpus
    return {
        "step_time_s": t,
        "throughput": r.throughput if r.step_time_s > 0 else None,  # JSON has no Infinity
        "throughput_unit": "samples/s" if r.batch else "steps/s",
        "mfu": r.mfu,
        "hfu": r.hfu,
        "flops": r.flops,
        "model_flops": r.model_flops,
        "bubble_fraction": r.bubble_fraction,
        "ops": r.n_ops,
        "peak_memory_bytes": {str(d): r.peak_memory[g] for d, g in sorted(gpu_of.items())},
        "runtime_memory_bytes": {str(d): r.runtime_memory.get(g, 0.0) for d, g in sorted(gpu_of.items())},
        "reserved_memory_bytes": {str(d): r.reserved_memory.get(g) for d, g in sorted(gpu_of.items())},
        "parameter_bytes": {str(d): r.param_memory[g] for d, g in sorted(gpu_of.items())},
        "capacity_bytes": {str(d): r.capacity[g] for d, g in sorted(gpu_of.items())},
        "oom": bool(oom),
        "oom_devices": [str(d) for d, g in sorted(gpu_of.items()) if g in oom],
        "devices": devices,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def format_seconds(s: float) -> str:
    """A duration for tables: ``1.234 s``, ``12.345 ms`` or ``56.7 µs``."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def summary_table(r: SimResult, title: str) -> Group:
    d = summary_dict(r)
    head = Text()
    head.append(f"{title}\n", style="bold")
    head.append(
        f"step time {format_seconds(r.step_time_s)}   throughput {r.throughput:.4g} {d['throughput_unit']}   "
        f"MFU {_pct(r.mfu)}   HFU {_pct(r.hfu)}   bubble {100 * r.bubble_fraction:.1f}%   ops {r.n_ops:,}\n"
    )
    table = Table()
    reserved = ("reserved",) if r.reserved_memory else ()
    for col in ("device", "GPU", "busy", "comm", "idle", "peak memory", "runtime", *reserved, "capacity", ""):
        table.add_column(col, justify="left" if col in ("device", "GPU", "") else "right")
    for dev in d["devices"]:
        g = dev["gpu"]
        peak, cap = r.peak_memory[g], r.capacity[g]
        flag = "[red]OOM[/red]" if peak > cap else ""
        table.add_row(
            ", ".join(dev["devices"]),
            f"{g} {dev['kind']}" + (f" ({dev['stream']})" if dev["stream"] != "compute" else ""),
            format_seconds(dev["busy_s"]),
            format_seconds(dev["comm_s"]),
            format_seconds(dev["idle_s"]),
            f"{peak / GIB:.3f} GiB",
            f"{r.runtime_memory.get(g, 0.0) / GIB:.3f} GiB",
            *((f"{r.reserved_memory[g] / GIB:.3f} GiB",) if reserved else ()),
            f"{cap / GIB:.1f} GiB",
            flag,
        )
    return Group(head, table)
