"""A found layout as a program: the legalized DTensor program on the whole mesh, its collectives
per layer, and its simulated cost.

``layout_program`` annotates every parameter with its placements on every axis (the fixed ones
and the searched axis' from the state's propagation), ties each updated parameter's result to
it, pins the parameters, propagates on the whole mesh and legalizes. ``collectives`` lowers
each ``Redistribute`` into its one-axis steps (``redistribute_steps``, as materialization
does) — AllReduce, AllGather, ReduceScatter, AllToAll, with the bytes one device holds (the
buffer; an AllGather's gathered result) — and files it under the layer of the op that needs it
(``results`` for the reductions of the program's results). ``simulated`` runs the simulator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from distir.hardware.cluster import Cluster
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard, format_placements
from distir.ir.function import Function, Module
from distir.ops.dist import REDISTRIBUTE
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import redistribute_steps
from distir.parallel.sharding.propagate import Placed, propagate
from distir.search.automap.points import Problem
from distir.sim.simulate import simulate

RESULTS = "results"


class Collective(NamedTuple):
    axis: str
    kind: str
    nbytes: int

    def __str__(self) -> str:
        return f"{self.kind}({self.axis}, {self.nbytes} B)"


class Simulated(NamedTuple):
    step_time_s: float
    peak_memory: float
    capacity: float

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.capacity


def layout_annotations(problem: Problem, placed: Placed | None) -> dict[int, tuple[Placement, ...]]:
    """Per parameter, its placements on every axis: the fixed ones, and on the searched axis
    what ``placed`` (a state's propagation) gives it — replicated when ``placed`` is None."""
    out: dict[int, tuple[Placement, ...]] = {}
    fn = problem.fn
    for i, places in problem.fixed.items():
        searched: Placement = Replicate()
        if places[problem.axis] is not None:
            searched = places[problem.axis]  # type: ignore[assignment]
        elif placed is not None:
            searched = placed.placed[fn.params[i]][0]
        out[i] = tuple(searched if b == problem.axis else (p or Replicate()) for b, p in enumerate(places))
    return out


def layout_program(
    fn: Function,
    mesh: Mesh,
    pairs: Mapping[int, int],
    params: Mapping[int, Sequence[Placement]],
    pins: Mapping[str, Sequence[Placement]],
    outs: Mapping[int, Sequence[Placement]] | None = None,
) -> Module:
    """The legalized DTensor program of the flat ``fn`` on ``mesh`` with parameters placed as
    ``params``, each result of ``pairs`` as its parameter, ``outs`` others (module docstring)."""
    results = dict(outs or {})
    results.update({r: params[i] for r, i in pairs.items() if i in params})
    prop = propagate(
        Module((fn,)),
        mesh,
        pins,
        params=params,
        results=results,
        replicate_results=False,
        pinned=tuple(params),
    )
    return legalize(prop.module)


def _kind(src: Placement, dst: Placement) -> str | None:
    if isinstance(src, Partial):
        return "AllReduce" if isinstance(dst, Replicate) else "ReduceScatter"
    if isinstance(src, Shard):
        return "AllGather" if isinstance(dst, Replicate) else "AllToAll"
    return None  # Replicate -> Shard: a local slice


def collectives(problem: Problem, legal: Module) -> dict[str, Counter[Collective]]:
    """Per layer, its collectives (module docstring); layers without any are left out."""
    layers = problem.layers
    out: dict[str, Counter[Collective]] = {}
    pending: list[Collective] = []
    k = 0
    for op in legal.entry.ops():
        if op.name != REDISTRIBUTE.name:
            if pending:
                out.setdefault(layers[k], Counter()).update(pending)
                pending = []
            k += 1
            continue
        src_t, dst_t = op.inputs[0].type, op.outputs[0].type
        assert isinstance(src_t, DTensorType) and isinstance(dst_t, DTensorType)
        pending.extend(redistribution_collectives(src_t, dst_t.placements))
    if pending:
        out.setdefault(RESULTS, Counter()).update(pending)
    return out


def redistribution_collectives(src: DTensorType, dst: Sequence[Placement]) -> list[Collective]:
    """The collectives that move ``src`` to placements ``dst``, one axis at a time (none along
    an axis of one device: a placement change there moves nothing)."""
    out: list[Collective] = []
    cur = list(src.placements)
    for ax, p in redistribute_steps(src.placements, dst, src.mesh.shape):
        kind = _kind(cur[ax], p)
        gathers = isinstance(cur[ax], Shard) and isinstance(p, Replicate)  # its result is the larger
        before = _local_bytes(src, cur)
        cur[ax] = p
        if kind is not None and src.mesh.shape[ax] > 1:
            nb = _local_bytes(src, cur) if gathers else before
            out.append(Collective(src.mesh.axes[ax][0], kind, nb))
    return out


def _local_bytes(t: DTensorType, places: Sequence[Placement]) -> int:
    """Bytes of one device's piece of ``t`` under ``places`` (even split)."""
    div = 1
    for (_, n), p in zip(t.mesh.axes, places, strict=True):
        if isinstance(p, Shard):
            div *= n
    return t.global_type().nbytes // div


def simulated(legal: Module, cluster: Cluster) -> Simulated:
    """The simulator's step time and peak memory of a legalized program (the worst device)."""
    r = simulate(legal, cluster)
    peak = max(r.peak_memory.values())
    cap = min(r.capacity.values())
    return Simulated(r.step_time_s, peak, cap)


def summarize(
    per_layer: Mapping[str, Counter[Collective]],
) -> list[tuple[str, int, list[tuple[Collective, int]]]]:
    """Layers with equal collectives merged: (first layer, how many layers, sorted collectives
    with counts), in program order of their first layer."""
    rows: dict[tuple[tuple[Collective, int], ...], list[str]] = {}
    for layer, c in per_layer.items():
        key = tuple(sorted(c.items()))
        rows.setdefault(key, []).append(layer)
    return [(names[0], len(names), list(key)) for key, names in rows.items()]


def placement_text(places: Sequence[Placement]) -> str:
    return format_placements(tuple(places))
