"""The torchtitan job TOML (``distir.export.torchtitan``), parsed by tomllib and checked against
the keys of torchtitan's job_config.py (commit e347b1e5) and the plan's closed-form figures."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from distir.export import ExportError, export, make_plan

# torchtitan/config/job_config.py at e347b1e5: the keys of the sections the export writes
KEYS = {
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {
        "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
        "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
        "gc_debug",
    },
    "parallelism": {
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
        "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "context_parallel_degree", "context_parallel_rotate_method", "expert_parallel_degree",
    },
    "activation_checkpoint": {
        "mode", "selective_ac_option", "early_stop", "memory_budget", "preserve_rng_state",
    },
    "optimizer": {"name", "lr", "eps", "weight_decay", "implementation"},
    "compile": {"enable", "components", "backend"},
    "quantize.linear.float8": {
        "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
        "filter_fqns", "emulate",
    },
}  # fmt: skip
SCHEDULES = {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "LoopedBFS"}


def _toml(
    strategy: str, model: str = "llama3-8b", batch: int = 64, **kw: Any
) -> tuple[dict[str, Any], tuple[str, ...]]:
    cluster = "h100:2" if kw.get("precision", "").startswith("fp8") else "dgx-a100:2"
    e = export(make_plan(model, strategy, batch, cluster=cluster, **kw), "torchtitan")
    doc = tomllib.loads(e.text)
    for section, table in _tables(doc):
        assert set(table) <= KEYS[section], (section, set(table) - KEYS[section])
    return doc, e.warnings


def _tables(doc: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """The TOML's tables by dotted name (``[quantize.linear.float8]``), each with its keys."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, table in doc.items():
        keys = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if keys:
            out.append((prefix + name, keys))
        out += _tables({k: v for k, v in table.items() if isinstance(v, dict)}, f"{prefix}{name}.")
    return out


def test_pure_data_parallel_is_ddp() -> None:
    doc, warn = _toml("d8.t1.p1.k1.1f1b")
    par, tr = doc["parallelism"], doc["training"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (8, 1)
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (1, 1)
    assert (tr["local_batch_size"], tr["global_batch_size"], tr["seq_len"]) == (8, 64, 8192)
    assert tr["mixed_precision_param"] == "bfloat16" and tr["mixed_precision_reduce"] == "float32"
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    assert doc["activation_checkpoint"] == {"mode": "none"}
    assert warn == ()


def test_fsdp_with_gradient_accumulation() -> None:
    doc, _ = _toml("d4.t1.p1.k4.1f1b.z3.rfull")
    par, tr = doc["parallelism"], doc["training"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 4)
    assert par["fsdp_reshard_after_forward"] == "always"
    assert not any("DDP" in w for w in _toml("d4.t2.p1.k1.1f1b.z3")[1])  # FSDP as asked: no warning
    # torchtitan accumulates global / (local · dp) = k microbatches
    assert tr["global_batch_size"] // (tr["local_batch_size"] * 4) == 4
    assert doc["activation_checkpoint"] == {"mode": "full"}


def test_tp_with_sequence_parallelism() -> None:
    doc, warn = _toml("d1.t8.sp.p1.k1.1f1b.rops", model="llama3-8b:loss=parallel")
    assert doc["parallelism"]["tensor_parallel_degree"] == 8
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert warn == ()


def test_the_loss_form_under_tp_is_torchtitans_loss_parallel_or_its_absence() -> None:
    """torchtitan's loss_parallel is ``loss=parallel``, disabling it is ``loss=torch`` (whole
    logits); distir's vocabulary-parallel ``fp32`` form has no torchtitan option: a warning."""
    parallel, _ = _toml("d1.t8.sp.p1.k1.1f1b", model="llama3-8b:loss=parallel")
    assert "disable_loss_parallel" not in parallel["parallelism"]
    whole, warn = _toml("d1.t8.sp.p1.k1.1f1b", model="llama3-8b:loss=torch")
    assert whole["parallelism"]["disable_loss_parallel"] is True and warn == ()
    _, warn = _toml("d1.t8.sp.p1.k1.1f1b")  # the zoo's default loss=fp32
    assert len(warn) == 1 and "no loss of the plan's form (loss=fp32" in warn[0]
    one, warn = _toml("d8.t1.p1.k1.z3", model="llama3-8b:loss=torch")  # no TP: no loss parallelism
    assert "disable_loss_parallel" not in one["parallelism"] and warn == ()


def test_replicas_beside_tp_are_fsdp_since_torchtitan_ddp_is_1d_only() -> None:
    doc, warn = _toml("d2.t4.sp.p1.k1.1f1b", model="llama3-8b:loss=parallel")
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 2)
    assert par["fsdp_reshard_after_forward"] == "never"
    assert len(warn) == 1 and "DDP" in warn[0]


def test_interleaved_pipeline_lists_every_chunk() -> None:
    doc, _ = _toml("d1.t1.p4.k8.interleaved.v2")
    par = doc["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" in SCHEDULES
    assert par["pipeline_parallel_microbatch_size"] == 8
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 8  # p·v chunks
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    layers = [n for part in parts for n in part if n.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(32)]
    assert doc["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == 8  # k


def test_hybrid_3d_with_an_uneven_split_and_its_warnings() -> None:
    doc, warn = _toml("d2.t2.p2.k4.zb1.z1.rsel.L15-17")
    par = doc["parallelism"]
    assert (
        par["data_parallel_shard_degree"],
        par["tensor_parallel_degree"],
        par["pipeline_parallel_degree"],
    ) == (2, 2, 2)
    assert par["fsdp_reshard_after_forward"] == "never"
    assert par["pipeline_parallel_schedule"] == "InterleavedZeroBubble"
    assert [sum(n.startswith("layers.") for n in p) for p in par["module_fqns_per_model_part"]] == [15, 17]
    text = " ".join(warn)
    assert "ZeRO-1" in text and "sequence parallelism" in text and "rsel" in text


def test_pure_bf16_is_the_training_dtype() -> None:
    doc, _ = _toml("d8.t1.p1.k1.1f1b", dtype="bf16", precision="pure")
    assert doc["training"]["dtype"] == "bfloat16" and "mixed_precision_param" not in doc["training"]


def test_a_model_torchtitan_does_not_ship_is_named_with_a_warning() -> None:
    doc, warn = _toml("d8.t1.p1.k1.1f1b", model="llama2-7b")
    assert doc["model"]["flavor"] == "llama2-7b" and any("llama2-7b" in w for w in warn)


@pytest.mark.parametrize(
    ("strategy", "kw", "feature"),
    [
        ("d8.t1.p1.k1.1f1b", {"dtype": "f16"}, "fp16"),
        ("d2.t1.p1.k1.1f1b.b1-3", {}, "uneven batch shares"),
        ("d2.t1.p1.k1.1f1b.@1-0", {}, "placement"),
        # its attention views each rank's columns as whole heads (n_heads // tp of them)
        ("d1.t3.sp.p1.k1.1f1b", {"dtype": "bf16"}, "t=3 does not divide heads=32, kv_heads=8"),
    ],
)
def test_what_torchtitan_cannot_express_is_an_error(strategy: str, kw: dict[str, str], feature: str) -> None:
    with pytest.raises(ExportError, match=feature):
        export(make_plan("llama3-8b", strategy, 64, **kw), "torchtitan")


def test_context_parallelism_is_a_degree_rotated_shard_by_shard() -> None:
    doc, _ = _toml("d2.t4.sp.c2.p1.k1.1f1b.z3")
    par = doc["parallelism"]
    assert (par["data_parallel_shard_degree"], par["context_parallel_degree"]) == (2, 2)
    assert par["tensor_parallel_degree"] == 4 and par["context_parallel_rotate_method"] == "alltoall"
    assert doc["training"]["local_batch_size"] == 32  # the batch splits over d, not over c


def test_no_context_parallelism_no_degree() -> None:
    doc, _ = _toml("d8.t1.p1.k1.1f1b")
    assert "context_parallel_degree" not in doc["parallelism"]


def test_fp8_is_the_float8_converter_with_the_head_left_bf16_and_compile(
    golden: Callable[[str, str], None],
) -> None:
    plan = make_plan("llama3-8b", "d2.t4.sp.p2.k4.1f1b.z1", 64, precision="fp8", cluster="h100:2")
    e = export(plan, "torchtitan")
    golden("torchtitan-fp8.toml", e.text)
    doc, warn = _toml("d2.t4.sp.p2.k4.1f1b.z1", precision="fp8")
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"]}  # FSDP float8 all-gather off
    assert doc["compile"] == {"enable": True}
    assert doc["training"]["mixed_precision_param"] == "bfloat16"
    assert any('named "float8"' in w for w in warn)  # its float8 TP is off at e347b1e5


def test_fp8_without_tensor_parallelism_needs_no_float8_tp_warning() -> None:
    doc, warn = _toml("d8.t1.p1.k1.1f1b.z3", precision="fp8")
    assert doc["model"]["converters"] == ["quantize.linear.float8"] and warn == ()


def test_what_has_no_torchtitan_float8_is_an_error() -> None:
    with pytest.raises(ExportError, match="cannot express fp8-delayed"):
        export(make_plan("llama3-8b", "d8.t1.p1.k1.1f1b", 64, precision="fp8-delayed"), "torchtitan")
