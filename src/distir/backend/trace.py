"""Chrome/Perfetto trace of a real run (open it at https://ui.perfetto.dev), in the simulator's
format (``distir.sim.trace``) so the two can be loaded side by side.

One process per rank (``pid`` = global rank, named ``rank r (dN)``), one track (the rank runs its
ops in order on one thread), a slice per op of the last step named by the op (category
``compute`` or ``comm``; the op as printed in the IR in ``args.op``), and a ``memory`` counter
track with the tracked live tensor bytes after each op. Times are microseconds from the start of
the step (every rank starts the step together, after a barrier). ``args.cpu_us`` is the rank
thread's CPU time during the op (``time.thread_time``): on a loaded machine, about the op's time
less the time the rank was preempted (a point-to-point batch's slice has none).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distir.backend.worker import RankResult
from distir.files import write_atomically


def trace_events(results: Sequence[RankResult]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rank, r in enumerate(results):
        events.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} ({r.device})"}}
        )
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        events.append(
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"ops: {r.device}"}}
        )
        for s in r.slices:
            events.append(
                {
                    "name": s.name,
                    "cat": s.category,
                    "ph": "X",
                    "pid": rank,
                    "tid": 0,
                    "ts": s.start * 1e6,
                    "dur": max(s.end - s.start, 0.0) * 1e6,
                    "args": {"op": s.text, "cpu_us": s.cpu * 1e6},
                }
            )
            events.append(
                {"name": "memory", "ph": "C", "pid": rank, "ts": s.end * 1e6, "args": {"bytes": s.live_bytes}}
            )
    return events


def write_trace(results: Sequence[RankResult], path: str | Path) -> None:
    doc = {"traceEvents": trace_events(results), "displayTimeUnit": "ms"}
    write_atomically(path, json.dumps(doc))
