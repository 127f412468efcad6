"""Chrome/Perfetto trace of a simulation (open it at https://ui.perfetto.dev).

One process per GPU, one track (thread) per slot of that GPU — its compute stream and any other
streams — with a slice per op or call; a communication op appears on every participant's track
(category ``comm``). Slices nest as deep as the run was traced (``simulate(trace_detail=...)``:
``chunk``, ``layer`` or ``op``, ``distir.sim.tracedetail``) and carry their op, types, FLOPs and
bytes as arguments. A point-to-point transfer (``Send``, ``MeshSend``) is a flow arrow from the
sender's slice to the receiver's (a ``s``/``f`` pair of one id, both at the middle of the
transfer's slice, the end bound to its enclosing slice). A counter track per GPU shows live
memory in bytes. Times are microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distir.files import write_atomically
from distir.sim.simulate import SimResult

US = 1e6  # microseconds per second


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    """The trace's events (``traceEvents``): metadata, slices, flows, memory counters."""
    detail = result.trace_detail()
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
    # parents before their children: by track, start, then the longer (outer) first
    for s in sorted(detail.slices, key=lambda s: (s.slot, s.start, s.depth)):
        ts = s.start * US
        events.append(
            {
                "name": s.name,
                "cat": "comm" if s.comm else "compute",
                "ph": "X",
                "pid": result.slots[s.slot].gpu,
                "tid": s.slot,
                "ts": ts,
                "dur": max(s.end * US - ts, 0.0),
                "args": s.args,
            }
        )
    for k, f in enumerate(detail.flows):
        mid = (f.start + f.end) / 2 * US
        for ph, j in (("s", f.src), ("f", f.dst)):
            ev = {"name": f.name, "cat": "p2p", "ph": ph, "id": k, "pid": result.slots[j].gpu, "tid": j}
            events.append({**ev, "ts": mid, **({"bp": "e"} if ph == "f" else {})})
    for g, samples in (result.memory_timeline or {}).items():
        for t, b in samples:
            events.append({"name": "memory", "ph": "C", "pid": g, "ts": t * US, "args": {"bytes": b}})
    return events


def write_trace(result: SimResult, path: str | Path) -> None:
    doc = {"traceEvents": trace_events(result), "displayTimeUnit": "ms"}
    write_atomically(path, json.dumps(doc))
