"""``automap``: find the placements along one mesh axis by search, for any program.

The search (``mcts``) scores every state it meets with the analytic judge; the ``FINALISTS``
best distinct layouts are then built on the whole mesh, legalized and simulated, and the one
with the least simulated step time wins (a layout over memory capacity only when all are;
fewer bytes moved break ties). The result carries the decisions, the placements of every
parameter, the collectives per layer, the simulated step time, and the baseline: the same
devices as data parallelism alone (``baseline``).

``with_layout(model, result)`` is a zoo model whose weights declare the found placements along
the searched axis as their tensor-parallel placements (``WeightSpec.tp``), so ``distribute``
runs it as any model that declares them.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from distir.frontends.zoo.model import Model
from distir.hardware.cluster import Cluster
from distir.ir.dtensor import Mesh, Placement, Replicate, Shard
from distir.ir.function import Module
from distir.parallel.sharding.propagate import ShardingError
from distir.search.automap.judge import AnalyticJudge, Cost
from distir.search.automap.layout import (
    Collective,
    Simulated,
    collectives,
    layout_annotations,
    layout_program,
    simulated,
)
from distir.search.automap.mcts import Budget, Tree
from distir.search.automap.points import Flat, Problem
from distir.search.automap.state import Outcome, Propagator

FINALISTS = 3


@dataclass(frozen=True)
class AutomapResult:
    problem: Problem
    decisions: tuple[tuple[str, Placement], ...]  # decision point label -> placement (searched axis)
    placements: Mapping[str, tuple[Placement, ...]]  # every tensor parameter: its placements
    collectives: Mapping[str, Counter[Collective]]  # per layer
    simulated: Simulated
    analytic: Cost
    baseline: Simulated | None  # data parallelism alone on the same devices
    baseline_label: str
    episodes: int
    seconds: float
    found_episode: int  # the episode that first met the winning state
    found_seconds: float
    propagations: int

    @property
    def gain(self) -> float | None:
        """Baseline step time over the found layout's."""
        if self.baseline is None or self.simulated.step_time_s <= 0:
            return None
        return self.baseline.step_time_s / self.simulated.step_time_s


def automap(
    module: Module,
    mesh: Mesh,
    axis: str,
    cluster: Cluster,
    fixed: Mapping[str, Sequence[Placement | None]] | None = None,
    *,
    budget: Budget | None = None,
    seed: int = 0,
    group: bool = True,
    batch_axis: str | None = None,
    boundaries: Callable[[Flat], Mapping[str, tuple[Placement, ...]]] | None = None,
) -> AutomapResult:
    """Search the placements along ``axis`` of ``mesh`` for ``module``'s entry (module
    docstring). ``fixed``: placements per parameter name, one per axis, None on the searched
    axis to search it (a batch split of the inputs along ``batch_axis``; every other parameter
    is replicated on the other axes). ``batch_axis`` names the axis the baseline merges the
    searched one into (data parallelism alone); None: no baseline."""
    if len(mesh.devices) > cluster.num_devices:
        raise ShardingError(
            f"the mesh needs {len(mesh.devices)} GPUs but the cluster has {cluster.num_devices}"
        )
    start = time.perf_counter()
    problem = Problem.build(module, mesh, axis, fixed or {}, group, boundaries)
    propagator = Propagator(problem)
    judge = AnalyticJudge(problem, cluster)
    tree = Tree(propagator, lambda s: judge.cost(s.placed), random.Random(seed))
    tree.run(budget or Budget())
    outs = judge.whole_results()
    ranked = sorted(tree.scored.values(), key=lambda e: (e[0].key, len(e[1].decisions)))
    best: tuple[tuple[bool, float, float], Outcome, Cost, Simulated, Module, int, float] | None = None
    for cost, state, ep, sec in ranked[:FINALISTS]:
        legal = layout_program(
            problem.fn,
            problem.mesh,
            problem.pairs,
            layout_annotations(problem, state.placed),
            problem.pins,
            outs,
        )
        sim = simulated(legal, cluster)
        key = (not sim.fits, sim.step_time_s, cost.comm_bytes)
        if best is None or key < best[0]:
            best = (key, state, cost, sim, legal, ep, sec)
    assert best is not None
    _, state, cost, sim, legal, ep, sec = best
    seconds = time.perf_counter() - start
    fn = problem.fn
    places = layout_annotations(problem, state.placed)
    base, label = baseline(problem, cluster, batch_axis, outs)
    return AutomapResult(
        problem,
        tuple((problem.points[k].label, p) for k, p in state.decisions),
        {fn.params[i].name: pl for i, pl in places.items()},
        collectives(problem, legal),
        sim,
        cost,
        base,
        label,
        tree.episodes,
        seconds,
        ep,
        sec,
        propagator.propagations,
    )


def baseline(
    problem: Problem, cluster: Cluster, batch_axis: str | None, outs: Mapping[int, Sequence[Placement]]
) -> tuple[Simulated | None, str]:
    """Data parallelism alone on the same devices: the searched axis merged into
    ``batch_axis`` (the inputs split over both), simulated; when the batch does not split so,
    the searched axis replicated instead. None without a ``batch_axis``."""
    if batch_axis is None:
        return None, "none"
    mesh = problem.mesh
    names = [a for a, _ in mesh.axes]
    b = names.index(batch_axis)
    ax = problem.axis
    n = problem.size
    merged = [(a, s * (n if i == b else 1)) for i, (a, s) in enumerate(mesh.axes) if i != ax]
    dp_mesh = Mesh(tuple(merged), mesh.devices)
    params = {}
    ok = True
    for i, places in problem.fixed.items():
        pl = tuple(p or Replicate() for k, p in enumerate(places) if k != ax)
        t = problem.plan.types[problem.fn.params[i]]
        for p in pl:
            if isinstance(p, Shard) and t.shape[p.dim] % dict(merged)[batch_axis]:  # type: ignore[union-attr]
                ok = False
        params[i] = pl
    if ok:
        pins = {name: tuple(p for k, p in enumerate(pl) if k != ax) for name, pl in problem.pins.items()}
        dp_outs = {r: tuple(p for k, p in enumerate(pl) if k != ax) for r, pl in outs.items()}
        legal = layout_program(problem.fn, dp_mesh, problem.pairs, params, pins, dp_outs)
        return simulated(legal, cluster), f"data parallel over {len(dp_mesh.devices)} devices"
    legal = layout_program(
        problem.fn, mesh, problem.pairs, layout_annotations(problem, None), problem.pins, outs
    )
    return simulated(legal, cluster), f"{names[ax]} replicated"


def with_layout(model: Model, result: AutomapResult) -> Model:
    """``model`` with each weight's tensor-parallel placement the found one (module docstring)."""
    ax = result.problem.axis
    weights = tuple(
        replace(w, tp=result.placements[w.name][ax]) if w.name in result.placements else w
        for w in model.weights
    )
    return replace(model, weights=weights)
