"""Sequence parallelism (``Strategy.sp``, ``distir.parallel.seqpar``): the training step still
matches the sequential one; the block's collectives are Megatron-LM's (AllGather on the sequence
dim before each column-parallel region, ReduceScatter on it after each row-parallel one, no
AllReduce of activations); activation memory drops by the expected amount at about the same
simulated step time."""

from __future__ import annotations

import pytest

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.annotate import annotate_types
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.function import Module
from distir.ir.rewrite import inline_calls
from distir.ir.types import DType
from distir.ops.registry import REGISTRY, OpKind
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute, sharded_layers
from distir.parallel.sharding.materialize import materialize
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.simulate import simulate

GPT = "gpt:layers=3,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=3,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        (GPT, "d1.t2.sp.p1.k1.1f1b"),
        (GPT, "d2.t2.sp.p2.k2.1f1b.z1"),  # 8 devices
        (GPT, "d1.t2.sp.p2.k2.zb1.rsel"),
        (LLAMA, "d2.t2.sp.p2.k2.zb1.rfull"),  # the weight passes gather their carried slices again
        (LLAMA, "d2.t2.sp.p2.k4.gpipe.z3"),  # 8 devices
        (LLAMA, "d1.t2.sp.p1.k2.1f1b.rfull"),
        ("gpt:layers=2,hidden=8,heads=2,seq=5,vocab=16", "d1.t2.sp.p1.k2.1f1b"),  # uneven: 3 + 2
    ],
)
def test_sequence_parallel_training_step_matches_sequential(spec: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{spec} {s}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    ranks = project(cmp.materialized)
    assert len(ranks) == s.devices
    check_deadlock_free(ranks)
    if s.p > 1:  # what crosses a stage boundary is sequence-sharded too (1/t of it per rank pair)
        entry = annotate_types(cmp.distributed).entry
        sent = [op.inputs[0].type for op in entry.ops() if op.name == "MeshSend"]
        assert any(isinstance(t, DTensorType) and t.placements == (Shard(0), Shard(1)) for t in sent)


def _redistributions(fn_name: str, spec: str, sp: bool, batch: int = 4) -> list[tuple[str, str]]:
    model = build_model(spec, batch=batch)
    layers = sharded_layers(model, 2, 2, sp=sp)
    fns = {f.name: f for L in layers for f in (L.fwd, L.bwd) if f is not None}
    return [
        (op.inputs[0].name, str(op.attrs["to"])) for op in fns[fn_name].ops() if op.name == "Redistribute"
    ]


# 64 tokens per microbatch > ffn 32: gathering a weight moves fewer bytes than gathering the
# activation it multiplies, so without pinned weights propagation gathers wq..w2 instead
BLOCK = "gpt:layers=1,hidden=8,heads=2,seq=16,vocab=16"


def test_block_forward_golden() -> None:
    """Megatron-LM's sequence-parallel block: g = AllGather(seq) before the attention and the
    MLP (column-parallel), ḡ = ReduceScatter(seq) after them (row-parallel); layer norms and
    residual adds run on sequence shards; weights never move."""
    assert _redistributions("block_fwd", BLOCK, sp=True) == [
        ("ln1", "S(0), R"),  # AllGather over tp (dp is already S(0))
        ("o_xw", "S(0), S(1)"),  # ReduceScatter: P(sum) -> S(1) over tp
        ("ln2", "S(0), R"),
        ("fc2_xw", "S(0), S(1)"),
    ]


def test_block_backward_golden() -> None:
    """The conjugates: AllGather of the incoming gradient (ḡ's), the saved sequence-sharded
    inputs of the column-parallel MatMuls gathered again for the weight gradients, ReduceScatter
    of the input gradients (g's); plus the pending tp sum of the norms' weight gradients."""
    # activations (S(0) over dp); weight gradients stay pending over dp (P(sum), ...)
    big = [r for r in _redistributions("block_bwd", BLOCK, sp=True) if r[1].startswith("S(0)")]
    assert [to for _, to in big] == ["S(0), R", "S(0), R", "S(0), S(1)", "S(0), R", "S(0), R", "S(0), S(1)"]
    assert [name for name, _ in big][:2] == ["dx_mlp", "ln2"]
    assert big[4][0] == "ln1"
    weights = {"wq", "wk", "wv", "wo", "w1", "w2", "bq", "bk", "bv", "b1"}
    for fn in ("block_fwd", "block_bwd"):
        assert not {n for n, _ in _redistributions(fn, BLOCK, sp=True)} & weights
        assert not {n for n, _ in _redistributions(fn, BLOCK, sp=False)} & weights


@pytest.mark.parametrize("spec", [BLOCK, LLAMA, BLOCK + ",tied=1"])
def test_sequence_parallel_backward_transposes_by_gemm_flags(spec: str) -> None:
    """dX = dY·Wᵀ and dW = Xᵀ·dY under T+SP are MatMuls with transposed operands (cuBLAS flags,
    as Megatron-LM's linear layers run them), never a Transpose copy; the products keep the
    column/row-parallel layout (the redistributions are pinned by the golden tests above)."""
    layers = sharded_layers(build_model(spec, batch=4), 2, 2, sp=True)
    bwd = [op for L in layers if L.bwd is not None for op in L.bwd.ops()]
    assert not [op for op in bwd if op.name == "Transpose"]
    flagged = [op for op in bwd if op.name == "MatMul" and (op.attrs.get("transA") or op.attrs.get("transB"))]
    # every product's two gradients but the tied head's dX = dY·(wteᵀ)ᵀ = dY·wte
    plain = 1 if "tied=1" in spec else 0
    assert len(flagged) == len([op for op in bwd if op.name == "MatMul"]) - plain


def test_materialized_forward_uses_allgather_and_reducescatter_on_the_sequence_dim() -> None:
    model = build_model(BLOCK, batch=2)
    s = parse_strategy("d1.t2.sp.p1.k1.1f1b")
    mat = materialize(annotate_types(Module((inline_calls(distribute(model, s)),))))
    ops = list(mat.entry.ops())
    seed = next(i for i, op in enumerate(ops) if op.name == "FillLike")  # forward ends at the loss
    comm = [op for op in ops[:seed] if REGISTRY[op.name].kind is OpKind.COMM]
    activations = [op for op in comm if len(op.inputs[0].type.shape) == 3]  # type: ignore[union-attr]
    kinds = [(op.name, op.attrs["dim"]) for op in activations]
    # per block 2 AllGathers + 2 ReduceScatters, the head gathers the final norm's output, and
    # the vocabulary-parallel embedding's pending sum is reduce-scattered along the sequence
    assert sorted(kinds) == [("AllGather", 1)] * 3 + [("ReduceScatter", 1)] * 3, kinds
    # no activation is all-reduced: only the cross entropy's per-token max, sum and target logit
    reduced = [op.inputs[0].type.shape for op in comm if op.name == "AllReduce"]  # type: ignore[union-attr]
    assert reduced == [(2 * 16,)] * 3, reduced  # batch · seq tokens


def test_sequence_parallel_errors_are_named() -> None:
    with pytest.raises(StrategyError, match="declares none"):
        distribute(build_model("mlp:layers=2,hidden=4", batch=2), parse_strategy("t2.sp"))
    with pytest.raises(StrategyError, match="declares none"):  # latent → tokens → windows
        distribute(build_model("transgan:wide_layers=1,narrow_layers=1", batch=2), parse_strategy("t2.sp"))
    with pytest.raises(StrategyError, match=r"sequence \(2 positions\) is shorter than the t=4"):
        distribute(
            build_model("gpt:layers=1,hidden=8,heads=4,seq=2,vocab=16", batch=2), parse_strategy("t4.sp")
        )


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_saves_activation_memory_at_about_the_same_step_time(t: int) -> None:
    """Expected saving: of the four (batch, seq, hidden) tensors a block keeps for its backward
    on the layer-norm side (its input and LN1's output, LN2's input and output), propagation
    already keeps the last two sequence-sharded without sp (the row-parallel sum is reduce-
    scattered into the residual add); sp shards the first two, saving 2·B·S·H·4·(1 − 1/t) bytes
    per block. The head keeps the same pair (its input and the final norm's output): whether
    its saving shows too depends on where the peak falls; and a peak inside a block's backward
    no longer holds that block's saved tensors once its layer call has read them (the inlined
    program's liveness), so the bound allows L - 1 to L + 1 pairs (3.5 measured at t = 2)."""
    layers, batch, seq, hidden = 4, 8, 256, 128
    spec = f"gpt:layers={layers},hidden={hidden},heads=4,seq={seq},vocab=256"
    cluster = parse_cluster("dgx-a100")
    res = {}
    for sp in (False, True):
        s = parse_strategy(f"d1.t{t}{'.sp' if sp else ''}.p1.k1.1f1b")
        model = build_model(spec, batch=batch)
        res[sp] = simulate(distribute(model, s), cluster, device_map(s), batch=batch)
    pair = 2 * batch * seq * hidden * 4 * (1 - 1 / t)
    for g in res[False].peak_memory:
        # tensors only: the allocator's reserve (runtime memory) is a share of the peak
        saved = (res[False].peak_memory[g] - res[False].runtime_memory[g]) - (
            res[True].peak_memory[g] - res[True].runtime_memory[g]
        )
        assert res[True].param_memory[g] == res[False].param_memory[g]
        assert 0.95 * (layers - 1) * pair <= saved <= 1.05 * (layers + 1) * pair, (g, saved / pair)
    # the same bytes cross the tp group in the forward; the backward gathers the saved shards
    # again (as Megatron-LM does): a few percent at most on this compute-bound toy
    assert res[True].step_time_s <= 1.1 * res[False].step_time_s
    assert res[True].step_time_s > 0 and sum(res[True].comm_s) > 0


PINNED = """func @mlp(%x: Tensor[f32, (64, 16), d0], %w1: Tensor[f32, (16, 8), d0], %w2: Tensor[f32, (8, 16), d0]) {
  %h = MatMul(%x, %w1)
  %a = Gelu(%h)
  %y = MatMul(%a, %w2)
  return %y
}
"""


@pytest.mark.parametrize("pinned", [(), (1, 2)])
def test_pinned_weights_are_used_where_they_lie(pinned: tuple[int, ...]) -> None:
    """Rows sharded (a sequence-sharded activation) times a column-parallel weight: gathering the
    weight (16·8) moves fewer bytes than gathering the rows (64·16), so unpinned propagation
    gathers the weights; pinned, it gathers the rows and keeps Megatron's column/row layout."""
    from distir.ir.parser import parse_module
    from distir.parallel.sharding.legalize import legalize
    from distir.parallel.sharding.propagate import propagate

    from .gen import mesh_of

    m = parse_module(PINNED)
    params = {0: "S(0)", 1: "S(1)", 2: "S(0)"}
    prop = propagate(m, mesh_of((2,)), {}, params=params, results={0: "S(0)"}, pinned=pinned)
    moved = {op.inputs[0].name for op in legalize(prop.module).entry.ops() if op.name == "Redistribute"}
    assert moved == ({"x", "y"} if pinned else {"w1", "w2"})


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [
        "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32",
        "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=24,vocab=32,seq=8",
    ],
)
@pytest.mark.parametrize("strategy", ["d2.t2.sp.p1.k4", "d2.t2.sp.p2.k4.1f1b", "d4.t2.sp.p1.k2"])
def test_one_sample_microbatches_per_replica_with_sp_train_as_the_sequential_step(
    spec: str, strategy: str
) -> None:
    """Megatron's usual setting for large models: data parallelism, sequence parallelism and one
    sample per replica and microbatch (the batch is d·k)."""
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.d * s.k, dtype=DType.f64)
    err, where = check_against_sequential(model, s).update_error()
    assert err < 1e-9, (where, err)


# -- the norms' and biases' gradients: summed over tp once per step (Megatron-LM) ---------------

SP_WEIGHTS = {"ln1_scale", "ln1_bias", "bo", "ln2_scale", "ln2_bias", "b2"}  # replicated over tp


def test_sequence_parallel_weight_gradients_stay_pending_over_tp() -> None:
    """Under sp the gradients of the weights replicated over tp in the sequence-parallel region
    (the norms, the biases after row-parallel products: Megatron's ``sequence_parallel``
    parameters) leave the layer's backward pending over tp — no weight gradient is reduced
    inside it; the embedding's (its input is not split along the sequence) is whole as before."""
    model = build_model(BLOCK, batch=4)
    layers = sharded_layers(model, 2, 2, sp=True)
    block = next(L for L in layers if L.bwd is not None and L.bwd.name == "block_bwd")
    pending = {w.name.rsplit("_", 1)[0] for w, p in zip(block.weights, block.tp_pending, strict=True) if p}
    assert pending == SP_WEIGHTS
    assert not [r for r in _redistributions("block_bwd", BLOCK, sp=True) if r[1].startswith("P(sum)")]
    embed, head = layers[0], layers[-2]
    assert not any(embed.tp_pending)
    assert {w.name for w, p in zip(head.weights, head.tp_pending, strict=True) if p} == {
        "lnf_scale",
        "lnf_bias",
    }
    assert not any(L.tp_pending and any(L.tp_pending) for L in sharded_layers(model, 2, 2, sp=False))


@pytest.mark.parametrize(
    "strategy", ["d2.t2.sp.p1.k2.1f1b.z1", "d1.t2.sp.p2.k2.1f1b", "d2.t2.sp.p2.k2.1f1b.z3"]
)
def test_the_step_sums_them_over_tp_in_one_call_per_stage(strategy: str) -> None:
    """After the data-parallel reduction, each stage sums its pending gradients over tp in one
    coalesced call (``finalize_model_grads``' ``_allreduce_layernorm_grads``): a Redistribute
    per pending weight in the entry, the first of each stage paying the call's latency."""
    s = parse_strategy(strategy)
    model = build_model("gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16", batch=2 * s.d * s.k)
    prog = distribute(model, s, comm_streams=True)
    n_pending = 4 * len(SP_WEIGHTS) + 2  # the blocks' and the final norm's
    names = {f"g_{w}_{i}" for w in SP_WEIGHTS for i in range(4)} | {"g_lnf_scale", "g_lnf_bias"}
    # the sums over tp (to R over tp); ZeRO-1's slices of the reduced gradient stay P over tp
    sums = [
        op
        for op in prog.entry.ops()
        if op.name == "Redistribute" and op.outputs[0].name in names and str(op.attrs["to"]).endswith(" R")
    ]
    assert len(sums) == n_pending
    assert sum(not op.attrs.get("coalesced") for op in sums) == s.p


@pytest.mark.parametrize("strategy", ["d2.t2.sp.p1.k2.1f1b.z2", "d4.t2.sp.p1.k2.1f1b.z3h2"])
def test_mixed_sequence_parallel_steps_with_the_sum_deferred_match_sequential(strategy: str) -> None:
    """Mixed precision with fp32 reductions (ZeRO-2; HSDP on (dpr, dp, tp)): the deferred tp sum
    still gives the sequential step."""
    from parallel.helpers import assert_mixed_step_matches

    assert_mixed_step_matches(GPT, strategy, comm_streams=True, reduce_fp32=True)
