"""Whole programs on torch (``run_torch``) against the reference executor: the training step
(forward, loss, backward, optimizer update) of the MLP, a tiny GPT and a tiny Llama.

Tolerances, on every result (the loss and each updated weight and optimizer state), relative to
the result's largest magnitude (at least 1): f32 1e-5 (measured: below 1e-7); mixed precision
(bf16 compute, f32 masters, loss and update) 1e-3 on the loss (measured: below 4e-5) and 1e-2 on
each weight's update w_new - w relative to the largest weight (measured: below 2.2e-3; bf16 keeps
8 significant bits, and the reference computes bf16 ops in f32 rounding only at casts, while
torch rounds every op's result to bf16).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from distir.autodiff.train import Optimizer, training_step  # noqa: E402
from distir.backend.context import TorchContext  # noqa: E402
from distir.backend.domain import args_to_torch, run_torch, to_numpy  # noqa: E402
from distir.frontends.zoo import build_model  # noqa: E402
from distir.interp.annotate import annotate_types  # noqa: E402
from distir.interp.loop import InterpretError  # noqa: E402
from distir.interp.reference import run_reference  # noqa: E402
from distir.ir.builder import FunctionBuilder  # noqa: E402
from distir.ir.function import Module  # noqa: E402
from distir.ir.types import Device, DType, TensorType  # noqa: E402
from distir.ops import REGISTRY  # noqa: E402
from distir.ops.elementwise import round_to_bf16  # noqa: E402

TINY = {
    "mlp": "mlp:layers=3,hidden=6",
    "gpt": "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16",
    "llama": "llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4",
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> None:
    torch.set_num_threads(1)


def _step(family: str, dtype: DType, opt: Optimizer, precision: str = "pure") -> tuple[Module, list[Any]]:
    """The training step and its numpy arguments (bf16 ones on the bf16 grid; Adam's state)."""
    model = build_model(TINY[family], batch=2, dtype=dtype)
    step = training_step(model, opt, precision=precision)
    vals = model.random_inputs(seed=3)
    rng = np.random.default_rng(5)
    args = []
    for p in step.entry.params:
        t = p.type
        assert isinstance(t, TensorType)
        if p.name in vals:
            v = vals[p.name]
        elif p.name == "step":
            v = np.array(3, dtype=np.int64)
        else:  # Adam's m (any sign) and v (non-negative)
            v = rng.standard_normal(t.shape) * 0.1
            v = np.abs(v) if p.name.startswith("v_") else v
        v = np.asarray(v, dtype=t.dtype.to_numpy())
        args.append(round_to_bf16(v) if t.dtype is DType.bf16 else v)
    return step, args


def _both(step: Module, args: list[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    ctx = TorchContext.local()
    want = run_reference(step, args)
    got = tuple(to_numpy(x) for x in run_torch(step, args_to_torch(ctx, step.entry, args), ctx))
    return want, got


def _max_error(got: Any, want: Any) -> float:
    w = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - w), initial=0.0)) / max(
        1.0, float(np.max(np.abs(w), initial=0.0))
    )


@pytest.mark.parametrize("opt", [Optimizer("sgd", lr=0.5), Optimizer("adam", lr=0.01)], ids=["sgd", "adam"])
@pytest.mark.parametrize("family", sorted(TINY))
def test_training_step_on_torch_equals_the_reference_in_f32(family: str, opt: Optimizer) -> None:
    step, args = _step(family, DType.f32, opt)
    want, got = _both(step, args)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype, k
        assert _max_error(g, w) <= 1e-5, (k, _max_error(g, w))


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_mixed_precision_training_step_on_torch_is_close_to_the_reference(family: str) -> None:
    """bf16 compute, f32 masters: the loss and every weight's update agree to bf16 accuracy."""
    step, args = _step(family, DType.bf16, Optimizer("sgd", lr=1.0), precision="mixed")
    want, got = _both(step, args)
    assert _max_error(got[0], want[0]) <= 1e-3
    masters = args[-(len(got) - 1) :]  # SGD: the new weights are the last parameters' updates
    for k, (m, g, w) in enumerate(zip(masters, got[1:], want[1:], strict=True)):
        scale = max(1.0, float(np.max(np.abs(m))))
        err = float(np.max(np.abs((g - m) - (w - m)))) / scale
        assert err <= 1e-2, (step.entry.params[k - len(masters)].name, err)


def _relu_program() -> Module:
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x", TensorType(DType.f32, (2, 3), Device(0)))
    (y,) = fb.op("Relu", x, names=["y"])
    return annotate_types(Module((fb.ret(y),)))


def test_a_torch_result_of_the_wrong_shape_or_dtype_is_an_error_naming_the_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the reference executor's: the interpreter's error shows the op as printed in the IR."""
    ctx, prog = TorchContext.local(), _relu_program()
    x = [torch.ones(2, 3)]
    monkeypatch.setattr(REGISTRY["Relu"], "torch", lambda ctx, xs, attrs: (xs[0].reshape(3, 2),))
    with pytest.raises(InterpretError, match=r"Relu's torch implementation produced .*\(3, 2\)"):
        run_torch(prog, x, ctx)
    monkeypatch.setattr(REGISTRY["Relu"], "torch", lambda ctx, xs, attrs: (xs[0].double(),))
    with pytest.raises(InterpretError, match=r"torch\.float64"):
        run_torch(prog, x, ctx)
    monkeypatch.setattr(REGISTRY["Relu"], "torch", None)
    with pytest.raises(InterpretError, match="Relu has no torch implementation"):
        run_torch(prog, x, ctx)
