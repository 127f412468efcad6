"""Automap on a zoo model: the search runs on its sequential training step with the placements
``distribute`` imposes (inputs split over the batch axis; activations and their gradients between
layers replicated along the searched axis but for the loss layer's input,
``Model.loss_input_tp``), which gives the decision points and prunes the moot ones; each state is
judged as the model it describes — every weight's tensor-parallel placement (``WeightSpec.tp``)
the one its propagation gives it (a pending sum: replicated) — distributed (``distribute``, data
parallel over the batch axis, one microbatch) and simulated: the judge is the program the layout
will run as. Layouts are memoized: many states describe one. The collectives per layer are
those of the layer functions ``distribute`` shards (``sharded_layers``), forward and backward;
the hand layout (what the weights declare) is judged alike to compare with.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from distir.autodiff.reverse import value_types
from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import FAMILIES
from distir.hardware.cluster import Cluster
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard
from distir.ir.function import Function, Module
from distir.ir.types import Type
from distir.parallel.distribute import device_map, distribute
from distir.parallel.layer_sharder import sharded_layers
from distir.parallel.pipeline.partition import ends
from distir.parallel.sharding.propagate import ShardingError
from distir.parallel.strategy import Strategy
from distir.search.automap.judge import OVER_CAPACITY, Cost
from distir.search.automap.layout import Collective, Simulated, redistribution_collectives
from distir.search.automap.mcts import Budget, Tree
from distir.search.automap.points import Flat, Problem, scope
from distir.search.automap.search import AutomapResult
from distir.search.automap.state import Outcome, Propagator
from distir.sim.simulate import simulate


def training_program(model: Model, optimizer: str = "adam") -> Module:
    return training_step(model, Optimizer(optimizer))


def _places(
    mesh: Mesh, axis: str, batch_axis: str | None, searched: Placement | None
) -> tuple[Placement | None, ...]:
    return tuple(
        searched if a == axis else Shard(0) if a == batch_axis else Replicate() for a, _ in mesh.axes
    )


def model_fixed(
    model: Model, mesh: Mesh, axis: str, batch_axis: str | None
) -> dict[str, tuple[Placement | None, ...]]:
    """The inputs split over ``batch_axis``, searched along ``axis``."""
    return {i.name: _places(mesh, axis, batch_axis, None) for i in model.inputs}


def model_boundaries(
    model: Model, mesh: Mesh, axis: str, batch_axis: str | None
) -> Callable[[Flat], Mapping[str, tuple[Placement, ...]]]:
    """The activations between layers and their gradients, as ``distribute`` places them."""
    n = len(model.layers)
    act = _places(mesh, axis, batch_axis, Replicate())
    loss_in = _places(mesh, axis, batch_axis, model.loss_input_tp)

    def of(flat: Flat) -> dict[str, tuple[Placement, ...]]:
        out: dict[str, tuple[Placement, ...]] = {}
        res = flat.call_results
        for i in range(n - 1):  # forward: layer i's activation
            out[res[i][0]] = loss_in if i == n - 2 else act  # type: ignore[assignment]
        for j in range(n):  # backward, last layer first: the gradient of layer i's input
            i = n - 1 - j
            if i > 0 and len(res) > n + j:
                out[res[n + j][0]] = loss_in if i - 1 == n - 2 else act  # type: ignore[assignment]
        return out

    return of


def at_depth(model: Model, blocks: int) -> Model | None:
    """``model`` rebuilt with ``blocks`` repeated blocks (its family's ``layers``), or None when
    its configuration does not say how."""
    cfg = dict(model.config)
    family = FAMILIES.get(str(cfg.pop("family", "")))
    if family is None or "layers" not in cfg:
        return None
    try:
        config = family.config(**{**cfg, "layers": blocks})
    except (TypeError, ValueError):
        return None
    return family.build(config, model.batch, model.weights[0].type.dtype, model.name)


def automap_model(
    model: Model,
    mesh: Mesh,
    axis: str,
    cluster: Cluster,
    *,
    batch_axis: str | None = None,
    optimizer: str = "adam",
    budget: Budget | None = None,
    seed: int = 0,
    group: bool = True,
) -> AutomapResult:
    """Automap on ``model`` (module docstring): ``mesh`` is (batch axis, searched axis). With
    grouping, a model of many blocks is searched on its two-block form, each state judged by
    extrapolating the one- and two-block forms' simulations to the model's depth (blocks share
    their decisions, so they cost alike); the winner is simulated at full depth."""
    names = [a for a, _ in mesh.axes]
    if len(names) > 2 or (len(names) == 2 and batch_axis not in names):
        raise ShardingError(f"--model: the mesh must be (data-parallel axis, {axis}); got {mesh}")
    start = time.perf_counter()
    depth = int(model.config.get("layers", 0))  # type: ignore[call-overload]
    small = (at_depth(model, 2), at_depth(model, 1)) if group and depth > 2 else (None, None)
    searched = small[0] if small[0] is not None and small[1] is not None else model
    problem = Problem.build(
        training_program(searched, optimizer),
        mesh,
        axis,
        {i.name: _places(mesh, axis, batch_axis, Replicate()) for i in searched.inputs},
        group,
        decide={w.name for w in searched.weights},
        repeat=depth / 2 if searched is not model else 1.0,
    )
    propagator = Propagator(problem)
    proxy = (small[1], depth) if searched is not model else None
    judge = ModelJudge(searched, problem, cluster, optimizer, proxy)
    tree = Tree(propagator, judge.cost, random.Random(seed))
    tree.run(budget or Budget())
    cost, state, ep, sec = min(tree.scored.values(), key=lambda e: (e[0].key, len(e[1].decisions)))
    found = dict(zip((w.name for w in searched.weights), judge.layout(state), strict=True))
    by_scope = {scope(name): p for name, p in found.items()}
    tp = tuple(found.get(w.name, by_scope.get(scope(w.name), Replicate())) for w in model.weights)
    full = ModelJudge(model, problem, cluster, optimizer) if searched is not model else judge
    sim = full.simulated(tp)
    base = full.simulated(tuple(Replicate() for _ in tp), dp_only=True)
    ax = problem.axis
    placements = {
        w.name: tuple(p if b == ax else Replicate() for b in range(len(names)))
        for w, p in zip(model.weights, tp, strict=True)
    }
    for i in model.inputs:
        placements[i.name] = tuple(Replicate() if b == ax else Shard(0) for b in range(len(names)))
    return AutomapResult(
        problem,
        tuple((problem.points[k].label, p) for k, p in state.decisions),
        placements,
        full.collectives(tp),
        sim,
        cost,
        base,
        f"data parallel over {len(mesh.devices)} devices",
        tree.episodes,
        time.perf_counter() - start,
        ep,
        sec,
        propagator.propagations,
    )


class ModelJudge:
    """Judges states of a model's problem by the distributed program they describe (module
    docstring)."""

    def __init__(
        self,
        model: Model,
        problem: Problem,
        cluster: Cluster,
        optimizer: str,
        proxy: tuple[Model | None, int] | None = None,
    ) -> None:
        """``proxy``: (the model with one block, the depth to extrapolate to) when ``model`` has
        two blocks standing for many."""
        self.model = model
        self.proxy = proxy
        self.problem = problem
        self.cluster = cluster
        self.optimizer = Optimizer(optimizer)
        names = [a for a, _ in problem.mesh.axes]
        self.t = problem.size
        self.d = len(problem.mesh.devices) // self.t
        index = {p.name: i for i, p in enumerate(problem.fn.params)}
        self.weight_params = [problem.fn.params[index[w.name]] for w in model.weights if w.name in index]
        self._sims: dict[tuple[Placement, ...], Simulated] = {}
        self.capacity = cluster.device_spec(0).tensor_capacity
        del names

    def layout(self, state: Outcome) -> tuple[Placement, ...]:
        """Per weight, its placement along the searched axis in ``state`` (a sum: replicated)."""
        pl = state.placed.placed
        return tuple(Replicate() if isinstance(p := pl[v][0], Partial) else p for v in self.weight_params)

    def with_tp(self, tp: tuple[Placement, ...], model: Model | None = None) -> Model:
        """``model`` (default: the judged one) with the weights' placements ``tp`` (by name
        scope for a model of another depth)."""
        by_scope = {scope(w.name): p for w, p in zip(self.model.weights, tp, strict=True)}
        m = model or self.model
        return replace(m, weights=tuple(replace(w, tp=by_scope.get(scope(w.name), w.tp)) for w in m.weights))

    def simulated(self, tp: tuple[Placement, ...], dp_only: bool = False) -> Simulated:
        """The simulated step of the layout ``tp`` (``dp_only``: data parallelism alone), at
        the judged model's depth — extrapolated from one and two blocks with a ``proxy``."""
        key = (*tp, dp_only)
        got = self._sims.get(key)  # type: ignore[arg-type]
        if got is None:
            two = self._simulate(self.with_tp(tp), dp_only)
            if self.proxy is not None and self.proxy[0] is not None:
                one = self._simulate(self.with_tp(tp, self.proxy[0]), dp_only)
                k = self.proxy[1] - 1
                two = Simulated(
                    one.step_time_s + k * (two.step_time_s - one.step_time_s),
                    one.peak_memory + k * (two.peak_memory - one.peak_memory),
                    two.capacity,
                )
            got = self._sims[key] = two  # type: ignore[index]
        return got

    def _simulate(self, model: Model, dp_only: bool) -> Simulated:
        st = Strategy(d=self.d * self.t, t=1) if dp_only else Strategy(d=self.d, t=self.t)
        r = simulate(distribute(model, st, self.optimizer), self.cluster, device_map(st))
        return Simulated(r.step_time_s, max(r.peak_memory.values()), min(r.capacity.values()))

    def cost(self, state: Outcome) -> Cost:
        sim = self.simulated(self.layout(state))
        seconds = sim.step_time_s
        if not sim.fits:
            seconds *= 1 + OVER_CAPACITY * (sim.peak_memory / sim.capacity - 1)
        return Cost(seconds, 0.0, sim.peak_memory)

    def collectives(self, tp: tuple[Placement, ...]) -> dict[str, Counter[Collective]]:
        """Per layer call, the collectives of its sharded forward and backward."""
        out: dict[str, Counter[Collective]] = {}
        calls = self.model.layers
        for L in sharded_layers(self.with_tp(tp), self.d, self.t):
            c: Counter[Collective] = Counter()
            c.update(_function_collectives(L.fwd, L.fwd_args))
            if L.bwd is not None:
                c.update(_function_collectives(L.bwd, L.bwd_args))
            if c:
                out[f"@{calls[L.index].callee}[{L.index}]"] = c
        return out


def _function_collectives(fn: Function, args: Sequence[Type]) -> list[Collective]:
    types = value_types(Module((fn,)), fn, args)
    out: list[Collective] = []
    for op in fn.ops():
        if op.name == "Redistribute":
            src, dst = types[op.inputs[0]], types[op.outputs[0]]
            if isinstance(src, DTensorType) and isinstance(dst, DTensorType):
                out.extend(redistribution_collectives(src, dst.placements))
    return out


class HandComparison:
    """The hand layout of a model (what its weights declare) next to ``result``: its
    collectives per layer and simulated step time; ``differing``: the layer calls whose
    collectives (kind, axis, bytes, count) differ, in call order; ``matches``: none does;
    ``blocks_match``: no repeated block does (the transformer layers Megatron's scheme is
    about); ``ends_differing``: those of the embedding (``pre``) and head and loss (``post``)
    layers that differ. None when the model declares no tensor-parallel placement."""

    def __init__(self, result: AutomapResult, model: Model, cluster: Cluster) -> None:
        self.matches: bool | None = None
        self.blocks_match: bool | None = None
        self.step_time_s: float | None = None
        self.collectives: dict[str, Counter[Collective]] = {}
        self.differing: tuple[str, ...] = ()
        self.pre: tuple[str, ...] = ()
        self.post: tuple[str, ...] = ()
        if all(isinstance(w.tp, Replicate) for w in model.weights):
            return
        judge = ModelJudge(model, result.problem, cluster, "adam")
        tp = tuple(w.tp for w in model.weights)
        self.collectives = judge.collectives(tp)
        calls = [f"@{c.callee}[{i}]" for i, c in enumerate(model.layers)]
        none: Counter[Collective] = Counter()
        self.differing = tuple(
            k for k in calls if self.collectives.get(k, none) != result.collectives.get(k, none)
        )
        e = ends(model, len(model.layers))
        self.pre, self.post = tuple(calls[: e.pre]), tuple(calls[len(calls) - e.post :])
        self.matches = not self.differing
        self.blocks_match = set(self.differing) <= {*self.pre, *self.post}
        self.step_time_s = judge.simulated(tp).step_time_s

    def differing_in(self, layers: tuple[str, ...]) -> tuple[str, ...]:
        """Those of ``layers`` whose collectives differ."""
        return tuple(k for k in self.differing if k in layers)
