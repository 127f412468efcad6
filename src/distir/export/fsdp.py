"""A short PyTorch file applying a plan with torch.distributed's own APIs (FSDP2, TP, pipelining).

The file (``TEMPLATE`` filled in) builds the device mesh ``(pp, dp_replicate, dp_shard, tp)``
with ``init_device_mesh`` — distir's rank order: stage outermost, tensor rank fastest — and, on
the user's model cut into the plan's pipeline chunks (``CHUNK_BLOCKS``), applies
``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``, with ``SequenceParallel`` norms for
``sp``; module names are torchtitan's Llama ones, ``attention.wq/wk/wv/wo``,
``feed_forward.w1/w2[/w3]``, ``attention_norm``/``ffn_norm``, or for a Hugging Face Llama config
(``hf:``) its own, ``self_attn.q_proj/k_proj/v_proj/o_proj``, ``mlp.gate_proj/down_proj/up_proj``,
``input_layernorm``/``post_attention_layernorm``, its attention's input passed by keyword:
``ModuleNames``), activation checkpointing
(``checkpoint_wrapper``; selective policies through ``create_selective_checkpoint_contexts``),
``fully_shard`` (ZeRO-3: resharded after the forward; ZeRO-1/2: kept gathered until the backward;
ZeRO-0: a replicate-only mesh, i.e. DDP) with a ``MixedPrecisionPolicy`` for mixed precision, and
a ``torch.distributed.pipelining`` schedule (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble
for zb1). The degrees come from the mesh, so the file also runs on a smaller mesh (the tests run
it on one CPU process with gloo).

FP8 (``fp8``: torchao's ``Float8Linear``, dynamic tensorwise scaling, what distir simulates;
``torchao/float8`` of pytorch/ao at 36027d82d1ad9949597ea16002ff4940374b1b94, 2026-08-21): each
chunk goes through ``convert_to_float8_training`` before TP, with the default
``Float8LinearConfig`` (tensorwise; ``enable_fsdp_float8_all_gather`` off, as the plans distir
searches run: FSDP2 gathers the bf16 copy) and a filter keeping the head
(``output``) in bf16, as distir leaves it; the TP plan's classes are torchao's
``Float8ColwiseParallel``/``Float8RowwiseParallel``/``PrepareFloat8ModuleInput`` (the
sequence-parallel all-gather in float8, as distir shards it; torchtitan's float8 TP); each block
is compiled (``torch.compile`` after TP and checkpointing, before ``fully_shard``: torchtitan's
order), since distir's float8 casts are the ones torch.compile fuses. ``fp8-delayed`` is
refused: torchao deleted delayed scaling (#1753).

Nearest, with a warning: ZeRO-1 (FSDP2 shards gradients with the optimizer state: ZeRO-2), pure
half precision (``param_dtype`` half, fp32 kept in the sharded parameters). Refused: uneven batch
shares, a non-default placement.
"""

from __future__ import annotations

from string import Template
from typing import NamedTuple

from distir.export.plan import Exported, ExportError, Plan, refuse_common, refuse_context

TARGET = "fsdp"
SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb1": "ScheduleInterleavedZeroBubble",
}
MULTI = ("interleaved", "zb1")  # schedules over a list of local stages
TP_CLASSES = ("ColwiseParallel", "RowwiseParallel", "PrepareModuleInput")  # torch's; fp8: torchao's Float8*
FLOAT8_IMPORTS = """\
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from torchao.float8.float8_tensor_parallel import (
    Float8ColwiseParallel,
    Float8RowwiseParallel,
    PrepareFloat8ModuleInput,
)
"""
FLOAT8_CONFIG = """
FLOAT8 = Float8LinearConfig()  # dynamic tensorwise scaling; FSDP all-gathers the bf16 weights"""
FLOAT8_CONVERT = """
        convert_to_float8_training(chunk, config=FLOAT8, module_filter_fn=lambda mod, fqn: fqn != "$head")"""
FLOAT8_COMPILE = """
            block = torch.compile(block)  # float8 casts fused, as distir costs them"""
DTYPES = {"f32": "None", "bf16": "torch.bfloat16", "f16": "torch.float16"}


class ModuleNames(NamedTuple):
    """A transformer block's module names as the exported tensor-parallel plan names them."""

    attention: str
    wq: str
    wk: str
    wv: str
    wo: str
    feed_forward: str
    w1: str  # the gate (SwiGLU) or first projection: column-parallel
    w2: str  # the last projection: row-parallel
    w3: str  # SwiGLU's up projection: column-parallel
    attention_norm: str
    ffn_norm: str
    head: str  # the output projection (left in bf16 under fp8)
    attention_gather: str  # the attention's input all-gathered under sequence parallelism
    doc: str


TITAN_NAMES = ModuleNames(
    "attention", "wq", "wk", "wv", "wo", "feed_forward", "w1", "w2", "w3", "attention_norm",
    "ffn_norm", "output", "gather",
    "torchtitan's Llama module names (attention.wq/wk/wv/wo, feed_forward.w1/w2[/w3],\n"
    "attention_norm, ffn_norm; rename in tp_plan for yours)",
)  # fmt: skip
# Hugging Face's LlamaDecoderLayer (transformers' modeling_llama): its attention takes
# ``hidden_states`` by keyword, so the all-gather before it names the keyword
HF_LLAMA_NAMES = ModuleNames(
    "self_attn", "q_proj", "k_proj", "v_proj", "o_proj", "mlp", "gate_proj", "down_proj", "up_proj",
    "input_layernorm", "post_attention_layernorm", "lm_head",
    '${prepare}(input_kwarg_layouts={"hidden_states": Shard(1)}, '
    'desired_input_kwarg_layouts={"hidden_states": Replicate()})',
    "Hugging Face's Llama module names (self_attn.q_proj/k_proj/v_proj/o_proj,\n"
    "mlp.gate_proj/down_proj/up_proj, input_layernorm, post_attention_layernorm: for a\n"
    "LlamaForCausalLM, chunk.layers is model.model.layers)",
)  # fmt: skip


def module_names(plan: Plan) -> ModuleNames:
    """The plan's model's block names: a Hugging Face Llama config's own, else torchtitan's."""
    hf = plan.model.strip().startswith("hf:") and plan.shape is not None
    return HF_LLAMA_NAMES if hf else TITAN_NAMES


TEMPLATE = Template('''\
"""$title

Run with torchrun on $world processes (d*t*p = $d*$t*$p). Cut your model into the pipeline
chunks of CHUNK_BLOCKS (chunk c runs on stage c % PP; the embedding joins chunk 0, the final
norm, head and loss the last), each an nn.Module whose blocks are ``chunk.layers`` with
$names_doc. With tensor parallelism each rank's
attention runs heads/TP heads: compute the local head count from the weights' local shapes.

    mesh = build_mesh()
    chunks = {c: my_chunk(c) for c in local_chunks(mesh)}
    schedule = build_schedule(parallelize(chunks, mesh), mesh, loss_fn, device)
    schedule.step(tokens, target=labels)  # tokens: this replica's GLOBAL_BATCH // DP samples
"""

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, $schedule
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
$float8_imports
DP, TP, PP, V = $d, $t, $p, $v
ZERO = $zero  # 0: replicated (DDP); 1-2: sharded, gathered from forward to backward; 3: resharded
SEQUENCE_PARALLEL = $sp
RECOMPUTE = "$recompute"  # none, full, selective (the attention core), ops (all but matmuls)
MICROBATCHES = $k  # per step and replica
MICROBATCH_SIZE = $micro
GLOBAL_BATCH = $batch
CHUNK_BLOCKS = $blocks  # blocks of each pipeline chunk
PARAM_DTYPE = $param_dtype  # compute dtype (None: fp32)
GATED_MLP = $gated  # feed_forward.w3 (SwiGLU)$float8_config


def build_mesh(device_type: str = "cuda", pp: int = PP, dp: int = DP, tp: int = TP) -> DeviceMesh:
    """The ranks as (pp, dp_replicate, dp_shard, tp): ZeRO-0 replicas replicate, others shard."""
    shape = (pp, dp, 1, tp) if ZERO == 0 else (pp, 1, dp, tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))


def local_chunks(mesh: DeviceMesh) -> list[int]:
    pp = mesh["pp"].size()
    return [c for c in range(pp * V) if c % pp == mesh["pp"].get_local_rank()]


def tp_plan() -> dict[str, object]:
    """Megatron's column/row split of attention and MLP, norms sequence-parallel with sp."""
    out = ${rowwise}(output_layouts=Shard(1)) if SEQUENCE_PARALLEL else ${rowwise}()
    plan: dict[str, object] = {
        "$attention.$wq": ${colwise}(),
        "$attention.$wk": ${colwise}(),
        "$attention.$wv": ${colwise}(),
        "$attention.$wo": out,
        "$feed_forward.$w1": ${colwise}(),
        "$feed_forward.$w2": out,
    }
    if GATED_MLP:
        plan["$feed_forward.$w3"] = ${colwise}()
    if SEQUENCE_PARALLEL:
        gather = ${prepare}(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan |= {"$attention_norm": SequenceParallel(), "$attention": $attention_gather}
        plan |= {"$ffn_norm": SequenceParallel(), "$feed_forward": gather}
    return plan


def _policy(save_matmuls: bool):
    """Selective checkpointing: "ops" saves every other matmul and recomputes the rest (torchtitan's
    op-level policy); "selective" recomputes only the attention core (Megatron's)."""
    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
    core = {torch.ops.aten._softmax.default, torch.ops.aten._scaled_dot_product_efficient_attention.default}

    def context():
        count = {False: 0, True: 0}

        def policy(ctx, op, *args, **kwargs):
            if save_matmuls:
                if op not in matmuls:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                count[ctx.is_recompute] += 1
                odd = count[ctx.is_recompute] % 2
                return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.PREFER_RECOMPUTE if op in core else CheckpointPolicy.MUST_SAVE

        return create_selective_checkpoint_contexts(policy)

    return context


def _recompute(block: nn.Module) -> nn.Module:
    if RECOMPUTE == "full":
        return checkpoint_wrapper(block, preserve_rng_state=True)
    if RECOMPUTE in ("selective", "ops"):
        return checkpoint_wrapper(block, context_fn=_policy(RECOMPUTE == "ops"), preserve_rng_state=True)
    return block


def parallelize(chunks: dict[int, nn.Module], mesh: DeviceMesh) -> dict[int, nn.Module]:
    """TP, recomputation and FSDP2 on this rank's chunks, in place (torchtitan's order)."""
    dp_mesh = mesh["dp_replicate", "dp_shard"]
    mp = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=torch.float32)
    reshard = ZERO == 3
    for chunk in chunks.values():$float8_convert
        for name, block in list(chunk.layers.named_children()):
            if mesh["tp"].size() > 1 or TP > 1:
                parallelize_module(block, mesh["tp"], tp_plan())
            block = _recompute(block)$float8_compile
            chunk.layers.register_module(name, block)
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(chunk, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    return chunks


def build_schedule(chunks: dict[int, nn.Module], mesh: DeviceMesh, loss_fn, device: torch.device):
    """The plan's pipeline schedule over this rank's stages (chunk c is stage c of PP*V)."""
    n_stages = mesh["pp"].size() * V
    group = mesh["pp"].get_group()
    stages = [PipelineStage(chunks[c], c, n_stages, device, group=group) for c in sorted(chunks)]
    return $schedule($stage_arg, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
''')


def _float8_parts(plan: Plan) -> dict[str, str]:
    """The template's FP8 parts (module docstring): empty without fp8, so the file is the same."""
    if not plan.float8:
        return dict(zip(("colwise", "rowwise", "prepare"), TP_CLASSES, strict=True)) | dict.fromkeys(
            ("float8_imports", "float8_config", "float8_convert", "float8_compile"), ""
        )
    if plan.precision == "fp8-delayed":
        raise ExportError(
            f"{TARGET} cannot express fp8-delayed (Transformer Engine's delayed scaling): torchao's "
            "Float8Linear scales dynamically only; give --precision fp8 or export to megatron"
        )
    return {
        "colwise": "Float8ColwiseParallel",
        "rowwise": "Float8RowwiseParallel",
        "prepare": "PrepareFloat8ModuleInput",
        "float8_imports": FLOAT8_IMPORTS,
        "float8_config": FLOAT8_CONFIG,
        "float8_convert": FLOAT8_CONVERT,
        "float8_compile": FLOAT8_COMPILE,
    }


def export(plan: Plan) -> Exported:
    refuse_common(plan, TARGET)
    refuse_context(plan, TARGET)
    s = plan.strategy
    warn: list[str] = []
    if s.zero == 1:
        warn.append(
            "FSDP2 has no ZeRO-1 (optimizer state sharded, gradients whole); exported as fully_shard without "
            "resharding after the forward (ZeRO-2: gradients sharded too, less memory)"
        )
    if plan.half and plan.precision == "pure":
        warn.append(
            f"pure {plan.dtype}: exported as FSDP2 mixed precision (param_dtype {plan.dtype}), whose sharded "
            "parameters and optimizer state stay fp32"
        )
    if s.t > 1 and (plan.shape is None):
        raise ExportError(
            f"{TARGET}: the tensor-parallel plan names transformer modules; {plan.model} has none"
        )
    parts = _float8_parts(plan)
    names = module_names(plan)
    gather = Template(names.attention_gather).substitute(prepare=parts["prepare"])
    parts |= names._asdict() | {"attention_gather": gather, "names_doc": names.doc}
    parts["float8_convert"] = Template(parts["float8_convert"]).substitute(head=names.head)
    del parts["doc"]
    title = f"distir export --to fsdp: {plan.model} {s}, batch {plan.batch}, {plan.dtype} {plan.precision}."
    text = TEMPLATE.substitute(
        parts,
        title=title,
        world=s.devices,
        d=s.d,
        t=s.t,
        p=s.p,
        v=s.v,
        k=s.k,
        zero=s.zero,
        sp=s.sp,
        recompute=s.recompute,
        micro=plan.microbatch,
        batch=plan.batch,
        blocks=repr(plan.blocks),
        param_dtype=DTYPES[plan.dtype],
        gated=plan.shape is not None and plan.shape.family == "llama",
        schedule=SCHEDULES[s.schedule],
        stage_arg="stages" if s.schedule in MULTI else "stages[0]",
    )
    return Exported(TARGET, text, ".py", tuple(warn))
