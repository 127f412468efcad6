"""Hugging Face configs as Megatron-LM's and torchtitan's model arguments
(``distir.export.hf_shape``): Llama-architecture configs map, others say why not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from distir.export import ExportError, make_plan
from distir.export.hf_shape import hf_shape
from distir.export.plan import model_shape

CONFIGS = Path(__file__).parents[1] / "frontends" / "configs"
LLAMA3 = json.loads((CONFIGS / "llama3-8b.json").read_text())
# Llama 3.1 8B's config.json: Llama 3's with a 131,072-token context and rope scaling
LLAMA31 = {
    **LLAMA3,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3",
    },
}  # fmt: skip


def _config(tmp_path: Path, raw: dict[str, Any], name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return f"hf:{path}"


def test_llama3_8b_config_is_the_zoo_llama3_8b() -> None:
    """The config's shape is the zoo model's (which torchtitan ships as llama3 8B) at the
    config's context length."""
    got = hf_shape(f"hf:{CONFIGS / 'llama3-8b.json'}")
    zoo = model_shape("llama3-8b")
    assert got.why == "" and zoo is not None
    assert got.shape == replace(zoo, seq=8192)


def test_the_import_sequence_and_llama31_rope_scaling(tmp_path: Path) -> None:
    got = hf_shape(_config(tmp_path, LLAMA31) + ":seq=8192").shape
    assert got is not None and got.seq == 8192 and got.rope_scaling == 8.0
    assert hf_shape(_config(tmp_path, LLAMA31)).shape.seq == 131072  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "qwen2"}, "a qwen2 config (only the Llama architecture's"),
        ({"attention_bias": True}, "with biases in its projections"),
        ({"hidden_act": "gelu"}, "with hidden_act 'gelu'"),
        ({"head_dim": 64}, "with head_dim 64 other than hidden_size / num_attention_heads"),
        ({"sliding_window": 4096}, "with a sliding window of 4096 positions, shorter than the sequence"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "with rope_scaling"),
        ({"rope_scaling": {**LLAMA31["rope_scaling"], "high_freq_factor": 2.0}}, "with rope_scaling"),
        ({"intermediate_size": None}, "without intermediate_size"),
    ],
)
def test_configs_their_llama_is_not_say_why(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    got = hf_shape(_config(tmp_path, {**LLAMA3, **change}))
    assert got.shape is None and words in got.why


def test_a_window_as_long_as_the_sequence_does_not_bind(tmp_path: Path) -> None:
    assert hf_shape(_config(tmp_path, {**LLAMA3, "sliding_window": 8192})).shape is not None
    assert hf_shape(_config(tmp_path, {**LLAMA3, "sliding_window": 8192}) + ":seq=16384").shape is None


@pytest.mark.slow
def test_megatron_arguments_of_a_llama31_config(tmp_path: Path) -> None:
    import argparse

    from distir.export.megatron import megatron_args

    # the options as megatron/training/arguments.py declares them (test_megatron.py's parser has
    # the others); the rest of the line is skipped
    parser = argparse.ArgumentParser(exit_on_error=False)
    for name in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads"):
        parser.add_argument(name, type=int)
    for name in ("--num-query-groups", "--rotary-base", "--seq-length"):
        parser.add_argument(name, type=int)
    for name in ("--group-query-attention", "--untie-embeddings-and-output-weights", "--swiglu"):
        parser.add_argument(name, action="store_true")
    parser.add_argument("--use-rope-scaling", action="store_true")
    parser.add_argument("--rope-scaling-factor", type=float)
    parser.add_argument("--norm-epsilon", type=float)
    spec = _config(tmp_path, {**LLAMA31, "rms_norm_eps": 1e-6}) + ":seq=8192"
    args, _ = megatron_args(make_plan(spec, "d2.t4.sp.p1.k4.1f1b", 32, cluster="h100"))
    ns, _ = parser.parse_known_args(args)
    assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads) == (
        32,
        4096,
        14336,
        32,
    )
    assert ns.group_query_attention and ns.num_query_groups == 8 and ns.rotary_base == 500000
    assert ns.seq_length == 8192 and ns.untie_embeddings_and_output_weights and ns.swiglu
    assert ns.use_rope_scaling and ns.rope_scaling_factor == 8.0 and ns.norm_epsilon == 1e-6


def test_torchtitan_runs_a_llama3_8b_config_as_its_8b_flavor(tmp_path: Path) -> None:
    """torchtitan's llama3 8B is Llama 3.1's model (its rope scaling, factor 8, in every flavor):
    a Llama 3.1 8B config is that flavor as it is; a Llama 3 8B config (unscaled) is that flavor
    with a warning about its positions."""
    from distir.export.torchtitan import job_sections

    sections, warn = job_sections(
        make_plan(_config(tmp_path, LLAMA31) + ":seq=8192", "d8.t1.p1.k1.1f1b.z3", 8, cluster="h100")
    )
    assert sections["model"] == {"name": "llama3", "flavor": "8B"} and warn == []
    sections, warn = job_sections(
        make_plan(f"hf:{CONFIGS / 'llama3-8b.json'}", "d8.t1.p1.k1.1f1b.z3", 8, cluster="h100")
    )
    assert sections["model"] == {"name": "llama3", "flavor": "8B"}
    assert sections["training"]["seq_len"] == 8192 and not any("ships no" in w for w in warn)
    assert [w for w in warn if "unscaled (Llama 3's)" in w and "factor 8" in w] == warn and len(warn) == 1


def test_megatron_refuses_a_qwen2_config_saying_why() -> None:
    plan = make_plan(f"hf:{CONFIGS / 'qwen2-tiny.json'}", "d2.t1.p1.k1.1f1b", 4)
    from distir.export.megatron import megatron_args

    with pytest.raises(ExportError, match=r"is a qwen2 config \(only the Llama architecture's"):
        megatron_args(plan)
