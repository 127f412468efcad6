"""The DeepSpeed config JSON (``distir.export.deepspeed``): parsed by json, checked against the
documented keys (deepspeed.ai/docs/config-json, AutoTP training) and DeepSpeed's batch identity
train_batch_size = micro × accumulation × data-parallel size."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from distir.export import ExportError, export, make_plan

TOP = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
    "bf16", "fp16", "tensor_parallel", "activation_checkpointing", "optimizer",
}  # fmt: skip


def _cfg(strategy: str, **kw: Any) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...]]:
    e = export(make_plan("gpt2-1.6b", strategy, 64, cluster="dgx-a100:2", **kw), "deepspeed")
    cfg = json.loads(e.text)
    assert set(cfg) <= TOP
    d = make_plan("gpt2-1.6b", strategy, 64).strategy.d
    assert (
        cfg["train_batch_size"]
        == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * d
    )
    return cfg, e.warnings, e.notes


def test_pure_data_parallel() -> None:
    cfg, warn, notes = _cfg("d8.t1.p1.k1.1f1b")
    assert cfg["zero_optimization"] == {"stage": 0} and cfg["bf16"] == {"enabled": True}
    assert "fp16" not in cfg and "tensor_parallel" not in cfg and warn == ()
    # DeepSpeed builds no optimizer without a section or a client optimizer: the user is told
    (note,) = notes
    assert note.startswith("optimizer: the plan's Adam") and "deepspeed.initialize" in note


def test_zero3_with_accumulation() -> None:
    cfg, _, _ = _cfg("d4.t1.p1.k4.1f1b.z3")
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["gradient_accumulation_steps"] == 4


def test_tp_with_sp_warns_that_autotp_has_no_sequence_parallelism() -> None:
    cfg, warn, _ = _cfg("d2.t4.sp.p1.k1.1f1b.z2")
    assert cfg["tensor_parallel"] == {"autotp_size": 4}
    assert any("sequence parallelism" in w for w in warn)


def test_f16_mixed_precision() -> None:
    cfg, _, _ = _cfg("d8.t1.p1.k1.1f1b", dtype="f16")
    assert cfg["fp16"] == {"enabled": True} and "bf16" not in cfg


def test_pipeline_is_a_note_and_gpipe_a_warning() -> None:
    cfg, warn, notes = _cfg("d4.t1.p2.k4.gpipe.z1.rfull")
    assert cfg["gradient_accumulation_steps"] == 4
    assert any("GPipe" in w for w in warn)
    assert any("num_stages=2" in n for n in notes) and any("checkpoint" in n for n in notes)
    # 'uniform' counts the embedding and head as layers: the blocks are balanced by their type
    assert any("partition_method='type:BLOCK'" in n for n in notes)
    assert not any("partition_method='uniform'" in n for n in notes)


def test_pipeline_with_tensor_parallelism_is_a_topology_not_autotp() -> None:
    """AutoTP's mesh has no pipeline axis and PipelineModule(num_stages=p) would make d·t ranks
    data-parallel (the batch identity fails): the tensor axis goes in the pipeline's topology."""
    cfg, _, notes = _cfg("d2.t2.p2.k4.1f1b.z1")
    assert "tensor_parallel" not in cfg
    assert any("topology.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)" in n for n in notes)
    assert not any("num_stages=" in n for n in notes)
    assert any("tensor-parallel in your model code" in n for n in notes)


def test_autotp_with_zero3() -> None:
    """DeepSpeed trains AutoTP with ZeRO-3 since 0.19.4 (#8168, at edaa7221)."""
    cfg, _, notes = _cfg("d2.t4.p1.k1.1f1b.z3")
    assert cfg["tensor_parallel"] == {"autotp_size": 4} and cfg["zero_optimization"] == {"stage": 3}
    assert any("0.19.4" in n for n in notes)


@pytest.mark.parametrize(
    ("strategy", "feature"),
    [
        ("d1.t1.p4.k8.interleaved.v2", "interleaved"),
        ("d2.t1.p4.k8.1f1b.z2", "ZeRO stage 2"),
        ("d2.t1.p1.k1.1f1b.b1-3", "uneven batch shares"),
        ("d2.t1.c2.p1.k1.1f1b", "context parallelism"),
    ],
)
def test_what_deepspeed_cannot_express_is_an_error(strategy: str, feature: str) -> None:
    with pytest.raises(ExportError, match=feature):
        export(make_plan("gpt2-1.6b", strategy, 64), "deepspeed")


@pytest.mark.parametrize("precision", ["fp8", "fp8-delayed"])
def test_fp8_is_refused_since_the_config_has_no_float8(precision: str) -> None:
    plan = make_plan("llama3-8b", "d8.t1.p1.k1.1f1b", 64, precision=precision, cluster="h100")
    with pytest.raises(ExportError, match=f"cannot express {precision} training: its config has no float8"):
        export(plan, "deepspeed")


class _DataParallel:
    """The model-parallel unit DeepSpeed asks for the data-parallel size (a stand-in for
    Megatron's ``mpu``): ``d`` replicas, this process rank 0 of each group."""

    def __init__(self, d: int, t: int) -> None:
        self.d, self.t = d, t

    def get_data_parallel_world_size(self) -> int:
        return self.d

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return self.t

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture(scope="module")
def deepspeed_config() -> Iterator[Any]:
    """DeepSpeed's own config loader, in a one-process gloo group (it reads the rank from its
    communication module) on a free port; skipped where DeepSpeed is not installed (``./dev``
    installs it). The launcher variables it sets are removed afterwards, and the group destroyed:
    other tests in this process must not believe they run under torchrun.

    The group comes up without DeepSpeed's shared-memory all-reduce kernel: its backend compiles
    that C++ extension on first use (2–5 minutes on two cores, again for each virtual environment,
    so on every fresh clone), and only its CPU inference all-reduce calls it, never the config
    loader."""
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (./dev installs the deepspeed extra)")
    import importlib
    import socket

    import deepspeed.comm as ds_comm
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (*env.items(), ("LOCAL_RANK", "0")):
            mp.setenv(k, v)
        # (deepspeed.comm's attribute ``torch`` is the torch package: the module by its full name)
        mp.setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
        ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        try:
            yield DeepSpeedConfig
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


@pytest.mark.xdist_group("deepspeed")
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [
        "d8.t1.p1.k1.1f1b",
        "d4.t1.p1.k4.1f1b.z3",
        "d8.t1.p1.k2.1f1b.z2",
        "d16.t1.p1.k1.1f1b.z1",
        "d2.t4.p1.k1.1f1b.z3",
    ],
)
def test_deepspeeds_own_loader_reads_the_export(deepspeed_config: Any, strategy: str) -> None:
    """The exported JSON through ``deepspeed.runtime.config.DeepSpeedConfig``: accepted (its batch
    identity holds for the plan's data-parallel size) and read back as the plan says."""
    plan = make_plan("gpt2-1.6b", strategy, 64, cluster="dgx-a100:2")
    cfg = json.loads(export(plan, "deepspeed").text)
    s = plan.strategy
    got = deepspeed_config(cfg, mpu=_DataParallel(s.d, s.t))
    assert got.train_batch_size == 64
    assert got.train_micro_batch_size_per_gpu == 64 // (s.d * s.k)
    assert got.gradient_accumulation_steps == s.k
    assert got.zero_optimization_stage == s.zero
    assert got.bfloat16_config.enabled


@pytest.mark.xdist_group("deepspeed")
@pytest.mark.slow  # DeepSpeed's import and process group take ~35 s
def test_deepspeeds_loader_refuses_a_broken_batch_identity(deepspeed_config: Any) -> None:
    """The loader really checks: the same JSON with one accumulation step too many is refused."""
    plan = make_plan("gpt2-1.6b", "d4.t1.p1.k4.1f1b.z3", 64, cluster="dgx-a100:2")
    cfg = json.loads(export(plan, "deepspeed").text)
    cfg["gradient_accumulation_steps"] += 1
    with pytest.raises(AssertionError, match="batch"):
        deepspeed_config(cfg, mpu=_DataParallel(4, 1))
