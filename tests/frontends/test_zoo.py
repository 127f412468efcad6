"""The model zoo at its real sizes: every entry builds (types only, no weight arrays) and keeps
the chain contract; parameter counts equal closed forms written here and the published
figures; FLOP counts; model strings and their errors; ``distir models``."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from distir.cli import app
from distir.frontends.zoo import ZOO, ModelError, build_model, check_model, parse_model_string, zoo_table
from distir.frontends.zoo._build import LayerCall, LayerFn, assemble, tensor, weight
from distir.frontends.zoo.model import InputSpec
from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain, type_of
from distir.ir.dtensor import Replicate, Shard
from distir.ir.types import DType
from distir.ops.registry import REGISTRY


# -- closed-form parameter counts (independent of the builders) --------------------------------
def closed_form_params(family: str, c: dict[str, Any]) -> int:
    if family == "mlp":
        return c["layers"] * c["hidden"] ** 2
    if family == "gpt":
        h, v = c["hidden"], c["vocab"]
        block = 4 * (h * h + h) + 2 * (4 * h * h) + 4 * h + h + 2 * 2 * h  # qkvo, mlp, b1, b2, norms
        return v * h + c["seq"] * h + c["layers"] * block + 2 * h + h * v
    if family == "llama":
        h, v, kv = c["hidden"], c["vocab"], c["kv_heads"] * (c["hidden"] // c["heads"])
        block = 2 * h * h + 2 * h * kv + 3 * h * c["ffn"] + 2 * h
        return v * h + c["layers"] * block + h + h * v
    if family == "nemotron":  # llama's less the gate, LayerNorm1p's scale and bias
        h, v, kv = c["hidden"], c["vocab"], c["kv_heads"] * (c["hidden"] // c["heads"])
        block = 2 * h * h + 2 * h * kv + 2 * h * c["ffn"] + 4 * h
        return v * h + c["layers"] * block + 2 * h + h * v
    assert family == "transgan"
    return transgan_repository_params(c) - transgan_unapplied_params(c)


# -- AMP's TransGAN generator, as its repository configures it ---------------------------------
# github:DachengLi1/AMP @ 72eeea45518d88997dd33c0db4a885a7eeec1d15: src/het_model.py (hidden_size
# 1024, depth [12,0,0,0,0,12], bottom 9), examples/ds_pretrain_transgan_pipe.sh (--g_window_size
# 18, --latent_dim 512, --gf_dim = hidden), megatron/arguments.py (--g_mlp 4) and
# megatron/model/trans_gan_gen.py (ParallelTransGANGeneratorPipe: num_heads 4; the widths
# gf_dim, gf_dim, gf_dim, gf_dim//4, gf_dim//16, gf_dim//64; position embeddings of
# (bottom_width·2^k)² tokens; stages 1-3 attend over the whole grid, 4-6 in windows).
AMP_REPO = {
    "g_depth": (12, 0, 0, 0, 0, 12),
    "gf_dim": 1024,
    "bottom_width": 9,
    "g_window_size": 18,
    "latent_dim": 512,
    "num_heads": 4,
    "g_mlp": 4,
}
WIDTH_DIV = (1, 1, 1, 4, 16, 64)


def _stages(c: dict[str, Any]) -> list[dict[str, int]]:
    """Per stage of the generator written from the config dict of the zoo (c) or the repo."""
    depth = (c["wide_layers"], 0, 0, 0, 0, c["narrow_layers"])
    out = []
    for k in range(6):
        res = c["bottom"] * 2**k
        win = res if k < 3 else c["window"]  # the pipe passes bottom_width·2^k to stages 1-3
        out.append({"depth": depth[k], "res": res, "width": c["dim"] // WIDTH_DIV[k], "win": win})
    return out


def transgan_repository_params(c: dict[str, Any]) -> int:
    """The parameters ``ParallelTransGANGeneratorPipe`` allocates (tensor parallelism 1)."""
    total = c["latent"] * c["bottom"] ** 2 * c["dim"] + c["bottom"] ** 2 * c["dim"]  # l1
    for s in _stages(c):
        h, ff = s["width"], c["mlp"] * s["width"]
        total += s["res"] ** 2 * h  # PositionEmbedding
        block = (3 * h * h + 3 * h) + (h * h + h) + (h * ff + ff) + (ff * h + h)  # qkv, proj, fc1, fc2
        block += (2 * s["win"] - 1) ** 2 * c["heads"] + 1  # relative position bias, noise_strength_1
        total += s["depth"] * block
    return total + 3 * c["dim"] // 64 + 3  # Conv2d(dim/64, 3, 1)


def transgan_unapplied_params(c: dict[str, Any]) -> int:
    """Parameters the zoo model leaves out (its docstring): the biases the repository allocates
    but discards (skip_bias_add: proj, fc1, fc2), the relative position bias tables and the noise
    strengths."""
    total = 0
    for s in _stages(c):
        h = s["width"]
        total += s["depth"] * (h + c["mlp"] * h + h + (2 * s["win"] - 1) ** 2 * c["heads"] + 1)
    return total


def test_transgan_follows_amps_repository() -> None:
    r = AMP_REPO
    cfg = dataclasses.asdict(ZOO["transgan-hetero"].config)
    assert (cfg["wide_layers"], cfg["narrow_layers"]) == (r["g_depth"][0], r["g_depth"][5])
    assert (cfg["dim"], cfg["bottom"], cfg["window"]) == (r["gf_dim"], r["bottom_width"], r["g_window_size"])
    assert (cfg["latent"], cfg["heads"], cfg["mlp"]) == (r["latent_dim"], r["num_heads"], r["g_mlp"])
    m = build_model("transgan-hetero", 1)
    # position embeddings: (bottom·2^k)² tokens of width gf_dim / (1, 1, 1, 4, 16, 64)
    pos = [m.weight(f"pos_{k + 1}").type.shape for k in range(6)]
    assert pos == [((9 * 2**k) ** 2, 1024 // d) for k, d in enumerate(WIDTH_DIV)]
    assert [t[0] for t in pos] == [81, 324, 1296, 5184, 20736, 82944]
    # the blocks: 12 of width 1024 on 81 tokens (global), 12 of width 16 on 288² tokens in
    # windows of 18² (256 per image)
    _, env = interpret(m.module, m.forward, [p.type for p in m.forward.params], TypeDomain())
    blocks = [c for c in m.layers if c.callee.startswith("block_")]
    shapes = [type_of(env[c.inputs[0]]).shape for c in blocks]  # type: ignore[union-attr]
    assert shapes == [(1, 81, 1024)] * 12 + [(256, 324, 16)] * 12
    assert 256 * 324 == 288**2 == pos[5][0]
    assert [m.weight(f"w1_{i}").type.shape for i in range(24)] == [(1024, 4096)] * 12 + [(16, 64)] * 12
    assert [c.callee for c in m.layers] == ["stem"] + ["block_1"] * 12 + ["up_6"] + ["block_6"] * 12 + [
        "to_rgb",
        "loss",
    ]
    repo = {"wide_layers": 12, "narrow_layers": 12, "dim": 1024, "bottom": 9, "window": 18}
    repo |= {"latent": 512, "heads": 4, "mlp": 4}
    # by hand: l1 42,550,272 + pos 5,723,136 + 12 × 12,593,285 + 12 × 8,117 + conv 51
    assert transgan_repository_params(repo) == 199_490_283
    assert m.num_params == transgan_repository_params(repo) - transgan_unapplied_params(repo)


def _matmul_flops(m: Any, callee: str) -> float:
    """Forward MatMul FLOPs of the first call of ``callee`` at batch 1, by the registry."""
    _, env = interpret(m.module, m.forward, [p.type for p in m.forward.params], TypeDomain())
    call = next(c for c in m.layers if c.callee == callee)
    _, inner = interpret(m.module, m.module[callee], [type_of(env[v]) for v in call.inputs], TypeDomain())
    total = 0.0
    for op in m.module[callee].body:
        if op.name == "MatMul":
            ins = [type_of(inner[v]) for v in op.inputs]
            total += REGISTRY["MatMul"].flops(ins, [type_of(inner[op.outputs[0]])], op.attrs)
    return total


def test_transgan_narrow_blocks_cost_as_much_as_the_wide() -> None:
    """Per sample, a block of N tokens of width h attending over rows of S tokens does
    2·N·12h² (q, k, v, o, fc1, fc2) + 2·2·N·S·h (scores and context) multiply-add FLOPs: the
    narrow high-resolution blocks cost more than the wide ones."""
    m = build_model("transgan-hetero:attention=naive", 1)  # the explicit score and context matmuls
    wide = 2 * 81 * 12 * 1024**2 + 4 * 81 * 81 * 1024
    narrow = 2 * 288**2 * 12 * 16**2 + 4 * 288**2 * 324 * 16
    assert _matmul_flops(m, "block_1") == wide
    assert _matmul_flops(m, "block_6") == narrow
    assert narrow > wide


# published sizes; GPT counts exclude the untied output projection (hidden·vocab). GPT-2's
# "117M" and "1542M" are 124M and 1558M as released (the paper's counts are known to be off);
# GPT-3 13B was trained at width 5140 (the zoo uses 5120); Llama counts as released.
PUBLISHED = {
    "mlp-1b": 1.07e9,
    "mlp-17b": 17.2e9,
    "mlp-103b": 103e9,
    "gpt2-117m": 124.4e6,
    "gpt2-1.6b": 1.558e9,
    "gpt2-13b": 13.0e9,
    "gpt2-175b": 175.0e9,
    "llama2-7b": 6.738e9,
    "llama2-13b": 13.016e9,
    "llama2-70b": 68.977e9,
    "llama3-8b": 8.030e9,
    "llama3-405b": 405.85e9,  # Meta's released config (embedding and head untied)
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_entry_builds_at_real_size(name: str) -> None:
    tracemalloc.start()
    try:
        m = build_model(name, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20, f"{name}: {peak / 2**20:.0f} MiB allocated (types only: no weight is)"
    check_model(m)
    assert m.batch == 8 and all(i.type.shape[0] == 8 for i in m.inputs)
    e = ZOO[name]
    cfg = dataclasses.asdict(e.config)
    assert m.num_params == closed_form_params(e.family, cfg)
    if name in PUBLISHED:
        untied = cfg["hidden"] * cfg["vocab"] if e.family == "gpt" else 0
        assert (m.num_params - untied) == pytest.approx(PUBLISHED[name], rel=0.015)
    # the loss layer takes no weights
    loss = m.layers[-1]
    assert not set(loss.inputs[1:]) & set(m.forward.params[len(m.inputs) :])


def test_tensor_parallel_declarations() -> None:
    gpt = build_model("gpt2-117m:layers=1", 2)
    want = {"wq_0": Shard(1), "bq_0": Shard(0), "wo_0": Shard(0), "bo_0": Replicate()}
    want |= {"w1_0": Shard(1), "b1_0": Shard(0), "w2_0": Shard(0), "b2_0": Replicate()}
    # Megatron's vocabulary-parallel embedding and head; position embeddings replicated
    want |= {"wte": Shard(0), "wpe": Replicate(), "wlm": Shard(1)}
    assert {k: gpt.weight(k).tp for k in want} == want
    assert gpt.loss_input_tp == Shard(2)  # logits (batch, seq, vocab) sharded on the vocabulary
    llama = build_model("llama3-8b:layers=1", 1)
    assert [llama.weight(f"{n}_0").tp for n in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")] == [
        Shard(1),
        Shard(1),
        Shard(1),
        Shard(0),
        Shard(1),
        Shard(1),
        Shard(0),
    ]
    assert llama.weight("wk_0").type.shape == (4096, 1024)  # 8 kv heads of 128
    assert (llama.weight("tok_emb").tp, llama.weight("wlm").tp, llama.loss_input_tp) == (
        Shard(0),
        Shard(1),
        Shard(2),
    )
    mlp = build_model("mlp:layers=4,hidden=8", 2)
    assert [w.tp for w in mlp.weights] == [Shard(1), Shard(0), Shard(1), Shard(0)]


def test_loss_forms_take_the_logits_as_their_kernels_do() -> None:
    """Sharded on the vocabulary but for ``torch`` (F.cross_entropy on whole logits); ``fused``
    reads them in the compute dtype; ``parallel`` (torch's loss_parallel) ends in NllLossParts."""
    spec = "llama:layers=1,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4"
    got = {f: build_model(f"{spec},loss={f}", 2) for f in ("fp32", "fused", "torch", "parallel")}
    assert {f: m.loss_input_tp for f, m in got.items()} == {
        "fp32": Shard(2),
        "fused": Shard(2),
        "torch": Replicate(),
        "parallel": Shard(2),
    }
    assert [f for f, m in got.items() if m.loss_dtype is DType.f32] == ["fused"]
    loss = got["parallel"].module[got["parallel"].layers[-1].callee]
    assert [op.name for op in loss.ops()][-4:] == ["Sub", "NllLossParts", "ReduceSum", "Scale"]


def test_flops_per_sample() -> None:
    # MLP, exactly from the registry's costs: MatMul 2mnk, Relu 1, MSELoss 3 per element, Scale 1
    layers, h = 3, 8
    m = build_model(f"mlp:layers={layers},hidden={h}", 5)
    assert m.flops_per_sample == layers * (2 * h * h + h) + 3 * h + 1
    # GPT-2: 2·(matmul weights)·seq + attention per layer, plus a few % of elementwise work;
    # attention as FlashAttention-2 counts it (fused, the default): 4·seq²·hidden halved for the
    # causal mask; the naive form computes the whole S×S products: 2·2·seq²·hidden
    c = dataclasses.asdict(ZOO["gpt2-117m"].config)
    big = build_model("gpt2-117m", 2)
    L, H, S, V = c["layers"], c["hidden"], c["seq"], c["vocab"]
    matmul = 2 * S * (L * 12 * H * H + H * V) + L * 2 * S * S * H
    assert 1.0 < big.flops_per_sample / matmul < 1.05
    naive = build_model("gpt2-117m:attention=naive", 2)
    assert 1.0 < naive.flops_per_sample / (matmul + L * 2 * S * S * H) < 1.05
    # does not depend on the batch the model is built for
    assert build_model("gpt2-117m", 7).flops_per_sample == big.flops_per_sample


def test_dtype_applies_to_floats_only() -> None:
    m = build_model("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16", 2, DType.bf16)
    assert {w.type.dtype for w in m.weights} == {DType.bf16}
    assert [i.type.dtype for i in m.inputs] == [DType.i64, DType.i64]


# -- model strings ----------------------------------------------------------------------------
def test_parse_family_string() -> None:
    s = parse_model_string("gpt:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200")
    assert s.family == "gpt"
    assert dataclasses.asdict(s.config) == {
        "layers": 24,
        "hidden": 2304,
        "heads": 24,
        "seq": 2048,
        "vocab": 51200,
        "attention": "fused",
        "tied": False,  # GPT-2's tied embedding is a flag, off by default
        "dropout": 0.0,  # hidden and attention dropout, off by default
        "loss": "fp32",  # the cross entropy on the logits cast to fp32 (mixed precision)
        "unpad": False,  # llm-foundry's unpad/pad copies around flash attention, off by default
        "qkv": "split",  # Q, K and V as three GEMMs (``qkv=fused``: one), by default
    }
    s = parse_model_string(" gpt2-117m:layers=2 ")
    assert dataclasses.asdict(s.config) == {
        "layers": 2,
        "hidden": 768,
        "heads": 12,
        "seq": 1024,
        "vocab": 50257,
        "attention": "fused",
        "tied": False,
        "dropout": 0.0,
        "loss": "fp32",
        "unpad": False,
        "qkv": "split",
    }
    assert parse_model_string("gpt2-117m:attention=naive").config.attention == "naive"
    assert parse_model_string("llama3-8b:qkv=fused").config.qkv == "fused"
    assert parse_model_string("gpt2-117m:unpad=1").config.unpad is True
    assert parse_model_string("gpt2-117m:tied=1").config.tied is True
    assert parse_model_string("llama").config.rope_theta == 10000  # Llama 2's RoPE base
    assert parse_model_string("llama3-8b").config.rope_theta == 500000  # Llama 3's
    assert parse_model_string("llama").config == ZOO["llama2-7b"].config
    assert parse_model_string("llama3-8b").config == ZOO["llama3-8b"].config
    m = build_model("mlp:layers=2,hidden=4", 3)
    assert m.name == "mlp:layers=2,hidden=4" and m.config == {"family": "mlp", "layers": 2, "hidden": 4}


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 4),
    heads=st.integers(1, 4),
    head_dim=st.sampled_from([2, 4, 6, 8]),  # even: RoPE rotates pairs
    group=st.integers(1, 3),
    seq=st.integers(1, 9),
    vocab=st.integers(2, 50),
)
def test_llama_strings_round_trip(
    layers: int, heads: int, head_dim: int, group: int, seq: int, vocab: int
) -> None:
    cfg = {
        "layers": layers,
        "hidden": heads * group * head_dim,
        "heads": heads * group,
        "kv_heads": heads,
        "ffn": 3 * head_dim,
        "vocab": vocab,
        "seq": seq,
    }
    text = "llama:" + ",".join(f"{k}={v}" for k, v in cfg.items())
    spec = parse_model_string(text)
    defaults = {"rope_theta": 10000, "attention": "fused", "loss": "fp32"}
    # the eager forms' defaults
    defaults |= {"norm": "fused", "rope": "fused", "silu": "fused", "kv": "native", "qkv": "split"}
    assert dataclasses.asdict(spec.config) == {**cfg, **defaults}
    m = build_model(text, 2)
    assert m.num_params == closed_form_params("llama", cfg)


BAD = [
    ("gtp:layers=2", ["'gtp'", "did you mean gpt", "mlp, gpt, llama, nemotron, transgan", "gpt2-117m"]),
    ("gpt2-117:layers=2", ["'gpt2-117'", "did you mean gpt2-117m"]),
    ("gpt:layer=2", ["'layer'", "did you mean layers", "layers, hidden, heads, seq, vocab, attention"]),
    ("gpt:attention=flash", ["attention='flash'", "expected one of fused, naive"]),
    ("llama3-8b:attention=nave", ["attention='nave'", "did you mean naive", "expected one of fused, naive"]),
    ("transgan:attention=2", ["attention='2'", "expected one of fused, naive"]),
    ("gpt:layers=fused", ["layers='fused'", "positive integer"]),
    ("gpt:layers=two", ["layers='two'", "positive integer"]),
    ("gpt:layers=0", ["layers='0'", "positive integer"]),
    ("gpt:layers=-3", ["layers='-3'", "positive integer"]),
    ("gpt:layers", ["'layers' is not key=value", "layers, hidden"]),
    ("gpt:layers=2,layers=3", ["'layers' is given twice"]),
    ("gpt:heads=5", ["heads=5 must divide hidden=768"]),
    ("llama:kv_heads=5", ["kv_heads=5 must divide heads=32"]),
    ("llama:hidden=96,heads=32,kv_heads=32", ["head_dim = hidden/heads = 3 must be even"]),
    ("transgan:heads=3", ["heads=3 must divide narrow=16"]),
    ("transgan:dim=1000", ["dim=1000 must be a multiple of 64"]),
    ("transgan:window=20", ["window=20 must divide stage 6's resolution 288"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_model_string_errors(text: str, fragments: list[str]) -> None:
    with pytest.raises(ModelError) as e:
        build_model(text, 2)
    for f in fragments:
        assert f in str(e.value)


def test_build_errors() -> None:
    with pytest.raises(ModelError, match="batch=0; expected a positive integer"):
        build_model("mlp:layers=1,hidden=2", 0)
    with pytest.raises(ModelError, match="expected a float DType"):
        build_model("mlp:layers=1,hidden=2", 2, DType.i32)


def test_loss_layer_with_weights_is_rejected() -> None:
    f = LayerFn("loss")
    x, y, w = f.param("x"), f.param("y"), f.param("w")
    loss_fn = f.ret(f("MSELoss", f("MatMul", x, w), y, reduction="sum"))
    g = LayerFn("dense")
    a, b = g.param("x"), g.param("w")
    dense = g.ret(g("MatMul", a, b))
    inputs = [InputSpec("x", tensor(DType.f32, 2, 4)), InputSpec("y", tensor(DType.f32, 2, 4))]
    calls = [
        LayerCall(dense, (weight("w0", DType.f32, (4, 4)),), "h"),
        LayerCall(loss_fn, ("y", weight("w1", DType.f32, (4, 4))), "loss"),
    ]
    with pytest.raises(ModelError, match=r"the loss layer @loss takes weights \['w1'\]"):
        assemble("bad", {}, inputs, calls)
    with pytest.raises(ModelError, match="'w0' is declared twice"):
        assemble("bad", {}, inputs, [calls[0], LayerCall(dense, (weight("w0", DType.f32, (4, 4)),), "h2")])


# -- listing ----------------------------------------------------------------------------------
def test_zoo_table_and_cli() -> None:
    rows = {r.name: r for r in zoo_table()}
    assert list(rows) == list(ZOO)
    assert (rows["mlp-1b"].layers, rows["mlp-1b"].hidden, rows["mlp-1b"].heads) == (16, 8192, None)
    assert rows["llama2-70b"].params == closed_form_params(
        "llama", dataclasses.asdict(ZOO["llama2-70b"].config)
    )
    r = CliRunner().invoke(app, ["models", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    recs = {m["name"]: m for m in data["models"]}
    assert set(recs) == set(ZOO)
    assert recs["mlp-1b"]["params"] == 16 * 8192**2 and recs["mlp-1b"]["params_human"] == "1.07B"
    assert recs["gpt2-175b"]["params_human"] == "175B" and recs["llama3-8b"]["params_human"] == "8.03B"
    assert recs["gpt2-117m"]["flops_per_sample"] == build_model("gpt2-117m", 1).flops_per_sample
    assert math.isclose(recs["transgan-hetero"]["params"], rows["transgan-hetero"].params)
    r = CliRunner().invoke(app, ["models"], terminal_width=200)
    assert r.exit_code == 0
    lines = [ln for ln in r.stdout.splitlines() if "llama2-7b" in ln]
    assert len(lines) == 1 and "6.74B" in lines[0] and "4096" in lines[0]


def test_model_spec_tp_replaces_declared_placements_by_name() -> None:
    from dataclasses import replace as _replace

    from distir.frontends.zoo.registry import parse_model_string
    from distir.ir.dtensor import Replicate as _R
    from distir.ir.dtensor import Shard as _S

    spec = _replace(parse_model_string("mlp:layers=2,hidden=64"), tp=(("w_0", _R()),))
    m = spec.build(4)
    assert [w.tp for w in m.weights] == [_R(), _S(0)]  # w_1 keeps its declared row-parallel S(0)


@pytest.mark.parametrize(
    ("flops", "text"),
    [
        (158744.0, "159KFLOP"),
        (1.5e9, "1.5GFLOP"),
        (65.9e12, "65.9TFLOP"),
        (6.47e15, "6.47PFLOP"),
        (12.0, "12FLOP"),
    ],
)
def test_flops_read_with_metric_prefixes(flops: float, text: str) -> None:
    """`distir import`'s FLOPs per sample: G, not a count's B; P, not 6.47e+03T."""
    from distir.frontends.zoo.registry import human_flops

    assert human_flops(flops) == text


def test_a_config_path_without_hf_says_the_prefix(tmp_path: Path) -> None:
    """`distir import` reads a config path as hf:PATH; `--model` needs the prefix and says so."""
    (tmp_path / "config.json").write_text("{}")
    for text in (str(tmp_path / "config.json"), str(tmp_path)):
        with pytest.raises(ModelError, match=re.escape(f"a Hugging Face config is --model hf:{text}")):
            parse_model_string(text)
    with pytest.raises(ModelError, match="unknown model 'llama3-9b'"):
        parse_model_string("llama3-9b")


@pytest.mark.parametrize(
    ("model", "strategy", "split"),
    [
        ("mlp:layers=2,hidden=1", "d2", 0),  # every weight 1 x 1
        # the embedding and head on the vocabulary of 8, each block's w1, b1, w2 on its 4 FFN
        # columns; q, k, v and o (1 x 1) whole
        ("gpt:layers=2,hidden=1,heads=1,seq=4,vocab=8", "d2.z3", 8),
        ("gpt:layers=2,hidden=4,heads=2,seq=4,vocab=1", "d1.t2", 20),  # the blocks' 10 each
        # the embedding, the head and each block's q, k, v, o; its FFN of 1 (w1, w3, w2) whole
        ("llama:layers=2,hidden=2,heads=1,kv_heads=1,ffn=1,vocab=8,seq=4", "d1.p2.k2", 10),
    ],
)
def test_a_one_wide_dim_is_kept_whole_and_the_step_equals_the_sequential_one(
    model: str, strategy: str, split: int
) -> None:
    """A weight declared split along a dim of size 1 (hidden, FFN or vocabulary of 1) is kept
    whole, the `split` others declared split stay so, and the distributed step is the sequential
    one's (a 1-wide column-parallel weight's gradient was split along its 1-wide dim, which no
    elementwise op's sharding rule takes: `simulate --model mlp:layers=2,hidden=1` failed)."""
    from distir.parallel.check import check_against_sequential
    from distir.parallel.strategy import parse_strategy

    m = parse_model_string(model).build(4)
    sharded = [w for w in m.weights if isinstance(w.tp, Shard)]
    assert all(w.type.shape[w.tp.dim] > 1 for w in sharded if isinstance(w.tp, Shard))
    assert len(sharded) == split
    cmp = check_against_sequential(m, parse_strategy(strategy))
    assert cmp.max_rel_diff < 1e-4, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"
