"""Gradient-norm clipping (``Optimizer(max_norm=...)``): the step's gradients scaled by
min(1, max_norm / (norm + 1e-6)) before the update, the norm global over every weight, as
Megatron-LM, DeepSpeed, torchtitan and Composer/FSDP clip by default.

Oracles: the sequential clipped step (the distributed step's values), the clip coefficient by
hand (the sequential step's values), and the program's ops counted against the model's weights
(one norm term per weight, a tied copy's not counted; the scaling after every term and before
any update; the sums all-reduced on the compute mesh)."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.train import AutodiffError, Optimizer, training_step
from distir.frontends.zoo import build_model
from distir.interp.reference import run_reference
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential, initial_values
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy
from distir.parallel.trainers import trainer_semantics

from .helpers import BF16_ROUNDOFF

GPT = "gpt:layers=4,hidden=32,heads=2,seq=8,vocab=64"
TIED = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=13,tied=1"
CLIP = 0.05  # far under these models' gradient norms: every step is clipped


def test_the_sequential_step_scales_every_gradient_by_the_clip_coefficient() -> None:
    """SGD with clipping moves every weight by -lr · g · max_norm / (|g| + 1e-6), |g| the norm of
    all the gradients together: the unclipped step's moves, scaled by one factor."""
    model = build_model(GPT, batch=2, dtype=DType.f64)  # moves far above the weights' rounding
    plain, clipped = Optimizer("sgd", lr=0.1), Optimizer("sgd", lr=0.1, max_norm=CLIP)
    vals = initial_values(model, plain, 0, "pure")
    moves = []
    for opt in (plain, clipped):
        step = training_step(model, opt)
        got = run_reference(step, [vals[p.name] for p in step.entry.params])
        names = [p.name for p in step.entry.params[len(model.inputs) :]]
        moves.append({n: np.asarray(g, np.float64) - vals[n] for n, g in zip(names, got[1:], strict=True)})
    norm = np.sqrt(sum(float(np.sum((m / 0.1) ** 2)) for m in moves[0].values()))
    coef = CLIP / (norm + 1e-6)
    assert coef < 0.5
    for n, m in moves[0].items():
        np.testing.assert_allclose(moves[1][n], coef * m, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(
    ("spec", "strategy", "opt"),
    [
        (GPT, "d2.t1.p1.k2", "sgd"),
        (GPT, "d2.t2.p2.k2.1f1b.z1", "sgd"),
        (GPT, "d2.t2.sp.p2.k2.1f1b.z3", "adam"),
        (GPT, "d2.t1.p2.k2.1f1b.z2", "adam"),
        (GPT, "d4.t1.p1.k1.z3h2", "sgd"),
        (TIED, "d1.t1.p2.k2.1f1b", "sgd"),
        (TIED, "d2.t1.p2.k2.1f1b.z1", "adam"),
    ],
)
def test_the_clipped_step_equals_the_sequential_clipped_step(spec: str, strategy: str, opt: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=2 * s.d * s.k, dtype=DType.f32)
    cmp = check_against_sequential(model, s, Optimizer(opt, lr=0.1, max_norm=CLIP))
    err, where = cmp.update_error()
    assert err < 1e-3, f"{strategy}: {where} differs by {err:.2e}"


@pytest.mark.parametrize("strategy", ["d2.t1.p2.k4.1f1b.z1", "d2.t2.sp.p1.k2.z1"])
def test_megatrons_clipped_mixed_step_equals_the_sequential_one(strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=s.k * s.d, dtype=DType.bf16)
    opt = Optimizer("adam", lr=0.01, max_norm=CLIP, clip_scale="if_over")
    options = {"megatron_ddp": True, "reduce_fp32": True, "grad_accum_fusion": True}
    cmp = check_against_sequential(model, s, opt, precision="mixed", comm_streams=True, **options)
    err, where = cmp.update_error()
    assert err < BF16_ROUNDOFF, f"{strategy}: {where} differs by {err:.2e}"


def _entry_ops(strategy: str, spec: str = GPT, **opt: float | str) -> tuple[list, object]:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=2 * s.d * s.k, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam", **opt), comm_streams=True, precision="mixed")  # type: ignore[arg-type]
    return list(prog.entry.ops()), model


def test_the_norm_counts_every_weight_once_then_scales_before_any_update() -> None:
    ops, model = _entry_ops("d2.t2.sp.p2.k2.1f1b.z1", max_norm=1.0)
    names = [op.name for op in ops]
    assert names.count("GradNormSq") == len(model.weights)  # type: ignore[attr-defined]
    assert names.count("ClipByNorm") == names.count("Adam") == len(model.weights)  # type: ignore[attr-defined]
    assert max(i for i, n in enumerate(names) if n == "GradNormSq") < names.index("ClipByNorm")
    assert names.index("ClipByNorm") < names.index("Adam")
    # the sums of squares all-reduced where they are made, on the compute devices (no hand-over
    # to a communication stream between)
    made = {o: op.name for op in ops for o in op.outputs}
    sums = [op for op in ops if op.name == "Redistribute" and op.outputs[0].name.startswith("grad_sumsq")]
    assert sums and all(made[op.inputs[0]] in ("GradNormSq", "Sum") for op in sums)


def test_a_tied_copy_is_scaled_but_not_counted() -> None:
    ops, model = _entry_ops("d1.t1.p2.k2.1f1b", spec=TIED, max_norm=1.0)
    names = [op.name for op in ops]
    assert names.count("GradNormSq") == len(model.weights)  # type: ignore[attr-defined]
    assert names.count("ClipByNorm") == len(model.weights) + 1  # type: ignore[attr-defined]


def test_without_max_norm_the_program_is_unchanged() -> None:
    ops, _ = _entry_ops("d2.t1.p1.k2.z1")
    assert not {"GradNormSq", "ClipByNorm"} & {op.name for op in ops}


def test_the_trainers_clip_at_one_and_distir_does_not() -> None:
    from distir.autodiff.precision import Precision

    s, mixed = parse_strategy("d2.t1.p1.k1.z3"), Precision.parse("mixed")
    want = {"distir": (0.0, "always"), "megatron": (1.0, "if_over"), "torchtitan": (1.0, "always")}
    for trainer, (norm, scale) in want.items():
        strat = parse_strategy("d2.t1.p1.k1.z1") if trainer == "megatron" else s
        opt = trainer_semantics(trainer, strat, mixed, DType.bf16).optimizer("adam")
        assert (opt.max_norm, opt.clip_scale) == (norm, scale), trainer
    ds = trainer_semantics("deepspeed", parse_strategy("d2.t1.p2.k2.1f1b.z1"), mixed, DType.bf16)
    assert (ds.max_norm, ds.clip_scale) == (1.0, "if_over")


@pytest.mark.parametrize(("norm", "scale"), [(-1.0, "always"), (1.0, "sometimes")])
def test_a_bad_clip_is_refused(norm: float, scale: str) -> None:
    with pytest.raises(AutodiffError):
        Optimizer("adam", max_norm=norm, clip_scale=scale)
