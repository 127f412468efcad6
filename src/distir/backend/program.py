"""What ``distir run`` runs: a global explicit program, its seeded inputs, and its rank programs.

``model_program(spec, strategy, ...)`` builds a zoo model's training step distributed with a
strategy (``distribute``), materialized into explicit per-device code, with the inputs the
numerical checks use (``distir.parallel.check.initial_values``: random data, weights and
optimizer state — Adam's second moments non-negative — split into microbatches and sharded).
``file_program(module, seed)`` takes a parsed explicit program with seeded random inputs (as
``distir exec``). ``rank_programs(prog)`` projects it: one ``RankProgram`` per device, devices
mapped to global ranks in id order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import distir
from distir.backend.worker import RankProgram, agreed_calls
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.interp.reference import random_inputs
from distir.ir.function import Module
from distir.ir.rewrite import inline_calls
from distir.ir.types import Device
from distir.ops.registry import REGISTRY, OpKind
from distir.report.demo import rank_inputs


@dataclass(frozen=True, slots=True)
class GlobalProgram:
    """An explicit (per-device) program, its inputs, and a label for reports."""

    module: Module
    args: tuple[Any, ...]
    label: str


def model_program(
    spec: str,
    strategy: str | None,
    batch: int | None,
    dtype: str = "f32",
    precision: str = "pure",
    optimizer: str = "adam",
    seed: int = 0,
) -> GlobalProgram:
    """A zoo model's distributed training step and its seeded inputs (see the module docstring).
    Raises the build's user errors (StrategyError, ModelError, ...)."""
    from distir.autodiff.precision import Precision
    from distir.autodiff.train import Optimizer
    from distir.backend.launch import under_torchrun
    from distir.frontends.zoo import build_model
    from distir.frontends.zoo.registry import parse_training_dtype
    from distir.limits import max_local_ranks
    from distir.parallel.check import initial_values, materialized_inputs
    from distir.parallel.distribute import distribute
    from distir.parallel.strategy import StrategyError, parse_strategy

    st = parse_strategy("d1.t1.p1.k1.1f1b" if strategy is None else strategy)  # "" is an error
    if not under_torchrun() and st.devices > max_local_ranks():
        raise StrategyError(
            f"the strategy {st} has {st.devices:,} ranks; a local run starts one process per rank, at "
            f"most {max_local_ranks()} here (more: torchrun on a cluster)"
        )
    dt = parse_training_dtype(dtype, also=("f64",))  # f64: run's exact comparisons
    b = batch if batch is not None else 2 * st.d * st.k
    prec = Precision.parse(precision)
    model = build_model(spec, batch=b, dtype=dt)
    opt = Optimizer(optimizer)
    dist = distribute(model, st, opt, train=True, comm_streams=False, precision=prec)
    vals = initial_values(model, opt, seed, prec)
    mat, flat = materialized_inputs(dist, model, st, vals)
    mat = distir.check(mat)
    mode = f"train, {dt}{f' {prec}' if prec.mixed else ''}"
    return GlobalProgram(mat, tuple(flat), f"{model.name} {st} ({mode})")


def file_program(module: Module, label: str, seed: int = 0) -> GlobalProgram:
    """An explicit program (already checked) with seeded random inputs."""
    return GlobalProgram(module, tuple(random_inputs(module.entry, seed)), label)


def _groups(ranks: dict[Device, Module]) -> tuple[tuple[Device, ...], ...]:
    """Every device group a rank op of any rank's program meets in (sorted)."""
    seen: set[tuple[Device, ...]] = set()
    for m in ranks.values():
        for op in inline_calls(m).ops():
            group: Any = op.attrs.get("group")
            if REGISTRY[op.name].kind is OpKind.RANK_COMM and group is not None:
                seen.add(tuple(group))
    return tuple(sorted(seen, key=lambda g: [d.id for d in g]))


def rank_programs(prog: GlobalProgram, steps: int = 1, trace: bool = False) -> list[RankProgram]:
    """One ``RankProgram`` per device of ``prog`` (in device id order: device i is global rank i),
    checked free of deadlocks."""
    ranks = project(prog.module)
    check_deadlock_free(ranks)
    inputs = rank_inputs(prog.module, list(prog.args))
    groups = _groups(ranks)
    order = sorted(ranks, key=lambda d: d.id)
    rank_of = {d: i for i, d in enumerate(order)}
    calls = agreed_calls([inline_calls(ranks[d]) for d in order])
    return [
        RankProgram(d, ranks[d], tuple(inputs.get(d, ())), rank_of, groups, steps, trace, calls[i])
        for i, d in enumerate(order)
    ]
