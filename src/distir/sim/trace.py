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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distir.files import write_atomically
from distir.ir.dtensor import device_ranges
from distir.limits import MAX_DEVICES, exceeds, over, read_int
from distir.sim.simulate import SimResult

US = 1e6  # microseconds per second


def parse_gpus(text: str) -> frozenset[int]:
    """GPUs written as ids and inclusive ranges, ``0-7,64``; ``ValueError`` naming the part that
    is not one, or a count above ``MAX_DEVICES``."""
    gpus: set[int] = set()
    for part in text.split(","):
        lo_text, dash, hi_text = part.strip().partition("-")
        lo, hi = read_int(lo_text.strip()), read_int(hi_text.strip()) if dash else read_int(lo_text.strip())
        if lo is None or hi is None or hi < lo:
            raise ValueError(f"{part.strip()!r} is not a GPU or a range of GPUs like 0-7")
        if exceeds(hi - lo + 1 + len(gpus), MAX_DEVICES):
            raise ValueError(over("the GPUs listed", hi - lo + 1 + len(gpus), MAX_DEVICES))
        gpus.update(range(lo, hi + 1))
    return frozenset(gpus)


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    """The trace's events (``traceEvents``): metadata, slices, flows, memory counters."""
    return list(iter_events(result))


def iter_events(result: SimResult) -> Iterator[dict[str, Any]]:
    """``trace_events`` one by one: of the traced GPUs only (``simulate(trace_gpus=...)``)."""
    detail = result.trace_detail()
    cluster = result.cluster
    traced = result.trace_source.traced if result.trace_source is not None else None
    shown = [i for i in range(len(result.slots)) if traced is None or i in traced]
    gpus = {result.slots[i].gpu for i in shown}
    for g in sorted(gpus):
        kind = cluster.device_spec(g).name if cluster is not None else "GPU"
        yield {"name": "process_name", "ph": "M", "pid": g, "args": {"name": f"GPU {g} ({kind})"}}
        yield {"name": "process_sort_index", "ph": "M", "pid": g, "args": {"sort_index": g}}
    for i in shown:
        slot = result.slots[i]
        label = f"{slot.stream}: {device_ranges(result.slot_devices[i])}"
        yield {"name": "thread_name", "ph": "M", "pid": slot.gpu, "tid": i, "args": {"name": label}}
    # parents before their children: by track, start, then the longer (outer) first
    for s in sorted(detail.slices, key=lambda s: (s.slot, s.start, s.depth)):
        ts = s.start * US
        yield (
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
            yield {**ev, "ts": mid, **({"bp": "e"} if ph == "f" else {})}
    for g, samples in (result.memory_timeline or {}).items():
        if g not in gpus:  # a timeline kept for every GPU (a simulation on shared plans)
            continue
        for t, b in samples:
            yield {"name": "memory", "ph": "C", "pid": g, "ts": t * US, "args": {"bytes": b}}


def write_trace(result: SimResult, path: str | Path) -> None:
    """The trace as JSON at ``path``, written atomically, one event at a time (a trace is not
    held as one string)."""
    write_atomically(path, _json_chunks(result))


def _json_chunks(result: SimResult) -> Iterator[str]:
    yield '{"traceEvents": ['
    for i, ev in enumerate(iter_events(result)):
        yield ("," if i else "") + json.dumps(ev)
    yield '], "displayTimeUnit": "ms"}\n'
