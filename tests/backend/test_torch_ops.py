"""Every LOCAL op with a numpy reference has a torch implementation equal to the reference on
every example of ``EXAMPLES`` (``tests/ops/ops_examples.py``), in the example's dtype and again
with its f32 inputs in bf16 (torch computing in bf16, the reference in f32 on the bf16-rounded
inputs).

Tolerances (relative and absolute, on results scaled by their largest magnitude, at least 1):
integers, bools and shapes exactly; f64 1e-9; f32 1e-5; f16 2e-3 (torch rounds some f16 steps
the reference takes in f64); bf16 3e-2 (8 significant bits, several roundings per op).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from distir.backend.context import TorchContext  # noqa: E402
from distir.backend.domain import to_numpy, to_torch  # noqa: E402
from distir.ir.types import DType, ScalarType, TensorType, TupleType, Type  # noqa: E402
from distir.ir.values import Attrs  # noqa: E402
from distir.ops import REGISTRY, OpDef, OpKind  # noqa: E402
from distir.ops.attention import AttentionDropoutError  # noqa: E402
from distir.ops.elementwise import round_to_bf16  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_examples import EXAMPLES, Case, In, random_inputs  # noqa: E402

# float8 values are held in bf16 by torch (distir.ops.float8): the same grid, rounded to bf16
TOLERANCE = {
    DType.f64: 1e-9,
    DType.f32: 1e-5,
    DType.f16: 2e-3,
    DType.bf16: 3e-2,
    DType.f8e4m3: 3e-2,
    DType.f8e5m2: 3e-2,
}
# ops whose bf16 variant is not an op of the same meaning (a cast's target is its attribute;
# AdamRemainder's inputs are bf16, int16 and f32 by definition)
NO_BF16 = {"Cast", "AdamRemainder"}
# inputs that stay f32 when the others are bf16 (attention's log-sum-exp is f32 for bf16 inputs;
# clipping's sum of squares is f32 whatever the gradient's dtype)
KEEP_F32 = {"AttentionGrad": {5}, "AttentionMerge": {1, 3}, "ClipByNorm": {1}}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> None:
    torch.set_num_threads(1)


def _checked_ops() -> list[OpDef]:
    return [d for d in REGISTRY if d.kind is OpKind.LOCAL and d.reference is not None]


def test_every_local_op_with_a_reference_has_a_torch_implementation() -> None:
    missing = sorted(d.name for d in _checked_ops() if d.torch is None)
    assert not missing, f"give these ops a torch implementation (OpDef.torch): {missing}"


CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name, cases in sorted(EXAMPLES.items())
    for i in range(len(cases))
]


def _dtype_of(t: Type) -> DType | None:
    return t.dtype if isinstance(t, TensorType | ScalarType) else None


def _compare(got: Any, want: Any, t: Type, where: str) -> None:
    if isinstance(t, TupleType):
        for k, (g, w, e) in enumerate(zip(got, want, t.elements, strict=True)):
            _compare(g, w, e, f"{where}[{k}]")
        return
    g, w = to_numpy(got), np.asarray(want)
    assert g.shape == w.shape, f"{where}: torch shape {g.shape} != reference {w.shape}"
    dt = _dtype_of(t)
    assert dt is not None
    if not dt.is_float:
        assert g.dtype == w.dtype, f"{where}: torch dtype {g.dtype} != reference {w.dtype}"
        np.testing.assert_array_equal(g, w, err_msg=where)
        return
    tol = TOLERANCE[dt]
    finite = np.isfinite(w)
    scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
    np.testing.assert_array_equal(np.isfinite(g), finite, err_msg=f"{where}: non-finite entries differ")
    np.testing.assert_allclose(g[finite], w[finite], rtol=tol, atol=tol * scale, err_msg=where)


def _run(d: OpDef, case: Case, values: list[Any], types: list[Type]) -> tuple[Any, tuple[Any, ...]]:
    """The reference's results and the torch implementation's, on ``values`` of ``types``."""
    ctx = TorchContext.local()
    want = tuple(d.reference(values, case.attr_map()))  # type: ignore[misc]
    assert d.torch is not None, f"{d.name} has no torch implementation"
    ins = [to_torch(ctx, v, t) for v, t in zip(values, types, strict=True)]
    got = tuple(d.torch(ctx, ins, case.attr_map()))
    return want, got


def _out_types(d: OpDef, case: Case, types: list[Type], values: list[Any]) -> list[Type]:
    known = [np.asarray(v) if s.fixed else None for s, v in zip(case.specs(), values, strict=True)]
    return list(d.infer_types(types, case.attr_map(), known))


@pytest.mark.parametrize(("name", "index"), CASES)
def test_torch_implementation_equals_the_reference(name: str, index: int) -> None:
    d, case = REGISTRY[name], EXAMPLES[name][index]
    values = random_inputs(case, np.random.default_rng(index))
    types = case.types()
    want, got = _run(d, case, values, types)
    outs = _out_types(d, case, types, values)
    assert len(got) == len(want) == len(outs), f"{name}: {len(got)} results, reference {len(want)}"
    for k, (g, w, t) in enumerate(zip(got, want, outs, strict=True)):
        _compare(g, w, t, f"{name} result {k}")


def _bf16(t: Type) -> Type:
    if isinstance(t, TensorType) and t.dtype is DType.f32:
        return TensorType(DType.bf16, t.shape, t.device)
    if isinstance(t, ScalarType) and t.dtype is DType.f32:
        return ScalarType(DType.bf16, t.device)
    return t


BF16_CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name, cases in sorted(EXAMPLES.items())
    for i, c in enumerate(cases)
    if name not in NO_BF16 and any(_dtype_of(t) is DType.f32 for t in c.types())
]


@pytest.mark.parametrize(("name", "index"), BF16_CASES)
def test_torch_implementation_in_bf16_is_close_to_the_reference(name: str, index: int) -> None:
    """The example's f32 inputs as bf16: torch computes in bf16; the reference in f32 on the
    same (bf16-rounded) numbers, as the reference executor holds bf16."""
    d, case = REGISTRY[name], EXAMPLES[name][index]
    values = random_inputs(case, np.random.default_rng(index))
    keep = KEEP_F32.get(name, set())
    types = [t if i in keep else _bf16(t) for i, t in enumerate(case.types())]
    values = [
        round_to_bf16(v) if _dtype_of(t) is DType.bf16 else v for v, t in zip(values, types, strict=True)
    ]
    bcase = Case([In(t, s.value, s.lo, s.hi) for t, s in zip(types, case.specs(), strict=True)], case.attrs)
    want, got = _run(d, bcase, values, types)
    for k, (g, w, t) in enumerate(zip(got, want, _out_types(d, bcase, types, values), strict=True)):
        _compare(g, w, t, f"{name} result {k} (bf16)")


@pytest.mark.parametrize(
    ("name", "index"), [p for p in CASES if p.values[0] in ("Attention", "AttentionGrad")]
)
def test_unfused_attention_equals_the_reference(
    name: str, index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unfused formulas other devices than the CPU run (the CPU runs torch's fused kernels)."""
    monkeypatch.setattr("distir.ops.attention._fused", lambda ctx: False)
    test_torch_implementation_equals_the_reference(name, index)


def test_dropout_on_torch_draws_its_mask_from_torchs_generator() -> None:
    """p > 0, which the reference refuses: the mask keeps each element with probability 1 − p
    (within 4 standard deviations over 10^4 draws), Y = X·mask/(1 − p), the same seed draws the
    same mask, and DropoutGrad scales dY by the same mask."""
    ctx, p = TorchContext.local(), 0.25
    x = torch.randn(100, 100, dtype=torch.float32)
    torch.manual_seed(7)
    y, keep = REGISTRY["Dropout"].torch(ctx, [x], Attrs({"p": p}))
    torch.manual_seed(7)
    _, again = REGISTRY["Dropout"].torch(ctx, [x], Attrs({"p": p}))
    assert keep.dtype == torch.bool and torch.equal(keep, again)
    assert abs(keep.float().mean().item() - (1 - p)) <= 4 * (p * (1 - p) / keep.numel()) ** 0.5
    torch.testing.assert_close(y, torch.where(keep, x / (1 - p), torch.zeros_like(x)))
    (dx,) = REGISTRY["DropoutGrad"].torch(ctx, [x, keep], Attrs({"p": p}))
    torch.testing.assert_close(dx, y)


@pytest.mark.parametrize("name", ["Attention", "AttentionGrad"])
def test_attention_dropout_is_refused_on_torch_as_by_the_reference(name: str) -> None:
    case = EXAMPLES[name][0]
    ctx = TorchContext.local()
    values = random_inputs(case, np.random.default_rng(0))
    ins = [to_torch(ctx, v, t) for v, t in zip(values, case.types(), strict=True)]
    with pytest.raises(AttentionDropoutError):
        REGISTRY[name].torch(ctx, ins, Attrs({**case.attrs, "dropout": 0.1}))
