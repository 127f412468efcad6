"""Run a sequential program and its sharded, materialized and projected forms on the same inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.interp.lockstep import check_deadlock_free, run_ranks
from distir.interp.project import project
from distir.interp.reference import random_inputs, run_reference
from distir.ir import DTensorType, Mesh, Module
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import local_shape, materialize, shard_value, unshard_value
from distir.parallel.sharding.propagate import propagate
from distir.parallel.strategy import parse_strategy

BF16_ROUNDOFF = 2.0**-8  # bf16's unit roundoff: the bound of tests/parallel/test_mixed_precision.py


def sharded(m: Module, mesh: Mesh, annotations: Mapping[str, str]) -> tuple[Module, Module]:
    """(legalized DTensor program, materialized explicit program), both verified and type-checked."""
    legal = distir.check(legalize(propagate(distir.check(m), mesh, annotations).module))
    return legal, distir.check(materialize(legal))


def compare(m: Module, mesh: Mesh, annotations: Mapping[str, str], seed: int = 0) -> float:
    """Max relative difference between the sequential outputs and the sharded program's outputs,
    computed both on the materialized global program and on its per-rank programs in lock-step."""
    m = distir.check(m)
    legal, mat = sharded(m, mesh, annotations)
    args = random_inputs(m.entry, seed)
    want = run_reference(m, args)
    pieces: list[np.ndarray] = []
    per_rank: dict[object, list[np.ndarray]] = {d: [] for d in mesh.devices}
    for a, p in zip(args, legal.entry.params, strict=True):
        assert isinstance(p.type, DTensorType)
        sv = shard_value(a, p.type)
        pieces += [sv[d] for d in mesh.devices]
        for d in mesh.devices:
            per_rank[d].append(sv[d])
    got = run_reference(mat, pieces)
    ranks = project(mat)
    check_deadlock_free(ranks)
    by_rank = run_ranks(ranks, per_rank)  # type: ignore[arg-type]
    worst = 0.0
    n = len(mesh.devices)
    for k, (w, v) in enumerate(zip(want, legal.entry.outputs, strict=True)):
        assert isinstance(v.type, DTensorType)
        global_pieces = {d: got[k * n + i] for i, d in enumerate(mesh.devices)}
        rank_pieces = {d: by_rank[d][k] for d in mesh.devices}
        for ps in (global_pieces, rank_pieces):
            back = unshard_value(ps, v.type)
            scale = max(float(np.max(np.abs(w))), 1e-6)
            worst = max(worst, float(np.max(np.abs(back - w))) / scale)
    return worst


def assert_mixed_step_matches(spec: str, strategy: str, batch: int | None = None, **options: Any) -> None:
    """A bf16 mixed-precision Adam step of zoo model ``spec`` distributed by ``strategy`` (with
    ``distribute``'s trainer ``options``) updates weights and optimizer state as the sequential
    mixed step does, within bf16's unit roundoff (``Comparison.update_error``)."""
    s = parse_strategy(strategy)
    model = build_model(spec, batch=batch or s.k * s.d, dtype=DType.bf16)
    cmp = check_against_sequential(model, s, Optimizer("adam", lr=0.01), precision="mixed", **options)
    err, where = cmp.update_error()
    assert err < BF16_ROUNDOFF, f"{spec} {strategy}: {where} differs by {err:.2e}"


def elements_per_device(prog: Module, named: Callable[[str], bool]) -> dict[int, int]:
    """Per device id, the elements it holds of the entry parameters whose name ``named``
    accepts."""
    held: dict[int, int] = {}
    for p in prog.entry.params:
        if named(p.name):
            t = p.type
            assert isinstance(t, DTensorType)
            for d in t.mesh.devices:
                held[d.id] = held.get(d.id, 0) + int(np.prod(local_shape(t, d)))
    return held
