"""A torchtitan job TOML for a plan (``--job.config_file``).

Section and key names follow ``torchtitan/config/job_config.py`` of pytorch/torchtitan at commit
e347b1e5e6b6941d789d16d340145294d82dc71e (2026-02-15), the last before #2386 (2026-02-23)
replaced the TOML job files by Python configurations (``Trainer.Config``; its
``ParallelismConfig`` keeps the degree names used here and its ``--section.option`` flags still
work). What the plan maps to:

- ``[parallelism]``: ZeRO-0 replicas as ``data_parallel_replicate_degree`` (DDP, which torchtitan
  runs without TP and PP only: with them, FSDP as for ZeRO-2, with a warning); ZeRO-1/2/3 as
  ``data_parallel_shard_degree`` (FSDP2) with ``fsdp_reshard_after_forward`` "always" (ZeRO-3)
  or "never" (parameters kept gathered from the forward to the backward: ZeRO-2);
  ``tensor_parallel_degree``; ``pipeline_parallel_degree``, ``pipeline_parallel_schedule``
  (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble for zb1),
  ``pipeline_parallel_microbatch_size`` and, for p > 1, the chunks as
  ``module_fqns_per_model_part`` (torchtitan's Llama module names); ``context_parallel_degree``
  for c > 1, with ``context_parallel_rotate_method = "alltoall"`` (each step swaps K/V shards
  between neighbours: the ring; "allgather", torchtitan's default, gathers them all at once —
  more memory). Its load balancer's default (head-tail: rank i holds chunks i and 2c−1−i) is
  distir's layout. torchtitan's FSDP shards over dp_shard × cp;
- ``[training]``: ``local_batch_size`` (per data-parallel rank; without pipelining, one
  microbatch, torchtitan accumulating ``global_batch_size / (local_batch_size · d)`` of them),
  ``global_batch_size``, ``seq_len``; mixed precision as ``mixed_precision_param`` (bfloat16)
  and ``mixed_precision_reduce`` (float32), pure bf16 as ``dtype = "bfloat16"``;
- ``[activation_checkpoint]``: ``mode`` none/full, op-level recomputation as ``selective`` with
  ``selective_ac_option = "op"``;
- ``[model]``: ``name``/``flavor`` for the models torchtitan ships (Llama 3 8B), else a flavor
  named after the model, with a warning (register it in torchtitan's model args). torchtitan's
  Llama 3 scales its rotary frequencies as Llama 3.1 does in every flavor (``RoPEScalingArgs``,
  factor 8, in ``models/llama3/model/args.py``): a Hugging Face config of the shipped shape is
  that flavor, with a warning when its own rope scaling is not that (Llama 3's unscaled positions);
- FP8 (``fp8``: torchao's ``Float8Linear``, dynamic tensorwise scaling, what distir simulates):
  ``[model] converters = ["quantize.linear.float8"]`` (the name its float8 converter is
  registered under, ``components/quantization/float8.py``) and ``[quantize.linear.float8]
  filter_fqns = ["output"]`` (the head stays bf16, as distir leaves it; torchtitan's Llama 3 8B
  preset filters it so too); no ``recipe_name``: torchtitan's default, tensorwise. Its FSDP float8
  options (``enable_fsdp_float8_all_gather``, ``precompute_float8_dynamic_scale_for_fsdp``) stay
  off, their default, as the plans distir searches gather the bf16 copy (the float8 all-gather is
  ``simulate --float8-all-gather``'s, not a dimension of the search). ``[compile] enable =
  true``: distir's float8 cast is the one torch.compile fuses (its
  transposed copy in the same kernel, an input read by several linear layers cast once), and
  torchtitan's docs/float8.md calls compile required for float8's speed.

Nearest, with a warning: TP without sp (torchtitan's TP always shards the norms' activations
over the sequence), ZeRO-1 (exported as ZeRO-2), Megatron's selective recomputation (exported as
op-level), fp8 with TP: at e347b1e5 the Llama ``parallelize`` turns on its float8 tensor
parallelism (``Float8ColwiseParallel``, ``PrepareFloat8ModuleInput``: the sequence-parallel
all-gathers in float8, as distir shards them) only when ``model.converters`` holds the string
``"float8"``, a name no converter is registered under since #1701, so its TP gathers bf16.
Refused: fp16 (torchtitan's mixed precision is bfloat16), fp8-delayed (torchtitan deleted delayed
scaling in #812, torchao in #1753: their float8 is dynamic), uneven batch shares, a non-default
placement.

Later torchtitan (b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, 2026-08-21) configures float8 in
Python (``Float8LinearConverter.Config``) and has dropped tensorwise scaling (#3127: rowwise
recipes only), so fp8 as distir simulates it is a job for the TOML release above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from distir.export.plan import (
    Exported,
    ExportError,
    Plan,
    degrees_text,
    model_shape,
    need_transformer,
    refuse_common,
    refuse_split_heads,
)
from distir.frontends.zoo.registry import parse_model_string

TARGET = "torchtitan"
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zb1": "InterleavedZeroBubble",
}
FLAVORS = {"llama3-8b": ("llama3", "8B")}
ROPE_SCALING = 8.0  # the rope-scaling factor of torchtitan's Llama 3 flavors (module docstring)
FLOAT8_CONVERTER = "quantize.linear.float8"  # torchtitan's registered float8 converter (and its table)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_value(x) for x in v) + "]"


def to_toml(sections: dict[str, dict[str, Any]], header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    for name, table in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def module_fqns(blocks: tuple[int, ...]) -> list[list[str]]:
    """torchtitan's Llama module names per chunk: the embedding first, the norm and head last."""
    out: list[list[str]] = []
    start = 0
    for c, n in enumerate(blocks):
        names = [f"layers.{i}" for i in range(start, start + n)]
        start += n
        if c == 0:
            names.insert(0, "tok_embeddings")
        if c == len(blocks) - 1:
            names += ["norm", "output"]
        out.append(names)
    return out


def _parallelism(plan: Plan, warn: list[str]) -> dict[str, Any]:
    s = plan.strategy
    ddp = s.zero == 0 and (s.d == 1 or (s.t == 1 and s.p == 1))
    if s.zero == 0 and not ddp:
        warn.append(
            "torchtitan's DDP runs without TP and PP only (its parallelize: \"DDP has not supported > 1D "
            'parallelism"); ZeRO-0 replicas exported as FSDP without resharding after the forward (ZeRO-2: '
            "less memory, gradients reduce-scattered and parameters all-gathered instead of all-reduced)"
        )
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": s.d if ddp else 1,
        "data_parallel_shard_degree": 1 if ddp else s.d,
    }
    if not ddp:
        par["fsdp_reshard_after_forward"] = "always" if s.zero == 3 else "never"
        if s.zero == 1:
            warn.append(
                "torchtitan has no ZeRO-1 (optimizer state sharded, gradients whole); exported as FSDP "
                "without resharding after the forward (ZeRO-2: gradients sharded too, less memory)"
            )
    par["tensor_parallel_degree"] = s.t
    if s.t > 1:
        par |= _loss_parallel(plan, warn)
    if s.c > 1:
        par["context_parallel_degree"] = s.c
        par["context_parallel_rotate_method"] = "alltoall"
    if s.t > 1 and not s.sp:
        warn.append(
            "torchtitan's tensor parallelism always shards the norms' activations over the sequence "
            "(sequence parallelism); exported with it (less activation memory than the plan's)"
        )
    par["pipeline_parallel_degree"] = s.p
    if s.p > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[s.schedule]
        par["pipeline_parallel_microbatch_size"] = plan.microbatch
        par["module_fqns_per_model_part"] = module_fqns(plan.blocks)
    return par


def _loss_parallel(plan: Plan, warn: list[str]) -> dict[str, Any]:
    """Under tensor parallelism torchtitan runs its cross entropy under ``loss_parallel`` unless
    ``disable_loss_parallel`` (``[parallelism]``, job_config.py at e347b1e5): the plan's
    ``loss=parallel`` is that, ``loss=torch`` (whole logits) is it disabled; distir's
    vocabulary-parallel forms (``fp32``, ``fused``) have no torchtitan option."""
    if plan.model.strip().startswith("hf:"):  # Hugging Face's loss: no vocabulary-parallel form
        return {}
    form = parse_model_string(plan.model).config.loss
    if form == "torch":
        return {"disable_loss_parallel": True}
    if form != "parallel":
        warn.append(
            f"torchtitan has no loss of the plan's form (loss={form}, Megatron-LM's vocabulary-parallel "
            "cross entropy); exported with its loss_parallel, whose backward holds four fp32 logit-sized "
            "tensors where the plan's holds two: simulate the model with loss=parallel (or --trainer "
            "torchtitan) to see its memory"
        )
    return {}


def _training(plan: Plan) -> dict[str, Any]:
    s = plan.strategy
    shape = need_transformer(plan, TARGET)
    local = plan.batch // s.d if s.p > 1 else plan.microbatch
    tr: dict[str, Any] = {"local_batch_size": local, "global_batch_size": plan.batch, "seq_len": shape.seq}
    if plan.dtype == "f16":
        raise ExportError(
            f"{TARGET} cannot express fp16: its mixed precision and training dtype are bfloat16 or float32"
        )
    if plan.dtype == "bf16" and plan.precision == "pure":
        tr["dtype"] = "bfloat16"
    else:
        tr["mixed_precision_param"] = "bfloat16" if plan.dtype == "bf16" else "float32"
        tr["mixed_precision_reduce"] = "float32"
    return tr


def _activation_checkpoint(plan: Plan, warn: list[str]) -> dict[str, Any]:
    r = plan.strategy.recompute
    if r in ("none", "full"):
        return {"mode": r}
    if r == "selective":
        warn.append(
            "rsel (Megatron's selective recomputation: the attention core) has no torchtitan mode; exported "
            'as op-level selective checkpointing (selective_ac_option = "op"), which recomputes more'
        )
    return {"mode": "selective", "selective_ac_option": "op"}


def _float8(plan: Plan, sections: dict[str, dict[str, Any]], warn: list[str]) -> None:
    """FP8's converter, its table and compile (module docstring); fp8-delayed refused."""
    if plan.precision == "fp8-delayed":
        raise ExportError(
            f"{TARGET} cannot express fp8-delayed (Transformer Engine's delayed scaling): its float8 "
            "converter runs torchao's dynamic scaling only; give --precision fp8 or export to megatron"
        )
    sections["model"]["converters"] = [FLOAT8_CONVERTER]
    sections["compile"] = {"enable": True}
    sections[FLOAT8_CONVERTER] = {"filter_fqns": ["output"]}
    if plan.strategy.t > 1:
        warn.append(
            "torchtitan (e347b1e5) turns on its float8 tensor parallelism only for a converter named "
            f'"float8", which is registered as {FLOAT8_CONVERTER!r}: its sequence-parallel all-gathers '
            "move bf16, twice the bytes of the float8 ones distir simulated"
        )


def _shipped(plan: Plan) -> str | None:
    """The torchtitan model (a ``FLAVORS`` key) the plan's model is: its zoo name, with options
    that leave its shape as it is (the loss, the norms' kernels, ...), or a Hugging Face config
    of its shape at any sequence length and rope scaling (``_rope_warning``); else None."""
    head = plan.model.partition(":")[0].strip()
    if head in FLAVORS:
        return head if model_shape(head) == plan.shape else None
    if plan.shape is None or not plan.model.strip().startswith("hf:"):
        return None
    for name in FLAVORS:
        shipped = model_shape(name)
        if shipped is None:
            continue
        if replace(shipped, seq=plan.shape.seq, rope_scaling=plan.shape.rope_scaling) == plan.shape:
            return name
    return None


def _rope_warning(plan: Plan, flavor: str) -> str:
    """Why an ``hf:`` config run as torchtitan's ``flavor`` has other rotary positions ("" when
    its rope scaling is torchtitan's)."""
    factor = plan.shape.rope_scaling if plan.shape is not None else ROPE_SCALING
    if not plan.model.strip().startswith("hf:") or factor == ROPE_SCALING:
        return ""
    own = "unscaled (Llama 3's)" if factor is None else f"scaled by {factor:g}"
    return (
        f"torchtitan's llama3 {flavor} scales its rotary frequencies as Llama 3.1 (factor {ROPE_SCALING:g}); "
        f"this config's are {own}: the same shapes and step, other positions (its weights would see "
        "shifted ones)"
    )


def job_sections(plan: Plan) -> tuple[dict[str, dict[str, Any]], list[str]]:
    refuse_common(plan, TARGET)
    warn: list[str] = []
    shape = need_transformer(plan, TARGET)
    refuse_split_heads(plan, TARGET, shape, ffn=False)
    shipped = _shipped(plan)
    name, flavor = FLAVORS.get(
        shipped or "", ("llama3" if shape.family == "llama" else shape.family, plan.model)
    )
    if shipped is None:
        warn.append(
            f"torchtitan ships no {plan.model} model; [model] names it (name {name!r}, flavor {flavor!r}): "
            "register a model of its shape under those names"
        )
    elif rope := _rope_warning(plan, flavor):
        warn.append(rope)
    sections = {
        "model": {"name": name, "flavor": flavor},
        "training": _training(plan),
        "parallelism": _parallelism(plan, warn),
        "activation_checkpoint": _activation_checkpoint(plan, warn),
    }
    if plan.optimizer == "sgd":
        sections["optimizer"] = {"name": "SGD"}
    if plan.float8:
        _float8(plan, sections, warn)
    return sections, warn


def export(plan: Plan) -> Exported:
    sections, warn = job_sections(plan)
    s = plan.strategy
    header = [
        f"distir export --to torchtitan: {plan.model} {s}, batch {plan.batch}, {plan.dtype} {plan.precision}",
        f"NGPU = {s.devices} ({degrees_text(s)}); torchtitan job config (job_config.py at e347b1e5)",
    ]
    return Exported(TARGET, to_toml(sections, header), ".toml", tuple(warn))
