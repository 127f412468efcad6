"""The shared plan (``distir.export.plan``): microbatch, chunk blocks, numerics, input errors."""

from __future__ import annotations

import pytest

from distir.export import ExportError, export, make_plan
from distir.export.plan import resolve_numerics


def test_microbatch_and_uniform_blocks() -> None:
    plan = make_plan("gpt2-1.6b", "d2.t1.p4.k8.1f1b", 64)
    assert plan.microbatch == 64 // (2 * 8)
    assert plan.blocks == (12, 12, 12, 12) and plan.uniform_blocks == 12


def test_uneven_uniform_split_gives_the_first_chunks_one_more() -> None:
    plan = make_plan("gpt2-1.6b", "d1.t1.p5.k5.1f1b", 10)
    assert plan.blocks == (10, 10, 10, 9, 9) and plan.uniform_blocks is None


def test_fp8_computes_in_bf16_on_gpus_with_fp8_tensor_cores() -> None:
    assert resolve_numerics("auto", "fp8", "h100:2") == ("bf16", "fp8")
    assert resolve_numerics("bf16", "fp8-delayed", None) == ("bf16", "fp8-delayed")
    assert make_plan("llama3-8b", "d8.t1.p1.k1.1f1b", 64, precision="fp8").float8


@pytest.mark.parametrize(
    ("dtype", "precision", "cluster", "what"),
    [
        ("auto", "fp8", "dgx-a100", "needs FP8 tensor cores; A100"),
        ("auto", "fp8-delayed", "dgx2-v100", "needs FP8 tensor cores; V100"),
        ("f16", "fp8", None, "computes what is not float8 in bf16"),
        ("f32", "fp8-delayed", "h100", "computes what is not float8 in bf16"),
        ("auto", "fp4", None, "--precision must be auto, mixed, pure, fp8 or fp8-delayed"),
    ],
)
def test_fp8_numerics_the_simulator_refuses_are_one_line_errors(
    dtype: str, precision: str, cluster: str | None, what: str
) -> None:
    with pytest.raises(ExportError, match=what) as e:
        resolve_numerics(dtype, precision, cluster)
    assert "\n" not in str(e.value)


def test_numerics_auto_follow_the_cluster() -> None:
    assert resolve_numerics("auto", "auto", "dgx-a100") == ("bf16", "mixed")
    assert resolve_numerics("auto", "auto", "dgx2-v100") == ("f16", "mixed")
    assert resolve_numerics("f32", "auto", None) == ("f32", "pure")
    with pytest.raises(ExportError, match="half format"):
        resolve_numerics("f32", "mixed", None)


def test_auto_without_a_cluster_is_the_targets_half_format() -> None:
    """``distir export --to torchtitan`` without ``--cluster``: auto is bf16, torchtitan's only half
    format (it resolved to f16 and was refused, "torchtitan cannot express fp16", for a dtype
    the user never gave); f16 given is still refused, and other targets keep f16 without a cluster."""
    plan = make_plan("gpt2-117m", "d8.t1.p1.k1.1f1b.z3", 8, target="torchtitan")
    assert (plan.dtype, plan.precision) == ("bf16", "mixed")
    assert "bfloat16" in export(plan, "torchtitan").text
    with pytest.raises(ExportError, match="cannot express fp16"):
        export(make_plan("gpt2-117m", "d8.t1.p1.k1.1f1b.z3", 8, "f16", target="torchtitan"), "torchtitan")
    assert make_plan("gpt2-117m", "d8.t1.p1.k1.1f1b", 8, target="megatron").dtype == "f16"
    v100 = make_plan("gpt2-117m", "d8.t1.p1.k1.1f1b", 8, cluster="dgx2-v100", target="torchtitan")
    assert v100.dtype == "f16"


@pytest.mark.parametrize(
    ("strategy", "batch", "cluster", "what"),
    [
        ("d2.t1.p1.k3.1f1b", 64, None, "equal microbatches"),
        ("d16.t1.p1.k1.1f1b", 64, "dgx-a100", "needs 16 GPUs"),
        ("d1.t1.p2.k2.1f1b.L1-1", 64, None, "covers 2 blocks"),
    ],
)
def test_bad_plans_are_one_line_errors(strategy: str, batch: int, cluster: str | None, what: str) -> None:
    with pytest.raises(ExportError, match=what):
        make_plan("gpt2-1.6b", strategy, batch, cluster=cluster)


def test_unknown_target() -> None:
    with pytest.raises(ExportError, match="--to must be one of"):
        export(make_plan("gpt2-1.6b", "d1.t1.p1.k1.1f1b", 8), "colossal")


@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_an_imported_model_is_pointed_to_the_targets_that_take_it(target: str) -> None:
    """torchtitan and Megatron-LM build their own transformers from arguments: a user's module
    is refused with the targets that do take it."""
    pytest.importorskip("torch")
    plan = make_plan("tests.frontends.torch_models:mlp", "d2.t1.p1.k1", 4)
    with pytest.raises(ExportError, match=r"is an imported model .* export it to deepspeed .* or fsdp"):
        export(plan, target)
    assert export(plan, "deepspeed").text and export(plan, "fsdp").text


def test_a_batch_that_does_not_split_says_which_batches_do() -> None:
    with pytest.raises(ExportError, match="batch 3 does not split into d·k = 2·1 = 2 equal microbatches "):
        make_plan("gpt2-117m", "d2.t1.p1.k1.1f1b", 3)
    with pytest.raises(ExportError, match=r"\(a multiple of 8: 8, 16, 24, ...\)"):
        make_plan("gpt2-117m", "d2.t1.p1.k4.1f1b", 12)
