"""NegativeLogLikelihoodLoss and its gradient with the classes on another dim than ONNX's (the
``axis`` attribute; ``distir.ops.loss``): on (batch, sequence, classes) scores with ``axis=-1``
they equal the ONNX layout on the (batch·sequence, classes) flattening (numpy oracle: the
flattened rows, picked by hand), and the sharding rule offers the item dims — batch and
sequence, never the classes — each sound on the reference executor."""

from __future__ import annotations

import numpy as np
import pytest

from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops import REGISTRY, OpTypeError
from ops.test_new_ops_sharding import Case, check

B, S, V = 3, 4, 5
D0 = Device(0)


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, S, V)), rng.integers(0, V, size=(B, S))


def _nll(x: np.ndarray, labels: np.ndarray, **attrs: object) -> np.ndarray:
    ref = REGISTRY["NegativeLogLikelihoodLoss"].reference
    assert ref is not None
    return np.asarray(ref([x, labels], Attrs(attrs))[0])


def _nll_grad(d: np.ndarray, x: np.ndarray, labels: np.ndarray, **attrs: object) -> np.ndarray:
    ref = REGISTRY["NegativeLogLikelihoodLossGrad"].reference
    assert ref is not None
    return np.asarray(ref([d, x, labels], Attrs(attrs))[0])


@pytest.mark.parametrize("how", ["mean", "sum", "none"])
def test_classes_last_equals_the_flattened_onnx_layout(how: str) -> None:
    x, labels = _inputs()
    flat_x, flat_l = x.reshape(-1, V), labels.reshape(-1)
    by_hand = -flat_x[np.arange(B * S), flat_l]  # the oracle: each row's picked value, negated
    want = {"mean": by_hand.mean(), "sum": by_hand.sum(), "none": by_hand.reshape(B, S)}[how]
    got = _nll(x, labels, axis=-1, reduction=how)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(np.reshape(_nll(flat_x, flat_l, reduction=how), np.shape(want)), want)
    assert np.array_equal(_nll(x, labels, axis=2, reduction=how), got)


@pytest.mark.parametrize("how", ["mean", "sum", "none"])
def test_classes_last_gradient_equals_the_flattened_onnx_layout(how: str) -> None:
    x, labels = _inputs(1)
    rng = np.random.default_rng(2)
    d = rng.standard_normal((B, S)) if how == "none" else np.asarray(rng.standard_normal())
    flat = _nll_grad(
        d.reshape(-1) if how == "none" else d, x.reshape(-1, V), labels.reshape(-1), reduction=how
    )
    got = _nll_grad(d, x, labels, axis=-1, reduction=how)
    np.testing.assert_allclose(got, flat.reshape(B, S, V), rtol=1e-12)
    # the oracle: −dLoss (over the item count for a mean) at each label, zeros elsewhere
    scale = {"mean": -d / (B * S), "sum": -d * np.ones((B, S)), "none": -d}[how]
    want = np.zeros((B, S, V))
    want[np.arange(B)[:, None], np.arange(S)[None, :], labels] = scale
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_the_labels_are_the_scores_shape_without_the_classes_axis() -> None:
    op = REGISTRY["NegativeLogLikelihoodLoss"]
    scores, labels = TensorType(DType.f32, (B, S, V), D0), TensorType(DType.i64, (B, S), D0)
    (out,) = op.infer_types([scores, labels], Attrs({"axis": -1, "reduction": "none"}), [None, None])
    assert isinstance(out, TensorType) and out.shape == (B, S)
    with pytest.raises(OpTypeError, match="labels of shape"):
        op.infer_types([scores, labels], Attrs({}), [None, None])  # ONNX's layout wants (B, V)


def _strategies(op: str, ins: list[TensorType], attrs: dict[str, object]) -> set[str]:
    d = REGISTRY[op]
    outs = d.infer_types(ins, Attrs(attrs), [None] * len(ins))
    return {str(s) for s in d.strategies(ins, outs, Attrs(attrs), 2)}


def test_sharding_classes_last_offers_batch_and_sequence_never_the_classes() -> None:
    scores, labels = TensorType(DType.f64, (4, 6, 8), D0), TensorType(DType.i64, (4, 6), D0)
    fwd = _strategies("NegativeLogLikelihoodLoss", [scores, labels], {"axis": -1, "reduction": "sum"})
    assert {"(S(0), S(0)) -> (P(sum))", "(S(1), S(1)) -> (P(sum))"} <= fwd
    assert not any("S(2)" in s for s in fwd)
    dloss = TensorType(DType.f64, (), D0)
    bwd = _strategies(
        "NegativeLogLikelihoodLossGrad", [dloss, scores, labels], {"axis": -1, "reduction": "sum"}
    )
    assert {"(R, S(0), S(0)) -> (S(0))", "(R, S(1), S(1)) -> (S(1))"} <= bwd
    assert not any("S(2)" in s for s in bwd)
    # ONNX's layout: the classes on dim 1, items on dims 0 and 2
    onnx = _strategies(
        "NegativeLogLikelihoodLoss", [scores, TensorType(DType.i64, (4, 8), D0)], {"reduction": "none"}
    )
    assert {"(S(0), S(0)) -> (S(0))", "(S(2), S(1)) -> (S(1))"} <= onnx


@pytest.mark.parametrize("how", ["mean", "sum", "none"])
@pytest.mark.parametrize("n", [2, 3])
def test_every_classes_last_strategy_is_sound(how: str, n: int) -> None:
    """Each strategy the rules offer, run piecewise on the reference executor, gives the
    sequential result (``ops.test_new_ops_sharding.check``)."""
    x, labels = _inputs(3)
    rng = np.random.default_rng(4)
    assert check(Case("NegativeLogLikelihoodLoss", (x, labels), {"axis": -1, "reduction": how}), n, 5) > 1
    d = rng.standard_normal((B, S)) if how == "none" else np.asarray(rng.standard_normal())
    grad = Case("NegativeLogLikelihoodLossGrad", (d, x, labels), {"axis": -1, "reduction": how})
    assert check(grad, n, 6) > 1
