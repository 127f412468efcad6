"""What a trainer runs for a strategy: its program switches and kernels, named once.

``distribute`` and the cost model take one switch per trainer behaviour (each documented, with its
source, in ``distir.parallel.distribute``): Megatron-LM's gradient buffers, FSDP2's copies,
DeepSpeed's pipeline engine. ``trainer_semantics(trainer, strategy, precision, dtype, device)``
turns a trainer's name into the switches that trainer sets for that strategy by default, so
``distir simulate --trainer megatron`` predicts the step and the memory as Megatron-LM runs the
plan, not as distir's trainer-neutral program does (which accumulates and reduces gradients in
the compute dtype, keeps a low-precision copy of every weight, and runs every kernel fused):

- ``distir``: the trainer-neutral program (no switch).
- ``megatron`` (Megatron-LM with Megatron-Core's ``DistributedDataParallel`` and distributed
  optimizer, its defaults): gradient-accumulation fusion into the fp32 ``main_grad`` (on unless
  ``--no-gradient-accumulation-fusion``), gradients reduced in fp32 (``--bf16`` forces
  ``accumulate_allreduce_grads_in_fp32``), its buckets (``megatron_ddp``: d > 1, ZeRO 0/1),
  fused kernels and Adam, Transformer Engine's cuDNN attention where the GPU has its published
  speed (Hopper), FlashAttention-2 elsewhere. Opt-in flags stay the user's
  (``--overlap-param-gather``, ``--tp-comm-overlap``). ``--bf16``/``--fp16`` always keep fp32
  main parameters: pure half precision is refused; its pipelines run 1F1B or interleaved 1F1B
  (no GPipe, no zero-bubble schedule in Megatron-Core).
- ``deepspeed`` (Megatron-DeepSpeed on DeepSpeed's engine): the pipeline engine when p > 1
  (1F1B, ZeRO 0/1), bf16 mixed precision as ``BF16_Optimizer`` runs it (ZeRO stage 0 in
  DeepSpeed's config, which shards the fp32 state over data parallelism like ZeRO-1: distir's
  z1, with its fp32 gradient accumulation; distir's z0 is refused there), Megatron's fused
  kernels, FusedAdam, FlashAttention-2. Its optimizers keep fp32 masters: pure half precision
  is refused; its context parallelism is Ulysses (all-to-alls over heads), so a ring over
  context ranks (c > 1) is refused. Under ZeRO-3 (one stage, all data-parallel ranks) its
  parameters are fetched module by module as ``PartitionedParameterCoordinator`` fetches them,
  with DeepSpeed's default knobs (``zero3_fetch``, ``distir.parallel.zero3_fetch``).
- ``torchtitan`` (PyTorch FSDP2 as torchtitan 820504e applies it, its defaults: no
  ``torch.compile``, ``mixed_precision_reduce = "float32"``, the fused AdamW): eager kernels,
  gradients cast into the fp32 reduce-scatter input (``grad_copy_in = "cast"``,
  ``reduce_fp32``); under ZeRO-3 on one stage FSDP2's all-gather copy-out, its root kept
  unsharded, gathers and reductions on one stream and the fp32 shard cast at each gather; under
  pipelining ZeRO-2 (``reshard_after_forward`` off by default there) with the fp32 sums of the
  no-sync backwards, and what ``torch.distributed.pipelining``'s stages keep through the step
  (``pipelining_kept = "last"``: the last stage's outputs, as torch after pytorch#153383
  keeps), and under context parallelism PyTorch's ring (``context_parallel``:
  ``ring_form = "torch"``, ``distir.sim.ring``). Mixed precision only through FSDP2
  (``mixed_precision_param`` takes effect with ``data_parallel_shard_degree`` > 1): elsewhere
  it is refused, as is ZeRO-3 with p > 1 (torchtitan's pipeline reduce-scatters once a step;
  distir's ZeRO-3 every backward), and
  tensor parallelism without sequence parallelism (its plan always shards the norms along the
  sequence), and fp16 mixed precision (its ``mixed_precision_param`` is bf16 or fp32).

All three clip the step's gradients by their global norm before the update, max norm 1.0
(``Optimizer.max_norm``, ``distir.ops.optim``'s ``GradNormSq`` and ``ClipByNorm``): Megatron-LM's
``--clip-grad`` (``clip_grad_norm`` in megatron/core/optimizer/optimizer.py, clip_grads.py at
f2e5db4: ``multi_tensor_l2norm`` over the fp32 main gradients, this rank's shard with the
distributed optimizer, an all-reduce over the model-parallel group or the world, ``.item()``, and
``multi_tensor_scale`` only if the coefficient is under 1: ``clip_scale = "if_over"``); DeepSpeed's
``gradient_clipping`` (``BF16_Optimizer.step``: ``get_global_norm_of_tensors`` and
``clip_tensors_by_global_norm``, which scales only if the coefficient is under 1; its ZeRO and
FP16 optimizers' ``unscale_and_clip_grads`` multiply by 1 / (loss scale · clip) every step,
deepspeed/runtime/zero/stage_1_and_2.py, fp16/fused_optimizer.py; the BigScience configs and the
MT-NLG paper clip at 1.0); torchtitan's ``training.max_norm``
(``clip_grad_norm_`` in torchtitan/distributed/utils.py at 820504e: torch's foreach norms of the
local shards, ``full_tensor`` over the mesh, an all-reduce over the pipeline stages, then
``clip_grads_with_norm_``'s ``_foreach_mul_`` by the clamped coefficient, every step:
``clip_scale = "always"``). The ``distir`` trainer clips nothing.

None of the three splits a microbatch unevenly over its data-parallel replicas: AMP's batch
shares are refused under each.

Each rule follows the published-runs records of that trainer (``bench/published_runs.toml``,
which cite the trainers' code for every switch). A switch applies where ``distribute`` says it
does (ZeRO-3's options under ZeRO-3, the reductions' with d > 1, ...) and is a no-op elsewhere;
a strategy the trainer does not run by default is a ``TrainerError`` (or ``distribute``'s
``StrategyError``), one line. A trainer's switches describe training: an inference program
takes none (``train=False`` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, cast

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer
from distir.hardware.specs import DeviceSpec
from distir.ir.types import DType
from distir.parallel.distribute import check_switches
from distir.parallel.grad_reduction import reduce_scatter_every_backward
from distir.parallel.strategy import Strategy, StrategyError
from distir.parallel.zero3_fetch import Zero3Fetch

TRAINERS = ("distir", "megatron", "deepspeed", "torchtitan")
# the gradient-norm bound every trainer clips by unless told otherwise: Megatron-LM's
# ``--clip-grad`` default (megatron/training/arguments.py at f2e5db4), torchtitan's
# ``training.max_norm`` (torchtitan/config_manager.py at 820504e), DeepSpeed's
# ``gradient_clipping`` in the Megatron-DeepSpeed and BigScience configs
DEFAULT_MAX_NORM = 1.0


class TrainerError(StrategyError):
    """An unknown trainer, or a strategy the named trainer does not run (one line)."""


@dataclass(frozen=True, slots=True)
class TrainerSemantics:
    """A trainer's choices for one strategy: ``distribute``'s switches (``switches``), the
    cost model's kernels (``kernels``: fused, inductor or eager; ``attention_kernel``; Adam's
    ``optimizer_kernels``; ``ring_form``, the ring attention it runs under context parallelism,
    ``RooflineCostModel.ring_form``) and its optimizer's gradient clipping (``max_norm``,
    ``clip_scale``: ``optimizer``)."""

    trainer: str = "distir"
    kernels: str = "fused"
    attention_kernel: str = "fa2"
    optimizer_kernels: str = "fused"
    megatron_ddp: bool = False
    grad_accum_fusion: bool = False
    reduce_fp32: bool = False
    deepspeed_pipe: bool = False
    fp32_grad_accum: bool = False
    gather_copy_out: bool = False
    fsdp2_root: bool = False
    one_dp_stream: bool = False
    grad_copy_in: str = ""
    gather_cast: bool = False
    fsdp2_grad_accum: bool = False
    overlap_param_gather: bool = False
    pipelining_kept: str = ""
    fp8_weight_cache: bool = False
    zero3_fetch: Zero3Fetch | None = None
    # Apex DistributedFusedAdam's store_param_remainders (NeMo's): each fp32 master kept as its
    # bf16 copy and an int16 remainder (``distribute(master_remainders=True)``)
    master_remainders: bool = False
    # Megatron-LM's pipeline transfers waited on by the schedule (``distribute(p2p_blocking=True)``)
    p2p_blocking: bool = False
    # DeepSpeed's ZeRO-Offload: masters, Adam's state and step on the host's CPUs
    # (``distribute(offload_optimizer=True)``; the user's ``--offload-optimizer``, a record's
    # ``offload_optimizer``: a ds_config's ``offload_optimizer.device`` "cpu", never a default)
    offload_optimizer: bool = False
    # torchao's float8 all-gather under FSDP (``distribute(float8_gather=True)``; the user's
    # ``--float8-all-gather``, a record's ``float8_gather``: torchtitan's default is off)
    float8_gather: bool = False
    ring_form: str = "p2p"
    # gradient-norm clipping (``Optimizer.max_norm``, ``clip_scale``; 0: none)
    max_norm: float = 0.0
    clip_scale: str = "always"

    def optimizer(self, kind: str) -> Optimizer:
        """The trainer's ``kind`` optimizer (sgd or adam): its Adam kernels, its clipping."""
        kernels = self.optimizer_kernels if kind == "adam" else "fused"
        return Optimizer(kind, kernels=kernels, max_norm=self.max_norm, clip_scale=self.clip_scale)

    def switches(self) -> Switches:
        """``distribute``'s keyword arguments this trainer sets (``Switches``' keys)."""
        return cast(Switches, {k: getattr(self, k) for k in Switches.__required_keys__})


class Switches(TypedDict):
    """``distribute``'s trainer switches, by keyword (``TrainerSemantics.switches``)."""

    megatron_ddp: bool
    grad_accum_fusion: bool
    reduce_fp32: bool
    deepspeed_pipe: bool
    fp32_grad_accum: bool
    gather_copy_out: bool
    fsdp2_root: bool
    one_dp_stream: bool
    grad_copy_in: str
    gather_cast: bool
    fsdp2_grad_accum: bool
    overlap_param_gather: bool
    pipelining_kept: str
    fp8_weight_cache: bool
    zero3_fetch: Zero3Fetch | None
    master_remainders: bool
    p2p_blocking: bool
    offload_optimizer: bool
    float8_gather: bool


def trainer_semantics(
    trainer: str,
    s: Strategy,
    precision: Precision,
    dtype: DType,
    device: DeviceSpec | None = None,
    train: bool = True,
) -> TrainerSemantics:
    """What ``trainer`` (one of ``TRAINERS``) runs by default for ``s`` in ``precision`` and
    ``dtype`` on GPUs of ``device`` (None: not known; the attention kernel is then
    FlashAttention-2)."""
    if trainer not in TRAINERS:
        raise TrainerError(f"trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if trainer == "distir":
        return TrainerSemantics()
    if not train:
        raise TrainerError(
            f"a trainer ({trainer}) describes training: an inference program takes none of its switches"
        )
    if s.shares is not None and len(set(s.shares)) > 1:
        raise TrainerError(
            f"{s}: {trainer} splits every microbatch evenly over its data-parallel replicas "
            "(uneven batch shares are AMP's, not a trainer's)"
        )
    if trainer == "torchtitan":
        sem = _torchtitan(s, precision, dtype)
    elif dtype is not DType.f32 and not precision.mixed:
        raise TrainerError(
            f"{trainer} keeps fp32 master weights and optimizer state with {dtype} (Megatron-LM's "
            "--bf16/--fp16, DeepSpeed's BF16/FP16 optimizers): use --precision mixed"
        )
    elif trainer == "megatron":
        sem = _megatron(s, precision, device)
    else:
        sem = _deepspeed(s, precision, dtype)
    try:
        check_switches(s, precision, train, sem.switches())
    except StrategyError as e:
        raise TrainerError(str(e)) from None
    return sem


def _megatron(s: Strategy, precision: Precision, device: DeviceSpec | None) -> TrainerSemantics:
    if s.p > 1 and s.schedule not in ("1f1b", "interleaved"):
        raise TrainerError(
            f"{s}: Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B "
            "(megatron/core/pipeline_parallel/schedules.py: forward_backward_pipelining_without_"
            "interleaving and _with_interleaving): use 1f1b or interleaved"
        )
    # the fusion accumulates whole gradients: Megatron's distributed optimizer is ZeRO-1, and
    # Megatron-FSDP (ZeRO-2/3 reducing every backward) runs without it
    whole = not (s.d * s.c > 1 and reduce_scatter_every_backward(s))
    return TrainerSemantics(
        trainer="megatron",
        attention_kernel=trainer_attention("megatron", device),
        megatron_ddp=True,
        grad_accum_fusion=precision.mixed and whole,
        reduce_fp32=True,
        # Megatron-Core passes TE is_first_microbatch: the FP8 weight cache (``distribute``)
        fp8_weight_cache=precision.float8 and precision.float8_scaling == "delayed" and s.zero < 3,
        # overlap_p2p_comm is on by default for the interleaved schedule and turned off for 1F1B
        # (megatron/training/arguments.py at f2e5db4): 1F1B waits on its transfers
        p2p_blocking=s.p > 1 and s.v == 1,
        **trainer_clip("megatron"),
    )


def _deepspeed(s: Strategy, precision: Precision, dtype: DType) -> TrainerSemantics:
    if s.c > 1:
        raise TrainerError(
            f"{s}: DeepSpeed's sequence parallelism is Ulysses (all-to-alls over the heads, "
            "deepspeed/sequence/layer.py), not attention over a ring of context ranks: use c1"
        )
    bf16 = precision.mixed and dtype is DType.bf16
    _deepspeed_masters(s, precision)
    if bf16 and s.zero == 0 and s.d * s.c > 1:
        raise TrainerError(
            f"{s}: DeepSpeed's bf16 with ZeRO stage 0 is its BF16_Optimizer, which shards the fp32 "
            "state over data parallelism: that is distir's z1"
        )
    return TrainerSemantics(
        trainer="deepspeed",
        deepspeed_pipe=s.p > 1,  # the pipeline engine runs pipelines only
        # BF16_Optimizer's fp32 gradient sums; with ZeRO-2/3 DeepSpeed accumulates bf16 gradients
        fp32_grad_accum=bf16 and s.zero <= 1,
        # ZeRO-3's PartitionedParameterCoordinator with DeepSpeed's default knobs, where distir's
        # ZeRO-3 is DeepSpeed's (its whole data-parallel group, no pipeline)
        zero3_fetch=Zero3Fetch()
        if s.zero == 3 and s.p == 1 and s.shard_group is None and s.schedule != "zb1"
        else None,
        # BF16_Optimizer scales only over the bound; the ZeRO and FP16 optimizers unscale every step
        max_norm=DEFAULT_MAX_NORM,
        clip_scale="if_over" if bf16 and s.zero <= 1 else "always",
    )


def _deepspeed_masters(s: Strategy, precision: Precision) -> None:
    """Masters and optimizer state in the compute dtype (``Precision.with_optimizer_dtype``) as
    DeepSpeed keeps them: only its ZeRO-3 optimizer with ``bf16_master_weights_and_grads`` and
    ``bf16_optimizer_states`` (DeepSpeed 0.18.3 and later, deepspeed/runtime/zero/stage3.py), whose
    bf16 partition of each weight is the master itself, updated in place, as distir's step updates
    it. ``BF16_Optimizer`` (distir's z0/z1 for DeepSpeed) always keeps fp32 masters and gradient
    sums; the ZeRO-1/2 optimizer keeps a bf16 clone of this rank's partition beside the weights
    (``single_partition_of_fp32_groups``, stage_1_and_2.py), which the in-place update does not
    hold; DeepSpeed has no fp16 optimizer state (``fp16_master_weights_and_grads`` keeps Adam's
    moments in fp32 on the host)."""
    if not precision.mixed or precision.master is DType.f32:
        return
    opt = f"--optimizer-dtype {precision.master}"
    if precision.master is not DType.bf16:
        raise TrainerError(
            f"{opt}: DeepSpeed keeps no {precision.master} optimizer state (fp16_master_weights_and_grads "
            "keeps Adam's moments in fp32, under ZeRO-Offload only): drop --optimizer-dtype"
        )
    if s.zero <= 1:
        raise TrainerError(
            f"{s}: {opt} keeps no fp32 masters, but DeepSpeed's bf16 under ZeRO 0/1 is its BF16_Optimizer, "
            "which always keeps fp32 masters and fp32 gradient sums (bf16_optimizer.py): drop "
            "--optimizer-dtype, or use z3 (bf16_master_weights_and_grads with bf16_optimizer_states)"
        )
    if s.zero == 2:
        raise TrainerError(
            f"{s}: {opt} under DeepSpeed's ZeRO-2 keeps a bf16 clone of this rank's partition beside "
            "the weights (stage_1_and_2.py's single_partition_of_fp32_groups), which distir's in-place "
            "update does not model: use z3, whose partition is the master, or drop --optimizer-dtype"
        )


def _torchtitan(s: Strategy, precision: Precision, dtype: DType) -> TrainerSemantics:
    if precision.mixed and dtype is DType.f16:
        raise TrainerError(
            "torchtitan's mixed precision computes in bf16 (training.mixed_precision_param: "
            "bfloat16 or float32, torchtitan/config_manager.py; no fp16 loss scaling): use --dtype bf16"
        )
    fsdp = s.d * s.c > 1 and s.zero >= 2
    if precision.mixed and not fsdp:
        raise TrainerError(
            f"{s}: torchtitan applies mixed precision through FSDP2 only (mixed_precision_param "
            "takes effect with data_parallel_shard_degree > 1): use z3 (z2 under pipelining) with "
            "d > 1, or --precision pure"
        )
    if s.zero == 3 and s.p > 1:
        raise TrainerError(
            f"{s}: torchtitan's pipeline accumulates unsharded gradients and reduce-scatters them "
            "once a step, without resharding after the forward by default (distir's ZeRO-2 under "
            "a pipeline); distir's ZeRO-3 reduce-scatters every backward: use z2"
        )
    if s.t > 1 and not s.sp:
        raise TrainerError(
            f"{s}: torchtitan's tensor parallelism always shards the norms along the sequence "
            "(SequenceParallel in apply_tp's plan, torchtitan/parallelisms/parallelize_llama.py): "
            "use sp"
        )
    # the no-sync backwards of a pipeline add into fp32 sums as each block completes
    piped = s.p > 1 and precision.mixed and s.k > 1
    return TrainerSemantics(
        trainer="torchtitan",
        kernels=trainer_kernels("torchtitan"),
        reduce_fp32=True,
        grad_copy_in="cast" if fsdp else "",
        gather_copy_out=True,
        fsdp2_root=True,
        one_dp_stream=True,
        gather_cast=True,
        fp32_grad_accum=piped,
        fsdp2_grad_accum=piped,
        overlap_param_gather=s.p > 1,
        # torch.distributed.pipelining's stages keep their receive buffers, input gradients and
        # the last stage's outputs for the step (every stage's before pytorch#153383, May 2025)
        pipelining_kept="last" if s.p > 1 else "",
        # torchtitan's context parallelism is torch's context_parallel (create_context_parallel_ctx)
        ring_form="torch" if s.c > 1 else "p2p",
        **trainer_clip("torchtitan"),
    )


class Clip(TypedDict):
    """A trainer's gradient clipping, as ``TrainerSemantics`` and ``Optimizer`` take it."""

    max_norm: float
    clip_scale: str


def trainer_clip(trainer: str) -> Clip:
    """How ``trainer`` clips the gradients' global norm by default (module docstring): at
    ``DEFAULT_MAX_NORM``, scaling every step (torchtitan: torch's ``clip_grads_with_norm_``) or
    only over the bound (Megatron-LM; DeepSpeed's BF16_Optimizer, which its semantics refine by
    strategy); the ``distir`` trainer does not clip."""
    if trainer not in TRAINERS:
        raise TrainerError(f"trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if trainer == "distir":
        return Clip(max_norm=0.0, clip_scale="always")
    return Clip(max_norm=DEFAULT_MAX_NORM, clip_scale="always" if trainer == "torchtitan" else "if_over")


def model_options(trainer: str, s: Strategy, kernels: str) -> dict[str, str]:
    """The zoo model options (``NAME:key=value``) ``trainer`` runs its model with under ``s``
    and ``kernels`` (the trainer's or the user's), as the published-run records' model strings
    have them: Megatron-LM's and Megatron-DeepSpeed's one QKV GEMM; torchtitan 820504e's cross
    entropy on the fp32 logits — ``F.cross_entropy`` (``loss=torch``) on one tensor-parallel
    rank, under ``loss_parallel`` (``loss=parallel``) when t > 1 in eager mode, compiled with
    the model under ``--training.compile`` (``build_cross_entropy_loss``: fused kernels over
    vocabulary-sharded logits, ``loss=fp32``) — and, with eager kernels, its RMSNorm, RoPE and
    ``repeat_kv`` as the separate ops eager PyTorch runs; compiled (``inductor``), its RoPE
    still in fp32 around the complex product, which Inductor does not generate code for and runs
    as ATen's kernel (``rope=fp32``; torchtitan ``apply_rotary_emb``'s ``view_as_complex``,
    pytorch/torchtitan#15: "Torchinductor does not support code generation for complex
    operators"), ``repeat_kv``'s copy, which the SDPA kernel reads as one buffer (``kv=copy``),
    and ``F.silu`` as one op (``silu=fused``); its RMSNorm is one fused kernel. A model's own
    options win; a family without such an option takes none."""
    if trainer in ("megatron", "deepspeed"):
        return {"qkv": "fused"}
    if trainer != "torchtitan":
        return {}
    eager = kernels == "eager"
    compiled = {"rope": "fp32", "silu": "fused", "kv": "copy"}
    forms = {"norm": "composite", **compiled} if eager else compiled if kernels == "inductor" else {}
    loss = "torch" if s.t == 1 else "parallel" if eager else "fp32"
    return {**forms, "loss": loss}


def trainer_allows(trainer: str, s: Strategy, precision: Precision, dtype: DType, train: bool = True) -> bool:
    """Whether ``trainer`` runs ``s`` by default (``trainer_semantics`` refuses it otherwise):
    the search's space under ``--trainer``. An unknown trainer raises."""
    try:
        trainer_semantics(trainer, s, precision, dtype, None, train)
    except TrainerError:
        if trainer not in TRAINERS:
            raise
        return False
    return True


def trainer_attention(trainer: str, device: DeviceSpec | None) -> str:
    """The fused-attention kernel ``trainer`` runs on GPUs of ``device`` (None: not known):
    Transformer Engine's cuDNN attention for Megatron-LM where the GPU has its published speed
    (Hopper), FlashAttention-2 otherwise (``TrainerSemantics.attention_kernel``)."""
    cudnn = device is not None and any(a.kernel == "cudnn" for a in device.attention)
    return "cudnn" if trainer == "megatron" and cudnn else "fa2"


def trainer_kernels(trainer: str) -> str:
    """The kernels ``trainer`` runs by default: eager for torchtitan (no ``torch.compile``),
    fused for the others (``TrainerSemantics.kernels``)."""
    return "eager" if trainer == "torchtitan" else "fused"


def user_switches_fit(
    trainer: str,
    deepspeed_pipe: bool,
    fp32_grad_accum: bool,
    overlap_param_gather: bool,
    *,
    zero3_fetch: bool = False,
    master_remainders: bool = False,
    offload_optimizer: bool = False,
    optimizer_dtype: str = "f32",
) -> None:
    """Refuse a switch the user adds that belongs to another trainer than ``trainer``: DeepSpeed's
    pipeline engine, ``BF16_Optimizer`` and ZeRO-3 fetch (``zero3_fetch``: the user's
    ``deepspeed`` form) to Megatron-LM or torchtitan, Megatron-LM's parameter-gather overlap and
    NeMo's master remainders (Apex DistributedFusedAdam's) to DeepSpeed, and ZeRO-Offload and an
    optimizer without fp32 masters (``optimizer_dtype``) to Megatron-LM or torchtitan, whose fp32
    gradients feed fp32 masters."""
    if trainer in ("megatron", "torchtitan") and offload_optimizer:
        raise TrainerError(f"--offload-optimizer is DeepSpeed's ZeRO-Offload (its CPU Adam), not {trainer}'s")
    if trainer in ("megatron", "torchtitan") and (deepspeed_pipe or fp32_grad_accum):
        given = [
            what
            for on, what in (
                (deepspeed_pipe, "--deepspeed-pipe is DeepSpeed's pipeline engine"),
                (fp32_grad_accum, "--fp32-grad-accum is DeepSpeed's BF16_Optimizer"),
            )
            if on
        ]
        raise TrainerError(f"{' and '.join(given)}, not {trainer}'s")
    if trainer in ("megatron", "torchtitan") and optimizer_dtype != "f32":
        feeds = (
            "accumulates gradients in fp32 (main_grad)"
            if trainer == "megatron"
            else "reduces gradients in fp32 (FSDP2's reduce_dtype)"
        )
        raise TrainerError(
            f"--optimizer-dtype {optimizer_dtype} keeps no fp32 masters; --trainer {trainer} {feeds} "
            "for fp32 masters: drop one (NeMo's bf16 optimizer: the default trainer)"
        )
    if trainer in ("megatron", "torchtitan") and zero3_fetch:
        raise TrainerError(
            f"--zero3-fetch deepspeed is DeepSpeed's ZeRO-3 parameter coordinator, not {trainer}'s "
            "(its ZeRO-3 gathers a whole layer per call: --zero3-fetch layer, the default)"
        )
    if trainer == "deepspeed" and overlap_param_gather:
        raise TrainerError("--overlap-param-gather is Megatron-LM's (and FSDP's), not DeepSpeed's engine's")
    if trainer == "deepspeed" and master_remainders:
        raise TrainerError(
            "--master-remainders is Apex DistributedFusedAdam's (NeMo on Megatron-Core), not DeepSpeed's: "
            "its BF16_Optimizer keeps whole fp32 masters"
        )
