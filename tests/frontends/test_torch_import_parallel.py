"""Imported models distribute like zoo models: the tensor-parallel (and pipelined, sequence-
parallel) training step of an imported GPT-2, Llama and Mixtral equals the sequential step, with the
weights' placements from the name patterns."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from distir.frontends.zoo import build_model
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.ir.dtensor import Replicate, Shard
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.strategy import parse_strategy

CONFIGS = Path(__file__).parent / "configs"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "strategy"),
    [
        ("gpt2-tiny", "d1.t2.p1.k1"),
        ("gpt2-tiny", "d2.t2.sp.p1.k2"),
        ("gpt2-tiny", "d1.t2.p2.k2.1f1b"),
        ("llama-tiny", "d1.t2.p1.k1"),
        ("mixtral-tiny", "d2.t1.p1.k1"),  # MoE: tokens split
        ("mixtral-tiny", "d1.t2.p1.k1"),  # MoE: the experts' hidden dim split
        ("mixtral-tiny", "d1.t1.p2.k2.1f1b"),
    ],
)
def test_distributed_training_step_equals_sequential(config: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(f"hf:{CONFIGS / config}.json", batch=s.k * s.d * 2, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{strategy}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    check_deadlock_free(project(cmp.materialized))


@pytest.mark.slow
def test_megatron_placements_from_name_patterns() -> None:
    model = build_model(f"hf:{CONFIGS / 'llama-tiny'}.json", batch=2)
    tp = {w.name: w.tp for w in model.weights}
    assert tp["model.layers.0.self_attn.q_proj.weight"] == Shard(1)  # column: (in, out) sharded on out
    assert tp["model.layers.0.mlp.up_proj.weight"] == Shard(1)
    assert tp["model.layers.1.self_attn.o_proj.weight"] == Shard(0)  # row
    assert tp["model.layers.1.mlp.down_proj.weight"] == Shard(0)
    assert tp["model.layers.0.input_layernorm.weight"] == Replicate()
    assert tp["model.embed_tokens.weight"] == Shard(0)  # vocabulary-parallel embedding
    assert tp["lm_head.weight"] == Shard(1)  # (hidden, vocab): the logits sharded on the vocabulary
    assert model.loss_input_tp == Shard(2)


@pytest.mark.slow
def test_tied_embedding_is_sharded_on_the_vocabulary() -> None:
    """GPT-2 ties its head to the token embedding: one weight (vocab, hidden), read by the
    embedding and (transposed) by the head, sharded on the vocabulary."""
    model = build_model(f"hf:{CONFIGS / 'gpt2-tiny'}.json", batch=2)
    (tied,) = model.tied
    w = model.weight(tied)
    assert w.type.shape == (32, 16)
    assert w.tp == Shard(0)


@pytest.mark.parametrize("strategy", ["d2.t2.p1.k2.1f1b", "d1.t2.sp.p2.k4.zb1.rfull", "d4.t1.p1.k2.1f1b.z3"])
@pytest.mark.parametrize("kernels", ["fused", "eager"])
def test_an_imported_llama_simulates_as_the_zoo_llama_of_its_shape(strategy: str, kernels: str) -> None:
    """HF's LlamaMLP runs F.silu: imported as one Silu, as the zoo's ``silu=fused``, the program
    costs and holds what the zoo model's does (x·Sigmoid(x) saved the sigmoid too: a tensor the
    size of the MLP's hidden activation per layer)."""
    import json

    from typer.testing import CliRunner

    from distir.cli import app

    zoo = "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=24,vocab=32,seq=8,rope_theta=500000,silu=fused"
    got = []
    for model in (f"hf:{CONFIGS / 'llama-tiny.json'}", zoo):
        args = ["simulate", "--model", model, "--strategy", strategy, "--batch", "8", "--cluster", "dgx-a100"]
        r = CliRunner().invoke(app, [*args, "--kernels", kernels, "--json"])
        assert r.exit_code == 0, r.stderr
        got.append(json.loads(r.stdout))
    for key in ("step_time_s", "peak_memory_bytes", "ops"):
        assert got[0][key] == got[1][key], key
