"""distribute(..., fsdp2_root=True): PyTorch FSDP2 as torchtitan wraps a model — the root's
weights (embedding, head) and the last block's stay gathered from the forward to their last use in
the backward, never gathered again. Checked by hand: at the loss's backward (the peak, with a
large vocabulary) the GPU holds, besides what it holds without, the whole bf16 embedding and the
whole bf16 last block; the backward chunk gathers those weights no more; the step trains as the
sequential one."""

from __future__ import annotations

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

LAYERS, HIDDEN, KV, FFN, VOCAB = 3, 256, 128, 512, 8192
LLAMA = f"llama:layers={LAYERS},hidden={HIDDEN},heads=4,kv_heads=2,ffn={FFN},seq=512,vocab={VOCAB}"
STRATEGY = "d2.t1.p1.k1.1f1b.z3"


def _program(root: bool) -> Module:
    s = parse_strategy(STRATEGY)
    model = build_model(LLAMA, batch=4 * s.d, dtype=DType.bf16)
    return distribute(model, s, Optimizer("adam"), precision="mixed", comm_streams=True, fsdp2_root=root)


def _peak(root: bool) -> float:
    s = parse_strategy(STRATEGY)
    return simulate(_program(root), parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]


def test_the_root_and_last_block_stay_gathered_at_the_loss_backward() -> None:
    """Hand oracle: the whole embedding (vocab × hidden) and the last block (q, o: hidden²; k, v:
    hidden × kv; gate, up, down: hidden × ffn; two norms: hidden) in bf16, plus the allocator's
    reserve on them. The head's weight is gathered at that point either way (prefetched for its
    backward, or kept)."""
    block = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV + 3 * HIDDEN * FFN + 2 * HIDDEN
    extra = (VOCAB * HIDDEN + block) * 2
    frag = parse_cluster("dgx-a100").device_spec(0).runtime.fragmentation
    got = _peak(True) - _peak(False)
    assert abs(got - extra * (1 + frag)) < 1e-6 * extra


def _gathers(prog: Module, fn_prefix: str) -> int:
    return sum(
        op.name == "Redistribute" for fn in prog.functions if fn.name.startswith(fn_prefix) for op in fn.ops()
    )


def test_the_backward_gathers_only_the_other_blocks() -> None:
    """Without: every weight gathered in the backward too; with: the root's (embedding, head,
    final norm) and the last block's (9 weights) are not."""
    plain, root = _program(False), _program(True)
    assert _gathers(plain, "c0_fwd") == _gathers(root, "c0_fwd")
    assert _gathers(plain, "c0_bwd_red") - _gathers(root, "c0_bwd_red") == 3 + 9


def test_fsdp2_root_trains_as_the_sequential_step() -> None:
    model = build_model("llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16", 4, DType.f64)
    cmp = check_against_sequential(model, parse_strategy("d2.t1.p1.k2.z3.rops"), fsdp2_root=True)
    err, where = cmp.update_error()
    assert err < 1e-9, (where, err)


def test_the_reference_planner_agrees_with_both_flags() -> None:
    """The fast planner's figures equal the reference planner's on programs with the root kept
    gathered and eager checkpointing's cache (microbatches; tensor and sequence parallelism)."""
    cl = parse_cluster("dgx-a100")
    for text in ("d2.t1.p1.k2.1f1b.z3.rops", "d2.t2.sp.p1.k1.1f1b.z3.rops"):
        s = parse_strategy(text)
        model = build_model(
            "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=256,seq=32", 8, DType.bf16
        )
        prog = distribute(
            model, s, Optimizer("adam"), precision="mixed", comm_streams=True, sac_eager=True, fsdp2_root=True
        )
        fast = simulate(prog, cl, device_map(s, True))
        ref = simulate(prog, cl, device_map(s, True), planner="reference")
        assert fast.step_time_s == ref.step_time_s
        assert fast.peak_memory == ref.peak_memory
