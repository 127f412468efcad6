"""Automap on a 24-layer GPT training step, mesh (dp=2, tp=4 searched): does the search recover
Megatron's layout — the same collectives (kind, bytes, count) in every transformer block as the
hand placements the model declares ("megatron"), and in every layer, embedding, head and loss
included ("all")? Over seeds: success rate, and the median episodes and seconds until the
winning layout was first met; with and without grouping of repeated layers.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_automap.py [--seeds 20] [--episodes 150]
        [--seconds 20] [--model gpt:layers=24,...] [--no-group-too]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

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
    ok, all_ok, eps, secs, total, ratio = 0, 0, [], [], [], []
    for seed in range(seeds):
        t = time.perf_counter()
        r = automap_model(model, mesh, "tp", cluster, batch_axis="dp", budget=budget, seed=seed, group=group)
        total.append(time.perf_counter() - t)
        hand = HandComparison(r, model, cluster)
        assert hand.step_time_s is not None
        ratio.append(r.simulated.step_time_s / hand.step_time_s)
        all_ok += bool(hand.matches)
        if hand.blocks_match:
            ok += 1
            eps.append(r.found_episode + 1)
            secs.append(r.found_seconds)
        print(
            f"  seed {seed:2d}: {'megatron' if hand.blocks_match else 'other   '}"
            f"{' (all layers)' if hand.matches else '             '} episodes {r.episodes:4d} "
            f"found at {r.found_episode + 1:4d} ({r.found_seconds:6.2f} s of {total[-1]:6.2f} s), "
            f"step {r.simulated.step_time_s * 1e3:.3f} ms = {ratio[-1]:.3f}× hand",
            flush=True,
        )
    label = "grouped" if group else "ungrouped"
    print(
        f"{label}: Megatron's blocks recovered in {ok}/{seeds} seeds within {budget}; every layer in {all_ok}"
    )
    if eps:
        print(f"  median episodes to it {statistics.median(eps):g}, seconds {statistics.median(secs):.2f}")
    print(f"  median search seconds {statistics.median(total):.2f}", end="; ")
    print(f"median step time vs hand {statistics.median(ratio):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-group-too", action="store_true")
    a = ap.parse_args()
    budget = Budget(a.episodes, a.seconds)
    print(f"{a.model}, mesh dp=2,tp=4 (tp searched), budget {budget}")
    run(a.model, a.seeds, budget, True)
    if a.no_group_too:
        run(a.model, a.seeds, budget, False)


if __name__ == "__main__":
    main()
