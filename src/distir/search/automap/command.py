"""``distir shard --auto AXIS``: run Automap on a zoo model's training step or a program file and
report it — the decisions, every parameter's placements, the collectives per layer (layers with
equal ones merged), the simulated step time and the gain over data parallelism alone, and for a
model that declares its own tensor-parallel placements whether the found layout has the same
collectives in every layer (``matches_hand_layout``) and in every block (``matches_hand_blocks``),
and the layers where they differ (``differing_layers``).
Also ``--tp-layout auto`` of ``distir simulate --model``: the model with the found placements
(``auto_layout``), and of ``distir search``: the placements found once, on one tensor-parallel
group, declared by the model in every strategy searched (``search_layout``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from distir.frontends.zoo.model import Model, ModelError
from distir.frontends.zoo.registry import ModelSpec, build_from
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import HardwareError
from distir.ir.dtensor import Mesh, Placement, Replicate, format_placements
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.strategy import Strategy
from distir.search.automap.layout import summarize
from distir.search.automap.mcts import Budget
from distir.search.automap.model import HandComparison, automap_model
from distir.search.automap.points import scope
from distir.search.automap.search import AutomapResult, automap, with_layout

AUTO_EPISODES, AUTO_SECONDS = 200, 10.0  # ``--tp-layout auto``'s search budget


def run_auto(
    source: Model | Module,
    mesh: Mesh,
    axis: str,
    cluster: Cluster,
    fixed: dict[str, tuple[Placement | None, ...]],
    budget: Budget,
    seed: int,
    group: bool,
) -> tuple[AutomapResult, HandComparison | None]:
    """Search ``source`` (a zoo model: its training step; or a program), batch axis the first
    unsearched one."""
    batch_axis = next((a for a, _ in mesh.axes if a != axis), None)
    if isinstance(source, Model):
        r = automap_model(
            source, mesh, axis, cluster, batch_axis=batch_axis, budget=budget, seed=seed, group=group
        )
        return r, HandComparison(r, source, cluster)
    r = automap(
        source, mesh, axis, cluster, fixed, budget=budget, seed=seed, group=group, batch_axis=batch_axis
    )
    return r, None


def report(r: AutomapResult, hand: HandComparison | None, label: str) -> dict[str, Any]:
    """The JSON object of ``distir shard --auto --json``."""
    return {
        "source": label,
        "mesh": str(r.problem.mesh),
        "searched_axis": r.problem.mesh.axes[r.problem.axis][0],
        "decisions": {name: format_placements(pl) for name, pl in r.placements.items()},
        "actions": [{"point": label_, "placement": str(p)} for label_, p in r.decisions],
        "collectives": {
            layer: [
                {"axis": c.axis, "kind": c.kind, "bytes": c.nbytes, "count": k} for c, k in sorted(cs.items())
            ]
            for layer, cs in r.collectives.items()
        },
        "seconds": r.seconds,
        "episodes": r.episodes,
        "found_at_episode": r.found_episode,
        "step_time_s": r.simulated.step_time_s,
        "peak_memory_bytes": r.simulated.peak_memory,
        "baseline": r.baseline_label,
        "baseline_step_time_s": r.baseline.step_time_s if r.baseline is not None else None,
        "gain_over_baseline": r.gain,
        "matches_hand_layout": hand.matches if hand is not None else None,
        "matches_hand_blocks": hand.blocks_match if hand is not None else None,
        "differing_layers": list(hand.differing) if hand is not None else None,
        "hand_step_time_s": hand.step_time_s if hand is not None else None,
    }


def text(r: AutomapResult, hand: HandComparison | None) -> list[str]:
    """The text report, line by line."""
    axis = r.problem.mesh.axes[r.problem.axis][0]
    lines = [f"searched {axis} of {r.problem.mesh}: {r.episodes} episodes in {r.seconds:.2f} s"]
    lines.append("decisions:" if r.decisions else "decisions: none (everything inferred)")
    lines += [f"  {name} -> {p}" for name, p in r.decisions]
    lines.append("placements (" + ", ".join(a for a, _ in r.problem.mesh.axes) + "):")
    alike: dict[tuple[str, tuple[Placement, ...]], list[str]] = {}
    for name, pl in r.placements.items():  # repeated layers' values alike: one line
        alike.setdefault((scope(name), pl), []).append(name)
    for (_, pl), names in alike.items():
        what = f"%{names[0]}" if len(names) == 1 else f"%{names[0]} … %{names[-1]} ({len(names)})"
        lines.append(f"  {what}: [{format_placements(pl)}]")
    lines.append("collectives per layer:")
    for first, count, cs in summarize(r.collectives):
        what = ", ".join(f"{k}× {c}" for c, k in cs)
        lines.append(f"  {first}{f' (and {count - 1} alike)' if count > 1 else ''}: {what}")
    lines.append(f"simulated step time: {r.simulated.step_time_s * 1e3:.3f} ms")
    if r.baseline is not None and r.gain is not None:
        lines.append(f"{r.baseline_label}: {r.baseline.step_time_s * 1e3:.3f} ms (gain ×{r.gain:.2f})")
    if hand is not None and hand.matches is not None:
        lines.append(
            f"hand layout: {hand.step_time_s * 1e3 if hand.step_time_s else 0:.3f} ms; "
            f"same collectives per layer: {'yes' if hand.matches else 'no'}, "
            f"in every block: {'yes' if hand.blocks_match else 'no'}"
            + (f" (differ in {', '.join(hand.differing)})" if hand.differing else "")
        )
    return lines


def auto_layout(model: Model, strategy: Strategy, how: str, cluster: str | None) -> Model:
    """``model`` with the tensor-parallel placements ``--tp-layout auto`` finds for the
    strategy's (d, t) on ``cluster`` (default dgx2-v100), searched from none declared; the
    model itself when t is 1."""
    if how != "auto":
        raise ModelError(f"--tp-layout must be declared or auto, got {how!r}")
    if strategy.t == 1:
        return model
    bare = replace(model, weights=tuple(replace(w, tp=Replicate()) for w in model.weights))
    mesh = Mesh.parse(f"dp={strategy.d},tp={strategy.t}")
    try:
        cl = parse_cluster(cluster or "dgx2-v100")
    except HardwareError:
        cl = parse_cluster("dgx2-v100")  # the caller reports its cluster's error
    found = automap_model(bare, mesh, "tp", cl, batch_axis="dp", budget=Budget(AUTO_EPISODES, AUTO_SECONDS))
    return with_layout(bare, found)


SEARCH_TP = 4  # the tensor-parallel group ``search_layout`` searches on, at most


def search_layout(
    spec: ModelSpec,
    how: str,
    cluster: Cluster,
    *,
    batch: int,
    dtype: DType,
    tp: int | None = None,
    optimizer: str = "adam",
) -> tuple[tuple[str, Placement], ...]:
    """``--tp-layout auto`` of ``distir search``: per weight of ``spec``'s model, the
    tensor-parallel placement Automap finds (searched from none declared) on one group of ``tp``
    GPUs (default: ``SEARCH_TP``, or a node's GPUs if fewer) for the samples one such group
    takes of a ``batch`` spread over the cluster. A placement names a dim, not a degree: the
    layout serves every degree the search tries (``ModelSpec.tp``)."""
    if how != "auto":
        raise ModelError(f"--tp-layout must be declared or auto, got {how!r}")
    t = min(tp or min(SEARCH_TP, *(n.devices_per_node for n in cluster.nodes)), cluster.num_devices)
    declared = build_from(spec, max(1, batch // max(1, cluster.num_devices // t)), dtype)
    bare = replace(declared, weights=tuple(replace(w, tp=Replicate()) for w in declared.weights))
    if t < 2:
        return tuple((w.name, w.tp) for w in bare.weights)
    found = automap_model(
        bare,
        Mesh.parse(f"tp={t}"),
        "tp",
        cluster,
        optimizer=optimizer,
        budget=Budget(AUTO_EPISODES, AUTO_SECONDS),
    )
    return tuple((w.name, found.placements[w.name][0]) for w in bare.weights)
