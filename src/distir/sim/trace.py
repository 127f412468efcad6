"""Chrome/Perfetto trace of a simulation (open it at https://ui.perfetto.dev).

One process per GPU, one track (thread) per slot of that GPU — its compute stream and any other
streams — with a slice per op or call; a communication op appears on every participant's track
(category ``comm``). A counter track per GPU shows live memory in bytes. Times are microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distir.files import write_atomically
from distir.sim.simulate import SimResult


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    if result.slices is None:
        raise ValueError("the simulation was run without trace=True, so it has no trace")
    cluster = result.cluster
    events: list[dict[str, Any]] = []
    gpus = sorted({s.gpu for s in result.slots})
    for g in gpus:
        kind = cluster.device_spec(g).name if cluster is not None else "GPU"
        events.append({"name": "process_name", "ph": "M", "pid": g, "args": {"name": f"GPU {g} ({kind})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": g, "args": {"sort_index": g}})
    for i, (slot, devs) in enumerate(zip(result.slots, result.slot_devices, strict=True)):
        label = f"{slot.stream}: {', '.join(map(str, devs))}"
        events.append({"name": "thread_name", "ph": "M", "pid": slot.gpu, "tid": i, "args": {"name": label}})
    for name, start, end, slot_i, is_comm in result.slices:
        slot = result.slots[slot_i]
        events.append(
            {
                "name": name,
                "cat": "comm" if is_comm else "compute",
                "ph": "X",
                "pid": slot.gpu,
                "tid": slot_i,
                "ts": start * 1e6,
                "dur": max(end - start, 0.0) * 1e6,
            }
        )
    for g, samples in (result.memory_timeline or {}).items():
        for t, b in samples:
            events.append({"name": "memory", "ph": "C", "pid": g, "ts": t * 1e6, "args": {"bytes": b}})
    return events


def write_trace(result: SimResult, path: str | Path) -> None:
    doc = {"traceEvents": trace_events(result), "displayTimeUnit": "ms"}
    write_atomically(path, json.dumps(doc))
