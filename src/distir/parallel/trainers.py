"""What a trainer runs for a strategy: its program switches and kernels, named once.

``distribute`` and the cost model take one switch per trainer behaviour (each documented, with its
source, in ``distir.parallel.distribute``): Megatron-LM's gradient buffers, FSDP2's copies,
DeepSpeed's pipeline engine. ``trainer_semantics(trainer, strategy, precision, device)`` turns a
trainer's name into the switches that trainer sets for that strategy, so ``distir simulate
--trainer megatron`` predicts the step and the memory as Megatron-LM runs the plan, not as
distir's trainer-neutral program does (which accumulates and reduces gradients in the compute
dtype, keeps a low-precision copy of every weight, and runs every kernel fused):

- ``distir``: the trainer-neutral program (no switch).
- ``megatron`` (Megatron-LM with Megatron-Core's ``DistributedDataParallel`` and distributed
  optimizer, its defaults): gradient-accumulation fusion into the fp32 ``main_grad`` (on unless
  ``--no-gradient-accumulation-fusion``), gradients reduced in fp32 (``--bf16`` forces
  ``accumulate_allreduce_grads_in_fp32``), its buckets (``megatron_ddp``: d > 1, ZeRO 0/1),
  fused kernels and Adam, Transformer Engine's cuDNN attention where the GPU has its published
  speed (Hopper), FlashAttention-2 elsewhere. Opt-in flags stay the user's
  (``--overlap-param-gather``, ``--tp-comm-overlap``).
- ``deepspeed`` (Megatron-DeepSpeed on DeepSpeed's engine): the pipeline engine when p > 1,
  ``BF16_Optimizer``'s fp32 gradient accumulation under bf16 mixed precision with ZeRO 0/1,
  Megatron's fused kernels, FusedAdam, FlashAttention-2.
- ``torchtitan`` (PyTorch FSDP2 as torchtitan applies it, its defaults: no ``torch.compile``,
  ``mixed_precision_reduce = "float32"``, the fused AdamW): eager kernels, gradients cast into
  the fp32 reduce-scatter input (``grad_copy_in = "cast"``, ``reduce_fp32``); under ZeRO-3 on
  one stage FSDP2's all-gather copy-out, its root kept unsharded, gathers and reductions on one
  stream and the fp32 shard cast at each gather; under pipelining torchtitan's FSDP is ZeRO-2
  (``reshard_after_forward=False``) with the fp32 sums of the no-sync backwards, so ZeRO-3 with
  p > 1 is refused, as is data parallelism with ZeRO 0/1 (torchtitan shards it with FSDP2).

Each rule follows the published-runs records of that trainer (``bench/published_runs.toml``,
which cite the trainers' code for every switch). A switch applies where ``distribute`` says it
does (ZeRO-3's options under ZeRO-3, the reductions' with d > 1, ...) and is a no-op elsewhere;
a strategy the trainer cannot run is a ``TrainerError`` or ``distribute``'s ``StrategyError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from distir.autodiff.precision import Precision
from distir.hardware.specs import DeviceSpec
from distir.ir.types import DType
from distir.parallel.grad_reduction import reduce_scatter_every_backward
from distir.parallel.strategy import Strategy, StrategyError

TRAINERS = ("distir", "megatron", "deepspeed", "torchtitan")


class TrainerError(StrategyError):
    """An unknown trainer, or a strategy the named trainer does not run (one line)."""


@dataclass(frozen=True, slots=True)
class TrainerSemantics:
    """A trainer's choices for one strategy: ``distribute``'s switches (``switches``) and the
    cost model's kernels (``kernels``: fused or eager; ``attention_kernel``; Adam's
    ``optimizer_kernels``)."""

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

    def switches(self) -> Switches:
        """``distribute``'s keyword arguments this trainer sets."""
        return Switches(
            megatron_ddp=self.megatron_ddp,
            grad_accum_fusion=self.grad_accum_fusion,
            reduce_fp32=self.reduce_fp32,
            deepspeed_pipe=self.deepspeed_pipe,
            fp32_grad_accum=self.fp32_grad_accum,
            gather_copy_out=self.gather_copy_out,
            fsdp2_root=self.fsdp2_root,
            one_dp_stream=self.one_dp_stream,
            grad_copy_in=self.grad_copy_in,
            gather_cast=self.gather_cast,
            fsdp2_grad_accum=self.fsdp2_grad_accum,
            overlap_param_gather=self.overlap_param_gather,
        )


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


def trainer_semantics(
    trainer: str, s: Strategy, precision: Precision, dtype: DType, device: DeviceSpec | None = None
) -> TrainerSemantics:
    """What ``trainer`` (one of ``TRAINERS``) runs for ``s`` in ``precision`` and ``dtype`` on
    GPUs of ``device`` (None: not known; the attention kernel is then FlashAttention-2)."""
    if trainer not in TRAINERS:
        raise TrainerError(f"trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if trainer == "megatron":
        return _megatron(s, precision, device)
    if trainer == "deepspeed":
        return _deepspeed(s, precision, dtype)
    if trainer == "torchtitan":
        return _torchtitan(s, precision)
    return TrainerSemantics()


def _megatron(s: Strategy, precision: Precision, device: DeviceSpec | None) -> TrainerSemantics:
    # the fusion accumulates whole gradients: Megatron's distributed optimizer is ZeRO-1, and
    # Megatron-FSDP (ZeRO-2/3 reducing every backward) runs without it
    whole = not (s.d * s.c > 1 and reduce_scatter_every_backward(s))
    cudnn = device is not None and any(a.kernel == "cudnn" for a in device.attention)
    return TrainerSemantics(
        trainer="megatron",
        attention_kernel="cudnn" if cudnn else "fa2",
        megatron_ddp=True,
        grad_accum_fusion=precision.mixed and whole,
        reduce_fp32=True,
    )


def _deepspeed(s: Strategy, precision: Precision, dtype: DType) -> TrainerSemantics:
    return TrainerSemantics(
        trainer="deepspeed",
        deepspeed_pipe=s.p > 1,  # the pipeline engine runs pipelines only
        # BF16_Optimizer (bf16 with ZeRO 0/1); FP16_Optimizer accumulates in fp16
        fp32_grad_accum=precision.mixed and dtype is DType.bf16 and s.zero <= 1,
    )


def _torchtitan(s: Strategy, precision: Precision) -> TrainerSemantics:
    if s.zero == 3 and s.p > 1:
        raise TrainerError(
            f"{s}: torchtitan runs FSDP under pipelining without resharding after the forward "
            "(ZeRO-2: reshard_after_forward=False in apply_fsdp); use z2"
        )
    if s.d * s.c > 1 and s.zero < 2:
        raise TrainerError(
            f"{s}: torchtitan shards data and context parallelism with FSDP2 (z3, or z2 under "
            "pipelining); its DDP (data_parallel_replicate_degree alone) has no mixed precision"
        )
    # the no-sync backwards of a pipeline add into fp32 sums as each block completes
    piped = s.p > 1 and precision.mixed and s.k > 1
    return TrainerSemantics(
        trainer="torchtitan",
        kernels="eager",
        reduce_fp32=True,
        grad_copy_in="cast",
        gather_copy_out=True,
        fsdp2_root=True,
        one_dp_stream=True,
        gather_cast=True,
        fp32_grad_accum=piped,
        fsdp2_grad_accum=piped,
        overlap_param_gather=s.p > 1,
    )
