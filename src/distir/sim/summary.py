"""A simulation's summary as plain data (the ``--json`` keys) and as a rich table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rich.console import Group
from rich.table import Table
from rich.text import Text

from distir.ir.dtensor import device_ranges, id_ranges
from distir.ir.types import Device
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
    ``distir simulate --reserved``), host_memory_bytes (per program device: the bytes its GPU's
    host holds for an offloaded optimizer, its masters, Adam's state and step, which the peak
    leaves out; null without one), oom (bool), oom_devices, devices (per slot: devices, gpu,
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
        "host_memory_bytes": {str(d): r.host_memory.get(g) for d, g in sorted(gpu_of.items())},
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


# a table of more rows than this merges the slots whose figures print the same
MERGE_ROWS_ABOVE = 64


def summary_table(r: SimResult, title: str) -> Group:
    """The summary's header and a row per slot that ran something (every compute stream; a
    communication stream with busy or communication time); above ``MERGE_ROWS_ABOVE`` such slots,
    the slots whose figures print alike share a row (their devices and GPUs as ranges)."""
    d = summary_dict(r)
    head = Text()
    head.append(f"{title}\n", style="bold")
    head.append(
        f"step time {format_seconds(r.step_time_s)}   throughput {r.throughput:.4g} {d['throughput_unit']}   "
        f"MFU {_pct(r.mfu)}   HFU {_pct(r.hfu)}   bubble {100 * r.bubble_fraction:.1f}%   ops {r.n_ops:,}\n"
    )
    ran = [
        (dev, devs)
        for dev, devs in zip(d["devices"], r.slot_devices, strict=True)
        if dev["stream"] == "compute" or dev["busy_s"] or dev["comm_s"]
    ]
    if r.host_memory:
        most = max(r.host_memory.values())
        head.append(
            f"host memory (offloaded optimizer: masters, Adam's state): up to {most / GIB:.2f} GiB a GPU, "
            f"{sum(r.host_memory.values()) / GIB:.1f} GiB over {len(r.host_memory)} GPUs; not in the peaks\n"
        )
    rows = [_row(r, dev, devs) for dev, devs in ran]
    if len(ran) < len(d["devices"]):
        quiet = len(d["devices"]) - len(ran)
        head.append(f"{quiet:,} streams that ran nothing are not shown (--json lists every stream)\n")
    if len(rows) > MERGE_ROWS_ABOVE:
        rows = _merged(rows)
        head.append(f"{len(ran):,} slots: those with the same figures share a row\n")
    table = Table()
    reserved = ("reserved",) if r.reserved_memory else ()
    for col in ("device", "GPU", "busy", "comm", "idle", "peak memory", "runtime", *reserved, "capacity", ""):
        table.add_column(col, justify="left" if col in ("device", "GPU", "") else "right")
    for row in rows:
        table.add_row(device_ranges(row.devices), f"{id_ranges(row.gpus)} {row.label}", *row.cells)
    return Group(head, table)


class _Row(NamedTuple):
    """A table row: its devices and GPUs, the GPU's kind and stream, and the figures' cells."""

    devices: list[Device]
    gpus: list[int]
    label: str
    cells: tuple[str, ...]


def _row(r: SimResult, dev: dict[str, Any], devices: Sequence[Device]) -> _Row:
    g = dev["gpu"]
    peak, cap = r.peak_memory[g], r.capacity[g]
    cells = (
        format_seconds(dev["busy_s"]),
        format_seconds(dev["comm_s"]),
        format_seconds(dev["idle_s"]),
        f"{peak / GIB:.3f} GiB",
        f"{r.runtime_memory.get(g, 0.0) / GIB:.3f} GiB",
        *((f"{r.reserved_memory[g] / GIB:.3f} GiB",) if r.reserved_memory else ()),
        f"{cap / GIB:.1f} GiB",
        "[red]OOM[/red]" if peak > cap else "",
    )
    label = f"{dev['kind']}" + (f" ({dev['stream']})" if dev["stream"] != "compute" else "")
    return _Row(list(devices), [g], label, cells)


def _merged(rows: list[_Row]) -> list[_Row]:
    """Rows of the same label and cells as one, in the order each first appears."""
    out: dict[tuple[str, tuple[str, ...]], _Row] = {}
    for row in rows:
        got = out.get((row.label, row.cells))
        if got is None:
            out[(row.label, row.cells)] = _Row(list(row.devices), list(row.gpus), row.label, row.cells)
            continue
        got.devices.extend(row.devices)
        got.gpus.extend(row.gpus)
    return [
        row._replace(devices=sorted(row.devices, key=lambda d: d.id), gpus=sorted(set(row.gpus)))
        for row in out.values()
    ]
