"""The cross entropy under context parallelism (``distir.parallel.context_model``): the ``torch``
loss form (``LogSoftmax`` then ``NegativeLogLikelihoodLoss``, torchtitan's F.cross_entropy) and the
``parallel`` form (torch's ``loss_parallel``, written on (B, S, V) rows) run
on each cp rank's own (batch, sequence/c, vocab) logits, as the fused and fp32 forms do — no
collective gathers the logits over cp — and the step with data and context parallelism equals
the sequential step (loss and updated weights) on the reference executor."""

from __future__ import annotations

from collections import Counter

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.interp.annotate import annotate_types
from distir.ir.dtensor import DTensorType
from distir.ir.function import Module
from distir.ir.rewrite import inline_calls
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.context_model import context_model
from distir.parallel.distribute import distribute
from distir.parallel.sharding.materialize import materialize
from distir.parallel.strategy import parse_strategy

LLAMA = "llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=16,loss={form}"
GPT = "gpt:layers=2,hidden=8,heads=2,seq=16,vocab=16,loss={form}"
FORMS = ["torch", "fp32", "fused", "parallel"]


def test_the_torch_form_takes_the_logits_unflattened_classes_last() -> None:
    model = build_model(LLAMA.format(form="torch"), batch=2, dtype=DType.f64)
    loss = context_model(model, 2).module["loss"]
    names = [op.name for op in loss.ops()]
    assert "Reshape" not in names
    logp = next(op for op in loss.ops() if op.name == "LogSoftmax")
    nll = next(op for op in loss.ops() if op.name == "NegativeLogLikelihoodLoss")
    assert logp.inputs[0] is loss.params[0] and logp.attrs["axis"] == -1
    assert nll.inputs[1] is loss.params[1] and nll.attrs["axis"] == -1


@pytest.mark.parametrize("form", FORMS)
def test_no_collective_gathers_the_logits_over_cp(form: str) -> None:
    """d = 2, c = 2, two sequences per rank: the loss layer keeps the logits sharded on batch and
    sequence (no Redistribute in it, but of the 0-d loss), and the materialized step gathers
    nothing (DDP's reductions and the ring's Sends are all it communicates)."""
    s = parse_strategy("d2.t1.c2.p1.k1")
    model = build_model(LLAMA.format(form=form), batch=4, dtype=DType.f64)
    mod = distribute(model, s)
    for name in ("loss_fwd", "loss_bwd"):
        for op in mod[name].ops():
            if op.name == "Redistribute":
                t = op.inputs[0].type
                assert not isinstance(t, DTensorType) or t.rank == 0, f"{name}: {op}"
    entry = annotate_types(Module((inline_calls(mod),))).entry
    kinds = Counter(op.name for op in materialize(Module((entry,))).entry.ops())
    assert kinds["AllGather"] == 0 and kinds["ReduceScatter"] == 0
    assert kinds["AllReduce"] > 0  # the weights' gradients (so the count above is meaningful)


@pytest.mark.parametrize("spec", [LLAMA, GPT])
def test_torch_form_step_with_data_and_context_parallelism_equals_the_sequential_step(spec: str) -> None:
    """Loss, and updated weights under SGD (so every weight's gradient), as the sequential step's."""
    s = parse_strategy("d2.t1.c2.p1.k1")
    model = build_model(spec.format(form="torch"), batch=4, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    err, where = cmp.update_error()
    assert err < 1e-9, f"{spec} {s}: {where} differs by {err:.2e}"
    assert cmp.results["loss"][2] == pytest.approx(cmp.results["loss"][3], rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy", "precision"),
    [
        (LLAMA, "d1.t2.c2.p1.k2", "pure"),  # logits whole over tp (no vocabulary-parallel form)
        (GPT, "d1.t1.c2.p2.k2.1f1b", "pure"),
        (LLAMA, "d2.t1.c2.p1.k2.z3", "mixed"),  # torchtitan's: FSDP over dp·cp, fp32 logits
    ],
)
def test_torch_form_under_cp_combines_with_tensor_pipeline_zero_and_mixed_precision(
    spec: str, strategy: str, precision: str
) -> None:
    s = parse_strategy(strategy)
    dtype = DType.bf16 if precision == "mixed" else DType.f64
    model = build_model(spec.format(form="torch"), batch=2 * s.d * s.k, dtype=dtype)
    cmp = check_against_sequential(model, s, Optimizer("adam"), comm_streams=True, precision=precision)
    err, where = cmp.update_error()
    assert err < (1e-4 if precision == "mixed" else 1e-9), (where, err)
