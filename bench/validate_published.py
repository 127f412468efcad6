"""Published-runs validation (issue 16): predict published training runs with distir and compare.

    PYTHONPATH=src .venv/bin/python bench/validate_published.py [--only NAME]... [--quick] [--markdown]
        [--interference off|persistent]

Each run of ``bench/published_runs.toml`` (its source, model, cluster, the run's own strategy and
precision, the published throughput and whether it fit) is built as ``distir simulate --model
... --strategy ... --dtype bf16 --precision mixed`` builds it — the zoo model on the global batch,
the cost model's chunk times, ``distribute`` with Adam and comm streams — and simulated on the
run's cluster. The predicted step time is turned into the published unit (tokens/s per GPU,
samples/s, seconds per step, or TFLOP/s per GPU under the publisher's FLOPs formula, so that the
error is the error of the step time whatever the formula), and the table prints published vs
predicted, the throughput error (negative: distir predicts a slower step), whether the run fits
(published vs predicted) and the peak memory. The summary gives the median and max absolute
error and how many published-fit runs are predicted to fit, against the issue's targets
(median ≤ 10 %, none over 25 %, all fit).

Runs needing a feature distir lacks are listed as
``unsupported: <feature>`` and left out of the summary; a run distir refuses is listed with its
error and counted as a failure. Prints figures; asserts nothing (``tests/bench`` checks the data).

``--quick`` keeps the runs on at most 256 GPUs; ``--only NAME`` (repeatable, or a prefix ending in
``*``) selects runs by name. One thread: set before numpy loads.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import sys
import time
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

if TYPE_CHECKING:
    from distir.parallel.strategy import Strategy
    from distir.sim.simulate import SimResult

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "published_runs.toml"
METRICS = {
    "tokens_per_gpu_s": "tok/s/GPU",
    "samples_per_s": "samples/s",
    "tflops_per_gpu": "TFLOP/s/GPU",
    "seconds_per_step": "s/step",
}
# fp8: torchao's Float8Linear (dynamic tensorwise scaling), ``distir simulate --precision fp8``;
# fp8-delayed: Transformer Engine's te.Linear under DelayedScaling (``--precision fp8-delayed``);
# fp16-mixed: the model built in f16 (``--dtype f16 --precision mixed``), fp32 Adam state
PRECISIONS = {
    "bf16-mixed": "mixed",
    "bf16-pure": "pure",
    "fp8": "fp8",
    "fp8-delayed": "fp8-delayed",
    "fp16-mixed": "mixed",
}
# megatron: model FLOPs (no recomputation); megatron-recompute: the same with the blocks' forward
# counted twice, as full activation recomputation runs it (hardware FLOPs)
FLOPS_FORMULAS = ("megatron", "megatron-recompute")
QUICK_MAX_GPUS = 256
TARGET_MEDIAN, TARGET_MAX = 10.0, 25.0


# the zoo families a record's model can be (``ModelCfg.family``): GPT (LayerNorm, GELU, learned
# positions), Llama (RMSNorm, SwiGLU, RoPE), Nemotron (LayerNorm1p, squared ReLU, partial RoPE)
MODEL_FAMILIES = ("gpt", "llama", "nemotron")


class RunsError(ValueError):
    """The data file is malformed: names the file, the run and the field."""


@dataclass(frozen=True, slots=True)
class ModelCfg:
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    notes: str
    # the attention the run's software computes: fused (FlashAttention and its kin, 2022 on) or
    # naive (the explicit scores, e.g. Megatron-DeepSpeed's fused masked softmax before it)
    attention: str = "fused"
    # GPT only: the head multiplies by the embedding's transpose (Megatron's, MPT's default)
    tied: bool = False
    # the cross entropy's kernel (the zoo's ``loss`` option): fp32 (the logits cast to fp32
    # first, vocabulary-parallel: Megatron), fused (fp32 inside, no fp32 copy: flash-attn's,
    # llm-foundry) or torch (F.cross_entropy on fp32 logits: torchtitan without TP)
    loss: str = "fp32"
    # the hidden and attention dropout probability the trainer runs with (the zoo's ``dropout``;
    # Megatron-LM's defaults are 0.1 for both, 0 where a record does not say)
    dropout: float = 0.0
    # llama only, how eager PyTorch runs the layer (the zoo's ``norm`` and ``rope`` options):
    # RMSNorm as one kernel (fused) or as torchtitan's module runs it, separate ops in fp32
    # (composite); RoPE in the model's dtype (fused) or cast to fp32 and back (fp32)
    norm: str = "fused"
    rope: str = "fused"
    # llama only: SwiGLU's silu as a·Sigmoid(a) (composite: two kernels when nothing fuses them)
    # or one op (fused: F.silu, one kernel)
    silu: str = "composite"
    # llama only: grouped-query k and v handed to the attention kernel as they are (native) or
    # repeated to every query head first, a copy each (copy: torchtitan's repeat_kv before SDPA)
    kv: str = "native"
    # gpt only: llm-foundry's flash_attn_fn copies q, k, v in (index_first_axis) and the output
    # out (pad_input) around flash-attn's variable-length kernel (the zoo's ``unpad`` option)
    unpad: bool = False
    # Q, K and V as three GEMMs (split: torchtitan's wq, wk, wv) or one of one weight (fused:
    # Megatron's query_key_value / linear_qkv, llm-foundry's Wqkv; the zoo's ``qkv`` option)
    qkv: str = "split"


@dataclass(frozen=True, slots=True)
class ClusterCfg:
    spec: str
    gpu: str
    gpus: int
    interconnect: str


@dataclass(frozen=True, slots=True)
class StrategyCfg:
    dp: int
    tp: int
    pp: int
    cp: int
    microbatch: int
    global_batch: int
    schedule: str
    virtual_stages: int
    zero: int
    recompute: str
    sequence_parallel: bool
    # blocks per pipeline stage: "uniform" or explicit counts "5-6-…" (Strategy.partition)
    partition: str = "uniform"
    assumed: tuple[str, ...] = ()
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Published:
    metric: str
    value: float
    fit: bool
    flops_formula: str = ""
    also: str = ""
    # a published peak memory per GPU (GiB) and what it measures: "allocator_reserved", the caching
    # allocator's peak reserved bytes (``reserved_bytes.all.peak``: its segments, cuBLAS workspaces
    # included, not the CUDA context or NCCL's buffers), the figure torchtitan logs as max_reserved
    memory: str = ""
    memory_gib: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    trainer: str
    source: str
    where: str
    commit: str
    precision: str
    precision_notes: str
    model: ModelCfg
    cluster: ClusterCfg
    strategy: StrategyCfg
    published: Published
    unsupported: str = ""
    # the trainer's kernels: fused (Megatron-LM's fused kernels), inductor (torch.compile's
    # default mode: the same chains, none joining a GEMM) or eager (one kernel per op, as eager
    # PyTorch runs them); ``distir simulate --kernels``
    kernels: str = "fused"
    # the fused-attention kernel the trainer runs: fa2 (flash-attn, PyTorch SDPA's flash backend),
    # cudnn (Transformer Engine's FusedAttention, preferred on Hopper) or fa-triton (flash-attn's
    # FlashAttention in Triton, llm-foundry's attn_impl: triton); ``distir simulate
    # --attention-kernel``
    attention_kernel: str = "fa2"
    # Megatron-LM's --overlap-param-gather: the distributed optimizer's parameter all-gather in the
    # next step's forward (``distribute(overlap_param_gather=True)``); FSDP1's SHARD_GRAD_OP
    # gathers so with one microbatch (each forward gathers unit by unit, the backward frees)
    overlap_param_gather: bool = False
    # Megatron-LM's --tp-comm-overlap: tensor-parallel collectives pipelined with their GEMMs
    # (``RooflineCostModel(tp_comm_overlap=True)``, ``distir.sim.overlap``)
    tp_comm_overlap: bool = False
    # how: te (Transformer Engine's userbuffers, Megatron-LM's) or async (PyTorch's async tensor
    # parallelism, torchtitan's: one chunk per rank) (``RooflineCostModel.tp_overlap_form``)
    tp_overlap_form: str = "te"
    # DeepSpeed's PipelineEngine (Megatron-DeepSpeed): blocking p2p transfers, the data-parallel
    # gradient all-reduce after the pipeline flush (``distribute(deepspeed_pipe=True)``)
    deepspeed_pipe: bool = False
    # Megatron-LM's pipeline transfers waited on by the schedule, as without overlap_p2p_comm
    # (always under 1F1B; NeMo's ``overlap_p2p_comm: False``) (``distribute(p2p_blocking=True)``)
    p2p_blocking: bool = False
    # DeepSpeed's BF16_Optimizer: each microbatch's gradients added into fp32 ones, reduced in fp32
    # (``distribute(fp32_grad_accum=True)``)
    fp32_grad_accum: bool = False
    # PyTorch FSDP2 (``fully_shard``, torchtitan): each parameter all-gather copied out of the flat
    # buffer into the parameters on the compute stream (``distribute(gather_copy_out=True)``)
    gather_copy_out: bool = False
    # FSDP's MixedPrecision(reduce_dtype=torch.float32): gradients cast to fp32 and reduced in it
    # (``distribute(reduce_fp32=True)``)
    reduce_fp32: bool = False
    # PyTorch FSDP2 as torchtitan wraps the model: the root's and the last block's gathered
    # weights kept from the forward for the backward (``distribute(fsdp2_root=True)``)
    fsdp2_root: bool = False
    # PyTorch FSDP (1 and 2): ZeRO-3's all-gathers and reduce-scatters over one process group, so
    # on one NCCL stream in issue order (``distribute(one_dp_stream=True)``)
    one_dp_stream: bool = False
    # FSDP's copy of each gradient into the flat reduce-scatter buffer on the compute stream: copy
    # (FSDP1's flat gradient) or cast (FSDP2's chunk_cat into the reduce dtype)
    # (``distribute(grad_copy_in=...)``)
    grad_copy_in: str = ""
    # FSDP's mixed precision: the fp32 shard cast to bf16 at each all-gather, no persistent bf16
    # copy (``distribute(gather_cast=True)``)
    gather_cast: bool = False
    # torchao's float8 all-gather under FSDP: the shards cast to float8 before the gather
    # (``distribute(float8_gather=True)``; torchtitan's --float8.enable_fsdp_float8_all_gather)
    float8_gather: bool = False
    # PyTorch FSDP1 FULL_SHARD: the root's gathered weights kept from the forward for the backward
    # (``distribute(fsdp1_root=True)``)
    fsdp1_root: bool = False
    # Megatron-LM's DDP with --overlap-grad-reduce and its distributed optimizer: buckets of
    # max(40M, 1M·dp) parameters on the first stage only, reduce-scattered
    # (``distribute(megatron_ddp=True)``)
    megatron_ddp: bool = False
    # PyTorch FSDP2's fp32 gradient accumulation in the no-sync backwards: each layer's gradients
    # cast and added as its post-backward hook runs, not after the whole backward
    # (``distribute(fsdp2_grad_accum=True)``)
    fsdp2_grad_accum: bool = False
    # Megatron-LM's gradient-accumulation fusion: each linear layer's weight-gradient GEMM adds
    # into the fp32 main_grad (``distribute(grad_accum_fusion=True)``)
    grad_accum_fusion: bool = False
    # torch.distributed.pipelining's stages: what they keep until the step's end — every stage's
    # outputs ("every") or the last stage's ("last"), the receive buffers and input gradients
    # (``distribute(pipelining_kept=...)``)
    pipelining_kept: str = ""
    # Transformer Engine's FP8 weight cache under fp8-delayed, as Megatron-Core (NeMo) runs it:
    # is_first_microbatch passed to te.Linear, each weight cast to float8 once per step and one
    # copy held per stage (``distribute(fp8_weight_cache=True)``); off where TE is called without
    # it (llm-foundry's Composer)
    fp8_weight_cache: bool = False
    # Apex DistributedFusedAdam's store_param_remainders, as NeMo sets it (distributed Adam, fp32
    # optimizer, bf16 model, no fp8_params): each fp32 master kept as its bf16 parameter and an
    # int16 remainder (``distribute(master_remainders=True)``)
    master_remainders: bool = False
    # the dtype of the master weights and optimizer state (``Precision.with_optimizer_dtype``):
    # f32, or the compute dtype for an optimizer that keeps no masters (NeMo's ``optim.dtype:
    # bf16``: Apex's DistributedFusedAdam with store_params=False, Adam's m and v in bf16)
    optimizer_dtype: str = "f32"
    # DeepSpeed's ZeRO-Offload (a ds_config's offload_optimizer device "cpu" with its CPU Adam):
    # fp32 masters, Adam's state and step on each GPU's host, the step on the host's CPUs
    # (``distribute(offload_optimizer=True)``; the cluster's nodes describe their host)
    offload_optimizer: bool = False
    # the ring attention the trainer runs under context parallelism: p2p (Megatron-LM's,
    # Transformer Engine's) or torch (PyTorch's context_parallel: K/V all-gathered, fp32 merges and
    # dK/dV) (``RooflineCostModel(ring_form=...)``, ``distir.sim.ring``)
    ring_form: str = "p2p"
    # how the trainer's Adam runs (``Optimizer(kernels=...)``): fused (one kernel: Megatron's,
    # DeepSpeed's), foreach (torch.optim.AdamW(foreach=True)) or loop (Composer's DecoupledAdamW)
    optimizer_kernels: str = "fused"
    # DeepSpeed ZeRO-3's parameter fetch, module by module with its prefetch bucket, live-parameter
    # cap, reuse distance, persistence threshold and reduce bucket: "deepspeed:key=value,..."
    # (``distribute(zero3_fetch=parse_zero3_fetch(...))``); "" is FSDP's whole-layer gathers
    zero3_fetch: str = ""
    # gradient-norm clipping before the update (``Optimizer(max_norm=..., clip_scale=...)``):
    # the bound (0: none) and when the scaling runs, always (torch's clip_grad_norm_, FSDP's) or
    # if_over (Megatron-LM's and DeepSpeed's host-side test; costed as not run)
    max_norm: float = 0.0
    clip_scale: str = "always"
    # CUDA_LAUNCH_BLOCKING=1 in the launch script: every kernel launch synchronous, so each GPU's
    # kernels run one at a time in issue order (``DeviceMap.blocking``) and the host's time per
    # op runs in series with them (``RooflineCostModel(host_s=EAGER_HOST_S)``)
    launch_blocking: bool = False


_TYPES: dict[str, type] = {"int": int, "str": str, "bool": bool, "float": float}


def _typed(cls: type, table: Any, where: str) -> Any:
    """An instance of dataclass ``cls`` from a TOML table: every field without a default present,
    no unknown keys, each of its declared type (an int is a float; tuples from arrays of strings)."""
    if not isinstance(table, dict):
        raise RunsError(f"{where}: expected a table, got {type(table).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise RunsError(f"{where}: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name, f in known.items():
        if name not in table:
            if f.default is f.default_factory:  # dataclasses.MISSING for both: required
                raise RunsError(f"{where}: missing field {name!r}")
            continue
        v, want = table[name], str(f.type).removesuffix(" | None")  # TOML has no null: a value is given
        if want.startswith("tuple"):
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise RunsError(f"{where}.{name}: expected a list of strings, got {v!r}")
            v = tuple(v)
        elif want in _TYPES and not isinstance(v, dict):
            ok = isinstance(v, _TYPES[want]) and not (want != "bool" and isinstance(v, bool))
            if want == "float" and isinstance(v, int) and not isinstance(v, bool):
                ok, v = True, float(v)
            if not ok:
                raise RunsError(f"{where}.{name}: expected {want}, got {v!r}")
        out[name] = v
    return cls(**out)


_SUB = {"model": ModelCfg, "cluster": ClusterCfg, "strategy": StrategyCfg, "published": Published}


def _check(r: Run, where: str) -> None:
    """Semantic checks a run needs before it can be predicted."""
    from distir.frontends.zoo.gpt import LOSS_FORMS
    from distir.hardware.attention import KERNELS as ATTENTION_KERNELS
    from distir.parallel.context import RING_FORMS
    from distir.sim.cost import KERNELS, TP_OVERLAP_FORMS

    for label, x in (("source", r.source), ("where", r.where), ("commit", r.commit)):
        if not x.strip():
            raise RunsError(f"{where}: empty {label}")
    if not r.source.startswith("https://"):
        raise RunsError(f"{where}.source: expected an https:// URL, got {r.source!r}")
    if r.kernels not in KERNELS:
        raise RunsError(f"{where}.kernels: expected one of {', '.join(KERNELS)}, got {r.kernels!r}")
    if r.optimizer_kernels not in ("fused", "foreach", "loop"):
        raise RunsError(
            f"{where}.optimizer_kernels: expected fused, foreach or loop, got {r.optimizer_kernels!r}"
        )
    if r.attention_kernel not in ATTENTION_KERNELS:
        raise RunsError(
            f"{where}.attention_kernel: expected one of {', '.join(ATTENTION_KERNELS)}, "
            f"got {r.attention_kernel!r}"
        )
    from distir.parallel.zero3_fetch import FetchSpecError, parse_zero3_fetch

    try:
        if r.zero3_fetch and parse_zero3_fetch(r.zero3_fetch) is None:
            raise FetchSpecError("give deepspeed:..., or leave the field out for whole layers")
    except FetchSpecError as e:
        raise RunsError(f"{where}.zero3_fetch: {e}") from None
    if r.launch_blocking and r.tp_comm_overlap:
        raise RunsError(f"{where}: launch_blocking runs one kernel at a time, tp_comm_overlap two")
    if r.ring_form not in RING_FORMS:
        raise RunsError(f"{where}.ring_form: expected one of {', '.join(RING_FORMS)}, got {r.ring_form!r}")
    if r.precision not in PRECISIONS:
        raise RunsError(f"{where}.precision: expected one of {', '.join(PRECISIONS)}, got {r.precision!r}")
    from distir.autodiff.precision import OPTIMIZER_DTYPES

    if r.optimizer_dtype not in OPTIMIZER_DTYPES:
        known = ", ".join(OPTIMIZER_DTYPES)
        raise RunsError(f"{where}.optimizer_dtype: expected one of {known}, got {r.optimizer_dtype!r}")
    if r.tp_overlap_form not in TP_OVERLAP_FORMS:
        forms = ", ".join(TP_OVERLAP_FORMS)
        raise RunsError(f"{where}.tp_overlap_form: expected one of {forms}, got {r.tp_overlap_form!r}")
    m, s, p = r.model, r.strategy, r.published
    if m.family not in MODEL_FAMILIES:
        raise RunsError(
            f"{where}.model.family: expected one of {', '.join(MODEL_FAMILIES)}, got {m.family!r}"
        )
    if m.attention not in ("fused", "naive"):
        raise RunsError(f"{where}.model.attention: expected fused or naive, got {m.attention!r}")
    if m.loss not in LOSS_FORMS:
        raise RunsError(f"{where}.model.loss: expected one of {', '.join(LOSS_FORMS)}, got {m.loss!r}")
    if not 0.0 <= m.dropout < 1.0:
        raise RunsError(f"{where}.model.dropout: expected a probability in [0, 1), got {m.dropout!r}")
    if m.norm not in ("fused", "composite") or m.rope not in ("fused", "fp32"):
        raise RunsError(f"{where}.model: norm must be fused or composite, rope fused or fp32")
    if m.silu not in ("composite", "fused"):
        raise RunsError(f"{where}.model.silu: expected composite or fused, got {m.silu!r}")
    if m.kv not in ("native", "copy"):
        raise RunsError(f"{where}.model.kv: expected native or copy, got {m.kv!r}")
    if m.unpad and m.family != "gpt":
        raise RunsError(f"{where}.model.unpad: an option of the gpt family")
    if (m.norm, m.rope, m.silu, m.kv) != ("fused", "fused", "composite", "native") and m.family != "llama":
        raise RunsError(f"{where}.model: norm, rope, silu and kv are options of the llama family")
    if m.tied and m.family != "gpt":
        raise RunsError(f"{where}.model.tied: only the gpt family ties its embedding and head")
    if (p.memory == "") != (p.memory_gib is None) or p.memory not in MEMORY_MEASURES:
        raise RunsError(
            f"{where}.published: memory_gib needs memory = one of {', '.join(MEMORY_MEASURES[1:])} and "
            f"the other way round, got memory = {p.memory!r}, memory_gib = {p.memory_gib!r}"
        )
    if p.metric not in METRICS:
        raise RunsError(f"{where}.published.metric: expected one of {', '.join(METRICS)}, got {p.metric!r}")
    if (p.metric == "tflops_per_gpu") != (p.flops_formula in FLOPS_FORMULAS):
        raise RunsError(f"{where}.published.flops_formula: tflops_per_gpu needs one of {FLOPS_FORMULAS}")
    if s.dp * s.tp * s.pp * s.cp != r.cluster.gpus:
        raise RunsError(
            f"{where}.strategy: dp·tp·pp·cp = {s.dp * s.tp * s.pp * s.cp} ≠ {r.cluster.gpus} GPUs"
        )
    if s.global_batch % (s.dp * s.microbatch):
        raise RunsError(
            f"{where}.strategy: global_batch {s.global_batch} is not a whole number of microbatches "
            f"of {s.microbatch} per replica (dp {s.dp})"
        )
    if s.partition not in ("uniform", "params"):
        counts = _counts(s.partition)
        if len(counts) != s.pp * s.virtual_stages or sum(counts) != m.layers:
            raise RunsError(
                f"{where}.strategy.partition: {s.partition!r} must give pp·virtual_stages = "
                f"{s.pp * s.virtual_stages} counts summing to {m.layers} layers"
            )
    if s.recompute not in ("none", "selective", "full", "ops"):
        raise RunsError(
            f"{where}.strategy.recompute: expected none, selective, full or ops, got {s.recompute!r}"
        )


def load_runs(path: Path = DATA) -> tuple[Run, ...]:
    """Every [[run]] of the data file, typed and checked (``RunsError`` naming where otherwise)."""
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    runs: list[Run] = []
    for i, t in enumerate(data.get("run", [])):
        where = f"{path.name}: run[{i}] ({t.get('name', '?') if isinstance(t, dict) else '?'})"
        if not isinstance(t, dict):
            raise RunsError(f"{where}: expected a table")
        top = {k: (_typed(_SUB[k], v, f"{where}.{k}") if k in _SUB else v) for k, v in t.items()}
        r = _typed(Run, top, where)
        _check(r, where)
        runs.append(r)
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RunsError(f"{path.name}: duplicate run names {', '.join(dup)}")
    return tuple(runs)


def unsupported(r: Run) -> str:
    """The features of ``r`` distir does not model, or ''."""
    feats = [x.strip() for x in r.unsupported.split(",") if x.strip()]
    if PRECISIONS[r.precision] is None and r.precision not in feats:
        feats.append(r.precision)
    if r.model.family == "gpt" and (r.model.ffn != 4 * r.model.hidden or r.model.kv_heads != r.model.heads):
        feats.append("gpt with ffn ≠ 4·hidden or grouped-query attention")
    return ", ".join(feats)


def zoo_model(m: ModelCfg) -> str:
    """The zoo model string of ``m`` (its family's fields; the record's notes say what differs)."""
    if m.family == "gpt":
        spec = f"gpt:layers={m.layers},hidden={m.hidden},heads={m.heads},seq={m.seq},vocab={m.vocab}"
    else:  # llama and nemotron: the same fields
        spec = (
            f"{m.family}:layers={m.layers},hidden={m.hidden},heads={m.heads},kv_heads={m.kv_heads},"
            f"ffn={m.ffn},vocab={m.vocab},seq={m.seq}"
        )
    if m.attention != "fused":
        spec += f",attention={m.attention}"
    if m.dropout:
        spec += f",dropout={m.dropout:g}"
    if m.tied:
        spec += ",tied=1"
    if m.unpad:
        spec += ",unpad=1"
    if m.norm != "fused":
        spec += f",norm={m.norm}"
    if m.rope != "fused":
        spec += f",rope={m.rope}"
    if m.silu != "composite":
        spec += f",silu={m.silu}"
    if m.kv != "native":
        spec += f",kv={m.kv}"
    if m.qkv != "split":
        spec += f",qkv={m.qkv}"
    return spec if m.loss == "fp32" else f"{spec},loss={m.loss}"


def strategy_of(s: StrategyCfg) -> Strategy:
    """The distir Strategy of a run: k = global batch / (dp · microbatch); context parallelism
    ``c`` splits each sequence (``distribute``'s ring attention)."""
    from distir.parallel.strategy import Strategy

    return Strategy(
        d=s.dp,
        t=s.tp,
        c=s.cp,
        p=s.pp,
        k=s.global_batch // (s.dp * s.microbatch),
        schedule=s.schedule,
        v=s.virtual_stages,
        zero=s.zero,
        recompute=s.recompute,
        sp=s.sequence_parallel,
        partition=s.partition if s.partition in ("uniform", "params") else _counts(s.partition),
    )


def _counts(text: str) -> tuple[int, ...]:
    """Explicit blocks per stage, ``"5-6-6"`` → (5, 6, 6) (RunsError otherwise)."""
    try:
        return tuple(int(x) for x in text.split("-"))
    except ValueError:
        raise RunsError(
            f"strategy.partition: expected uniform, params or counts like 5-6-6, got {text!r}"
        ) from None


def cluster_of(c: ClusterCfg) -> Any:
    """The run's cluster: the preset or one-node cluster file's node, repeated to hold ``gpus``."""
    from distir.hardware.cluster import Cluster, parse_cluster

    spec = str(ROOT / c.spec) if c.spec.endswith(".toml") else c.spec
    base = parse_cluster(spec)
    node = base.nodes[0]
    n = math.ceil(c.gpus / node.devices_per_node)
    return Cluster(f"{base.name}:{n}", (node,) * n, inter_node=base.inter_node)


def megatron_flops(m: ModelCfg, batch: int, recompute: bool = False) -> float:
    """Megatron-LM's model FLOPs per step (``num_floating_point_operations`` in
    megatron/training/training.py at f2e5db4, the commit of the H100 table): forward + backward,
    no recomputation, full (non-causal) attention scores, the logit layer included.
    ``recompute``: the transformer blocks' forward counted once more, as full activation
    recomputation runs it (the logit layer is not recomputed): for a GPT, 96·B·s·l·h²·(1 + s/6h +
    V/16lh), the hardware FLOPs Megatron-LM's papers and the OPT-175B figures count."""
    gated = 1.5 if m.family == "llama" else 1.0  # SwiGLU's three matrices; GPT's, Nemotron's two
    attn = 1 + m.kv_heads / m.heads + m.seq / m.hidden
    mlp = m.ffn / m.hidden * gated
    logit = m.vocab / (2 * m.layers * m.hidden)
    blocks = (attn + mlp) * (4 / 3 if recompute else 1.0)
    return 12 * batch * m.seq * m.layers * m.hidden**2 * (blocks + logit)


class Prediction(NamedTuple):
    step_time_s: float
    figure: float  # in the published metric's unit
    fits: bool
    peak_gib: float
    capacity_gib: float
    strategy: str
    seconds: float  # wall time of build + simulation
    # the caching allocator's reserved peak (``distir.sim.allocator``) without the CUDA context
    # and NCCL buffers, for a record publishing that figure (``Published.memory``); else None
    reserved_gib: float | None = None


# what a record's published memory figure measures (``Published.memory``): none, or the caching
# allocator's peak reserved bytes (its segments, cuBLAS workspaces included: PyTorch allocates them
# through it; not the CUDA context or NCCL's buffers)
MEMORY_MEASURES = ("", "allocator_reserved")


def allocator_reserved(res: SimResult) -> float:
    """The largest reserved peak of ``res``'s GPUs without the CUDA context and communication
    buffers: what the caching allocator's ``reserved_bytes.all.peak`` counts."""
    assert res.cluster is not None
    return max(
        x - res.cluster.device_spec(g).runtime.context_bytes - res.cluster.device_spec(g).runtime.comm_bytes
        for g, x in res.reserved_memory.items()
    )


def figure_of(r: Run, step_time_s: float) -> float:
    """A step time in the unit ``r`` publishes."""
    s, m = r.strategy, r.model
    metric = r.published.metric
    if metric == "seconds_per_step":
        return step_time_s
    if metric == "tokens_per_gpu_s":
        return s.global_batch * m.seq / step_time_s / r.cluster.gpus
    if metric == "samples_per_s":
        return s.global_batch / step_time_s
    flops = megatron_flops(m, s.global_batch, r.published.flops_formula == "megatron-recompute")
    return flops / step_time_s / r.cluster.gpus / 1e12


class Variant(NamedTuple):
    """What the cost model assumes, for ``--gemm flat`` / ``--kernels`` / ``--interference``
    comparisons: matmuls by the GEMM curve (``gemm_curve``) or at the flat 75% of peak; every
    run's own kernels (None) or all ``fused`` / ``inductor`` / ``eager``; collectives beside the
    compute slowing it by the SMs NCCL holds (``interference``, ``distir.sim.interference``) or
    not; and, on a GPU whose GEMM kernels are persistent (``GemmProfile.persistent``), the GEMMs
    beside them running in two waves (``persistent``: the run's GEMM share of GPU 0's kernel
    time, ``gemm_share``, from a first simulation of the run, is the cost model's
    ``gemm_share``); and each run's own ZeRO-3 fetch (None) or, for every ZeRO-3 run, the given
    one: ``--zero3-fetch layer`` (FSDP's whole-layer gathers) or ``deepspeed[:...]``."""

    gemm_curve: bool = True
    kernels: str | None = None
    interference: bool = True
    persistent: bool = False
    zero3_fetch: str | None = None


AS_PUBLISHED = Variant()  # each run's own kernels, matmuls by the GEMM curve


def _simulated(
    r: Run,
    v: Variant,
    trace: bool = False,
    allocator: bool = False,
    trace_detail: str = "chunk",
    trace_gpus: frozenset[int] | None = None,
) -> tuple[SimResult, Strategy]:
    """(the SimResult, the strategy) of ``r`` built, distributed and simulated as ``distir
    simulate --model`` does (``allocator``: with the caching allocator's pools; ``trace_detail``
    and ``trace_gpus``: the trace's detail and GPUs, as ``simulate``'s)."""
    from distir.autodiff.precision import Precision
    from distir.autodiff.train import Optimizer
    from distir.frontends.zoo.registry import build_model, parse_model_string
    from distir.ir.types import DType
    from distir.parallel.distribute import device_map, distribute
    from distir.search.chunk_times import chunk_times
    from distir.search.profile import TrainerForm
    from distir.sim.cost import EAGER_HOST_S, RooflineCostModel
    from distir.sim.simulate import simulate

    spec, st, cl = zoo_model(r.model), strategy_of(r.strategy), cluster_of(r.cluster)
    dt, batch = DType.f16 if r.precision.startswith("fp16") else DType.bf16, r.strategy.global_batch
    mod = build_model(spec, batch=batch, dtype=dt)
    prec = Precision.parse(PRECISIONS[r.precision] or "mixed").with_optimizer_dtype(r.optimizer_dtype)
    # in the order of the run's own chunk times (its kernels), as ``distir simulate`` orders it
    form = TrainerForm(v.kernels or r.kernels, r.attention_kernel)
    overlap = r.tp_comm_overlap and st.sp
    times = chunk_times(mod, parse_model_string(spec), cl, dt, True, st, prec.mixed, overlap, form)
    prog = distribute(
        mod,
        st,
        Optimizer("adam", kernels=r.optimizer_kernels, max_norm=r.max_norm, clip_scale=r.clip_scale),
        train=True,
        comm_streams=True,
        precision=prec,
        chunk_times=times,
        overlap_param_gather=r.overlap_param_gather,
        deepspeed_pipe=r.deepspeed_pipe,
        fp32_grad_accum=r.fp32_grad_accum,
        gather_copy_out=r.gather_copy_out,
        reduce_fp32=r.reduce_fp32,
        sac_eager=r.kernels == "eager",  # eager selective checkpointing caches what it saves
        fsdp2_root=r.fsdp2_root,
        one_dp_stream=r.one_dp_stream,
        grad_copy_in=r.grad_copy_in,
        gather_cast=r.gather_cast,
        fsdp1_root=r.fsdp1_root,
        megatron_ddp=r.megatron_ddp,
        fsdp2_grad_accum=r.fsdp2_grad_accum,
        grad_accum_fusion=r.grad_accum_fusion,
        pipelining_kept=r.pipelining_kept,
        fp8_weight_cache=r.fp8_weight_cache,
        master_remainders=r.master_remainders,
        p2p_blocking=r.p2p_blocking,
        offload_optimizer=r.offload_optimizer,
        zero3_fetch=_fetch_of(r, v),
        float8_gather=r.float8_gather,
    )
    kernels = v.kernels or r.kernels
    cost = RooflineCostModel(
        cl,
        fuse=kernels != "eager",
        inductor=kernels == "inductor",
        eager=kernels == "eager",
        gemm_curve=v.gemm_curve,
        attention_kernel=r.attention_kernel,
        tp_comm_overlap=r.tp_comm_overlap,
        tp_overlap_form=r.tp_overlap_form,
        comm_interference=v.interference,
        ring_form=r.ring_form,
        host_s=EAGER_HOST_S if r.launch_blocking else 0.0,
    )
    dmap = device_map(st, True, host=r.offload_optimizer)
    dmap = dmap.blocking() if r.launch_blocking else dmap
    profile = cl.device_spec(0).gemm
    if v.persistent and v.interference and profile is not None and profile.persistent:
        # GPU 0 alone: its compute stream is what the share is of (a whole op trace of a large
        # program would pass the trace size bound)
        first = simulate(
            prog, cl, dmap, cost, batch=batch, trace=True, trace_detail="op", trace_gpus=frozenset({0})
        )
        cost = replace(cost, gemm_share=gemm_share(first))
    res = simulate(
        prog,
        cl,
        dmap,
        cost,
        batch=batch,
        trace=trace,
        allocator=allocator,
        trace_detail=trace_detail,
        trace_gpus=trace_gpus,
    )
    return res, st


def _fetch_of(r: Run, v: Variant) -> Any:
    """The ZeRO-3 fetch ``r`` runs under ``v``: the variant's (``--zero3-fetch``), else the
    record's (``zero3_fetch``; "" is FSDP's whole layers)."""
    from distir.parallel.zero3_fetch import parse_zero3_fetch

    text = r.zero3_fetch if v.zero3_fetch is None else v.zero3_fetch
    return parse_zero3_fetch(text) if text else None


def gemm_share(res: Any, slot: int = 0) -> float:
    """The fraction of the kernel time of stream ``slot`` (GPU 0's compute stream) that its GEMMs
    (ops with a ``gemm`` shape: ``OpDef.gemm``) take in ``res``, a simulation traced with op
    detail (its plan and the bodies of its calls): each op's own time, as charged before any
    stall, summed over every call of every body (no replay of the timeline)."""
    src = res.trace_source
    clock = next(c for c, slots in enumerate(src.clock_slots) if slot in slots)
    total, gemm = _kernel_time(src.plan, clock, {})
    return gemm / total if total > 0 else 0.0


def _kernel_time(
    plan: Any, clock: int, memo: dict[tuple[int, int], tuple[float, float]]
) -> tuple[float, float]:
    """(all, GEMM) seconds of the compute ops ``plan`` runs on its clock ``clock``, its calls'
    bodies included (``distir.sim.tracedetail``'s clocks: a body's clock p runs on its caller's
    ``body_clocks[p]``)."""
    from distir.ops.registry import REGISTRY
    from distir.sim.records import CallSummary

    key = (id(plan), clock)
    if key in memo:
        return memo[key]
    total = gemm = 0.0
    for i, (ds, c, is_comm) in enumerate(zip(plan.devs, plan.costs, plan.comm, strict=True)):
        if isinstance(c, CallSummary):
            if c.body is None:
                continue
            to_call = c.body_clocks if c.body_clocks is not None else {x: x for x in c.slots}
            for inner, outer in to_call.items():
                if outer == clock:
                    t, g = _kernel_time(c.body, inner, memo)
                    total, gemm = total + t, gemm + g
        elif clock in ds and not is_comm:
            total += c
            if REGISTRY[plan.fn.body[i].name].gemm is not None:
                gemm += c
    memo[key] = (total, gemm)
    return total, gemm


def predict(r: Run, v: Variant = AS_PUBLISHED) -> Prediction:
    """``r``'s predicted step, figure, fit and peak memory."""
    t0 = time.perf_counter()
    # only where the record publishes a memory figure: the pools cost one more walk of the
    # program (minutes for a 512-GPU pipeline), and elsewhere there is nothing to compare
    reserved = r.published.memory == "allocator_reserved"
    res, st = _simulated(r, v, allocator=reserved)
    peak = max(res.peak_memory.values())
    cap = min(res.capacity.values())
    return Prediction(
        res.step_time_s,
        figure_of(r, res.step_time_s),
        not res.oom_gpus,
        peak / 2**30,
        cap / 2**30,
        str(st),
        time.perf_counter() - t0,
        allocator_reserved(res) / 2**30 if reserved else None,
    )


def breakdown(r: Run, v: Variant = AS_PUBLISHED) -> list[str]:
    """Where GPU 0's step goes: its compute stream's time per call or op (chunk calls include
    their tensor-parallel collectives), and busy, communication and idle time."""
    # GPU 0's slices only: a whole trace of a large program would pass the trace size bound
    res, st = _simulated(r, v, trace=True, trace_gpus=frozenset({0}))
    t = res.step_time_s
    per: dict[str, float] = {}
    for name, a, b, slot, _comm in res.slices or []:
        if slot == 0:
            per[name] = per.get(name, 0.0) + (b - a)
    lines = [
        f"{r.name} ({st}): step {t:.3f} s; GPU 0 busy {res.busy_s[0]:.3f} s, "
        f"communication {res.comm_s[0]:.3f} s, idle {max(t - res.busy_s[0] - res.comm_s[0], 0.0):.3f} s"
    ]
    for name, x in sorted(per.items(), key=lambda kv: -kv[1])[:10]:
        lines.append(f"  {name:40s} {x:10.4f} s  {100 * x / t:5.1f}%")
    return lines


class Row(NamedTuple):
    run: Run
    prediction: Prediction | None
    error_pct: float | None  # of the throughput: predicted / published - 1, in %
    note: str  # "unsupported: ...", "error: ..." or ""


def throughput_error_pct(r: Run, predicted: float) -> float:
    """predicted / published throughput - 1, in %: negative when distir predicts a slower step
    (for a published step time, published / predicted - 1)."""
    pub = r.published.value
    ratio = pub / predicted if r.published.metric == "seconds_per_step" else predicted / pub
    return 100.0 * (ratio - 1.0)


def _distir_errors() -> tuple[type[Exception], ...]:
    from distir.autodiff.reverse import AutodiffError
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import HardwareError
    from distir.interp.loop import InterpretError
    from distir.parallel.sharding.propagate import ShardingError
    from distir.parallel.strategy import StrategyError

    return (StrategyError, ModelError, AutodiffError, ShardingError, HardwareError, InterpretError)


def evaluate(r: Run, v: Variant = AS_PUBLISHED) -> Row:
    missing = unsupported(r)
    if missing:
        return Row(r, None, None, f"unsupported: {missing}")
    try:
        p = predict(r, v)
    except _distir_errors() as e:
        return Row(r, None, None, f"error: {e}")
    return Row(r, p, throughput_error_pct(r, p.figure), "")


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _yn(b: bool) -> str:
    return "yes" if b else "NO"


def _peak_cell(r: Run, p: Prediction) -> str:
    """The peak memory column: the allocator's reserved peak where the record publishes that
    (``Published.memory``, with the published figure), else the peak with the runtime memory;
    over the capacity."""
    if p.reserved_gib is not None:
        return f"reserved {p.reserved_gib:.1f}/{p.capacity_gib:.0f} (published {r.published.memory_gib})"
    return f"{p.peak_gib:.1f}/{p.capacity_gib:.0f}"


def memory_error_pct(row: Row) -> float | None:
    """The predicted reserved peak / the published one - 1, in %, where the record publishes it."""
    p, pub = row.prediction, row.run.published.memory_gib
    if p is None or p.reserved_gib is None or pub is None:
        return None
    return 100.0 * (p.reserved_gib / pub - 1.0)


def table_lines(rows: list[Row], markdown: bool) -> list[str]:
    head = (
        "run",
        "GPUs",
        "strategy",
        "unit",
        "published",
        "predicted",
        "error",
        "fits pub/pred",
        "peak GiB",
        "note",
    )
    body: list[tuple[str, ...]] = []
    for row in rows:
        r, p = row.run, row.prediction
        unit = METRICS[r.published.metric]
        if p is None or row.error_pct is None:
            fit = f"{_yn(r.published.fit)}/-"
            body.append(
                (r.name, str(r.cluster.gpus), "", unit, _fmt(r.published.value), "-", "", fit, "", row.note)
            )
            continue
        body.append(
            (
                r.name,
                str(r.cluster.gpus),
                p.strategy,
                unit,
                _fmt(r.published.value),
                _fmt(p.figure),
                f"{row.error_pct:+.1f}%",
                f"{_yn(r.published.fit)}/{_yn(p.fits)}",
                _peak_cell(r, p),
                f"assumed: {', '.join(r.strategy.assumed)}" if r.strategy.assumed else "",
            )
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return out + ["| " + " | ".join(b) + " |" for b in body]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return ["  ".join(x[i].ljust(widths[i]) for i in range(len(head))).rstrip() for x in [head, *body]]


def summary_lines(rows: list[Row]) -> list[str]:
    done = [r for r in rows if r.error_pct is not None]
    unsup = [r for r in rows if r.note.startswith("unsupported")]
    failed = [r for r in rows if r.note.startswith("error")]
    out = [f"runs: {len(rows)}; predicted: {len(done)}; unsupported: {len(unsup)}; refused: {len(failed)}"]
    if done:
        errs = [abs(r.error_pct) for r in done if r.error_pct is not None]
        worst = max(done, key=lambda r: abs(r.error_pct or 0.0))
        med, mx = statistics.median(errs), max(errs)
        pub_fit = [r for r in done + failed if r.run.published.fit]  # a refused run does not fit
        fit_ok = [r for r in pub_fit if r.prediction is not None and r.prediction.fits]
        over = sum(e > TARGET_MAX for e in errs)
        out += [
            f"median |error| {med:.1f}% "
            f"(target ≤ {TARGET_MEDIAN:.0f}%: {'met' if med <= TARGET_MEDIAN else 'NOT met'})",
            f"max |error| {mx:.1f}% ({worst.run.name}); {over} over {TARGET_MAX:.0f}% "
            f"(target none: {'met' if over == 0 else 'NOT met'})",
            f"published-fit runs predicted to fit: {len(fit_ok)}/{len(pub_fit)} "
            f"(target all: {'met' if len(fit_ok) == len(pub_fit) else 'NOT met'})",
        ]
    out += memory_summary(rows)
    if failed:
        out.append(f"refused by distir (count as misses): {', '.join(r.run.name for r in failed)}")
    return out


# a predicted reserved peak this far under the published one is the dangerous direction: a plan
# predicted to fit with that much room may not
MEMORY_UNDER_PCT = 5.0


def memory_summary(rows: list[Row]) -> list[str]:
    """The published peak memory's summary line: the errors' range and median, and the rows
    predicted more than ``MEMORY_UNDER_PCT`` under."""
    mem = [(r.run.name, e) for r in rows if (e := memory_error_pct(r)) is not None]
    if not mem:
        return []
    errs = [e for _, e in mem]
    under = [n for n, e in mem if e < -MEMORY_UNDER_PCT]
    return [
        f"published peak memory (allocator reserved), {len(mem)} runs: predicted "
        f"{min(errs):+.1f}…{max(errs):+.1f}% (median {statistics.median(errs):+.1f}%); "
        f"{len(under)} under by more than {MEMORY_UNDER_PCT:.0f}%"
        + (f" ({', '.join(under)})" if under else "")
    ]


def source_of(r: Run) -> str:
    """The publisher a record's name starts with (``megatron``, ``mosaic``, ``titan``, ...): the
    plot's series."""
    return r.name.split("-", 1)[0]


def plot_png(rows: list[Row], path: Path) -> None:
    """Each predicted run's throughput error against its GPU count, one series per source, with
    the targets' bands (±10%, ±25%); beside it the predicted reserved peak against the published
    one where a record publishes it, with the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from distir.files import write_atomically

    done = [r for r in rows if r.error_pct is not None]
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [2, 1]})
    ax.axhspan(-TARGET_MAX, TARGET_MAX, color="0.93", zorder=0)
    ax.axhspan(-TARGET_MEDIAN, TARGET_MEDIAN, color="0.85", zorder=0)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    markers = "osD^v<>pPX*h"
    for i, src in enumerate(sorted({source_of(r.run) for r in done})):
        mine = [r for r in done if source_of(r.run) == src]
        xs = [r.run.cluster.gpus for r in mine]
        ys = [r.error_pct or 0.0 for r in mine]
        ax.scatter(xs, ys, s=28, marker=markers[i % len(markers)], label=f"{src} ({len(mine)})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("predicted / published throughput − 1 (%)")
    errs = [abs(r.error_pct or 0.0) for r in done]
    ax.set_title(
        f"{len(done)} published runs: median |error| {statistics.median(errs):.1f}%, "
        f"{sum(e > TARGET_MAX for e in errs)} over {TARGET_MAX:.0f}% "
        f"(bands: ±{TARGET_MEDIAN:.0f}%, ±{TARGET_MAX:.0f}%)",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="best")
    pairs = [
        (float(r.run.published.memory_gib), float(r.prediction.reserved_gib))
        for r in done
        if r.prediction is not None
        and r.prediction.reserved_gib is not None
        and r.run.published.memory_gib is not None
    ]
    if pairs:
        mx.scatter([a for a, _ in pairs], [b for _, b in pairs], s=24)
        lo, hi = min(min(p) for p in pairs), max(max(p) for p in pairs)
        lo, hi = lo - 0.05 * (hi - lo + 1.0), hi + 0.05 * (hi - lo + 1.0)
        mx.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        mx.set_xlim(lo, hi)
        mx.set_ylim(lo, hi)
    mx.set_xlabel("published peak reserved (GiB)")
    mx.set_ylabel("predicted peak reserved (GiB)")
    mx.set_title(f"peak memory of the {len(pairs)} predicted runs publishing it", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomically(path, buf.getvalue())


def _named(r: Run, pattern: str) -> bool:
    return r.name.startswith(pattern[:-1]) if pattern.endswith("*") else r.name == pattern


def select(runs: tuple[Run, ...], only: list[str], quick: bool) -> list[Run]:
    """The runs named by ``only`` (all if empty), on at most QUICK_MAX_GPUS GPUs with ``quick``."""
    unknown = [o for o in only if not any(_named(r, o) for r in runs)]
    if unknown:
        raise RunsError(f"--only: no run named {', '.join(unknown)}")
    return [
        r
        for r in runs
        if (not only or any(_named(r, o) for o in only)) and (not quick or r.cluster.gpus <= QUICK_MAX_GPUS)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="a run name or prefix*")
    ap.add_argument("--quick", action="store_true", help=f"only runs on at most {QUICK_MAX_GPUS} GPUs")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--sources", action="store_true", help="also list each run's source")
    ap.add_argument("--data", type=Path, default=DATA, help="the runs file")
    ap.add_argument(
        "--gemm", choices=("curve", "flat"), default="curve",
        help="matmuls by the GPU's GEMM curve (default) or at a flat 75%% of peak",
    )  # fmt: skip
    ap.add_argument(
        "--kernels", choices=("run", "fused", "inductor", "eager"), default="run",
        help="each run's own kernels (default), or all fused / all inductor / all eager",
    )  # fmt: skip
    ap.add_argument(
        "--interference", choices=("on", "off", "persistent"), default="on",
        help="collectives slow the compute beside them by the SMs NCCL holds (default) or not; "
        "persistent: and persistent GEMM kernels beside them run in two waves",
    )  # fmt: skip
    ap.add_argument(
        "--zero3-fetch", metavar="FORM",
        help="every ZeRO-3 run's parameter fetch: layer (FSDP's whole layers) or deepspeed[:key=value,...] "
        "(DeepSpeed's module by module); default each run's own",
    )  # fmt: skip
    ap.add_argument("--breakdown", action="store_true", help="where each selected run's step goes")
    ap.add_argument("--plot", type=Path, metavar="PNG", help="write the errors' plot (PNG) here")
    args = ap.parse_args(argv)
    if args.plot is not None:
        from distir.files import OutputPathError, check_output

        try:
            check_output(args.plot, "--plot")
        except OutputPathError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.zero3_fetch is not None:
        from distir.parallel.zero3_fetch import FetchSpecError, parse_zero3_fetch

        try:
            parse_zero3_fetch(args.zero3_fetch)
        except FetchSpecError as e:
            print(f"error: --zero3-fetch: {e}", file=sys.stderr)
            return 2
    v = Variant(
        args.gemm == "curve",
        None if args.kernels == "run" else args.kernels,
        args.interference != "off",
        args.interference == "persistent",
        args.zero3_fetch,
    )
    try:
        runs = select(load_runs(args.data), args.only, args.quick)
    except RunsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.breakdown:
        for r in runs:
            if not unsupported(r):
                print("\n".join(breakdown(r, v)))
        return 0
    rows = []
    for i, r in enumerate(runs, 1):
        row = evaluate(r, v)
        took = f"{row.prediction.seconds:.1f} s" if row.prediction else row.note
        slow = "  (slow: over 60 s)" if row.prediction and row.prediction.seconds > 60 else ""
        print(f"[{i}/{len(runs)}] {r.name}: {took}{slow}", file=sys.stderr, flush=True)
        rows.append(row)
    print("\n".join(table_lines(rows, args.markdown)))
    print()
    print("\n".join(summary_lines(rows)))
    if args.plot is not None and any(r.error_pct is not None for r in rows):
        plot_png(rows, args.plot)
        print(f"plot: {args.plot}")
    if args.sources:
        print()
        for r in runs:
            print(f"{r.name}: {r.source} — {r.where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
