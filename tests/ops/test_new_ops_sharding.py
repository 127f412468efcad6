"""The sharding rules of the ops added for gradient rules and the model zoo (Scale, FillLike,
CausalMask, Expand, Reshape with the shape attribute, GatherGrad, SliceGrad, Trilu, CumSum) are sound: under
every strategy a rule offers on a 1-D mesh of 2-4 devices (uneven and empty shards included),
the materialized per-device program, fed the pieces of random inputs laid out as the strategy
takes them (pending sums as genuinely different pieces), gives pieces whose global value, laid
out as the strategy promises, is the sequential result; replicas agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import distir
from distir.interp.reference import run_reference
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Replicate
from distir.ir.function import Module
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops import REGISTRY
from distir.parallel.sharding.materialize import materialize, shard_value, unshard_value

D0 = Device(0)


@dataclass(frozen=True)
class Case:
    op: str
    inputs: tuple[np.ndarray, ...]
    attrs: dict[str, Any]


def _pieces(x: np.ndarray, t: DTensorType, rng: np.random.Generator) -> dict[Device, np.ndarray]:
    """``x`` laid out as ``t``; a pending sum is random pieces adding up to x, another pending
    reduction a copy of x on every device (its max, min and mean are x)."""
    (p,) = t.placements
    if isinstance(p, Partial) and p.op == "sum" and x.dtype.kind == "f":
        devs = t.mesh.devices
        noise = [rng.standard_normal(x.shape) for _ in devs[1:]]
        return dict(zip(devs, [x - sum(noise, np.zeros_like(x)), *noise], strict=True))
    if isinstance(p, Partial):
        return {d: np.array(x, copy=True) for d in t.mesh.devices}
    return shard_value(x, t)


def check(case: Case, n: int, seed: int) -> int:
    d = REGISTRY[case.op]
    assert d.reference is not None
    attrs = Attrs(case.attrs)
    ins = [TensorType(DType.from_numpy(x.dtype), x.shape, D0) for x in case.inputs]
    known = [x if x.dtype.kind in "iu" else None for x in case.inputs]
    outs = d.infer_types(ins, attrs, known)
    want = d.reference(list(case.inputs), attrs)
    mesh = Mesh((("x", n),), tuple(Device(i) for i in range(n)))
    rng = np.random.default_rng(seed)
    strategies = d.strategies(ins, outs, attrs, n)
    assert strategies[0].ins == tuple(Replicate() for _ in ins)
    for s in strategies:
        where = f"{case.op}{[x.shape for x in case.inputs]} {case.attrs} strategy {s} on {n} devices"
        tin = [DTensorType(t.dtype, t.shape, mesh, (p,)) for t, p in zip(ins, s.ins, strict=True)]
        tout = [DTensorType(t.dtype, t.shape, mesh, (p,)) for t, p in zip(outs, s.outs, strict=True)]  # type: ignore[union-attr]
        fb = FunctionBuilder("f", REGISTRY.out_arity)
        params = [fb.param(f"x{i}", t) for i, t in enumerate(tin)]
        ys = fb.op(case.op, *params, types=tout, **case.attrs)
        m = distir.check(materialize(distir.check(Module((fb.ret(*ys),)))))
        pieces = [_pieces(x, t, rng) for x, t in zip(case.inputs, tin, strict=True)]
        got = run_reference(m, [p[dev] for p in pieces for dev in mesh.devices])
        for k, (w, t) in enumerate(zip(want, tout, strict=True)):
            mine = {dev: np.asarray(got[k * n + i]) for i, dev in enumerate(mesh.devices)}
            if isinstance(t.placements[0], Replicate):
                for dev in mesh.devices[1:]:
                    np.testing.assert_array_equal(mine[dev], mine[mesh.devices[0]], err_msg=where)
            back = unshard_value(mine, t)
            scale = max(float(np.max(np.abs(np.asarray(w, dtype=np.float64)), initial=0.0)), 1.0)
            np.testing.assert_allclose(back, w, rtol=0, atol=1e-9 * scale, err_msg=where)
    return len(strategies)


dims = st.integers(1, 6)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=3)))
    rank = len(shape)
    kind = draw(
        st.sampled_from(
            [
                "Scale",
                "FillLike",
                "CausalMask",
                "Expand",
                "Reshape",
                "GatherGrad",
                "SliceGrad",
                "Trilu",
                "CumSum",
            ]
        )
    )
    x = rng.standard_normal(shape)
    if kind == "Scale":
        return Case(kind, (x,), {"alpha": draw(st.sampled_from([0.5, -2.0]))})
    if kind == "FillLike":
        return Case(kind, (x,), {"value": 3.0})
    if kind == "CausalMask":
        x = rng.standard_normal((*shape, draw(dims))) if rank == 1 else x
        return Case(kind, (x,), {"fill": draw(st.sampled_from([0.0, -1e9]))})
    if kind == "CumSum":
        return Case(
            kind, (x,), {"axis": draw(st.integers(-rank, rank - 1)), "reverse": draw(st.integers(0, 1))}
        )
    if kind == "Trilu":
        x = rng.standard_normal((*shape, draw(dims))) if rank == 1 else x
        return Case(kind, (x,), {"upper": draw(st.integers(0, 1)), "k": draw(st.integers(-2, 2))})
    if kind == "Expand":
        small = tuple(1 if draw(st.integers(0, 2)) == 0 else s for s in shape)
        # the target: new leading dims, and per dim its size or 1 where the input keeps it
        kept = (s if a == 1 or draw(st.booleans()) else 1 for s, a in zip(shape, small, strict=True))
        out = (*(draw(dims) for _ in range(draw(st.integers(0, 1)))), *kept)
        return Case(kind, (rng.standard_normal(small),), {"shape": out})
    if kind == "Reshape":  # merge two adjacent dims, or split one into two factors
        if rank >= 2 and draw(st.booleans()):
            i = draw(st.integers(0, rank - 2))
            target = (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :])
        else:
            i = draw(st.integers(0, rank - 1))
            f = draw(st.sampled_from([k for k in range(1, shape[i] + 1) if shape[i] % k == 0]))
            target = (*shape[:i], f, shape[i] // f, *shape[i + 1 :])
        return Case(kind, (x,), {"shape": target})
    if kind == "GatherGrad":
        size = draw(dims)
        axis = draw(st.integers(0, rank - 1))
        idx_shape = tuple(draw(st.lists(dims, min_size=0, max_size=2)))
        dy_shape = (*shape[:axis], *idx_shape, *shape[axis + 1 :])
        idx = rng.integers(-size, size, size=idx_shape)
        ins: tuple[np.ndarray, ...] = (rng.standard_normal(dy_shape), idx)
        if draw(st.booleans()):  # the forward's data, for its type: sharded on axis, rows of a table
            ins = (*ins, rng.standard_normal((*shape[:axis], size, *shape[axis + 1 :])))
        return Case(kind, ins, {"axis": axis, "size": size})
    d = draw(st.integers(0, rank - 1))
    lo = draw(st.integers(0, shape[d] - 1))
    hi = draw(st.integers(lo + 1, shape[d]))
    sliced = (*shape[:d], hi - lo, *shape[d + 1 :])
    shape = tuple(s if k == d or draw(st.booleans()) else -1 for k, s in enumerate(shape))
    return Case(
        kind, (rng.standard_normal(sliced),), {"shape": shape, "starts": (lo,), "ends": (hi,), "axes": (d,)}
    )


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_every_strategy_of_the_new_ops_is_sound(case: Case, n: int, seed: int) -> None:
    event(f"op {case.op}")
    check(case, n, seed)


def test_the_rules_offer_what_they_promise() -> None:
    """The strategies the task asks for are there (so the property above exercises them)."""

    def strategies(op: str, xs: list[np.ndarray], **attrs: Any) -> set[str]:
        d = REGISTRY[op]
        ins = [TensorType(DType.from_numpy(x.dtype), x.shape, D0) for x in xs]
        outs = d.infer_types(ins, Attrs(attrs), [None] * len(xs))
        return {str(s) for s in d.strategies(ins, outs, Attrs(attrs), 2)}

    x = np.zeros((4, 6, 6))
    assert "(P(sum)) -> (P(sum))" in strategies("Scale", [x], alpha=2.0)
    assert {"(P(sum)) -> (R)", "(P(max)) -> (R)", "(S(1)) -> (S(1))"} <= strategies("FillLike", [x])
    causal = strategies("CausalMask", [x])
    assert "(S(0)) -> (S(0))" in causal and not any(f"S({k})" in s for s in causal for k in (1, 2))
    assert "(P(sum)) -> (P(sum))" not in causal
    assert "(P(sum)) -> (P(sum))" in strategies("CausalMask", [x], fill=0.0)
    trilu = strategies("Trilu", [x], k=1)
    assert {"(S(0)) -> (S(0))", "(P(sum)) -> (P(sum))"} <= trilu and "(S(1)) -> (S(1))" not in trilu
    expand = strategies("Expand", [np.zeros((4, 1))], shape=(3, 1, 5))
    assert "(S(0)) -> (S(1))" in expand and "(S(1)) -> (S(2))" not in expand  # a size-1 dim grows
    # a global size in the attribute would be wrong for a piece: only a 1 keeps the piece's size
    assert "(S(0)) -> (S(1))" not in strategies("Expand", [np.zeros((4, 1))], shape=(3, 4, 5))
    gg = strategies("GatherGrad", [np.zeros((2, 3, 5)), np.zeros((2, 3), dtype=np.int64)], size=7)
    assert {"(S(0), S(0)) -> (P(sum))", "(S(2), R) -> (S(1))"} <= gg
    table = np.zeros((7, 5))
    gg = strategies("GatherGrad", [np.zeros((2, 3, 5)), np.zeros((2, 3), dtype=np.int64), table], size=7)
    assert "(R, R, S(0)) -> (S(0))" in gg  # each device its rows of the table's gradient
    sg = strategies("SliceGrad", [np.zeros((4, 2))], shape=(-1, 6), starts=(1,), ends=(3,), axes=(1,))
    assert "(S(0)) -> (S(0))" in sg and "(S(1)) -> (S(1))" not in sg
    sg = strategies("SliceGrad", [np.zeros((4, 2))], shape=(4, 6), starts=(1,), ends=(3,), axes=(1,))
    assert "(S(0)) -> (S(0))" not in sg
