"""Megatron-LM arguments (``distir.export.megatron``), parsed by an argparse parser declaring the
options as megatron/training/arguments.py (d98e8a64) declares them (names, arity, choices)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable

import pytest

from distir.export import ExportError, export, make_plan
from distir.export.megatron import layout, megatron_args
from distir.frontends.zoo.registry import parse_model_string
from distir.ir.types import DType


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    for name in (
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
        "--num-layers-per-virtual-pipeline-stage",
        "--micro-batch-size", "--global-batch-size", "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers", "--recompute-num-layers", "--num-layers", "--hidden-size",
        "--ffn-hidden-size", "--num-attention-heads", "--seq-length", "--max-position-embeddings",
        "--vocab-size", "--rotary-base", "--num-query-groups", "--context-parallel-size",
    ):  # fmt: skip
        p.add_argument(name, type=int)
    for name in ("--hidden-dropout", "--attention-dropout"):
        p.add_argument(name, type=float)
    for name in (
        "--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--bf16", "--fp16",
        "--untie-embeddings-and-output-weights", "--swiglu", "--disable-bias-linear",
        "--group-query-attention", "--overlap-grad-reduce",
    ):  # fmt: skip
        p.add_argument(name, action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument(
        "--data-parallel-sharding-strategy",
        choices=["no_shard", "optim", "optim_grads", "optim_grads_params"],
    )
    p.add_argument("--pipeline-model-parallel-layout", type=str)
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "none"])
    p.add_argument("--optimizer", choices=["adam", "sgd"])
    p.add_argument("--cp-comm-type", nargs="+", type=str, default=["p2p"])
    # TransformerConfig's fp8 fields (megatron/core/transformer/transformer_config.py at d98e8a64)
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    p.add_argument("--fp8-amax-history-len", type=int)
    p.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"])
    return p


def _args(strategy: str, model: str = "llama3-8b", **kw: str) -> tuple[argparse.Namespace, list[str]]:
    cluster = "h100:2" if kw.get("precision", "").startswith("fp8") else "dgx-a100:2"
    args, warn = megatron_args(make_plan(model, strategy, 64, cluster=cluster, **kw))
    return _parser().parse_args(args), [w for w in warn if not w.startswith(FP32_GRADIENTS)]


FP32_GRADIENTS = "Megatron-LM accumulates and reduces bf16 gradients in fp32"


@pytest.mark.parametrize(
    ("strategy", "share"), [("d8.t1.p1.k1.1f1b", 1), ("d2.t4.sp.p1.k1.1f1b.z1", 4), ("d1.t2.p4.k8.1f1b", 8)]
)
def test_bf16_notes_megatrons_fp32_gradients(strategy: str, share: int) -> None:
    """--bf16 forces Megatron-LM's fp32 gradient accumulation and reduction: 2 bytes per
    parameter more than distir's bf16 gradients, over the GPUs sharing the parameters."""
    plan = make_plan("llama3-8b", strategy, 64, cluster="dgx-a100:2")
    _, warn = megatron_args(plan)
    (note,) = [w for w in warn if w.startswith(FP32_GRADIENTS)]
    params = parse_model_string("llama3-8b").build(1, DType.bf16).num_params
    assert f"about {2 * params / share / 2**30:.1f} GiB more per GPU" in note
    _, f16 = megatron_args(make_plan("llama3-8b", strategy, 64, cluster="dgx-a100:2", dtype="f16"))
    assert not any(w.startswith(FP32_GRADIENTS) for w in f16)  # --fp16 reduces in fp16


def test_pure_data_parallel_and_the_llama_shape() -> None:
    a, warn = _args("d8.t1.p1.k1.1f1b")
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (1, 1)
    assert (a.micro_batch_size, a.global_batch_size) == (8, 64) and a.bf16 and warn == []
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads) == (32, 4096, 14336, 32)
    assert a.group_query_attention and a.num_query_groups == 8 and a.swiglu and a.normalization == "RMSNorm"
    assert a.position_embedding_type == "rope" and a.rotary_base == 500000 and a.vocab_size == 128256


def test_gpt_shape_learned_positions_untied() -> None:
    a, _ = _args("d8.t1.p1.k1.1f1b", model="gpt2-1.6b", dtype="f16")
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.seq_length) == (48, 1600, 6400, 1024)
    assert a.fp16 and not a.bf16 and not a.swiglu and a.untie_embeddings_and_output_weights
    assert a.position_embedding_type is None  # Megatron's default: learned absolute


def test_fsdp_is_megatron_fsdp() -> None:
    a, _ = _args("d4.t1.p1.k4.1f1b.z3")
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads_params"
    assert a.global_batch_size // (a.micro_batch_size * 4) == 4  # k microbatches per replica


def test_pipelined_zero2_is_the_distributed_optimizer() -> None:
    """Under a pipeline ZeRO-2 accumulates whole gradients and reduce-scatters them once per
    step, as Megatron's distributed optimizer does; without one it is Megatron-FSDP's optim_grads,
    which reduce-scatters in every backward as distir's program does."""
    a, _ = _args("d2.t1.p4.k8.1f1b.z2")
    assert a.use_distributed_optimizer and not a.use_megatron_fsdp
    assert a.data_parallel_sharding_strategy is None
    a, _ = _args("d8.t1.p1.k4.1f1b.z2")
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads"


def test_tp_with_sp_and_selective_recomputation() -> None:
    a, warn = _args("d2.t4.sp.p1.k1.1f1b.z1.rsel")
    assert a.tensor_model_parallel_size == 4 and a.sequence_parallel and a.use_distributed_optimizer
    assert a.recompute_granularity == "selective" and warn == []


def test_interleaved_uniform_pipeline() -> None:
    a, _ = _args("d1.t1.p4.k8.interleaved.v2")
    assert a.pipeline_model_parallel_size == 4 and a.num_layers_per_virtual_pipeline_stage == 32 // 8
    assert a.pipeline_model_parallel_layout is None


def test_hybrid_3d_with_uneven_first_and_last_stages() -> None:
    a, warn = _args("d2.t2.sp.p4.k8.zb1.rfull.L7-9-9-7")
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (7, 7)
    assert (
        a.recompute_granularity == "full" and a.recompute_method == "uniform" and a.recompute_num_layers == 1
    )
    assert any("ZB-H1" in w for w in warn)


def test_an_irregular_split_is_a_layout() -> None:
    a, _ = _args("d1.t1.p2.k8.interleaved.v2.L7-9-9-7")
    assert a.pipeline_model_parallel_layout == "Ettttttt|ttttttttt|ttttttttt|tttttttL"
    assert layout((0, 2, 0)) == "E|tt|L"


def test_the_file_is_a_bash_array_of_the_arguments() -> None:
    plan = make_plan("llama3-8b", "d2.t4.sp.p1.k1.1f1b", 64)
    text = export(plan, "megatron").text
    body = text.split("MEGATRON_ARGS=(\n", 1)[1].split("\n)", 1)[0]
    assert shlex.split(body) == megatron_args(plan)[0]


@pytest.mark.parametrize(
    ("model", "strategy", "feature"),
    [
        ("llama3-8b", "d2.t1.p1.k1.1f1b.b1-3", "uneven batch shares"),
        ("llama3-8b", "d2.t1.p1.k1.1f1b.@1-0", "placement"),
        ("mlp:layers=4,hidden=64", "d2.t1.p1.k1.1f1b", "transformers"),
    ],
)
def test_what_megatron_cannot_express_is_an_error(model: str, strategy: str, feature: str) -> None:
    with pytest.raises(ExportError, match=feature):
        export(make_plan(model, strategy, 64), "megatron")


@pytest.mark.parametrize(
    ("model", "strategy", "words"),
    [
        # Megatron-Core divides the heads, the query groups and the FFN columns by the TP size
        # (megatron/core/utils.py ``divide`` asserts): t = 3 would stop it at startup
        ("llama3-8b", "d1.t3.p1.k1.1f1b", "t=3 does not divide heads=32, kv_heads=8, ffn=14336"),
        ("gpt:layers=2,hidden=64,heads=2", "d1.t4.p1.k1.1f1b", "t=4 does not divide heads=2"),
        ("llama:layers=2,hidden=128,heads=8,kv_heads=2,ffn=256", "d1.t4.p1.k1.1f1b", "kv_heads=2"),
    ],
)
def test_a_tensor_parallel_size_that_splits_a_head_is_an_error(model: str, strategy: str, words: str) -> None:
    """distir shards unevenly; Megatron-LM runs whole heads, query groups and FFN columns per
    rank, so the arguments would fail its startup checks: refused, naming the degrees that work."""
    with pytest.raises(ExportError, match=re.escape(words)) as got:
        export(make_plan(model, strategy, 8), "megatron")
    assert "megatron" in str(got.value) and "t dividing them all:" in str(got.value)


def test_one_microbatch_needs_no_schedule_warning() -> None:
    _, warn = _args("d2.t2.p2.k1.gpipe")
    assert warn == []


def test_context_parallelism_is_a_p2p_ring_of_the_context_parallel_size() -> None:
    a, warn = _args("d2.t2.c4.p1.k1.1f1b")
    assert (a.tensor_model_parallel_size, a.context_parallel_size, a.pipeline_model_parallel_size) == (
        2,
        4,
        1,
    )
    assert a.cp_comm_type == ["p2p"] and warn == []
    # the batch splits over d only: the context ranks share each sample
    assert (a.micro_batch_size, a.global_batch_size) == (32, 64)
    head = export(make_plan("llama3-8b", "d2.t2.c4.p1.k1.1f1b", 64), "megatron").text
    assert "world size 16 = d·c·t·p = 2·4·2·1" in head


def test_no_context_parallelism_no_option() -> None:
    a, _ = _args("d8.t1.p1.k1.1f1b")
    assert a.context_parallel_size is None


@pytest.mark.parametrize(
    ("strategy", "overlapped"), [("d8.t1.p1.k1.1f1b", True), ("d1.t8.p1.k1.1f1b", False)]
)
def test_data_parallel_gradients_are_reduced_overlapped_as_simulated(strategy: str, overlapped: bool) -> None:
    """distir's program reduces gradients in buckets during the backward: with data parallelism
    the export asks Megatron-LM for the same (``--overlap-grad-reduce``); without, nothing."""
    a, _ = _args(strategy)
    assert a.overlap_grad_reduce is overlapped


@pytest.mark.parametrize("precision", ["fp8", "fp8-delayed"])
def test_fp8_is_transformer_engines_hybrid_format_in_the_simulated_recipe(
    golden: Callable[[str, str], None], precision: str
) -> None:
    plan = make_plan("llama3-8b", "d2.t4.sp.p2.k4.1f1b.z1", 64, precision=precision, cluster="h100:2")
    golden(f"megatron-{precision}.sh", export(plan, "megatron").text)
    a, warn = _args("d2.t4.sp.p2.k4.1f1b.z1", precision=precision)
    assert a.bf16 and a.fp8_format == "hybrid" and warn == []
    if precision == "fp8":  # torchao's dynamic tensorwise scaling: TE's current scaling
        assert a.fp8_recipe == "tensorwise" and a.fp8_amax_history_len is None
    else:  # TE's DelayedScaling defaults: the largest amax of 1024 steps
        assert a.fp8_recipe == "delayed"
        assert (a.fp8_amax_history_len, a.fp8_amax_compute_algo) == (1024, "max")


def test_no_fp8_no_fp8_options() -> None:
    a, _ = _args("d8.t1.p1.k1.1f1b")
    assert a.fp8_format is None and a.fp8_recipe is None
