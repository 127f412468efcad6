"""Automap on a zoo model: its sequential training step, the placements ``distribute`` imposes
(inputs split over the batch axis; activations and their gradients between layers replicated
along the searched axis but for the loss layer's input, ``Model.loss_input_tp``), and the hand
layout its weights declare (``WeightSpec.tp``, optimizer state alike), to compare with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo.model import Model
from distir.hardware.cluster import Cluster
from distir.ir.dtensor import Mesh, Placement, Replicate, Shard
from distir.ir.function import Module
from distir.search.automap.layout import collectives, layout_program, simulated
from distir.search.automap.mcts import Budget
from distir.search.automap.points import Flat, Problem
from distir.search.automap.search import AutomapResult, automap


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


def hand_params(problem: Problem, model: Model) -> dict[int, tuple[Placement, ...]] | None:
    """Per parameter, the hand layout's placements (weights and their optimizer state as the
    weights declare); None when the model declares no tensor-parallel placement."""
    declared = {w.name: w.tp for w in model.weights}
    if all(isinstance(p, Replicate) for p in declared.values()):
        return None
    out: dict[int, tuple[Placement, ...]] = {}
    for i, places in problem.fixed.items():
        name = problem.fn.params[i].name
        base = name[2:] if name[:2] in ("m_", "v_") and name[2:] in declared else name
        tp = declared.get(base, Replicate())
        out[i] = tuple(tp if b == problem.axis else (p or Replicate()) for b, p in enumerate(places))
    return out


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
    """``automap`` on ``model``'s training step with ``distribute``'s boundaries."""
    return automap(
        training_program(model, optimizer),
        mesh,
        axis,
        cluster,
        model_fixed(model, mesh, axis, batch_axis),
        budget=budget,
        seed=seed,
        group=group,
        batch_axis=batch_axis,
        boundaries=model_boundaries(model, mesh, axis, batch_axis),
    )


class HandComparison:
    """The hand layout of a model on ``result``'s problem: its collectives per layer, simulated
    step time, and whether the found layout has the same collectives in every layer."""

    def __init__(self, result: AutomapResult, model: Model, cluster: Cluster) -> None:
        pr = result.problem
        self.params = hand_params(pr, model)
        self.matches: bool | None = None
        self.step_time_s: float | None = None
        if self.params is None:
            return
        legal = layout_program(pr.fn, pr.mesh, pr.pairs, self.params, pr.pins)
        self.collectives = collectives(pr, legal)
        self.matches = self.collectives == result.collectives
        self.step_time_s = simulated(legal, cluster).step_time_s
