"""Sharding rules of the training ops (gradients, losses, optimizers).

1. Every strategy of every rule of these ops is sound: run on pieces laid out as the strategy
   takes them (uneven and empty shards, genuinely different partial pieces, integer labels in
   range), the pieces of the results, laid out as the strategy promises, are the unsharded
   result. Cases: the op examples of ``tests/ops/ops_examples.py``, realistic ones (``EXTRA``)
   and random ones. (``test_properties``' generic check draws forward ops only, with f64 inputs.)
2. The rules offer what data- and tensor-parallel training needs (and not what would be wrong:
   a sharded mean loss's gradient, a local mean of uneven shards, channels of a grouped conv).

Training steps sharded with these rules: ``test_training_sharding``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import distir
from distir.interp.reference import run_reference
from distir.ir import DTensorType, Module
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Replicate
from distir.ir.types import Device, DType, ScalarType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.ops.sharding import Strategy
from distir.parallel.sharding.materialize import materialize

from .gen import mesh_of, partial_pieces, reduce_pieces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_examples import EXAMPLES, Case, In, K, T

R = Replicate()
D0 = Device(0)
f64, i64 = DType.f64, DType.i64

TRAINING_OPS = (
    "ReluGrad",
    "GeluGrad",
    "TanhGrad",
    "SigmoidGrad",
    "SoftmaxGrad",
    "LayerNormalizationGrad",
    "RMSNormalizationGrad",
    "SoftmaxCrossEntropyLoss",
    "MSELoss",
    "SoftmaxCrossEntropyLossGrad",
    "SoftmaxCrossEntropyParts",
    "SoftmaxCrossEntropyPartsGrad",
    "NllLossParts",
    "NllLossPartsGrad",
    "MSELossGrad",
    "ConvGrad",
    "MaxPoolGrad",
    "AveragePoolGrad",
    "SGD",
    "Adam",
)


# -- 1. every strategy is sound ---------------------------------------------------------------
def _as_f64(spec: In) -> In:
    """The spec with float tensors in f64 (so rounding cannot pass for a sharding error) and a
    Scalar as a 0-d tensor (a parameter of a sharded program is a DTensor)."""
    t = spec.type
    if isinstance(t, ScalarType):
        t = TensorType(t.dtype, (), D0)
    assert isinstance(t, TensorType)
    if t.dtype.is_float:
        t = TensorType(f64, t.shape, D0)
    return In(t, spec.value, spec.lo, spec.hi)


def _attrs_f64(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes with float dtypes in f64 (an accumulation dtype, ``acc=f32``, would round)."""
    return {k: f64 if isinstance(v, DType) and v.is_float else v for k, v in attrs.items()}


def _value(spec: In, rng: np.random.Generator) -> np.ndarray:
    t = spec.type
    assert isinstance(t, TensorType)
    npdt = t.dtype.to_numpy()
    if spec.fixed:
        return np.asarray(spec.value, dtype=npdt).reshape(t.shape)
    if t.dtype.is_int:
        lo = int(spec.lo) if spec.lo is not None else 0
        hi = int(spec.hi) if spec.hi is not None else 3
        return rng.integers(lo, hi, size=t.shape).astype(npdt)
    if spec.lo is not None and spec.hi is not None:
        return rng.uniform(spec.lo, spec.hi, size=t.shape).astype(npdt)
    return rng.standard_normal(t.shape).astype(npdt)


def _one_op(op: str, types: Sequence[Type], attrs: Mapping[str, Any], outs: Sequence[Type] | None) -> Module:
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    params = [fb.param(f"a{i}", t) for i, t in enumerate(types)]
    n_out = len(outs) if outs is not None else REGISTRY.out_arity(op, len(types), Attrs(attrs))
    ys = fb.op(op, *params, names=[f"y{i}" for i in range(n_out)], types=outs, **attrs)
    return Module((fb.ret(*ys),))


def check_rule(op: str, case: Case, n: int, seed: int) -> list[Strategy]:
    """Run ``op`` on ``case`` under each strategy of its rule on a mesh of ``n`` devices and
    compare with the unsharded result; returns the strategies."""
    specs = [_as_f64(s) for s in case.specs()]
    attrs = _attrs_f64(case.attrs)
    rng = np.random.default_rng(seed)
    args = [_value(s, rng) for s in specs]
    seq = distir.check(_one_op(op, [s.type for s in specs], attrs, None))
    (node,) = seq.entry.ops()
    ins, outs = [v.type for v in node.inputs], [v.type for v in node.outputs]
    want = run_reference(seq, args)
    strategies = REGISTRY[op].strategies(ins, outs, node.attrs, n)  # type: ignore[arg-type]
    assert strategies[0] == Strategy(tuple(R for _ in ins), tuple(R for _ in outs))
    # the input layout picks the strategy when types are inferred: one strategy per layout
    assert len({s.ins for s in strategies}) == len(strategies), strategies
    mesh = mesh_of((n,))
    devs = mesh.devices
    for s in strategies:
        where = f"{op}{attrs} {[t.shape for t in ins]}: strategy {s} on {n} devices"  # type: ignore[union-attr]
        assert len(s.ins) == len(ins) and len(s.outs) == len(outs), where
        tin = [DTensorType(t.dtype, t.shape, mesh, (p,)) for t, p in zip(ins, s.ins, strict=True)]  # type: ignore[union-attr]
        tout = [DTensorType(t.dtype, t.shape, mesh, (p,)) for t, p in zip(outs, s.outs, strict=True)]  # type: ignore[union-attr]
        mat = distir.check(materialize(distir.check(_one_op(op, tin, attrs, tout))))
        pieces = [partial_pieces(a, t, rng) for a, t in zip(args, tin, strict=True)]
        got = run_reference(mat, [p[d] for p in pieces for d in devs])
        for k, (w, t) in enumerate(zip(want, tout, strict=True)):
            # (in f64: gathering marks missing elements NaN; integers here are exact in f64)
            back = reduce_pieces({d: np.asarray(got[k * n + i], np.float64) for i, d in enumerate(devs)}, t)
            scale = max(float(np.max(np.abs(w), initial=0.0)), 1.0)
            assert back.shape == np.shape(w), where
            np.testing.assert_allclose(back, w, rtol=0, atol=1e-9 * scale, err_msg=where)
    return strategies


# realistic cases beside the op examples: batches that split unevenly, channels and classes
def _pool(n: int, c: int, size: int, kernel: int, stride: int) -> Case:
    out = (size - kernel) // stride + 1
    attrs = {"kernel_shape": (kernel, kernel), "strides": (stride, stride)}
    return Case([T(f64, n, c, out, out), T(f64, n, c, size, size)], attrs)


EXTRA: dict[str, list[Case]] = {
    "ReluGrad": [Case([T(f64, 5, 7), T(f64, 5, 7)])],
    "GeluGrad": [Case([T(f64, 3, 5, 4), T(f64, 3, 5, 4)])],
    "SoftmaxGrad": [Case([T(f64, 2, 5, 6), T(f64, 2, 5, 6)], {"axis": 1})],
    "LayerNormalizationGrad": [Case([T(f64, 5, 3, 8), T(f64, 5, 3, 8), T(f64, 8)], {"axis": 2})],
    "RMSNormalizationGrad": [Case([T(f64, 3, 5, 8), T(f64, 3, 5, 8), T(f64, 8)])],
    "SoftmaxCrossEntropyLoss": [
        Case([T(f64, 6, 10), In(T(i64, 6), lo=0, hi=10)], {"reduction": r}) for r in ("sum", "none", "mean")
    ]
    + [Case([T(f64, 5, 4, 3), In(T(i64, 5, 3), lo=0, hi=4)], {"reduction": "sum"})],
    "MSELoss": [Case([T(f64, 5, 3), T(f64, 5, 3)], {"reduction": r}) for r in ("sum", "none", "mean")],
    "SoftmaxCrossEntropyLossGrad": [
        Case([T(f64), T(f64, 7, 10), In(T(i64, 7), lo=0, hi=10)], {"reduction": "sum"}),
        Case([T(f64, 5, 3), T(f64, 5, 4, 3), In(T(i64, 5, 3), lo=0, hi=4)], {"reduction": "none"}),
    ],
    "MSELossGrad": [
        Case([T(f64), T(f64, 5, 3), T(f64, 5, 3)], {"reduction": "sum"}),
        Case([T(f64, 5, 3), T(f64, 5, 3), T(f64, 5, 3)], {"reduction": "none"}),
    ],
    "ConvGrad": [
        Case([T(f64, 5, 6, 3, 3), T(f64, 5, 4, 5, 5), T(f64, 6, 4, 3, 3)]),
        Case([T(f64, 3, 6, 3, 3), T(f64, 3, 4, 5, 5), T(f64, 6, 2, 3, 3)], {"group": 2}),
    ],
    "MaxPoolGrad": [_pool(5, 3, 6, 2, 2)],
    "AveragePoolGrad": [_pool(3, 5, 7, 3, 2)],
    "SGD": [Case([T(f64, 5, 7), T(f64, 5, 7)], {"lr": 0.1})],
    "Adam": [Case([T(f64, 5, 3), T(f64, 5, 3), T(f64, 5, 3), In(T(f64, 5, 3), lo=0, hi=1), K(T(i64), 2)])],
}


@pytest.mark.parametrize(
    ("op", "k"),
    [(op, k) for op in TRAINING_OPS for k in range(len(EXAMPLES[op]) + len(EXTRA.get(op, [])))],
)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_strategy_of_the_training_rules_is_sound_on_examples(op: str, k: int, n: int) -> None:
    case = [*EXAMPLES[op], *EXTRA.get(op, [])][k]
    for seed in range(2):
        check_rule(op, case, n, seed)


def _conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


@st.composite
def training_cases(draw: st.DrawFn) -> tuple[str, Case]:
    """One of the training ops on random sizes 1-9 (shards uneven or empty) and attributes."""
    dim = st.integers(1, 9)
    op = draw(st.sampled_from(TRAINING_OPS))
    shape = tuple(draw(st.lists(dim, min_size=1, max_size=3)))
    rank = len(shape)
    how = draw(st.sampled_from(["mean", "sum", "none"]))
    if op in ("ReluGrad", "GeluGrad", "TanhGrad", "SigmoidGrad", "SGD"):
        return op, Case([T(f64, *shape), T(f64, *shape)])
    if op == "Adam":
        return op, Case([T(f64, *shape)] * 3 + [In(T(f64, *shape), lo=0, hi=1), K(T(i64), draw(dim))])
    if op == "SoftmaxGrad":
        return op, Case([T(f64, *shape), T(f64, *shape)], {"axis": draw(st.integers(-rank, rank - 1))})
    if op in ("LayerNormalizationGrad", "RMSNormalizationGrad"):
        axis = draw(st.integers(0, rank - 1))
        tail = shape[axis:]
        keep = draw(st.integers(1, len(tail)))
        scale = tuple(1 if draw(st.integers(0, 3)) == 0 else s for s in tail[len(tail) - keep :])
        return op, Case([T(f64, *shape), T(f64, *shape), T(f64, *scale)], {"axis": axis})
    if op in ("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad"):
        n, c = draw(dim), draw(dim)
        rest = tuple(draw(st.lists(dim, max_size=1)))
        scores, labels = T(f64, n, c, *rest), In(T(i64, n, *rest), lo=0, hi=c)
        if op == "SoftmaxCrossEntropyLoss":
            return op, Case([scores, labels], {"reduction": how})
        dloss = T(f64, n, *rest) if how == "none" else T(f64)
        return op, Case([dloss, scores, labels], {"reduction": how})
    if op in ("SoftmaxCrossEntropyParts", "SoftmaxCrossEntropyPartsGrad"):
        n, c = draw(dim), draw(dim)
        parts = [T(f64, n, c), T(f64, n), In(T(i64, n), lo=0, hi=c)]
        return op, Case(parts if op == "SoftmaxCrossEntropyParts" else [T(f64, n), T(f64, n), *parts])
    if op in ("NllLossParts", "NllLossPartsGrad"):
        n, c = draw(dim), draw(dim)
        parts = [T(f64, n, c), In(T(i64, n), lo=0, hi=c)]
        return op, Case(parts if op == "NllLossParts" else [T(f64, n), *parts])
    if op == "MSELoss":
        return op, Case([T(f64, *shape), T(f64, *shape)], {"reduction": how})
    if op == "MSELossGrad":
        dloss = T(f64, *shape) if how == "none" else T(f64)
        return op, Case([dloss, T(f64, *shape), T(f64, *shape)], {"reduction": how})
    n, group = draw(st.integers(1, 5)), draw(st.sampled_from([1, 1, 2]))
    c, spatial = group * draw(st.integers(1, 3)), draw(st.integers(1, 2))
    sizes = [draw(st.integers(3, 7)) for _ in range(spatial)]
    kernel, stride = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    window = {"kernel_shape": (kernel,) * spatial, "strides": (stride,) * spatial}
    if op == "ConvGrad":
        m, pad = group * draw(st.integers(1, 3)), draw(st.integers(0, 1))
        out = [_conv_out(s, kernel, stride, pad) for s in sizes]
        attrs = {**window, "pads": (pad,) * (2 * spatial), "group": group}
        dy, x, w = T(f64, n, m, *out), T(f64, n, c, *sizes), T(f64, m, c // group, *(kernel,) * spatial)
        return op, Case([dy, x, w], attrs)
    out = [_conv_out(s, kernel, stride, 0) for s in sizes]
    return op, Case([T(f64, n, c, *out), T(f64, n, c, *sizes)], window)


@settings(max_examples=200, deadline=None)
@given(training_cases(), st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_every_strategy_of_the_training_rules_is_sound(case: tuple[str, Case], n: int, seed: int) -> None:
    op, c = case
    event(f"op {op}")
    strategies = check_rule(op, c, n, seed)
    event(f"{len(strategies)} strategies")


# -- 2. what the rules offer --------------------------------------------------------------------
def _offered(op: str, types: Sequence[TensorType], n: int = 2, **attrs: Any) -> set[str]:
    seq = distir.check(_one_op(op, types, attrs, None))
    (node,) = seq.entry.ops()
    ins, outs = [v.type for v in node.inputs], [v.type for v in node.outputs]
    return {str(s) for s in REGISTRY[op].strategies(ins, outs, node.attrs, n)}  # type: ignore[arg-type]


def test_pointwise_gradients_shard_any_dim_and_are_linear_in_dy() -> None:
    for op in ("ReluGrad", "GeluGrad", "TanhGrad", "SigmoidGrad"):
        assert _offered(op, [T(f64, 4, 3), T(f64, 4, 3)]) == {
            "(R, R) -> (R)",
            "(S(0), S(0)) -> (S(0))",
            "(S(1), S(1)) -> (S(1))",
            "(P(sum), R) -> (P(sum))",
        }
    assert _offered("SoftmaxGrad", [T(f64, 4, 3), T(f64, 4, 3)], axis=-1) == {
        "(R, R) -> (R)",
        "(S(0), S(0)) -> (S(0))",
        "(P(sum), R) -> (P(sum))",
    }


def test_norm_gradients_shard_rows_and_sum_the_parameter_gradients() -> None:
    got = _offered("LayerNormalizationGrad", [T(f64, 4, 6, 8), T(f64, 4, 6, 8), T(f64, 8)])
    assert got == {
        "(R, R, R) -> (R, R, R)",
        "(S(0), S(0), R) -> (S(0), P(sum), P(sum))",
        "(S(1), S(1), R) -> (S(1), P(sum), P(sum))",
        "(P(sum), R, R) -> (P(sum), P(sum), P(sum))",
    }
    got = _offered("RMSNormalizationGrad", [T(f64, 4, 6, 8), T(f64, 4, 6, 8), T(f64, 6, 1)], axis=1)
    assert got == {
        "(R, R, R) -> (R, R)",
        "(S(0), S(0), R) -> (S(0), P(sum))",
        "(P(sum), R, R) -> (P(sum), P(sum))",
    }


def test_losses_shard_items_and_reduce_them_pending() -> None:
    ce = [T(f64, 4, 10, 3), T(i64, 4, 3)]
    assert _offered("SoftmaxCrossEntropyLoss", ce, reduction="sum") == {
        "(R, R) -> (R)",
        "(S(0), S(0)) -> (P(sum))",
        "(S(2), S(1)) -> (P(sum))",  # the class dim (1) is never sharded
    }
    assert _offered("SoftmaxCrossEntropyLoss", ce, reduction="none") == {
        "(R, R) -> (R)",
        "(S(0), S(0)) -> (S(0))",
        "(S(2), S(1)) -> (S(1))",
    }
    # a mean is a pending mean of local means only over even shards: 4 rows on 2 devices, 3
    # positions on 2 devices not
    assert _offered("SoftmaxCrossEntropyLoss", ce, reduction="mean") == {
        "(R, R) -> (R)",
        "(S(0), S(0)) -> (P(mean))",
    }
    assert _offered("MSELoss", [T(f64, 5, 4), T(f64, 5, 4)], n=2, reduction="mean") == {
        "(R, R) -> (R)",
        "(S(1), S(1)) -> (P(mean))",
    }
    assert _offered("MSELoss", [T(f64, 5, 4), T(f64, 5, 4)], reduction="sum") == {
        "(R, R) -> (R)",
        "(S(0), S(0)) -> (P(sum))",
        "(S(1), S(1)) -> (P(sum))",
    }


def test_loss_gradients_shard_items_except_for_a_mean() -> None:
    ce = [T(f64, 4, 10), T(i64, 4)]
    assert _offered("SoftmaxCrossEntropyLossGrad", [T(f64), *ce], reduction="sum") == {
        "(R, R, R) -> (R)",
        "(R, S(0), S(0)) -> (S(0))",
        "(P(sum), R, R) -> (P(sum))",
    }
    assert _offered("SoftmaxCrossEntropyLossGrad", [T(f64, 4), *ce], reduction="none") == {
        "(R, R, R) -> (R)",
        "(S(0), S(0), S(0)) -> (S(0))",
        "(P(sum), R, R) -> (P(sum))",
    }
    # the mean's gradient divides by the global item count, which a shard does not know
    assert _offered("SoftmaxCrossEntropyLossGrad", [T(f64), *ce], reduction="mean") == {
        "(R, R, R) -> (R)",
        "(P(sum), R, R) -> (P(sum))",
    }
    assert _offered("MSELossGrad", [T(f64), T(f64, 4, 2), T(f64, 4, 2)], reduction="mean") == {
        "(R, R, R) -> (R)",
        "(P(sum), R, R) -> (P(sum))",
    }


def test_conv_and_pool_gradients_shard_batch_and_channels_never_space() -> None:
    conv = [T(f64, 4, 6, 3, 3), T(f64, 4, 5, 5, 5), T(f64, 6, 5, 3, 3)]
    assert _offered("ConvGrad", conv) == {
        "(R, R, R) -> (R, R, R)",
        "(S(0), S(0), R) -> (S(0), P(sum), P(sum))",
        "(S(1), R, S(0)) -> (P(sum), S(0), S(0))",  # output channels
        "(R, S(1), S(1)) -> (S(1), S(1), R)",  # input channels
        "(P(sum), R, R) -> (P(sum), P(sum), P(sum))",
    }
    grouped = [T(f64, 4, 6, 3, 3), T(f64, 4, 4, 5, 5), T(f64, 6, 2, 3, 3)]
    assert _offered("ConvGrad", grouped, group=2) == {
        "(R, R, R) -> (R, R, R)",
        "(S(0), S(0), R) -> (S(0), P(sum), P(sum))",
        "(P(sum), R, R) -> (P(sum), P(sum), P(sum))",
    }
    for op in ("MaxPoolGrad", "AveragePoolGrad"):
        got = _offered(op, [T(f64, 4, 3, 3, 3), T(f64, 4, 3, 6, 6)], kernel_shape=(2, 2), strides=(2, 2))
        assert got == {
            "(R, R) -> (R)",
            "(S(0), S(0)) -> (S(0))",
            "(S(1), S(1)) -> (S(1))",
            "(P(sum), R) -> (P(sum))",
        }


def test_optimizers_take_every_data_parallel_and_zero_layout() -> None:
    w = T(f64, 6, 4)
    assert _offered("SGD", [w, w]) == {"(R, R) -> (R)", "(S(0), S(0)) -> (S(0))", "(S(1), S(1)) -> (S(1))"}
    adam = _offered("Adam", [w, w, w, w, T(i64)])
    assert "(R, R, R, R, R) -> (R, R, R)" in adam
    for d in (0, 1):  # weight, gradient and both moments sharded alike, the step replicated
        assert f"(S({d}), S({d}), S({d}), S({d}), R) -> (S({d}), S({d}), S({d}))" in adam


def test_vocab_parallel_rules_leave_pending_reductions_of_rows_only() -> None:
    """Megatron's vocabulary-parallel layers: a table sharded on its rows gives a pending sum of
    lookups; scores sharded on the classes give pending per-row max and sums, and the gradient
    stays sharded on the classes from whole per-row cotangents."""
    n, c = 6, 8
    scores, shift, labels = T(f64, n, c), T(f64, n), T(i64, n)
    assert "(S(0), R) -> (P(sum))" in _offered("Gather", [T(f64, c, 3), T(i64, 2, n)])
    assert "(S(1)) -> (P(max))" in _offered("ReduceMax", [scores], axes=(1,), keepdims=0)
    assert "(S(1), R, R) -> (P(sum), P(sum))" in _offered("SoftmaxCrossEntropyParts", [scores, shift, labels])
    grad = [T(f64, n), T(f64, n), scores, shift, labels]
    assert "(R, R, S(1), R, R) -> (S(1))" in _offered("SoftmaxCrossEntropyPartsGrad", grad)
    # torch's loss_parallel: the picked log-probability a pending sum, its gradient sharded
    assert "(S(1), R) -> (P(sum))" in _offered("NllLossParts", [scores, labels])
    assert "(R, S(1), R) -> (S(1), S(1), S(1))" in _offered("NllLossPartsGrad", [T(f64, n), scores, labels])
