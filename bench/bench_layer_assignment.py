"""Time the optimal pipeline layer assignment on large heterogeneous problems.

    .venv/bin/python bench/bench_layer_assignment.py

Layers have uneven random times (a factor 4 between the cheapest and the costliest); stages
alternate between two device kinds, the second twice as fast, with ±10% per-stage noise; every cut
has a random link cost. Prints, per (L, p, k), the best wall time of three runs, the number of
min-sum DP evaluations the search needed and the optimum found.
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import NDArray

from distir.search.layer_assignment import SearchStats, assign_layers

CASES = [(1000, 64, 128), (1000, 8, 128), (1000, 64, 2)]
REPEATS = 3


def problem(n_layers: int, p: int, seed: int = 0) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    layer = rng.uniform(0.5, 2.0, n_layers)
    speed = np.where(np.arange(p) % 2 == 0, 1.0, 2.0)  # two device kinds across the stages
    t = layer[None, :] / speed[:, None] * rng.uniform(0.9, 1.1, (p, n_layers))
    comm = rng.uniform(0.0, 0.3, (p - 1, n_layers - 1))
    return t, comm


def main() -> None:
    print("    L    p    k   seconds  DP evals  max stage   objective")
    for n_layers, p, k in CASES:
        t, comm = problem(n_layers, p)
        best = float("inf")
        stats = SearchStats()
        got = None
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            got = assign_layers(t, k, comm, stats=stats)
            best = min(best, time.perf_counter() - t0)
        assert got is not None
        print(
            f"{n_layers:5d} {p:4d} {k:4d} {best:9.3f} {stats.evaluations:9d}"
            f" {got.max_stage:10.3f} {got.time:11.3f}"
        )


if __name__ == "__main__":
    main()
