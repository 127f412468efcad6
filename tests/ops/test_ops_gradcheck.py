"""Every gradient op matches the derivative of its forward op's reference, by central finite
differences in float64.

For a forward op ``y = f(p)`` and a random cotangent ``dY``, the gradient op's output for a primal
``p`` must equal ∂/∂p Σ dY·f(p), which we estimate one element at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from distir.ir.values import Attrs
from distir.ops import REGISTRY

Arrays = dict[str, np.ndarray]


def run(name: str, args: list[Any], attrs: dict[str, Any]) -> tuple[Any, ...]:
    d = REGISTRY[name]
    assert d.reference is not None
    return tuple(d.reference(args, Attrs(attrs)))


@dataclass
class GradCase:
    grad_op: str
    forward: str
    primals: Callable[[np.random.Generator], Arrays]
    fwd_args: Callable[[Arrays], list[Any]]
    grad_args: Callable[[Arrays, np.ndarray, np.ndarray], list[Any]]  # (primals, dY, y)
    wrt: list[tuple[str, int]]  # (primal, output index of the grad op)
    attrs: dict[str, Any] = field(default_factory=dict)
    fwd_attrs: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return f"{self.grad_op}-{self.attrs}"


def normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def away_from_zero(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Normals pushed at least 0.1 away from 0 (Relu's kink)."""

    def f(rng: np.random.Generator) -> np.ndarray:
        x = rng.standard_normal(shape)
        return np.where(x >= 0, x + 0.1, x - 0.1)

    return f


def primals(**makers: Callable[[np.random.Generator], np.ndarray]) -> Callable[[np.random.Generator], Arrays]:
    return lambda rng: {k: m(rng) for k, m in makers.items()}


def unary(grad_op: str, fwd: str, uses_output: bool, make: Any = None) -> GradCase:
    return GradCase(
        grad_op,
        fwd,
        primals(x=make or normal(3, 4)),
        lambda p: [p["x"]],
        (lambda p, dy, y: [dy, y]) if uses_output else (lambda p, dy, y: [dy, p["x"]]),
        [("x", 0)],
    )


def labels(shape: tuple[int, ...], c: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(0, c, size=shape)


def sce_parts(rows: tuple[int, int] | None) -> GradCase:
    """SoftmaxCrossEntropyParts on a piece of the classes (``rows``) or all of them."""
    total = 9 if rows is None else rows[1]
    return GradCase(
        "SoftmaxCrossEntropyPartsGrad",
        "SoftmaxCrossEntropyParts",
        primals(s=normal(5, 4 if rows else 9), m=normal(5), l=labels((5,), total)),
        lambda p: [p["s"], p["m"], p["l"]],
        lambda p, dy, y: [dy[0], dy[1], p["s"], p["m"], p["l"]],
        [("s", 0)],
        {} if rows is None else {"rows": rows},
    )


def nll_parts(rows: tuple[int, int] | None) -> GradCase:
    """NllLossParts on a piece of the classes (``rows``) or all of them: its gradient
    (NllLossPartsGrad's dInput) is the derivative of its definition on any input, not only on
    log-probabilities."""
    total = 9 if rows is None else rows[1]
    return GradCase(
        "NllLossPartsGrad",
        "NllLossParts",
        primals(z=normal(5, 4 if rows else 9), l=labels((5,), total)),
        lambda p: [p["z"], p["l"]],
        lambda p, dy, y: [dy, p["z"], p["l"]],
        [("z", 0)],
        {} if rows is None else {"rows": rows},
    )


def sce(reduction: str, scores: tuple[int, ...], lab: tuple[int, ...]) -> GradCase:
    return GradCase(
        "SoftmaxCrossEntropyLossGrad",
        "SoftmaxCrossEntropyLoss",
        primals(s=normal(*scores), l=labels(lab, scores[1])),
        lambda p: [p["s"], p["l"]],
        lambda p, dy, y: [dy, p["s"], p["l"]],
        [("s", 0)],
        {"reduction": reduction},
    )


def mse(reduction: str, shape: tuple[int, ...]) -> GradCase:
    return GradCase(
        "MSELossGrad",
        "MSELoss",
        primals(p=normal(*shape), t=normal(*shape)),
        lambda p: [p["p"], p["t"]],
        lambda p, dy, y: [dy, p["p"], p["t"]],
        [("p", 0)],
        {"reduction": reduction},
    )


def layer_norm(x: tuple[int, ...], scale: tuple[int, ...], **attrs: Any) -> GradCase:
    return GradCase(
        "LayerNormalizationGrad",
        "LayerNormalization",
        primals(x=normal(*x), s=normal(*scale), b=normal(*scale)),
        lambda p: [p["x"], p["s"], p["b"]],
        lambda p, dy, y: [dy, p["x"], p["s"]],
        [("x", 0), ("s", 1), ("b", 2)],
        attrs,
    )


def rms_norm(x: tuple[int, ...], scale: tuple[int, ...], **attrs: Any) -> GradCase:
    return GradCase(
        "RMSNormalizationGrad",
        "RMSNormalization",
        primals(x=normal(*x), s=normal(*scale)),
        lambda p: [p["x"], p["s"]],
        lambda p, dy, y: [dy, p["x"], p["s"]],
        [("x", 0), ("s", 1)],
        attrs,
    )


def nll(reduction: str, scores: tuple[int, ...], lab: tuple[int, ...], axis: int = 1) -> GradCase:
    return GradCase(
        "NegativeLogLikelihoodLossGrad",
        "NegativeLogLikelihoodLoss",
        primals(s=normal(*scores), l=labels(lab, scores[axis])),
        lambda p: [p["s"], p["l"]],
        lambda p, dy, y: [dy, p["s"], p["l"]],
        [("s", 0)],
        {"reduction": reduction} if axis == 1 else {"reduction": reduction, "axis": axis},
    )


def log_softmax(shape: tuple[int, ...], axis: int) -> GradCase:
    return GradCase(
        "LogSoftmaxGrad",
        "LogSoftmax",
        primals(x=normal(*shape)),
        lambda p: [p["x"]],
        lambda p, dy, y: [dy, y],
        [("x", 0)],
        {"axis": axis},
    )


def softmax(shape: tuple[int, ...], axis: int) -> GradCase:
    return GradCase(
        "SoftmaxGrad",
        "Softmax",
        primals(x=normal(*shape)),
        lambda p: [p["x"]],
        lambda p, dy, y: [dy, y],
        [("x", 0)],
        {"axis": axis},
    )


def conv(x: tuple[int, ...], w: tuple[int, ...], **attrs: Any) -> GradCase:
    return GradCase(
        "ConvGrad",
        "Conv",
        primals(x=normal(*x), w=normal(*w), b=normal(w[0])),
        lambda p: [p["x"], p["w"], p["b"]],
        lambda p, dy, y: [dy, p["x"], p["w"]],
        [("x", 0), ("w", 1), ("b", 2)],
        attrs,
    )


def pool(op: str, x: tuple[int, ...], **attrs: Any) -> GradCase:
    """Normals: distinct values, so the max of every window is strict (MaxPool is smooth there)."""
    return GradCase(
        f"{op}Grad",
        op,
        primals(x=normal(*x)),
        lambda p: [p["x"]],
        lambda p, dy, y: [dy, p["x"]],
        [("x", 0)],
        attrs,
    )


GRAD_CASES = [
    unary("ReluGrad", "Relu", False, away_from_zero(3, 4)),
    unary("GeluGrad", "Gelu", False, lambda rng: rng.standard_normal((3, 4)) * 3),
    unary("GeluTanhGrad", "GeluTanh", False, lambda rng: rng.standard_normal((3, 4)) * 3),
    unary("TanhGrad", "Tanh", True),
    unary("SigmoidGrad", "Sigmoid", True),
    unary("SiluGrad", "Silu", False, lambda rng: rng.standard_normal((3, 4)) * 3),
    unary("SquaredReluGrad", "SquaredRelu", False, away_from_zero(3, 4)),
    softmax((3, 4), -1),
    softmax((3, 4, 2), 1),
    log_softmax((3, 4), -1),
    log_softmax((3, 4, 2), 1),
    layer_norm((2, 5), (5,)),
    layer_norm((2, 3, 4), (3, 4), axis=1, epsilon=1e-3),
    layer_norm((2, 3, 4), (1, 4), axis=-2),
    layer_norm((2, 5), (5,), zero_centered_gamma=True),  # LayerNorm1p: Scale applied as 1 + Scale
    rms_norm((2, 5), (5,)),
    rms_norm((2, 3, 4), (3, 1), axis=1, epsilon=1e-2),
    sce_parts(None),
    sce_parts((3, 9)),  # rows 3..6 of 9 classes: labels elsewhere pick nothing here
    nll_parts(None),
    nll_parts((3, 9)),
    sce("mean", (4, 3), (4,)),
    sce("sum", (4, 3), (4,)),
    sce("none", (2, 3, 4), (2, 4)),
    sce("mean", (2, 5, 3), (2, 3)),
    nll("mean", (4, 3), (4,)),
    nll("sum", (4, 3), (4,)),
    nll("none", (2, 3, 4), (2, 4)),
    nll("mean", (2, 3, 4), (2, 3), axis=-1),  # classes last: (batch, sequence) rows
    nll("none", (2, 3, 4), (2, 3), axis=-1),
    mse("mean", (3, 4)),
    mse("sum", (5,)),
    mse("none", (2, 3)),
    conv((2, 4, 5, 5), (6, 2, 3, 3), group=2, strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2)),
    conv((1, 3, 8), (2, 3, 3), strides=(3,), pads=(2, 1), dilations=(2,)),
    conv((1, 2, 3, 4, 3), (2, 1, 2, 2, 2), group=2, pads=(1, 0, 0, 0, 1, 1)),
    pool("MaxPool", (2, 2, 5, 5), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 0), ceil_mode=1),
    pool("MaxPool", (1, 2, 9), kernel_shape=(2,), pads=(1, 2), dilations=(3,)),
    pool("AveragePool", (2, 2, 5, 5), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1),
    pool("AveragePool", (1, 2, 7), kernel_shape=(3,), strides=(2,), pads=(1, 2), count_include_pad=1),
    pool(
        "AveragePool",
        (1, 2, 7),
        kernel_shape=(3,),
        strides=(2,),
        pads=(1, 2),
        ceil_mode=1,
        count_include_pad=1,
    ),
    GradCase(
        "GatherGrad",
        "Gather",
        primals(x=normal(5, 3), i=lambda rng: np.array([[0, 4], [-1, 2]])),
        lambda p: [p["x"], p["i"]],
        lambda p, dy, y: [dy, p["i"]],
        [("x", 0)],
        {"axis": 0, "size": 5},
        fwd_attrs={"axis": 0},
    ),
    GradCase(
        "SliceGrad",
        "Slice",
        primals(x=normal(5, 6)),
        lambda p: [p["x"]],
        lambda p, dy, y: [dy],
        [("x", 0)],
        {"shape": (5, -1), "starts": (4,), "ends": (0,), "axes": (0,), "steps": (-2,)},
        fwd_attrs={"starts": (4,), "ends": (0,), "axes": (0,), "steps": (-2,)},
    ),
]


def numeric_grad(f: Callable[[np.ndarray], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        orig = x[i]
        x[i] = orig + h
        up = f(x)
        x[i] = orig - h
        down = f(x)
        x[i] = orig
        g[i] = (up - down) / (2 * h)
    return g


def test_every_grad_op_has_a_gradient_check() -> None:
    grad_ops = {d.name for d in REGISTRY if d.family == "grad"}
    checked = {c.grad_op for c in GRAD_CASES}
    assert grad_ops - checked == set(), f"add GRAD_CASES for {sorted(grad_ops - checked)}"
    assert checked <= grad_ops


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_grad_op_matches_finite_differences(case: GradCase) -> None:
    rng = np.random.default_rng(0)
    p = case.primals(rng)
    fwd_attrs = case.attrs if case.fwd_attrs is None else case.fwd_attrs
    ys = run(case.forward, case.fwd_args(p), fwd_attrs)
    dys = [rng.standard_normal(np.shape(y)) for y in ys]
    # a forward of one result gets its dY and Y; of several, the lists of them
    dy, y = (dys[0], np.asarray(ys[0])) if len(ys) == 1 else (dys, ys)
    grads = run(case.grad_op, case.grad_args(p, dy, y), case.attrs)
    for name, k in case.wrt:

        def objective(v: np.ndarray, name: str = name) -> float:
            outs = run(case.forward, case.fwd_args({**p, name: v}), fwd_attrs)
            return float(sum(np.sum(d * o) for d, o in zip(dys, outs, strict=True)))

        want = numeric_grad(objective, p[name].copy())
        got = np.asarray(grads[k])
        assert got.shape == p[name].shape, (name, got.shape)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=f"d/d{name}")


def test_the_check_catches_a_wrong_gradient() -> None:
    """The finite-difference check is sharp enough to reject a subtly wrong derivative."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(6) * 2
    dy = rng.standard_normal(6)

    def objective(v: np.ndarray) -> float:
        return float(np.sum(dy * run("Gelu", [v], {})[0]))

    want = numeric_grad(objective, x.copy())
    tanh_approx = 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    wrong = dy * tanh_approx  # drops the x·φ(x) term
    assert not np.allclose(wrong, want, rtol=1e-6, atol=1e-8)
    (right,) = run("GeluGrad", [dy, x], {})
    np.testing.assert_allclose(right, want, rtol=1e-6, atol=1e-8)


def test_sce_grad_rows_sum_to_zero_and_mean_divides_by_label_count() -> None:
    rng = np.random.default_rng(2)
    s, lab = rng.standard_normal((4, 3, 2)), rng.integers(0, 3, size=(4, 2))
    (gm,) = run("SoftmaxCrossEntropyLossGrad", [np.array(1.0), s, lab], {})
    (gs,) = run("SoftmaxCrossEntropyLossGrad", [np.array(1.0), s, lab], {"reduction": "sum"})
    np.testing.assert_allclose(gm.sum(axis=1), 0, atol=1e-14)
    np.testing.assert_allclose(gm * 8, gs, rtol=1e-14)
