"""Simulated pipeline bubbles and activation memory against the textbook (issue 5's figures).

    .venv/bin/python bench/bench_pipeline.py

With unit matmul costs (FixedCostModel) and uniform stages of 16 MLP layers, prints per (p, k,
schedule) the simulated bubble fraction next to (p−1)/(k+p−1), and per stage the activation memory
(the tensors' peak minus parameters: ``SimResult.peak_memory`` without its runtime memory) of GPipe
and 1F1B.
"""

from __future__ import annotations

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import FixedCostModel
from distir.sim.simulate import SimResult, simulate

UNIT = FixedCostModel(compute=0.0, comm=0.0, by_op={"MatMul": 1.0}, free_local=True)
N = 16


def run(p: int, k: int, schedule: str) -> SimResult:
    model = build_model(f"mlp:layers={p * N},hidden=64", batch=k * 64)
    s = parse_strategy(f"p{p}.k{k}.{schedule}.L" + "-".join([str(N)] * p))  # blocks; the loss joins the last
    return simulate(
        distribute(model, s, comm_streams=True), parse_cluster("dgx2-v100"), device_map(s, True), UNIT
    )


def main() -> None:
    print(" p   k  schedule  bubble  (p-1)/(k+p-1)")
    for p, k in [(2, 4), (2, 8), (4, 8), (4, 16), (4, 32), (8, 16)]:
        for schedule in ("gpipe", "1f1b"):
            r = run(p, k, schedule)
            print(f"{p:2d} {k:3d}  {schedule:8s} {r.bubble_fraction:.4f}  {(p - 1) / (k + p - 1):.4f}")
    for k in (8, 16):
        for schedule in ("gpipe", "1f1b"):
            r = run(4, k, schedule)
            act = [(r.peak_memory[g] - r.runtime_memory[g] - r.param_memory[g]) / 1e6 for g in range(4)]
            print(f"p=4 k={k:2d} {schedule:6s} activation MB per stage: " + " ".join(f"{a:.2f}" for a in act))


if __name__ == "__main__":
    main()
