"""Automap on a 24-layer GPT training step, mesh (dp=2, tp=4 searched): does the search recover
Megatron's layout — the same collectives (kind, axis, bytes, count) per layer as the hand
placements the model declares (Megatron-LM's: column/row-parallel blocks, vocabulary-parallel
embedding, head and cross entropy)? Over seeds, within a budget in seconds: how often the
transformer blocks match ("blocks"), the blocks, head and loss ("but embedding"), and every
layer ("all"); the layers that differ and the found step time over the hand layout's; the
median episodes and seconds until the winning layout was first met, and the median search time
— with and without grouping of repeated layers, for the untied model (distir's default) and the
tied one (``tied=1``: Megatron-LM's default, ``share_embeddings_and_output_weights``).

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_automap.py [--seeds 20] [--seconds 6]
        [--episodes N] [--model gpt:layers=24,...] [--no-tied] [--no-group-too]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import Mesh
from distir.search.automap import Budget
from distir.search.automap.model import HandComparison, automap_model

MODEL = "gpt:layers=24,hidden=1024,heads=16,seq=512,vocab=8192"


def run(spec: str, seeds: int, budget: Budget, group: bool) -> None:
    model = build_model(spec, batch=16)
    cluster = parse_cluster("dgx2-v100")
    mesh = Mesh.parse("dp=2,tp=4")
    blocks = ends = every = no_slower = 0
    eps, secs, total, ratio = [], [], [], []
    differing: Counter[tuple[str, ...]] = Counter()
    for seed in range(seeds):
        t = time.perf_counter()
        r = automap_model(
            mesh=mesh,
            model=model,
            axis="tp",
            cluster=cluster,
            batch_axis="dp",
            budget=budget,
            seed=seed,
            group=group,
        )
        total.append(time.perf_counter() - t)
        hand = HandComparison(r, model, cluster)
        assert hand.step_time_s is not None
        ratio.append(r.simulated.step_time_s / hand.step_time_s)
        no_slower += ratio[-1] <= 1 + 1e-9
        blocks += bool(hand.blocks_match)
        ok = set(hand.differing) <= set(hand.pre)  # blocks, head and loss match
        ends += ok
        every += bool(hand.matches)
        differing[hand.differing] += 1
        if ok:
            eps.append(r.found_episode + 1)
            secs.append(r.found_seconds)
        what = (
            "all layers"
            if hand.matches
            else "but " + ", ".join(hand.differing)
            if ok
            else "blocks"
            if hand.blocks_match
            else "other"
        )
        print(
            f"  seed {seed:2d}: {what:24s} episodes {r.episodes:4d}, winner at {r.found_episode + 1:4d} "
            f"({r.found_seconds:5.2f} s), search {total[-1]:5.2f} s, step "
            f"{r.simulated.step_time_s * 1e3:.3f} ms = {ratio[-1]:.4f}× hand",
            flush=True,
        )
    label = "grouped" if group else "ungrouped"
    print(f"{spec} {label}, budget {budget}:")
    print(
        f"  blocks match in {blocks}/{seeds}; blocks, head and loss in {ends}/{seeds}; "
        f"every layer in {every}/{seeds}"
    )
    print(
        f"  found layout no slower than the hand one in {no_slower}/{seeds} "
        f"(median {statistics.median(ratio):.4f}×)"
    )
    for layers, n in differing.most_common():
        print(f"    {n:2d} seeds differ in: {', '.join(layers) or 'nothing'}")
    if eps:
        print(
            f"  median episodes to the winner {statistics.median(eps):g}, "
            f"seconds {statistics.median(secs):.2f}"
        )
    print(f"  median search seconds {statistics.median(total):.2f} (max {max(total):.2f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--no-tied", action="store_true", help="only the model as given (not tied=1 too)")
    ap.add_argument("--no-group-too", action="store_true")
    a = ap.parse_args()
    budget = Budget(a.episodes, a.seconds)
    specs = [a.model] if a.no_tied else [a.model, f"{a.model},tied=1"]
    print(f"mesh dp=2,tp=4 (tp searched), budget {budget}")
    for spec in specs:
        run(spec, a.seeds, budget, True)
        if a.no_group_too:
            run(spec, a.seeds, budget, False)


if __name__ == "__main__":
    main()
