"""FSDP2 under a pipeline as torchtitan runs it: ``fully_shard(reshard_after_forward=False)`` on
every block and chunk (torchtitan's ``apply_fsdp`` with PP) and ``torch.distributed.pipelining``'s
no-sync backwards (``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)`` in
all but a stage's last backward) — ``distribute``'s ZeRO-2 under a pipeline with
``overlap_param_gather``, ``fp32_grad_accum``, ``reduce_fp32`` and ``fsdp2_grad_accum``. Each chunk's
weights are all-gathered once per step (its first forward) and its gradients reduce-scattered once
(its last backward); the peak holds the stage's whole bf16 weights and whole fp32 gradient sums
(closed form); the fp32 accumulation per layer holds one layer's bf16 gradient, not the stage's;
and the training step equals the sequential mixed step."""

from __future__ import annotations

from collections import Counter

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=1,ffn=16,seq=4,vocab=16"
FSDP2_PP = {
    "overlap_param_gather": True,
    "fp32_grad_accum": True,
    "reduce_fp32": True,
    "fsdp2_grad_accum": True,
}


@pytest.mark.slow
@pytest.mark.parametrize("spec", [GPT, LLAMA])
@pytest.mark.parametrize("strategy", ["d2.t1.p2.k4.interleaved.v2.z2", "d2.t2.sp.p2.k4.1f1b.z2"])
@pytest.mark.parametrize("streams", [False, True])
def test_step_equals_the_sequential_mixed_step(spec: str, strategy: str, streams: bool) -> None:
    assert_mixed_step_matches(spec, strategy, comm_streams=streams, **FSDP2_PP)


def _program(strategy: str, spec: str = GPT, **options: bool) -> Module:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    return distribute(model, s, Optimizer("adam"), precision="mixed", **options)


def _redistributes(prog: Module, name: str) -> list[str]:
    """The target placements of the ``Redistribute`` ops of function ``name``."""
    return [str(op.attrs["to"]) for op in prog[name].ops() if op.name == "Redistribute"]


def test_each_chunk_gathers_once_and_reduce_scatters_once_per_step() -> None:
    prog = _program("d2.t1.p2.k4.interleaved.v2.z2", **FSDP2_PP)
    calls = Counter(c.callee for c in prog.entry.calls())
    # between steps the bf16 copies are this rank's shards (FSDP2's sharded parameters; a
    # weight with no dimension to shard over dp stays whole)
    copies = [p for p in prog.entry.params if p.name.endswith("_bf16")]
    sharded = [
        p for p in copies if isinstance(p.type, DTensorType) and isinstance(p.type.placements[0], Shard)
    ]
    assert len(sharded) > len(copies) // 2
    for c in range(4):  # 2 stages × 2 chunks
        # one gathering forward, the other three forwards gather nothing
        assert calls[f"c{c}_fwd_gather"] == 1 and calls[f"c{c}_fwd"] == 3
        assert _redistributes(prog, f"c{c}_fwd") == []
        gathered = _redistributes(prog, f"c{c}_fwd_gather")
        assert gathered and all(t.startswith("R") for t in gathered)  # all-gathers over dp
        # one reducing backward (the last microbatch's), the other three reduce nothing
        red = [n for n in calls if n.startswith(f"c{c}_bwd") and n.endswith("_red")]
        assert len(red) == 1 and calls[red[0]] == 1
        assert sum(calls[n] for n in calls if n.startswith(f"c{c}_bwd")) == 4
        for n in calls:
            if n.startswith(f"c{c}_bwd") and n != red[0]:
                assert _redistributes(prog, n) == []
        scattered = [t for t in _redistributes(prog, red[0]) if t.startswith("S")]
        # each gathered weight's gradient reduce-scattered back to its shard, once
        assert len(scattered) == len(gathered)


def test_zero_3_gathers_in_every_microbatch() -> None:
    """The contrast: per-microbatch ZeRO-3 gathers in all four forwards of a chunk."""
    prog = _program("d2.t1.p2.k4.interleaved.v2.z3")
    calls = Counter(c.callee for c in prog.entry.calls())
    assert calls["c0_fwd"] == 4 and _redistributes(prog, "c0_fwd")


MLP = "mlp:layers=64,hidden=256"  # 64 layers of 256 × 256, no biases: 32 per stage of p = 2


def _tensor_peak(strategy: str, **options: bool) -> tuple[float, int]:
    """(the busiest GPU's simulated peak tensor bytes, the parameters per GPU Ψ_s = Ψ / p)."""
    s = parse_strategy(strategy)
    model = build_model(MLP, batch=2 * s.d * s.k, dtype=DType.bf16)
    prog = distribute(
        model, s, Optimizer("adam"), comm_streams=True, precision="mixed", bucket_mb=0.25, **options
    )
    r = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True))
    return max(r.peak_memory[g] - r.runtime_memory[g] for g in r.peak_memory), model.num_params // s.p


@pytest.mark.parametrize("n", [2, 4])
def test_the_peak_holds_whole_bf16_weights_and_fp32_gradient_sums(n: int) -> None:
    """Per GPU: the gathered bf16 weights 2Ψ_s and the fp32 gradient sums 4Ψ_s whole, the fp32
    master, Adam's m and v and the bf16 shard 14Ψ_s/N sharded; beyond that at most one layer's
    bf16 gradient and fp32 cast, two 0.25 MiB buckets, the optimizer's transients for one layer
    (16 bytes a parameter) and the activations (4 microbatches in flight, each layer's input and
    output, 2 × 2 × 256 values each)."""
    peak, psi = _tensor_peak(f"d{n}.t1.p2.k4.1f1b.z2", **FSDP2_PP)
    state = (2 + 4) * psi + 14 * psi / n
    layer = 256 * 256
    bound = 6 * layer + 2 * 0.25 * (1 << 20) + 16 * layer + 4 * 32 * 2 * 2 * 2 * 256 * 2
    assert state <= peak <= state + bound, (peak / psi, state / psi, bound / psi)
    z3, _ = _tensor_peak(f"d{n}.t1.p2.k4.1f1b.z3")
    assert z3 < 16 * psi / n + bound  # the contrast: per-microbatch ZeRO-3 holds only shards


def test_fsdp2_grad_accum_holds_one_layers_bf16_gradient_not_the_stages() -> None:
    """Without it the fp32 accumulation runs after the whole backward (DeepSpeed's
    ``update_hp_grads``), so the stage's whole bf16 gradient 2Ψ_s is live first."""
    opts = dict(FSDP2_PP)
    per_layer, psi = _tensor_peak("d2.t1.p2.k4.1f1b.z2", **opts)
    opts["fsdp2_grad_accum"] = False
    whole, _ = _tensor_peak("d2.t1.p2.k4.1f1b.z2", **opts)
    layer = 256 * 256
    assert whole - per_layer >= 2 * psi - 4 * 2 * layer


def test_fsdp2_grad_accum_without_fp32_grad_accum_is_refused() -> None:
    base = {k: v for k, v in FSDP2_PP.items() if k not in ("fp32_grad_accum", "fsdp2_grad_accum")}
    with pytest.raises(StrategyError, match="needs fp32_grad_accum"):
        _program("d2.t1.p2.k4.1f1b.z2", **base, fsdp2_grad_accum=True)


@pytest.mark.parametrize("strategy", ["d1.t1.c2.p2.k4.1f1b.z2", "d2.t1.c2.p2.k4.1f1b.z2"])
def test_context_parallel_ranks_shard_and_gather_as_data_parallel_ones(strategy: str) -> None:
    """torchtitan shards with FSDP2 over ``dp_shard_cp`` whenever cp > 1, even with one
    data-parallel shard (``parallelize_llama`` at 9dec370: ``dp_shard_enabled or cp_enabled``):
    with d = 1 and c = 2 each chunk still gathers its weights in its first forward only."""
    prog = _program(strategy, LLAMA, **FSDP2_PP)
    calls = Counter(c.callee for c in prog.entry.calls())
    for c in range(2):
        assert calls[f"c{c}_fwd_gather"] == 1 and calls[f"c{c}_fwd"] == 3
        assert _redistributes(prog, f"c{c}_fwd_gather")


@pytest.mark.slow
def test_step_with_one_data_parallel_shard_over_cp_equals_the_sequential_mixed_step() -> None:
    assert_mixed_step_matches(LLAMA, "d1.t1.c2.p2.k4.1f1b.z2", comm_streams=True, **FSDP2_PP)
