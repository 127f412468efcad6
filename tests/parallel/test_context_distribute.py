"""Context parallelism inside ``distribute`` (``Strategy.c``; ``distir.parallel.context_model``):
the step equals the sequential one (loss, updated weights and optimizer state) on the reference
executor, for GPT (learned positions) and Llama (RoPE, grouped-query), causal attention, alone
and with data, tensor and pipeline parallelism; attention runs as a ring over ``cp`` (K/V and
dK/dV passed rank to rank with Sends, never gathered), or, with ``cp_ring=False``, gathers K/V
over ``cp`` and reduce-scatters their gradients back; weight gradients are pending sums over dp
and cp; what is not supported yet is refused by name."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.interp.annotate import annotate_types
from distir.interp.reference import run_reference
from distir.ir.dtensor import DTensorType, Partial, Replicate, Shard, parse_placements
from distir.ir.function import Module
from distir.ir.rewrite import inline_calls
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.context import balanced_positions
from distir.parallel.context_model import balanced_order, context_inputs, context_model
from distir.parallel.distribute import distribute
from distir.parallel.layer_sharder import with_cp
from distir.parallel.sharding.materialize import materialize
from distir.parallel.strategy import StrategyError, parse_strategy

GPT = "gpt:layers=2,hidden=8,heads=2,seq=16,vocab=16"
LLAMA = "llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=16"


def _check(spec: str, strategy: str, cp_ring: bool = True) -> None:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.d * s.k, dtype=DType.f64)
    cmp = check_against_sequential(model, s, cp_ring=cp_ring)
    # GPT's key bias has a zero gradient in exact arithmetic (softmax ignores it): its update is
    # rounding noise, which ``update_error`` measures against the largest update of its kind
    err, where = cmp.update_error()
    assert err < 1e-9, f"{spec} {s}: {where} differs by {err:.2e}"
    assert cmp.results["loss"][2] == pytest.approx(cmp.results["loss"][3], rel=1e-12)


@pytest.mark.parametrize("spec", [GPT, LLAMA])
@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("cp_ring", [True, False], ids=["ring", "gather"])
def test_context_parallel_step_equals_the_sequential_step(spec: str, c: int, cp_ring: bool) -> None:
    _check(spec, f"d1.t1.c{c}.p1.k1", cp_ring)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        (GPT, "d2.t1.c2.p1.k2"),
        (LLAMA, "d2.t1.c2.p1.k1"),
        (GPT, "d1.t2.c2.p1.k1"),
        (LLAMA, "d1.t2.c2.p1.k2"),
        (LLAMA, "d2.t2.c2.p1.k1"),  # 8 devices
        (GPT, "d1.t1.c2.p2.k2.1f1b"),
        (LLAMA, "d1.t1.c2.p2.k4.zb1.rsel"),
        (LLAMA, "d1.t1.c2.p2.k2.gpipe.rfull"),
    ],
)
def test_context_parallelism_combines_with_data_tensor_and_pipeline_parallelism(
    spec: str, strategy: str
) -> None:
    _check(spec, strategy)


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_context_with_sequence_parallelism_step_equals_the_sequential_step(spec: str) -> None:
    """c = 2 with t = 2 and sequence parallelism: between layers the sequence is split over cp
    and, inside each cp rank's block, over tp (``[S(0), S(1), S(1)]``, nested); causal attention
    as the ring over cp on the tp rank's heads."""
    _check(spec, "d1.t2.sp.c2.p1.k1")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        (GPT, "d2.t2.sp.c2.p1.k2"),  # 8 devices
        (LLAMA, "d2.t2.sp.c2.p1.k1"),
        (LLAMA, "d1.t4.sp.c2.p1.k1"),
        (GPT, "d1.t2.sp.c4.p1.k1"),
        (GPT, "d1.t2.sp.c2.p2.k2.1f1b"),
        (LLAMA, "d1.t2.sp.c2.p2.k4.zb1.rsel"),
        (LLAMA, "d1.t2.sp.c2.p2.k2.1f1b.z1.rfull"),
    ],
)
def test_context_with_sequence_parallelism_combines_with_data_and_pipeline_parallelism(
    spec: str, strategy: str
) -> None:
    _check(spec, strategy)


def test_context_with_sequence_parallelism_moves_the_sequence_over_tp_inside_each_cp_block() -> None:
    """The layer boundaries nest the sequence (cp, then tp within each cp rank's block); the
    tensor-parallel collectives are Megatron's sequence-parallel ones — AllGather and
    ReduceScatter over tp on the sequence dim of the cp rank's block — and nothing moves over cp
    but the ring's Sends and the gradients' reductions."""
    s = parse_strategy("d2.t2.sp.c2.p1.k1")
    model = build_model(GPT, batch=2, dtype=DType.f64)
    mod = distribute(model, s)
    entry = annotate_types(Module((inline_calls(mod),))).entry
    nested = (Shard(0), Shard(1), Shard(1))
    block = mod["block_fwd"]
    moves = [(op.inputs[0].name, str(op.attrs["to"])) for op in block.ops() if op.name == "Redistribute"]
    assert moves == [
        ("ln1", "S(0), S(1), R"),  # AllGather over tp: the cp rank's block
        ("o_xw", "S(0), S(1), S(1)"),  # ReduceScatter over tp: P(sum) -> S(1) inside the block
        ("ln2", "S(0), S(1), R"),
        ("fc2_xw", "S(0), S(1), S(1)"),
    ]
    xs = [v.type for op in entry.ops() for v in op.outputs if v.name.startswith("x_mlp")]
    assert xs and all(isinstance(t, DTensorType) and t.placements == nested for t in xs)
    kinds = Counter(_materialized_ops(mod))
    assert kinds["AllToAll"] == 0
    assert kinds["ReduceScatter"] > 0 and kinds["AllGather"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy", "precision"),
    [
        (LLAMA, "d2.t1.c2.p2.k2.z1", "pure"),  # 8 devices
        (GPT, "d1.t2.c2.p1.k2.z3", "mixed"),
        (LLAMA, "d2.t1.c2.p1.k2.z2", "mixed"),
    ],
)
def test_context_parallelism_with_zero_over_dp_and_cp_communication_streams_and_mixed_precision(
    spec: str, strategy: str, precision: str
) -> None:
    """ZeRO shards over the d·c ranks (``Strategy.zero_degree``: the weights live on the stage's
    devices seen as (dp·cp, tp)); the program with communication streams, as the search
    simulates it; Adam, mixed bf16 against the sequential mixed step."""
    s = parse_strategy(strategy)
    dtype = DType.bf16 if precision == "mixed" else DType.f64
    model = build_model(spec, batch=s.d * s.k, dtype=dtype)
    cmp = check_against_sequential(model, s, Optimizer("adam"), comm_streams=True, precision=precision)
    err, where = cmp.update_error()
    assert err < (1e-4 if precision == "mixed" else 1e-9), (where, err)


@pytest.mark.parametrize("strategy", ["d4.t1.c2.p1.k2.z3h2", "d4.t1.c2.p2.k2.1f1b.z3h2.rfull"])
def test_context_parallelism_with_hsdp_equals_the_sequential_step(strategy: str) -> None:
    """HSDP over dp × cp (torchtitan's ``dp_shard`` × ``cp`` mesh, replicated over
    ``dp_replicate``): ZeRO-3 shards within a group of h replicas' h·c ranks and all-reduces the
    shard across the d/h groups; the step equals the sequential one (causal attention, Adam,
    communication streams)."""
    s = parse_strategy(strategy)
    model = build_model(LLAMA, batch=s.d * s.k, dtype=DType.f64)
    cmp = check_against_sequential(model, s, Optimizer("adam"), comm_streams=True)
    err, where = cmp.update_error()
    assert err < 1e-9, (where, err)
    assert cmp.results["loss"][2] == pytest.approx(cmp.results["loss"][3], rel=1e-12)


def test_hsdp_with_context_parallelism_shards_over_a_group_of_replicas_and_their_context_ranks() -> None:
    """d4.c2.z3h2: each weight lives on the (dpr = 2, dp = h·c = 4, tp) view of the stage's 8
    devices, replicated over dpr and sharded over the 4 ranks of one group (2 replicas × 2
    context ranks, consecutive devices)."""
    s = parse_strategy("d4.t1.c2.p1.k1.z3h2")
    model = build_model(LLAMA, batch=4, dtype=DType.f64)
    entry = distribute(model, s, Optimizer("adam")).entry
    w = next(p for p in entry.params if p.name == model.weights[0].name)
    t = w.type
    assert isinstance(t, DTensorType)
    assert t.mesh.shape == (2, 4, 1)
    assert t.placements[0] == Replicate() and isinstance(t.placements[1], Shard)
    assert [d.id for d in t.mesh.devices] == list(range(8))


def test_the_reordered_sequence_with_its_positions_is_the_same_model() -> None:
    """Independent of distribute: the positioned model on the balanced order computes the
    original model's loss (the loss is a mean over tokens)."""
    for spec in (GPT, LLAMA):
        model = build_model(spec, batch=2, dtype=DType.f64)
        vals = model.random_inputs(3)
        want = run_reference(model.module, [vals[p.name] for p in model.forward.params])[0]
        cm = context_model(model, 4)
        moved = context_inputs(model, 4, vals)
        got = run_reference(cm.module, [moved[p.name] for p in cm.forward.params])[0]
        assert float(got) == pytest.approx(float(want), rel=1e-12)


def test_balanced_order_gives_rank_i_chunks_i_and_2c_minus_1_minus_i() -> None:
    order = balanced_order(16, 4)  # chunks of 2
    assert order.tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    for r in range(4):
        assert order[4 * r : 4 * (r + 1)].tolist() == balanced_positions(16, 4, r).tolist()


def _materialized_ops(mod: Module) -> list[str]:
    entry = annotate_types(Module((inline_calls(mod),))).entry
    return [op.name for op in materialize(Module((entry,))).entry.ops()]


def test_without_the_ring_keys_and_values_are_gathered_over_cp_and_their_gradients_scattered_back() -> None:
    s = parse_strategy("d1.t1.c2.p1.k1")
    model = build_model(LLAMA, batch=1, dtype=DType.f64)
    mod = distribute(model, s, cp_ring=False)
    fwd = mod["block_fwd"]
    over_cp = {
        op.inputs[0].name: parse_placements(str(op.attrs["to"]))[1]
        for op in fwd.ops()
        if op.name == "Redistribute"
    }
    assert over_cp["k_rope"] == over_cp["vh"] == Replicate()  # whole K/V for the rank's queries
    att = next(op for op in fwd.ops() if op.name == "Attention")
    assert att.inputs[1].name.startswith("k_rope_") and att.inputs[2].name.startswith("vh_")
    # backward: dK, dV come out as pending sums over cp (each rank's queries' part) and go back
    # to the keys' owners, sequence-sharded: P(sum) -> S(1) over cp is a reduce-scatter
    kinds = _materialized_ops(mod)
    assert "AllGather" in kinds and "ReduceScatter" in kinds
    assert "Send" not in kinds


@pytest.mark.parametrize("c", [2, 4])
def test_the_ring_passes_keys_and_values_rank_to_rank_and_gathers_nothing(c: int) -> None:
    """Attention and its gradient keep K/V split along the sequence over cp (``ring=c``); once
    materialized, each ring step's transfers are Sends: per layer and ring, forward c−1 steps of
    K and V of both chunks (4 Sends per rank), backward K/V c−1 times and dK/dV c times; every
    unmasked block of the causal triangle computed once per pass, the masked ones never."""
    s = parse_strategy(f"d1.t1.c{c}.p1.k1")
    model = build_model(LLAMA, batch=1, dtype=DType.f64)
    mod = distribute(model, s)
    att = next(op for op in mod["block_fwd"].ops() if op.name == "Attention")
    assert att.attrs["ring"] == c
    assert all(not n.startswith("k_rope_") for n in (att.inputs[1].name, att.inputs[2].name))
    kinds = Counter(_materialized_ops(mod))
    assert kinds["AllGather"] == kinds["ReduceScatter"] == 0
    layers = 2
    sends_per_layer = 4 * c * ((c - 1) + (c - 1) + c)  # forward K/V, backward K/V and dK/dV
    assert kinds["Send"] == layers * sends_per_layer
    # the causal triangle in 2c × 2c chunk blocks: (2c)(2c+1)/2 unmasked, each computed once
    # per pass; skipped blocks are not computed at all
    blocks = (2 * c) * (2 * c + 1) // 2
    assert kinds["Attention"] == layers * blocks
    assert kinds["AttentionGrad"] == layers * blocks


def test_weight_gradients_are_pending_over_dp_and_cp() -> None:
    """Each weight's gradient leaves the layers as a pending sum over dp and cp, is seen on the
    (dp·cp, tp) view of the same devices and all-reduced there: cp acts like dp for weights."""
    assert with_cp("S(0), R", 2) == "S(0), S(1), R"
    assert with_cp("R, S(1)", 2) == "R, R, S(1)"
    assert with_cp("P(sum), R", 2) == "P(sum), P(sum), R"
    assert with_cp("S(0), R", 1) == "S(0), R"
    s = parse_strategy("d2.t1.c2.p1.k1")
    model = build_model(LLAMA, batch=2, dtype=DType.f64)
    entry = annotate_types(Module((inline_calls(distribute(model, s)),))).entry
    viewed: dict[object, object] = {}
    reduced = 0
    for op in entry.ops():
        t = op.inputs[0].type if op.inputs else None
        if (
            op.name == "MeshView"
            and isinstance(t, DTensorType)
            and t.placements[:2] == (Partial(), Partial())
        ):
            out = op.outputs[0].type
            assert out.mesh.shape == (4, 1) and out.placements[0] == Partial()  # dp·cp = 4
            viewed[op.outputs[0]] = op
        elif op.name == "Redistribute" and op.inputs[0] in viewed:
            assert op.outputs[0].type.placements[0] == Replicate()
            reduced += 1
    assert reduced == len(model.weights)  # one all-reduce over dp × cp per weight (DDP)


def test_inputs_are_split_along_the_sequence_over_cp() -> None:
    s = parse_strategy("d2.t1.c2.p1.k1")
    model = build_model(GPT, batch=2, dtype=DType.f64)
    entry = distribute(model, s).entry
    ids = next(p for p in entry.params if p.name == "ids")
    assert ids.type.placements == (Shard(0), Shard(1), Replicate())
    assert any(p.name == "pos" for p in entry.params)


@pytest.mark.parametrize(
    ("strategy", "named"),
    [
        ("d2.t1.c2.p1.k1.b1-3", "batch shares"),
    ],
)
def test_unsupported_combinations_are_refused_by_name(strategy: str, named: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=4, dtype=DType.f64)
    with pytest.raises(StrategyError, match=named):
        distribute(model, s)


def test_a_sequence_that_does_not_cut_into_2c_chunks_is_refused() -> None:
    model = build_model("gpt:layers=1,hidden=8,heads=2,seq=12,vocab=16", batch=1, dtype=DType.f64)
    with pytest.raises(StrategyError, match="2c = 8"):
        distribute(model, parse_strategy("d1.t1.c4.p1.k1"))


def test_explicit_causal_mask_is_refused() -> None:
    model = build_model(GPT + ",attention=naive", batch=1, dtype=DType.f64)
    with pytest.raises(StrategyError, match="CausalMask"):
        distribute(model, parse_strategy("d1.t1.c2.p1.k1"))


def test_positions_input_is_the_balanced_order() -> None:
    model = build_model(GPT, batch=3, dtype=DType.f64)
    moved = context_inputs(model, 2, model.random_inputs(0))
    assert moved["pos"].shape == (3, 16)
    assert np.array_equal(moved["pos"][1], balanced_order(16, 2))
