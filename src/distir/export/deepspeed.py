"""A DeepSpeed config JSON for a plan.

Keys follow DeepSpeed's configuration documentation (https://www.deepspeed.ai/docs/config-json/,
and the AutoTP training tutorial https://www.deepspeed.ai/tutorials/autotp-training/ for
``tensor_parallel.autotp_size``), checked against deepspeedai/DeepSpeed at
edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (2026-08-22): ``train_batch_size`` (the global batch)
= ``train_micro_batch_size_per_gpu`` (batch / (d·k)) × ``gradient_accumulation_steps`` (k) × the
data-parallel size; ``zero_optimization.stage``; ``bf16.enabled`` / ``fp16.enabled`` (mixed
precision: DeepSpeed's optimizer keeps fp32 master weights); ``tensor_parallel.autotp_size`` for
t > 1 without pipelining (AutoTP, ZeRO stages 0-3: its engine trains AutoTP with ZeRO-3 since
DeepSpeed 0.19.4, #8168).

DeepSpeed's pipeline (``deepspeed.pipe.PipelineModule``) is built in code, not in the JSON: the
export notes the ``num_stages`` and the partition — ``partition_method='type:BLOCK'`` (the
blocks alone balanced over the stages, the embedding with the first and the head with the last;
``'uniform'`` counts the embedding and head as layers too, so it does not split the blocks
evenly). With tensor parallelism too, AutoTP does not apply: it builds a (data, tensor) mesh of
the whole world with no pipeline axis, and ``PipelineModule(num_stages=p)`` makes every
non-pipeline rank a data-parallel one (d·t of them, so the batch identity fails). The export then
writes no ``tensor_parallel`` section and notes the topology
``PipeModelDataParallelTopology(num_pp=p, num_mp=t, num_dp=d)`` with tensor-parallel layers in
the model code, as Megatron-DeepSpeed runs (BLOOM, MT-NLG). Refused: interleaved virtual stages
(its ``TrainSchedule`` is 1F1B only), ZeRO-2/3 with pipelining (its pipeline engine takes ZeRO
0-1), uneven batch shares and a non-default placement. Nearest, with a warning: GPipe and ZB-H1
(run as 1F1B), sequence parallelism under AutoTP (it has none: activations between layers
replicated), pure half precision (DeepSpeed keeps fp32 masters). Refused too: fp8 and
fp8-delayed (its config has ``fp16`` and ``bf16`` sections and no float8 one: float8 linear
layers would be the model code's).
"""

from __future__ import annotations

import json
from typing import Any

from distir.export.plan import Exported, ExportError, Plan, refuse_common, refuse_context

TARGET = "deepspeed"


def _pipeline(plan: Plan, warn: list[str], notes: list[str]) -> None:
    s = plan.strategy
    if s.v > 1:
        raise ExportError(
            f"{TARGET} cannot express interleaved virtual pipeline stages (v{s.v}): its pipeline engine runs "
            "one chunk per stage (TrainSchedule, 1F1B)"
        )
    if s.zero >= 2:
        raise ExportError(
            f"{TARGET} cannot combine ZeRO stage {s.zero} with pipeline parallelism (p{s.p}): 0 or 1"
        )
    if s.k > 1 and s.schedule in ("gpipe", "zb1"):  # one microbatch: the schedules coincide
        name = {"gpipe": "GPipe", "zb1": "ZB-H1"}[s.schedule]
        warn.append(
            f"DeepSpeed's pipeline has no {name} schedule; its TrainSchedule runs 1F1B (the same layout; "
            "the step time and peak memory differ from the plan's)"
        )
    split = (
        "partition_method='type:BLOCK' (BLOCK: your transformer block's class name; the blocks split "
        "evenly, the embedding with the first stage and the head with the last; 'uniform' would count "
        "those as layers too)"
        if plan.uniform_blocks is not None
        else f"the plan's split of the blocks, {'-'.join(map(str, plan.blocks))} (embedding with the first "
        "stage, head with the last; partition_method='type:BLOCK' splits the blocks evenly)"
    )
    stages = (
        f"topology=deepspeed.runtime.pipe.topology.PipeModelDataParallelTopology(num_pp={s.p}, num_mp={s.t}, "
        f"num_dp={s.d})"
        if s.t > 1
        else f"num_stages={s.p}"
    )
    notes.append(
        f"pipeline: build the model as deepspeed.pipe.PipelineModule(layers, {stages}, loss_fn=...) "
        f"with {split}; gradient_accumulation_steps is its number of microbatches"
    )
    if s.t > 1:
        sp = ", with sequence parallelism" if s.sp else ""
        notes.append(
            "tensor parallelism under the pipeline: the blocks' layers must be tensor-parallel in your "
            f"model code over the topology's model axis ({s.t} ranks{sp}), as Megatron-DeepSpeed's are; "
            "AutoTP (tensor_parallel.autotp_size) does not combine with PipelineModule: its mesh has no "
            "pipeline axis"
        )


def ds_config(plan: Plan) -> tuple[dict[str, Any], list[str], list[str]]:
    """The config, warnings (nearest configurations) and notes (what goes in code)."""
    refuse_common(plan, TARGET)
    refuse_context(plan, TARGET)
    if plan.float8:
        raise ExportError(
            f"{TARGET} cannot express {plan.precision} training: its config has no float8 option (only "
            "fp16 and bf16); export it to torchtitan, megatron or fsdp"
        )
    s = plan.strategy
    warn: list[str] = []
    notes: list[str] = []
    cfg: dict[str, Any] = {
        "train_batch_size": plan.batch,
        "train_micro_batch_size_per_gpu": plan.microbatch,
        "gradient_accumulation_steps": s.k,
        "zero_optimization": {"stage": s.zero},
    }
    if plan.half:
        cfg["bf16" if plan.dtype == "bf16" else "fp16"] = {"enabled": True}
        if plan.precision == "pure":
            warn.append(
                f"pure {plan.dtype} (no fp32 master weights) has no DeepSpeed option; exported as mixed "
                "precision, which keeps fp32 master weights in the optimizer"
            )
    if s.t > 1 and s.p == 1:  # under a pipeline, tensor parallelism is the model code's (_pipeline)
        cfg["tensor_parallel"] = {"autotp_size": s.t}
        if s.zero == 3:
            notes.append(
                "AutoTP with ZeRO-3: DeepSpeed 0.19.4 or later (earlier releases refuse to train it)"
            )
        if s.sp:
            warn.append(
                "DeepSpeed's AutoTP has no sequence parallelism: exported without sp (activations between "
                "layers replicated over the tensor-parallel group: more memory than the plan's)"
            )
    if s.p > 1:
        _pipeline(plan, warn, notes)
    if s.recompute != "none":
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
        }
        what = {
            "full": "every block's forward",
            "selective": "each block's attention core (softmax·V)",
            "ops": "everything in each block but its matrix products",
        }[s.recompute]
        notes.append(f"recomputation: wrap {what} in deepspeed.checkpointing.checkpoint")
    if plan.optimizer == "sgd":
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.001}}
        notes.append("optimizer: SGD with a placeholder learning rate; set your own")
    else:  # DeepSpeed's engine builds no optimizer without one (engine.py: has_optimizer)
        notes.append(
            "optimizer: the plan's Adam is not in the config (it needs your learning rate): add an "
            '"optimizer" section ({"type": "Adam", "params": {"lr": ...}}) or pass optimizer= to '
            "deepspeed.initialize; with neither, DeepSpeed updates no weights"
        )
    return cfg, warn, notes


def export(plan: Plan) -> Exported:
    cfg, warn, notes = ds_config(plan)
    return Exported(TARGET, json.dumps(cfg, indent=2) + "\n", ".json", tuple(warn), tuple(notes))
