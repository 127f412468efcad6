"""The simulator's figures and ``distribute``'s printed programs, bit for bit, against a golden file.

``figures_golden.json`` was written by the code before the simulator's core was restructured
(commit be919f4): every float as its ``repr`` (exact), every printed program as its SHA-256. A
refactoring that changes no semantics leaves it untouched. It covers the bench programs
(``bench/bench_sim.py``: flat, layered with calls, DTensor SPMD; scaled down), each simulated
untraced and traced (slices and memory timelines), the example programs, and zoo models
distributed under D/T/P/Z/SP strategies and simulated.

A change that is meant to alter a figure regenerates the file (``DISTIR_REGEN_GOLDEN=1``) and
says why in its commit message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import Module, parse_module
from distir.ir.printer import print_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import SimResult, simulate

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("figures_golden.json")
REGEN = os.environ.get("DISTIR_REGEN_GOLDEN") == "1"

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
ZOO = [  # (model, strategy, cluster, batch, train)
    (GPT, "d2.t1.p2.k4.zb1", "g4dn.12xlarge:2", 16, True),
    (GPT, "d1.t2.p2.k2.1f1b", "g4dn.12xlarge:2", 8, True),
    (GPT, "d2.t2.sp.p2.k2.z3.1f1b", "g4dn.12xlarge:2", 8, True),
    (GPT, "d1.t2.p2.k4.interleaved.v2.rsel", "p3.8xlarge:2", 8, True),
    (GPT, "d2.t2.p2.k2", "p3.8xlarge:2", 8, False),
    (
        "llama:layers=3,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128",
        "d1.t2.p3.k3.1f1b",
        "p3.8xlarge:2",
        6,
        True,
    ),
    ("transgan-hetero:wide_layers=2,narrow_layers=2", "d1.t1.p4.k4.zb1.L0-2-1-2", "p3.8xlarge:1", 8, True),
    ("mlp:layers=4,hidden=64", "d2.t2.z2", "p3.8xlarge:1", 8, True),
]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sim", ROOT / "bench" / "bench_sim.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _digest(x: Any) -> str:
    return hashlib.sha256(repr(x).encode()).hexdigest()


def figures(r: SimResult) -> dict[str, Any]:
    """Every figure of a result, exactly (floats by ``repr``; traces by digest)."""
    out: dict[str, Any] = {
        f: repr(getattr(r, f))
        for f in (
            "step_time_s",
            "busy_s",
            "comm_s",
            "flops",
            "n_ops",
            "peak_flops",
            "batch",
            "slot_devices",
            "runtime_memory",
        )
    }
    for f in ("peak_memory", "param_memory", "capacity"):
        out[f] = repr(sorted(getattr(r, f).items()))
    if r.slices is not None:
        out["slices"] = _digest(r.slices)
    if r.memory_timeline is not None:
        out["memory_timeline"] = _digest(sorted(r.memory_timeline.items()))
    return out


def _bench_cases() -> dict[str, tuple[Module, str, int | None]]:
    b = _bench()
    return {
        "bench.flat": (b.flat_program(2000), "dgx-a100:1", None),
        "bench.layered": (
            b.layered_program(layers=16, stages=4, micro=8, seq=128, hidden=256),
            "dgx-a100:1",
            32,
        ),
        "bench.spmd": (
            b.spmd_program(stages=2, dp=2, tp=2, layers=4, micro=4, batch=8, seq=64, hidden=128),
            "dgx-a100:1",
            32,
        ),
    }


EXAMPLES = sorted((ROOT / "examples").glob("*.distir"))


def compute() -> dict[str, Any]:
    """The figures of every case, as the golden file holds them."""
    got: dict[str, Any] = {}
    for name, (m, cluster, batch) in _bench_cases().items():
        for trace in (False, True):
            got[f"{name}.trace={trace}"] = figures(
                simulate(m, parse_cluster(cluster), trace=trace, batch=batch)
            )
    for path in EXAMPLES:
        m = parse_module(path.read_text())
        for trace in (False, True):
            got[f"example.{path.stem}.trace={trace}"] = figures(
                simulate(m, parse_cluster("p3.8xlarge:2"), trace=trace)
            )
    for model, strategy, cluster, batch, train in ZOO:
        s = parse_strategy(strategy)
        prog = distribute(build_model(model, batch), s, Optimizer("adam"), train=train, comm_streams=True)
        key = f"zoo.{model}.{strategy}.{cluster}.{batch}.train={train}"
        got[key + ".program"] = hashlib.sha256(print_module(prog).encode()).hexdigest()
        got[key] = figures(simulate(prog, parse_cluster(cluster), device_map(s, True), batch=batch))
    return got


@pytest.fixture(scope="module")
def computed() -> dict[str, Any]:
    got = compute()
    if REGEN:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    return got


def test_figures_and_programs_are_bit_identical_to_the_golden_file(computed: dict[str, Any]) -> None:
    want = json.loads(GOLDEN.read_text())
    assert sorted(computed) == sorted(want)
    for key in want:
        assert computed[key] == want[key], key
