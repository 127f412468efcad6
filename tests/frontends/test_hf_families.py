"""Decoder families beyond Llama's and GPT-2's, from tiny configs built here (random init, no
network): GPT-NeoX (Pythia: parallel residual, partial rotary, one fused QKV chunked), OPT
(learned positions computed from a mask of ones), BERT (an encoder: bidirectional attention, the
token-type embedding's rows of a constant, its own layer names), Falcon (multi-query attention
through its sdpa path and causal mask, parallel attention and MLP, ``x @ W.T`` linear layers; the
40B layout's grouped heads broadcast) and GPT-J (rotary on interleaved pairs, a sinusoidal CPU
buffer). Each imports with one block function, trains to torch's loss and gradients on the
reference executor, distributes (tensor and pipeline parallel) to the sequential step; OPT
simulates close to the zoo GPT of its shape. BLOOM's attention, written out with ALiBi biases,
is one Attention with the heads' slopes; attention with another bias is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from distir.cli import app  # noqa: E402
from distir.frontends.torch_import.hf import hf_model  # noqa: E402
from distir.frontends.zoo import build_model  # noqa: E402
from distir.interp.lockstep import check_deadlock_free  # noqa: E402
from distir.interp.project import project  # noqa: E402
from distir.ir.dtensor import Shard  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.parallel.check import check_against_sequential  # noqa: E402
from distir.parallel.strategy import parse_strategy  # noqa: E402

from .test_torch_import_numeric import BATCH, F32_INSIDE, _check_against_torch  # noqa: E402

TINY = {"vocab_size": 32, "bos_token_id": 0, "eos_token_id": 0}
CONFIGS: dict[str, dict[str, object]] = {
    "neox": {
        "model_type": "gpt_neox", "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 24,
        "num_hidden_layers": 2, "max_position_embeddings": 8, "rotary_pct": 0.5,
        "use_parallel_residual": True, **TINY,
    },
    "opt": {
        "model_type": "opt", "hidden_size": 16, "num_attention_heads": 4, "ffn_dim": 24,
        "num_hidden_layers": 2, "max_position_embeddings": 8, "word_embed_proj_dim": 16,
        "pad_token_id": 1, **TINY,
    },
    "falcon": {
        "model_type": "falcon", "hidden_size": 16, "num_attention_heads": 4, "num_hidden_layers": 2,
        "max_position_embeddings": 8, "multi_query": True, "parallel_attn": True, "bias": False, **TINY,
    },
    "bert": {
        "model_type": "bert", "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 24,
        "num_hidden_layers": 2, "max_position_embeddings": 8, "pad_token_id": 0, **TINY,
    },
    "falcon-new": {  # Falcon 40B's and 180B's layout: grouped key/value heads, two norms
        "model_type": "falcon", "hidden_size": 16, "num_attention_heads": 4, "num_kv_heads": 2,
        "num_hidden_layers": 2, "max_position_embeddings": 8, "new_decoder_architecture": True,
        "parallel_attn": True, "bias": False, **TINY,
    },
    "bloom": {"model_type": "bloom", "hidden_size": 16, "n_head": 4, "n_layer": 2, **TINY},
    "gptj": {
        "model_type": "gptj", "n_embd": 16, "n_head": 4, "n_layer": 2, "n_positions": 8,
        "rotary_dim": 2, **TINY,
    },
}  # fmt: skip


SEQ = {"bloom": 8}  # a config without a context length (ALiBi runs at any)
SUFFIX = {f: f":seq={n}" for f, n in SEQ.items()}


def config(tmp_path: Path, family: str, **changes: object) -> str:
    return written(tmp_path, family, {**CONFIGS[family], **changes})


def written(tmp_path: Path, name: str, cfg: dict[str, object]) -> str:
    """The directory ``tmp_path/name`` holding ``cfg`` as its config.json."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_loss_and_gradients_equal_torch(family: str, tmp_path: Path) -> None:
    """Rotary tables and the norms' casts compute in float32 in a float64 model (Llama's
    tolerance); OPT's pad token row gets no gradient (``padding_idx``), as in torch."""
    torch.manual_seed(0)
    module, inputs = hf_model(config(tmp_path, family), seq=SEQ.get(family), meta=False)
    seq = inputs["input_ids"].shape[1]
    x = torch.randint(0, 32, (BATCH, seq))
    x[0, :2] = 1  # OPT's pad id: its embedding row gets no gradient
    labels = torch.randint(0, 32, (BATCH, seq))
    _check_against_torch(module, inputs, x, labels, F32_INSIDE)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_blocks_are_one_function_and_tp_shards_megatrons_weights(family: str, tmp_path: Path) -> None:
    model = build_model(f"hf:{config(tmp_path, family)}{SUFFIX.get(family, '')}", batch=2)
    assert [c.callee for c in model.layers] == ["embed", "block", "block", "head", "loss"]
    tp = {w.name for w in model.weights if isinstance(w.tp, Shard)}
    block = {n.split(".0.", 1)[-1] for n in tp if ".0." in n}
    want = {
        "neox": {"attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"},
        "opt": {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1",
                "fc2"},
        "falcon": {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                   "mlp.dense_4h_to_h"},
        "falcon-new": {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                       "mlp.dense_4h_to_h"},
        "bert": {"attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense", "intermediate.dense", "output.dense"},
        "bloom": {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                  "mlp.dense_4h_to_h"},
        "gptj": {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.fc_in", "mlp.fc_out"},
    }[family]  # fmt: skip
    assert {n.rsplit(".", 1)[0] for n in block} == want
    assert model.loss_input_tp == Shard(2)  # the head vocabulary-parallel


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "strategy"),
    [
        ("neox", "d1.t2.p1.k1"),
        ("falcon", "d1.t2.p1.k1"),
        ("gptj", "d1.t1.p2.k2.1f1b"),
        ("opt", "d2.t2.p1.k1"),
        ("bloom", "d1.t2.p1.k1"),  # the heads split: each rank its heads' ALiBi slopes
    ],
)
def test_distributed_training_step_equals_sequential(family: str, strategy: str, tmp_path: Path) -> None:
    s = parse_strategy(strategy)
    path = f"hf:{config(tmp_path, family)}{SUFFIX.get(family, '')}"
    model = build_model(path, batch=s.k * s.d * 2, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{strategy}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    check_deadlock_free(project(cmp.materialized))


SHAPE = {"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 512, "max_position_embeddings": 64}
TWINS = {  # the family's shape options, the zoo GPT of that shape
    "opt": ({"word_embed_proj_dim": 64, "ffn_dim": 256}, "tied=1"),
    "neox": ({"intermediate_size": 256, "tie_word_embeddings": False}, "tied=0"),
}


@pytest.mark.parametrize("family", sorted(TWINS))
def test_simulates_close_to_the_zoo_gpt_of_its_shape(family: str, tmp_path: Path) -> None:
    """OPT is GPT's layout (pre-LN, learned positions, biases, tied head) but for its ReLU MLP and
    separate q/k/v; GPT-NeoX adds rotary on a quarter of each head and the parallel residual, and
    its fused QKV's head layout costs no transpose (the split and slices run before it): the step
    and the memory within a few percent of the zoo GPT's."""
    options, tied = TWINS[family]
    path = config(tmp_path, family, **SHAPE, **options)
    zoo = f"gpt:layers=4,hidden=64,heads=4,seq=64,vocab=512,{tied}"
    got = []
    for model in (f"hf:{path}", zoo):
        args = ["simulate", "--model", model, "--strategy", "d2.t2.p1.k1.1f1b", "--batch", "8"]
        code, out, err = run(*args, "--cluster", "dgx-a100", "--json")
        assert code == 0, err
        got.append(json.loads(out))
    imported, gpt = got
    assert imported["step_time_s"] == pytest.approx(gpt["step_time_s"], rel=0.1)
    assert max(imported["peak_memory_bytes"].values()) == pytest.approx(
        max(gpt["peak_memory_bytes"].values()), rel=0.1
    )


def test_bloom_attention_is_one_attention_with_alibi_slopes(tmp_path: Path) -> None:
    """BLOOM writes attention out (baddbmm with its ALiBi bias, the causal mask added, softmax,
    bmm) on heads merged into the batch: one fused Attention with the heads' slopes, no S×S
    scores, and its written-out GELU one GeluTanh."""
    model = build_model(f"hf:{config(tmp_path, 'bloom')}:seq=8", batch=2)
    names = [op.name for op in model.module["block"].ops()]
    (att,) = [op for op in model.module["block"].ops() if op.name == "Attention"]
    assert att.attrs["causal"] and tuple(att.attrs["alibi"]) == (0.25, 0.0625, 0.015625, 0.00390625)
    assert names.count("GeluTanh") == 1 and "Softmax" not in names and "Tanh" not in names


def test_attention_with_another_bias_is_one_line_exit_2(tmp_path: Path) -> None:
    """Falcon with ``alibi=True`` adds its biases to the mask it gives sdpa: the ops building them
    are listed, one line."""
    path = config(tmp_path, "falcon", alibi=True)
    code, out, err = run("simulate", "--model", f"hf:{path}", "--strategy", "d1.t1.p1.k1", "--batch", "2")
    assert code == 2 and not out
    (line,) = err.strip().splitlines()
    assert line.startswith("unsupported ops") and "modeling_falcon.py" in line


def test_transformers_warnings_do_not_precede_the_result(tmp_path: Path) -> None:
    """A tiny GPT-J config keeps GPT-J's token ids (50256), outside its vocabulary: transformers
    warns; the import does not print it."""
    path = config(tmp_path, "gptj", bos_token_id=50256, eos_token_id=50256)
    code, _, err = run("import", f"hf:{path}", "--json")
    assert code == 0 and "[transformers]" not in err and "bos_token_id" not in err


def test_a_sliding_window_is_windowed_attention_equal_to_transformers_eager(tmp_path: Path) -> None:
    """Mistral's window (3 keys, of 8 positions) passes through transformers' attention interface
    as ``distir::sdpa`` and imports as ``Attention(causal, window=3)``; the loss and
    gradients equal transformers' own eager attention with its sliding-window mask."""
    from distir.ir.ops import Op

    cfg = {
        "model_type": "mistral", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 24, "num_hidden_layers": 2, "max_position_embeddings": 16,
        "sliding_window": 3, **TINY,
    }  # fmt: skip
    d = written(tmp_path, "mistral", cfg)
    model = build_model(f"hf:{d}:seq=8", batch=2)
    atts = [i for f in model.module.functions for i in f.body if isinstance(i, Op) and i.name == "Attention"]
    assert atts and all(a.attrs["window"] == 3 and a.attrs["causal"] for a in atts)
    torch.manual_seed(0)
    module, inputs = hf_model(str(d), seq=8, meta=False)
    x, labels = torch.randint(0, 32, (BATCH, 8)), torch.randint(0, 32, (BATCH, 8))
    _check_against_torch(module, inputs, x, labels, F32_INSIDE, torch_attention="eager")


def test_gemma2s_local_and_global_layers_are_two_block_functions(tmp_path: Path) -> None:
    """Gemma 2 alternates sliding-window and full attention (``layer_types``): two block
    functions, called in turn, the window only on the local one; its attention softcapping is the
    Attention's ``softcap``; the loss and gradients equal transformers' eager attention."""
    from distir.ir.ops import Call, Op

    cfg = {
        "model_type": "gemma2", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 4, "intermediate_size": 24, "num_hidden_layers": 4, "max_position_embeddings": 32,
        "sliding_window": 4, "attn_logit_softcapping": 5.0, **TINY,
    }  # fmt: skip
    d = written(tmp_path, "gemma2", cfg)
    model = build_model(f"hf:{d}:seq=16", batch=2)
    windows = {
        f.name: [i.attrs.get("window", 0) for i in f.body if isinstance(i, Op) and i.name == "Attention"]
        for f in model.module.functions
    }
    calls = [c.callee for c in model.module.entry.body if isinstance(c, Call)]
    blocks = [c for c in calls if windows.get(c)]
    assert [windows[c][0] for c in blocks] == [4, 0, 4, 0]
    caps = {i.attrs.get("softcap") for f in model.module.functions for i in f.body if isinstance(i, Op)}
    assert 5.0 in caps  # the attention logits' softcapping is the Attention's
    torch.manual_seed(0)
    module, inputs = hf_model(str(d), seq=16, meta=False)
    x, labels = torch.randint(0, 32, (BATCH, 16)), torch.randint(0, 32, (BATCH, 16))
    _check_against_torch(module, inputs, x, labels, F32_INSIDE, torch_attention="eager")


def test_gpt_neos_written_out_attention_is_causal_and_windowed_attention(tmp_path: Path) -> None:
    """GPT-Neo writes attention out (``matmul``, ``where`` on its boolean buffer, the model's
    additive mask, softmax, ``matmul``; no scale): one ``Attention`` per block, causal on its global
    layers and windowed (``window_size``) on its local ones; the loss and gradients equal torch's."""
    from distir.ir.ops import Op

    cfg = {
        "model_type": "gpt_neo", "hidden_size": 16, "num_heads": 4, "num_layers": 2,
        "attention_types": [[["global", "local"], 1]], "window_size": 3, "max_position_embeddings": 8,
        **TINY,
    }  # fmt: skip
    d = written(tmp_path, "gptneo", cfg)
    model = build_model(f"hf:{d}", batch=2)
    atts = [
        (i.attrs.get("window", 0), i.attrs["scale"])
        for f in model.module.functions
        for i in f.body
        if isinstance(i, Op) and i.name == "Attention"
    ]
    assert sorted(atts) == [(0, 1.0), (3, 1.0)]
    assert not any(i.name == "Softmax" for f in model.module.functions for i in f.body if isinstance(i, Op))
    torch.manual_seed(0)
    module, inputs = hf_model(str(d), meta=False)
    x, labels = torch.randint(0, 32, (BATCH, 8)), torch.randint(0, 32, (BATCH, 8))
    _check_against_torch(module, inputs, x, labels, F32_INSIDE)


def test_attention_sinks_are_refused_in_one_line(tmp_path: Path) -> None:
    """gpt-oss hands the attention interface its sinks (``s_aux``), which the fused Attention
    does not compute: one line, exit 2, naming them (never a dropped argument)."""
    cfg = {
        "model_type": "gpt_oss", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 4, "intermediate_size": 16, "num_hidden_layers": 2, "num_local_experts": 2,
        "num_experts_per_tok": 1, "max_position_embeddings": 16, **TINY,
    }  # fmt: skip
    d = written(tmp_path, "gptoss", cfg)
    code, _, err = run(
        "simulate", "--model", f"hf:{d}:seq=8", "--strategy", "d1.t1.p1.k1.1f1b", "--batch", "2"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "s_aux: attention sinks" in err
