"""``distribute(..., called_only=True)`` (the search's exact simulations) against the whole program.

With ``called_only`` the builder makes each chunk function when the schedule first calls it
(``_LazyChunks``) and leaves out the chunk variants nothing calls. The program must be the one
``distribute`` builds otherwise but for functions nothing calls — every function it holds
printed alike, the entry and every function the entry reaches among them, the chunk functions
in the same order (helpers the chunks make as they need them, ``@hp_grad`` and fused
backwards, may come in another order) — and simulate to bit-identical results (``repr`` of
every field), over the schedules, microbatch counts, ZeRO stages and trainer switches that pick
the chunk variants (first / accumulating / reducing backwards, HSDP's ``_rs``, Megatron's
``_grad_sync``, the gathering first forward).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.printer import print_function
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.parallel.trainers import trainer_semantics
from distir.sim.simulate import simulate

FIELDS = ("step_time_s", "busy_s", "comm_s", "peak_memory", "param_memory", "flops", "n_ops", "peak_flops")
GPT = "gpt:layers=4,hidden=32,heads=2,seq=8,vocab=64"
MIXED: dict[str, Any] = {"precision": "mixed", "dtype": DType.bf16}
CASES: list[tuple[str, dict[str, Any]]] = [  # (strategy, options; "dtype" is the model's)
    ("d2.t1.p2.k4.zb1", {}),
    ("d2.t1.p1.k1.1f1b", {}),
    ("d2.t1.p2.k3.gpipe", {}),
    ("d2.t2.sp.p2.k2.z3.1f1b", {}),
    ("d2.t1.p2.k4.interleaved.v2.z1", {**MIXED, "megatron_ddp": True, "reduce_fp32": True}),
    ("d2.t1.p2.k4.1f1b.z2", {**MIXED, "overlap_param_gather": True}),
    ("d2.t1.p2.k2.zb1.z1", {**MIXED, "fp32_grad_accum": True}),
    ("d2.t1.p2.k3.1f1b", {**MIXED, "grad_accum_fusion": True}),
    ("d2.t1.p2.k4.1f1b.z1", {"deepspeed_pipe": True}),
    ("d4.t1.p2.k2.1f1b.z3h2", {}),
    ("d4.t1.p1.k1.1f1b.z3h2", {}),
    ("d2.t1.c2.p2.k2.z1", {}),
]


def _program(strategy: str, options: dict[str, Any], called_only: bool) -> Module:
    s = parse_strategy(strategy)
    opts = dict(options)
    dtype = opts.pop("dtype", DType.f32)
    model = build_model(GPT, batch=2 * s.d * s.k, dtype=dtype)
    return distribute(model, s, Optimizer("adam"), comm_streams=True, called_only=called_only, **opts)


def _chunk(name: str) -> bool:
    return re.fullmatch(r"c\d+_.*", name) is not None


def _called(m: Module) -> set[str]:
    """The functions the entry reaches through calls."""
    seen: set[str] = set()
    stack = [m.entry]
    while stack:
        for c in stack.pop().calls():
            if c.callee not in seen:
                seen.add(c.callee)
                stack.append(m[c.callee])
    return seen


@pytest.mark.parametrize(("strategy", "options"), CASES)
def test_the_called_chunk_functions_are_the_whole_programs(strategy: str, options: dict[str, Any]) -> None:
    whole = _program(strategy, options, False)
    lean = _program(strategy, options, True)
    called = _called(whole)
    assert _called(lean) == called
    names = [f.name for f in lean.functions]
    assert set(names) <= {f.name for f in whole.functions}
    assert {whole.entry.name, *called} <= set(names)
    assert all(n in called for n in names if _chunk(n))  # only the chunk functions called
    for f in lean.functions:
        assert print_function(f) == print_function(whole[f.name]), f.name
    assert [n for n in names if _chunk(n)] == [
        f.name for f in whole.functions if f.name in called and _chunk(f.name)
    ]
    s = parse_strategy(strategy)
    cluster = parse_cluster("g4dn.12xlarge:2")
    r1 = simulate(whole, cluster, device_map(s, True), batch=2 * s.d * s.k)
    r2 = simulate(lean, cluster, device_map(s, True), batch=2 * s.d * s.k)
    for f in FIELDS:
        assert repr(getattr(r1, f)) == repr(getattr(r2, f)), f


def test_called_only_leaves_out_what_nothing_calls() -> None:
    """The comparison above is not vacuous: a chunk variant goes, under several microbatches
    (the first backward that reduces) and under one (the accumulating backwards)."""
    for strategy in ("d2.t1.p2.k4.zb1", "d2.t1.p1.k1.1f1b"):
        whole, lean = _program(strategy, {}, False), _program(strategy, {}, True)
        gone = {f.name for f in whole.functions} - {f.name for f in lean.functions}
        assert gone and all(n.startswith(("c0_bwd", "c1_bwd")) for n in gone), gone
        assert not gone & _called(whole)


TRAINER_CASES = [  # (trainer, strategy): each trainer's own switches, as the search runs them
    ("megatron", "d2.t2.sp.p2.k4.interleaved.v2.z1"),
    ("megatron", "d2.t1.p2.k2.1f1b"),
    ("deepspeed", "d2.t1.p2.k4.1f1b.z1"),
    ("deepspeed", "d2.t1.p1.k2.1f1b.z3"),
    ("torchtitan", "d2.t1.p1.k2.1f1b.z3"),
    ("torchtitan", "d2.t1.p2.k4.1f1b.z2"),
    ("torchtitan", "d4.t1.p1.k1.1f1b.z3h2"),
]


@pytest.mark.parametrize(("trainer", "strategy"), TRAINER_CASES)
def test_the_called_chunk_functions_under_each_trainer(trainer: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    sem = trainer_semantics(trainer, s, Precision.parse("mixed"), DType.bf16)
    options: dict[str, Any] = {**MIXED, **sem.switches()}
    test_the_called_chunk_functions_are_the_whole_programs(strategy, options)
