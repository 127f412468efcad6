"""GPT-2's tied embedding (``gpt:...,tied=1``): the head multiplies by the token embedding
transposed; its gradient is the sum of both uses (checked against finite differences of the
loss); distributed steps — one stage, or the embedding and the head on different pipeline stages
with Megatron-LM's embedding group (a copy on the last stage, the two gradients exchanged and
added) — equal the sequential step, copies included, and their per-rank programs cannot
deadlock."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo import build_model
from distir.frontends.zoo.model import ModelError
from distir.interp.annotate import annotate_types
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.interp.reference import run_reference
from distir.ir.dtensor import DTensorType
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential, initial_values
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy

TIED = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=13,tied=1"


def test_tied_model_shares_the_embedding_with_the_head() -> None:
    tied, untied = build_model(TIED, 2), build_model(TIED.replace("tied=1", "tied=0"), 2)
    assert tied.tied == ("wte",) and untied.tied == ()
    assert "wlm" not in {w.name for w in tied.weights}
    assert untied.num_params - tied.num_params == 8 * 13  # no separate (hidden, vocab) head
    head = tied.layers[-2]
    assert head.inputs[-1].name == "wte" and tied.layers[0].inputs[1].name == "wte"
    for bad in ("tied=2", "tied=yes"):
        with pytest.raises(ModelError, match="expected 0 or 1"):
            build_model(TIED.replace("tied=1", bad), 2)


def test_tied_gradient_is_the_sum_of_both_uses() -> None:
    """The sequential SGD step's update of wte, against central differences of the loss."""
    model = build_model(TIED, 2, dtype=DType.f64)
    lr = 0.5
    step = training_step(model, Optimizer("sgd", lr=lr))
    vals = initial_values(model, Optimizer("sgd", lr=lr), seed=3)
    args = [vals[p.name] for p in step.entry.params]
    outs = run_reference(step, args)
    k = 1 + [w.name for w in model.weights].index("wte")
    grad = (vals["wte"] - outs[k]) / lr

    def loss(wte: np.ndarray) -> float:
        return float(
            run_reference(model.module, [{**vals, "wte": wte}[p.name] for p in model.forward.params])[0]
        )

    want = np.zeros_like(grad)
    h = 1e-6
    for idx in np.ndindex(grad.shape):
        up, down = vals["wte"].copy(), vals["wte"].copy()
        up[idx] += h
        down[idx] -= h
        want[idx] = (loss(up) - loss(down)) / (2 * h)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "precision"),
    [
        ("d1.t2.p1.k2", "pure"),
        ("d2.t2.sp.p1.k2.z2", "pure"),
        ("d1.t2.p2.k2.1f1b", "pure"),  # embedding on stage 0, head on stage 1
        ("d2.t1.p3.k3.1f1b.z3", "pure"),
        ("d1.t1.p2.k4.interleaved.v2", "pure"),
        ("d2.t2.p2.k2.1f1b.z1", "adam"),
        ("d1.t2.sp.p2.k2.zb1", "mixed"),
    ],
)
def test_tied_training_step_matches_sequential(strategy: str, precision: str) -> None:
    s = parse_strategy(strategy)
    dtype = DType.bf16 if precision == "mixed" else DType.f64
    model = build_model(TIED, batch=s.k * s.d * 2, dtype=dtype)
    opt = Optimizer("adam", lr=0.01) if precision != "pure" else None
    cmp = check_against_sequential(model, s, opt, precision="mixed" if precision == "mixed" else "pure")
    tol = 1e-5 if precision == "mixed" else 1e-7
    assert cmp.max_rel_diff < tol, f"{strategy}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    check_deadlock_free(project(cmp.materialized))


def test_pipelined_tied_embedding_keeps_a_copy_and_exchanges_gradients() -> None:
    """With the embedding on stage 0 and the head on stage 1, each stage holds wte (a parameter
    of its mesh) and sends its reduced gradient to the other once per step."""
    s = parse_strategy("d1.t2.p2.k2.1f1b")
    model = build_model(TIED, batch=4)
    prog = annotate_types(distribute(model, s))
    entry = prog.entry
    wte = [p.type for p in entry.params if p.name == "wte"]
    assert len(wte) == 2 and all(isinstance(t, DTensorType) for t in wte)
    assert len({t.mesh.devices for t in wte if isinstance(t, DTensorType)}) == 2  # one per stage
    sent = [op for op in entry.ops() if op.name == "MeshSend" and op.inputs[0].type.shape == (13, 8)]  # type: ignore[union-attr]
    assert len(sent) == 2  # the gradients cross, once each way
    assert len(entry.outputs) == 1 + len(model.weights) + 1  # the loss, the weights (SGD), the copy
