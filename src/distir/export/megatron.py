"""Megatron-LM command-line arguments for a plan (``pretrain_gpt.py``).

Option names follow ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22; many options there are generated from the
``TransformerConfig``/``ModelParallelConfig``/``TrainingConfig`` dataclass fields, ``x_y`` as
``--x-y``). What the plan maps to:

- degrees: ``--tensor-model-parallel-size t``, ``--pipeline-model-parallel-size p``,
  ``--context-parallel-size c`` with ``--cp-comm-type p2p`` (ring attention: K/V passed between
  neighbours, as ``distir.parallel.context``; Megatron's default order ``tp-cp-dp-pp`` is distir's
  rank order) for c > 1 (the data-parallel size is the world size over t·c·p),
  ``--sequence-parallel`` with ``sp``;
- batch: ``--micro-batch-size`` (batch / (d·k)), ``--global-batch-size`` (Megatron runs k
  microbatches per replica, through the pipeline or as gradient accumulation);
- the pipeline split: uniform chunks need nothing, or ``--num-layers-per-virtual-pipeline-stage``
  with v > 1; only the first and/or last stage different: ``--decoder-first-pipeline-num-layers``
  / ``--decoder-last-pipeline-num-layers``; any other split: ``--pipeline-model-parallel-layout``
  (``E`` embedding, ``t`` a block, ``L`` the head and loss, stages split by ``|``);
- recomputation: full → ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (every block), sel → ``--recompute-granularity selective`` (the
  attention core, Megatron's default module);
- data parallelism (d·c > 1): ``--overlap-grad-reduce`` (gradients reduced in buckets during the
  backward, overlapping it, as distir's program does);
- ZeRO: 1 → ``--use-distributed-optimizer``; 2 and 3 → Megatron-FSDP (``--use-megatron-fsdp
  --use-distributed-optimizer --data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params``), except ZeRO-2 under a pipeline (p > 1): its gradients accumulate whole
  and are reduce-scattered once per step (``distir.parallel.grad_reduction``), which is what
  ``--use-distributed-optimizer`` does (a whole gradient buffer, reduce-scattered in the last
  microbatch's backward);
- numerics: mixed bf16/f16 → ``--bf16`` / ``--fp16`` (fp32 main weights and optimizer state);
  FP8 through Transformer Engine (``TransformerConfig.fp8*`` fields; ``get_fp8_recipe`` in
  ``megatron/core/fp8_utils.py``), with ``--bf16``: ``--fp8-format hybrid`` (E4M3 activations
  and weights, E5M2 gradients, as distir casts them) and, for ``fp8`` (dynamic tensorwise
  scaling, torchao's recipe), ``--fp8-recipe tensorwise`` (TE's ``Float8CurrentScaling``: each
  tensor scaled by its own amax, TE >= 2.2); for ``fp8-delayed``, ``--fp8-recipe delayed``
  (TE's ``DelayedScaling``) with ``--fp8-amax-history-len 1024 --fp8-amax-compute-algo max``:
  Transformer Engine's own ``DelayedScaling`` defaults (``transformer_engine/common/recipe``,
  NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b), the scale from the largest
  amax of the history as distir models it (``distir.ops.float8``), where Megatron-LM's defaults
  are 1 and ``most_recent``. The embedding and the head stay bf16 (Megatron-LM runs only the
  transformer layers under TE's fp8 autocast), as distir leaves them. ``--fp8-param-gather``
  stays off: distir does not model float8 parameter all-gathers;
- the model's shape (``--num-layers``, ``--hidden-size``, ... and Llama's ``--swiglu
  --normalization RMSNorm --position-embedding-type rope ...``).

Nearest configurations, with a warning: the GPipe and ZB-H1 schedules (Megatron-LM runs 1F1B,
interleaved with virtual stages), op-level recomputation (exported as selective), pure half
precision (Megatron-LM keeps fp32 main weights). Refused: uneven batch shares, a non-default
placement (``distir.export.plan.refuse_common``), models other than GPT and Llama, a
tensor-parallel size that does not divide the heads, the query groups or the FFN's columns
(Megatron-Core divides each by it; ``refuse_split_heads``).
"""

from __future__ import annotations

import shlex

from distir.export.plan import (
    Exported,
    ModelShape,
    Plan,
    degrees_text,
    need_transformer,
    refuse_common,
    refuse_split_heads,
)
from distir.frontends.zoo.registry import parse_model_string
from distir.ir.types import DType
from distir.parallel.grad_reduction import reduce_scatter_every_backward

TARGET = "megatron"


def _model_args(m: ModelShape) -> list[str]:
    args = [
        "--num-layers", str(m.layers),
        "--hidden-size", str(m.hidden),
        "--ffn-hidden-size", str(m.ffn),
        "--num-attention-heads", str(m.heads),
        "--seq-length", str(m.seq),
        "--max-position-embeddings", str(m.seq),
        "--vocab-size", str(m.vocab),
        "--hidden-dropout", f"{m.dropout:g}",
        "--attention-dropout", f"{m.dropout:g}",
    ]  # fmt: skip
    if not m.tied:
        args.append("--untie-embeddings-and-output-weights")
    if m.family == "llama":
        args += [
            "--swiglu",
            "--normalization", "RMSNorm",
            "--position-embedding-type", "rope",
            "--rotary-base", str(m.rope_theta),
            "--disable-bias-linear",
        ]  # fmt: skip
        if m.kv_heads != m.heads:
            args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
        if m.rope_scaling is not None:  # Llama 3.1's (hf_shape)
            args += ["--use-rope-scaling", "--rope-scaling-factor", f"{m.rope_scaling:g}"]
    if m.norm_eps != 1e-5:  # Megatron-LM's default
        args += ["--norm-epsilon", f"{m.norm_eps:g}"]
    return args


def layout(blocks: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` for blocks per chunk: the embedding with chunk 0, the
    head and loss with the last."""
    last = len(blocks) - 1
    return "|".join(
        ("E" if c == 0 else "") + "t" * n + ("L" if c == last else "") for c, n in enumerate(blocks)
    )


def _split_args(plan: Plan) -> list[str]:
    s, b = plan.strategy, plan.blocks
    if s.p == 1:
        return []
    if plan.uniform_blocks is not None:
        return ["--num-layers-per-virtual-pipeline-stage", str(b[0])] if s.v > 1 else []
    middle = b[1:-1]
    if s.v == 1 and len(set(middle)) <= 1:
        args = []
        if not middle or b[0] != middle[0]:
            args += ["--decoder-first-pipeline-num-layers", str(b[0])]
        if not middle or b[-1] != middle[0]:
            args += ["--decoder-last-pipeline-num-layers", str(b[-1])]
        return args
    return ["--pipeline-model-parallel-layout", layout(b)]


def _recompute_args(plan: Plan, warn: list[str]) -> list[str]:
    r = plan.strategy.recompute
    if r == "full":
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    if r == "ops":
        warn.append(
            "rops (op-level recomputation: products saved, the rest recomputed) has no Megatron-LM "
            "option; exported as --recompute-granularity selective (the attention core), which keeps more"
        )
    return ["--recompute-granularity", "selective"] if r in ("selective", "ops") else []


# distir's precision → Megatron-LM's (Transformer Engine's) FP8 recipe (module docstring)
FP8_RECIPES = {
    "fp8": ["--fp8-recipe", "tensorwise"],
    "fp8-delayed": [
        "--fp8-recipe", "delayed", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max",
    ],
}  # fmt: skip


def _numerics_args(plan: Plan, warn: list[str]) -> list[str]:
    if not plan.half:
        return []
    if plan.precision == "pure":
        warn.append(
            f"pure {plan.dtype} (no fp32 master weights) has no Megatron-LM option; exported as mixed "
            f"precision, which keeps fp32 main weights and optimizer state"
        )
    args = ["--bf16" if plan.dtype == "bf16" else "--fp16"]
    if plan.dtype == "bf16":
        warn.append(_fp32_gradients_note(plan))
    if plan.float8:
        args += ["--fp8-format", "hybrid", *FP8_RECIPES[plan.precision]]
    return args


def _fp32_gradients_note(plan: Plan) -> str:
    """What Megatron-LM's bf16 gradients cost beyond the plan: ``--bf16`` forces
    ``accumulate_allreduce_grads_in_fp32`` (megatron/training/arguments.py at d98e8a64, "bfloat16
    requires gradient accumulation and all-reduce to be done in fp32"), so its gradient buffer
    holds 4 bytes per parameter where distir's mixed precision accumulates and reduces bf16 (2;
    ``docs/training.md``), over the parameters a GPU holds gradients of (sharded over d as well
    under Megatron-FSDP, ZeRO-2/3)."""
    s = plan.strategy
    params = parse_model_string(plan.model).build(1, DType.bf16).num_params
    share = s.t * s.p * (s.d if s.zero >= 2 and reduce_scatter_every_backward(s) else 1)
    extra_gib = 2 * params / share / 2**30
    return (
        "Megatron-LM accumulates and reduces bf16 gradients in fp32 (--bf16 forces "
        f"accumulate_allreduce_grads_in_fp32): its gradients take about {extra_gib:.1f} GiB more per GPU "
        f"than the plan's ({params / 1e9:.2f}B parameters, 2 more bytes each, over {share} GPU"
        f"{'s' if share > 1 else ''}); distir simulate --trainer megatron predicts the step with them"
    )


def megatron_args(plan: Plan) -> tuple[list[str], list[str]]:
    """The arguments, and the warnings on what was written as the nearest configuration."""
    refuse_common(plan, TARGET)
    shape = need_transformer(plan, TARGET)
    refuse_split_heads(plan, TARGET, shape, ffn=True)
    s = plan.strategy
    warn: list[str] = []
    args = [
        "--tensor-model-parallel-size", str(s.t),
        "--pipeline-model-parallel-size", str(s.p),
        "--micro-batch-size", str(plan.microbatch),
        "--global-batch-size", str(plan.batch),
    ]  # fmt: skip
    if s.c > 1:
        args += ["--context-parallel-size", str(s.c), "--cp-comm-type", "p2p"]
    if s.sp:
        args.append("--sequence-parallel")
    if s.p > 1 and s.k > 1 and s.schedule in ("gpipe", "zb1"):  # k = 1: the schedules coincide
        name = {"gpipe": "GPipe", "zb1": "ZB-H1"}[s.schedule]
        warn.append(
            f"Megatron-LM has no {name} schedule; exported with its 1F1B schedule (the same layout; "
            "the step time and peak memory differ from the plan's)"
        )
    args += _split_args(plan)
    args += _recompute_args(plan, warn)
    if s.d * s.c > 1:  # distir reduces gradients in buckets during the backward, overlapped
        args.append("--overlap-grad-reduce")
    if s.zero == 1 or (s.zero == 2 and not reduce_scatter_every_backward(s)):
        args.append("--use-distributed-optimizer")
    elif s.zero >= 2:
        strategy = "optim_grads" if s.zero == 2 else "optim_grads_params"
        # Megatron-FSDP (v1) runs with the distributed optimizer (it turns it on, with a warning)
        args += [
            "--use-megatron-fsdp",
            "--use-distributed-optimizer",
            "--data-parallel-sharding-strategy",
            strategy,
        ]
    args += _numerics_args(plan, warn)
    if plan.optimizer == "sgd":
        args += ["--optimizer", "sgd"]
    return args + _model_args(shape), warn


def export(plan: Plan) -> Exported:
    args, warn = megatron_args(plan)
    s = plan.strategy
    lines = [
        f"# distir export --to megatron: {plan.model} {s}, batch {plan.batch}, {plan.dtype} {plan.precision}",
        f"# world size {s.devices} = {degrees_text(s)}; ranks in Megatron-LM's order "
        "(TP fastest, then CP, then DP, then PP)",
        "MEGATRON_ARGS=(",
    ]
    i = 0
    while i < len(args):  # one option (with its value) per line
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        lines.append("  " + " ".join(shlex.quote(a) for a in args[i:j]))
        i = j
    lines += [
        ")",
        f'# on {s.devices} GPUs: torchrun ... pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" plus your data, '
        "tokenizer and "
        "learning-rate arguments",
    ]
    return Exported(TARGET, "\n".join(lines) + "\n", ".sh", tuple(warn))
