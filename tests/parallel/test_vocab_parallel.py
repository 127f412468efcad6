"""Megatron-LM's vocabulary-parallel embedding, LM head and cross entropy under tensor parallelism:
the zoo's loss layer with logits sharded on the vocabulary gives numpy's cross entropy and its
gradient (softmax − one-hot) on every TP degree, with labels in every shard and uneven shards;
the embedding table sharded on its rows gives the whole table's lookup and gradient; the only
collectives of the sharded loss are on (B·S,)-sized tensors; zoo training steps with t = 2 (and
sequence parallelism) equal the sequential step; the head and loss are no longer repeated on
every TP rank (FLOPs of the simulated step)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import distir
from distir.autodiff.reverse import value_types, vjp
from distir.frontends.zoo import build_model
from distir.frontends.zoo.gpt import token_loss_fn
from distir.frontends.zoo.llama import embed_fn
from distir.interp.reference import run_reference
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Replicate, Shard, parse_placements
from distir.ir.function import Function, Module
from distir.ir.types import Device, DType, TensorType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import sharded_layers
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import materialize, shard_value, unshard_value
from distir.parallel.sharding.propagate import propagate
from distir.parallel.strategy import parse_strategy

D0 = Device(0)


def _with_gradient(fn: Function, types: list[TensorType], wrt: int) -> Module:
    """``@step(args) -> (fn(args), d fn / d args[wrt])``: ``fn``'s forward, then its backward
    seeded with 1."""
    m = Module((fn,))
    vj = vjp(m, fn, types, [wrt])
    fb = FunctionBuilder("step")
    params = [fb.param(p.name, t) for p, t in zip(fn.params, types, strict=True)]
    outs = fb.call(vj.fwd, *params, n_out=len(vj.fwd.outputs))
    (seed,) = fb.op("FillLike", outs[0], value=1.0)
    args = [params[j] for j in vj.bwd_params] + list(outs[vj.n_outputs :]) + [seed]
    (grad,) = fb.call(vj.bwd, *args, n_out=1)
    return distir.check(Module((vj.fwd, vj.bwd, fb.ret(outs[0], grad))))


def _run_sharded(
    m: Module,
    t: int,
    params: dict[int, str],
    results: dict[int, str],
    args: list[np.ndarray],
    pinned: tuple[int, ...] = (),
) -> tuple[Module, list[np.ndarray]]:
    """``m`` sharded on ``tp=t`` (parameters and results at the given placements, ``pinned``
    weights used where they lie, as ``distribute`` does), legalized, materialized and run on
    ``args``; returns the legalized program and the reassembled results."""
    mesh = Mesh((("tp", t),), tuple(Device(i) for i in range(t)))
    placed = propagate(m, mesh, {}, params=params, results=results, pinned=pinned)
    legal = distir.check(legalize(placed.module))
    mat = distir.check(materialize(legal))
    pieces: list[np.ndarray] = []
    for a, p in zip(args, legal.entry.params, strict=True):
        assert isinstance(p.type, DTensorType)
        sv = shard_value(a, p.type)
        pieces += [sv[d] for d in mesh.devices]
    outs = run_reference(mat, pieces)
    got = []
    for k, v in enumerate(legal.entry.outputs):
        assert isinstance(v.type, DTensorType)
        got.append(unshard_value({d: outs[k * t + i] for i, d in enumerate(mesh.devices)}, v.type))
    return legal, got


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """numpy: the mean token cross entropy and its gradient (softmax − one-hot) / tokens."""
    x = logits.reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    loss = float(np.mean(-np.log(p[np.arange(len(y)), y])))
    p[np.arange(len(y)), y] -= 1.0
    return loss, (p / len(y)).reshape(logits.shape)


@pytest.mark.parametrize(("t", "vocab"), [(2, 10), (4, 10), (4, 12)])
def test_vocab_parallel_cross_entropy_equals_the_replicated_one(t: int, vocab: int) -> None:
    b, s = 2, 6
    rng = np.random.default_rng(t * vocab)
    logits = rng.standard_normal((b, s, vocab)) * 3.0
    labels = (rng.permutation(b * s) % vocab).reshape(b, s)  # every class, so every shard, is hit
    m = _with_gradient(
        token_loss_fn(vocab, b * s),
        [TensorType(DType.f64, (b, s, vocab), D0), TensorType(DType.i64, (b, s), D0)],
        0,
    )
    want_loss, want_grad = _cross_entropy(logits, labels)
    seq_loss, seq_grad = run_reference(m, [logits, labels])
    np.testing.assert_allclose(seq_loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(seq_grad, want_grad, rtol=1e-10, atol=1e-15)
    legal, (loss, grad) = _run_sharded(m, t, {0: "S(2)", 1: "R"}, {0: "R", 1: "S(2)"}, [logits, labels])
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-15)
    # the logits and their gradient never move: every redistribution is of B·S numbers or fewer
    moved = [op.inputs[0].type for op in legal.entry.ops() if op.name == "Redistribute"]
    assert moved and all(isinstance(x, DTensorType) and math.prod(x.shape) <= b * s for x in moved), moved
    ops = {op.name for op in legal.entry.ops()}
    assert {"ReduceMax", "SoftmaxCrossEntropyParts", "SoftmaxCrossEntropyPartsGrad"} <= ops


@pytest.mark.parametrize(("t", "vocab"), [(1, 10), (2, 10), (4, 12)])
def test_loss_parallel_cross_entropy_equals_the_replicated_one(t: int, vocab: int) -> None:
    """The ``parallel`` form (torch's loss_parallel): the cross entropy and its gradient, whole
    and sharded on the vocabulary, with only (B·S,)-sized tensors moved and torch's fused
    backward (NllLossPartsGrad) computing the gradient."""
    b, s = 2, 6
    rng = np.random.default_rng(t * vocab + 1)
    logits = rng.standard_normal((b, s, vocab)) * 3.0
    labels = (rng.permutation(b * s) % vocab).reshape(b, s)
    m = _with_gradient(
        token_loss_fn(vocab, b * s, "parallel"),
        [TensorType(DType.f64, (b, s, vocab), D0), TensorType(DType.i64, (b, s), D0)],
        0,
    )
    want_loss, want_grad = _cross_entropy(logits, labels)
    legal, (loss, grad) = _run_sharded(m, t, {0: "S(2)", 1: "R"}, {0: "R", 1: "S(2)"}, [logits, labels])
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-15)
    moved = [op.inputs[0].type for op in legal.entry.ops() if op.name == "Redistribute"]
    assert all(isinstance(x, DTensorType) and math.prod(x.shape) <= b * s for x in moved), moved
    assert {"NllLossParts", "NllLossPartsGrad"} <= {op.name for op in legal.entry.ops()}


@pytest.mark.parametrize("t", [2, 4])
def test_vocab_parallel_embedding_equals_the_replicated_lookup(t: int) -> None:
    vocab, hidden, b, s = 11, 3, 2, 7
    rng = np.random.default_rng(t)
    table = rng.standard_normal((vocab, hidden))
    ids = (rng.permutation(b * s) % vocab).reshape(b, s)  # ids in every shard, some repeated
    types = [TensorType(DType.i64, (b, s), D0), TensorType(DType.f64, (vocab, hidden), D0)]
    m = _with_gradient(embed_fn(), types, 1)
    out, dtable = run_reference(m, [ids, table])
    np.testing.assert_array_equal(out, table[ids])
    counts = np.bincount(ids.reshape(-1), minlength=vocab).astype(np.float64)
    np.testing.assert_array_equal(dtable, np.repeat(counts[:, None], hidden, axis=1))
    legal, (got, dgot) = _run_sharded(m, t, {0: "R", 1: "S(0)"}, {0: "R", 1: "S(0)"}, [ids, table], (1,))
    np.testing.assert_allclose(got, out, rtol=0, atol=1e-15)
    np.testing.assert_allclose(dgot, dtable, rtol=0, atol=1e-15)
    gather = next(op for op in legal.entry.ops() if op.name == "Gather")
    assert isinstance(gather.outputs[0].type, DTensorType)
    assert gather.outputs[0].type.placements == (Partial("sum"),)  # each rank's rows, then a sum
    # the backward scatters into each rank's rows: the table's gradient is never whole on a rank
    scatter = next(op for op in legal.entry.ops() if op.name == "GatherGrad")
    assert isinstance(scatter.outputs[0].type, DTensorType)
    assert scatter.outputs[0].type.placements == (Shard(0),)
    moved = [op.inputs[0].type.shape for op in legal.entry.ops() if op.name == "Redistribute"]  # type: ignore[union-attr]
    assert (vocab, hidden) not in moved, moved


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        ("gpt:layers=2,hidden=8,heads=2,seq=4,vocab=13", "d1.t2.p1.k1"),
        ("gpt:layers=2,hidden=8,heads=2,seq=4,vocab=13", "d2.t2.sp.p2.k2.1f1b"),
        ("llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=17,seq=4", "d1.t2.sp.p1.k2"),
        ("llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=17,seq=4", "d1.t4.p2.k2.1f1b"),
        ("llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=17,seq=4,loss=parallel", "d1.t2.sp.p1.k2"),
    ],
)
def test_zoo_training_step_with_vocab_parallel_tp_matches_sequential(spec: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d * 2, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{spec} {s}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    for layer in sharded_layers(model, s.d, s.t, sp=s.sp)[-2:]:  # the head and the loss
        for fn, args in ((layer.fwd, layer.fwd_args), (layer.bwd, layer.bwd_args)):
            assert fn is not None
            env = value_types(Module((fn,)), fn, args)
            moved = [
                x
                for op in fn.ops()
                if op.name == "Redistribute"
                and isinstance(x := env[op.inputs[0]], DTensorType)
                and x.placements[1] != parse_placements(str(op.attrs["to"]))[1]  # along tp
            ]
            # activations (B, S, hidden), per-token numbers, the scalar loss: never the logits
            assert all(model.config["vocab"] not in x.shape for x in moved), (fn.name, moved)  # type: ignore[union-attr]


def test_weights_and_logits_are_sharded_on_the_vocabulary() -> None:
    model = build_model("llama:layers=1,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4", batch=2)
    assert (model.weight("tok_emb").tp, model.weight("wlm").tp) == (Shard(0), Shard(1))
    assert model.loss_input_tp == Shard(2)
    assert build_model("mlp:layers=2,hidden=8", 2).loss_input_tp == Replicate()
