"""``distribute(model, strategy)``: the D/T/P/K program of a zoo model, as one DTensor program.

The output is ordinary DistIR — it verifies, prints, type-checks, simulates (the simulator runs
DTensor ops on all devices of their mesh), and ``materialize`` + ``project`` turn it into per-rank
programs. Its shape:

- **Meshes.** Pipeline stage s owns the mesh ``(dp=d, tp=t)`` over devices ``s·d·t … (s+1)·d·t−1``
  (or the strategy's placement permutation). Chunk c (of p·v) lives on stage ``c mod p``.
- **Streams.** With ``comm_streams``, pipeline transfers run between communication-stream devices, four per
  compute device (``STREAMS``: program devices N..2N−1 send activations forward, 2N..3N−1 send
  gradients backward, 3N..4N−1 and 4N..5N−1 receive them, for the N compute devices; 5N..6N−1
  and 6N..7N−1 run the data-parallel collectives; ``device_map`` maps them onto the GPUs'
  streams), so a stage keeps computing while its
  activations travel — the DistIR paper's model of overlap — and receives the next microbatch
  while it sends the last one on (links are full duplex; one stream for both would make each
  receive wait, in program order, behind the send written before it). Without, a transfer
  blocks sender and receiver (Figure 2's form).
- **Layers.** Each distinct layer function is differentiated once at microbatch shapes
  (``distir.autodiff``) and sharded once on a representative (d, t) mesh
  (``distir.parallel.sharding.shard_function``): the layer functions are shared by every stage and
  microbatch.
- **Chunks.** ``@c<i>_fwd`` calls its layers' forward functions and returns the activation and the
  residuals; ``@c<i>_bwd`` (``_bwd_acc`` adds into gradient accumulators) runs them backward; the
  zero-bubble schedule uses ``@c<i>_bwd_i`` (input gradients) and ``@c<i>_bwd_w`` (weight gradients).
  ZeRO-3 weights are gathered inside the chunk functions, right before each layer uses them.
- **Entry.** Inputs come as k microbatches; the schedule's actions (``distir.parallel.pipeline.schedules``)
  merged into one program order become chunk calls, with ``MeshSend`` between stages right after
  the producing action. With d > 1 the weight gradients (pending sums over ``dp``) are reduced in
  buckets inside the backward chunks as their layers complete them (``_Buckets``; ``bucket_mb``,
  DDP's 25 MiB): DDP / ZeRO-0/1 all-reduce the accumulated gradients in each chunk's last
  backward, ZeRO-2/3 reduce-scatter in every backward and accumulate this rank's shard — but
  ZeRO-2 under a pipeline accumulates whole gradients and reduce-scatters them in the last
  backward, as the trainers do (``distir.parallel.grad_reduction``). Then the
  optimizer updates the weight (ZeRO-1+: only this rank's shard of weight and state, then an
  AllGather for ZeRO-1/2); with the optimizer's ``max_norm`` every gradient is reduced first and
  all are clipped by their global norm before the updates (``_Builder._norm_totals``).
  Results: the loss (summed over microbatches, replicated), the new weights, the new optimizer
  state (and, under mixed precision, the new compute copies).
- **HSDP** (``z3h<n>``, ``Strategy.shard_group``): weights, optimizer state and the reduced
  gradients live on each stage's mesh seen as ``(dpr=d/n, dp=n, tp=t)`` (the same devices), ZeRO-3
  sharded over ``dp`` (a group of n consecutive replicas) and replicated over ``dpr``; a chunk
  all-gathers a weight within its group and sees it on the ``(dp, tp)`` mesh (``MeshView``); a
  bucket sees its pending gradients on the regrouped mesh and reduce-scatters them within the
  group in every backward, accumulating the shard (still a pending sum over ``dpr``); the last
  backward of each chunk all-reduces the accumulated shard across the groups, once per step (FSDP2's
  ``set_requires_all_reduce(False)`` on all microbatches but the last, as with gradient
  accumulation HSDP does). With context parallelism a group is n replicas' n·c ranks
  (``(dpr=d/n, dp=n·c, tp=t)``: torchtitan's ``dp_shard`` × ``cp`` mesh under ``dp_replicate``).
- **In place.** Weights, optimizer state, Adam's step and the compute copies are donated
  (``Function.donated``), each to its successor among the results: the simulator lets the
  update take the old value's storage, as trainers update in place (the ZeRO paper's model
  state: 2Ψ + 2Ψ + KΨ and its stage divisions, ``tests/parallel/test_zero_memory.py``).

**Trainer options** of ``distribute`` (each what one trainer does; off by default):

- ``overlap_param_gather`` (Megatron-LM's ``--overlap-param-gather`` with its distributed
  optimizer; mixed precision, ZeRO-1/2, d·c > 1): the new low-precision weights are not
  all-gathered after the optimizer but in the next step's first forward, layer by layer as the
  forward reaches them (on the ``dp_gather`` stream, one layer ahead), so the gather overlaps
  compute: the compute copy persists between steps as this rank's shard, and each chunk's first
  forward (``c<i>_fwd_gather``) gathers its weights and returns them whole for the rest of the
  step. Interleaved (v > 1, with communication streams and ``megatron_ddp``) the chunks are
  gathered ahead instead, as
  Megatron-LM's interleaved schedule launches each model chunk's parameter sync: every rank's
  first two chunks before the step's first forward, each later chunk ``rank`` forward passes
  before the first forward of the chunk before it, one coalesced all-gather per chunk, taken over
  to the compute stream at the chunk's first forward (``_prefetch_first``, ``_prefetch_next``).
- ``p2p_blocking`` (Megatron-LM's pipeline transfers without ``overlap_p2p_comm``: always under
  1F1B, which turns it off, and interleaved with ``--no-overlap-p2p-communication`` or NeMo's
  ``overlap_p2p_comm: False``): each exchange is one ``batch_isend_irecv`` whose requests the
  schedule waits on (``_communicate`` in megatron/core/pipeline_parallel/p2p_communication.py at
  f2e5db4), so the transfer runs between the two stages' compute streams, each held until it
  ends, as without ``comm_streams``. Megatron then calls ``torch.cuda.synchronize()`` after each
  batched exchange (``batch_p2p_sync``, default on), which waits for every stream of the device;
  that host barrier is not modelled.
- ``megatron_ddp`` (Megatron-LM's ``DistributedDataParallel`` with ``--overlap-grad-reduce``, and
  its distributed optimizer with ZeRO-1; d > 1, gradients reduced in the last backward):
  gradients accumulate whole in every microbatch but the last (the schedules run them under
  ``no_sync``, as distir's DDP form does), and then (1) a bucket holds max(40M, 1M·d)
  parameters (``DistributedDataParallel.__init__``, at f2e5db4) instead of ``bucket_mb``;
  (2) only the first model chunk of the first pipeline stage is bucketed: Megatron sets
  ``bucket_size = None`` on pipeline ranks > 0 and for model chunks after the first, so every
  other chunk's gradients are one bucket, reduced by a call of their own (``c<i>_grad_sync``)
  after the backward that completes them has sent its input gradient on — under 1F1B right
  after, interleaved ``rank`` backward steps later (``delay_grad_reduce``'s ``grad_sync_func``,
  ``megatron/core/pipeline_parallel/schedules.py``), so the reduction's interference does not
  hold up the pipeline's drain; (3) with ZeRO-1 each bucket is
  reduce-scattered to this rank's shard (``_reduce_scatter_base``,
  ``megatron/core/distributed/param_and_grad_buffer.py``), not all-reduced and sliced;
  (4) before a bucket is reduced, ``Bucket.start_grad_sync`` runs two kernels over its fp32
  gradients on the compute stream: the NaN check's norm (``check_for_nan_in_grad``, on unless
  ``--no-check-for-nan-in-loss-and-grad``: ``grad_data.norm(p=2)``, a reduction reading them
  once, for the host's assert) and the multiplication by ``gradient_scaling_factor`` (1/dp
  unless ``--ddp-average-in-collective``: ``grad_data *= ...``, in place, read and write), both
  at f2e5db4 (``_Buckets._megatron_prepared``).
- ``deepspeed_pipe`` (DeepSpeed's ``PipelineEngine``, as Megatron-DeepSpeed trains with it;
  ZeRO 0/1 only, as the engine asserts; the 1f1b schedule with one chunk per rank): the schedule
  is DeepSpeed's ``TrainSchedule`` (``distir.parallel.pipeline.deepspeed``: its lock steps, each
  step's transfers before its pass), written step by step; the pipeline transfers block the
  compute streams of sender and receiver (``deepspeed/runtime/pipe/p2p.py``: ``send``/``recv``
  are synchronous ``dist.send``/``dist.recv``); with t > 1 each tensor-parallel rank sends its
  1/t part and the receiver all-gathers it whole, and the sender gathers its sent output again
  before that microbatch's backward (``pipe_partitioned``/``grad_partitioned``, on by default:
  ``_pipe_partition``); and the data-parallel gradient reduction is not bucketed into the
  backward: ``TrainSchedule`` issues ``ReduceTiedGrads`` and ``ReduceGrads`` after a stage's last
  backward, and the engine runs them on the compute stream (``_exec_reduce_tied_grads``,
  ``_exec_reduce_grads``: one all-reduce of the accumulated gradients), so nothing overlaps them.
- ``fp32_grad_accum`` (DeepSpeed's ``BF16_Optimizer``; mixed precision): every backward ends by
  adding its low-precision weight gradients, cast to fp32, into an fp32 gradient per weight
  (``update_hp_grads``, after ``autograd.backward``, ``deepspeed/runtime/bf16_optimizer.py``),
  and that fp32 sum is what the data-parallel reduction sums (``get_grads_for_reduction``) and
  the optimizer takes.
- ``cp_ring`` (context parallelism, c > 1): attention runs as a ring over the cp axis (K/V
  passed rank to rank, overlapped with the blocks: ``distir.parallel.sharding.ring``), as
  Megatron-LM and torchtitan run it; False gathers K/V over cp instead (the older form, kept
  for comparison).
- ``gather_copy_out`` (PyTorch FSDP2, ``fully_shard``): each ZeRO-3 gather's result is copied
  into the parameters' own storage on the compute stream before the layer runs (an
  ``Identity`` on the layer's mesh): FSDP2 all-gathers into one flat buffer and
  ``FSDPParamGroup.wait_for_unshard`` copies it out per parameter (``foreach_all_gather_copy_out``,
  ``torch.split_with_sizes_copy``, torch/distributed/_composable/fsdp/_fsdp_collectives.py) on
  the current stream, in the forward and again in the backward. FSDP1 and DeepSpeed gather
  into the flat parameter their parameters are views of (no copy): the default.
- ``reduce_fp32`` (mixed precision, d > 1; FSDP's ``MixedPrecision(reduce_dtype=torch.float32)``:
  Composer's ``DEFAULT`` mode, ``get_mixed_precision`` in composer/distributed/mosaic_parallelism.py;
  torchtitan's ``mixed_precision_reduce = "float32"``): each gradient is cast to the masters'
  dtype on the reduction stream and reduced in it (twice the bytes of a bf16 reduction), as
  FSDP2's ``foreach_reduce`` copies the gradients into an fp32 reduce-scatter input on its
  reduce-scatter stream and FSDP1 casts them on its post-backward stream; the reduced shard is
  then the optimizer's gradient as it is. Default: reduced in the compute dtype, then cast.
- ``fsdp2_root`` (ZeRO-3, one stage; PyTorch FSDP2 as torchtitan wraps a model: each block
  ``fully_shard``-ed, the rest — embedding, final norm, head — the root's group): the root's
  gathered weights stay from the forward to their last use in the backward, never gathered
  again, since FSDP2 never reshards the root after forward (``FSDPState._lazy_init`` sets
  ``post_forward_mesh_info = None``, torch/distributed/_composable/fsdp/_fsdp_state.py), and so
  do the last block's (torchtitan's ``apply_fsdp`` passes ``reshard_after_forward=False`` for
  it, torchtitan/parallelisms/parallelize_llama.py). The blocks are the calls of the model's
  most repeated layer function. Default: every weight gathered again for the backward.
- ``one_dp_stream`` (ZeRO-3 with communication streams, not HSDP; PyTorch FSDP 1 and 2): the
  gradient reductions run on the ``dp_gather`` stream with the parameter gathers, one after another
  in issue order, as FSDP's all-gathers and reduce-scatters go over one process group (FSDP1's
  ``state.process_group``; FSDP2's shard group, "shared with all-gather" unless
  ``set_separate_reduce_scatter_group``, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)
  and ``ProcessGroupNCCL`` runs a group's collectives on one NCCL stream per device
  (``ncclStreams_``). Issue order as FSDP's hooks: a layer's reduction after the next layer's
  gather (the pre-backward prefetch precedes the post-backward reduce-scatter), the hand-overs to
  and from the compute stream written before the reduction so the compute waits for its gathers
  only. Default: reductions on their own ``dp_reduce`` stream, beside the gathers.
- ``grad_copy_in`` (``""`` | ``"copy"`` | ``"cast"``; data parallel with buckets): each gradient
  is copied into the bucket's flat buffer on the compute stream before it is handed to the
  reduction: ``"copy"`` as FSDP1 (the parameters are views of the flat parameter,
  ``FlatParamHandle._get_unflat_views``' ``torch.split``, so autograd's backward of the split
  writes the flat gradient, a cat, on the compute stream; ``reduce_fp32``'s cast stays on the
  reduction stream, as ``_post_backward_hook`` casts on its post-backward stream), ``"cast"`` as
  FSDP2 (``foreach_reduce``'s ``foreach_reduce_scatter_copy_in``, ``torch._chunk_cat`` into the
  ``reduce_dtype`` buffer, runs on the current stream before the reduce-scatter stream waits for
  it, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: under ``reduce_fp32`` it is the
  cast). FSDP2 divides by NCCL's ``AVG`` (no kernel); FSDP1's pre- and post-division kernels on
  the post-backward stream are not modelled. Default: no copy.
- ``gather_cast`` (ZeRO-3, mixed precision, d > 1; PyTorch FSDP 1 and 2): no low-precision copy
  of a ZeRO-sharded weight is held through the step; each gather casts the fp32 master shard to
  the compute dtype on the stream that gathers it, then gathers that — FSDP1's ``pre_unshard``
  casts the local shard into ``_mp_shard`` and frees it after the all-gather
  (``_use_low_precision_shard``, ``_free_low_precision_sharded_param``,
  torch/distributed/fsdp/_flat_param.py); FSDP2's ``_get_param_all_gather_inputs`` copies the
  fp32 shard into the ``param_dtype`` all-gather input (``torch._foreach_copy_`` on the copy-in
  stream, _fsdp_collectives.py). The compute copies stay step inputs and results (the
  program's interface, as the sequential mixed step's) but nothing in the step reads them: each
  is freed at the start and made anew from the new master at the end. Default: the persistent
  copy (this rank's shard) gathered per use, as DeepSpeed ZeRO-3 keeps its bf16 partitions.
- ``float8_gather`` (with ``gather_cast``, under torchao's float8, ``precision="fp8"``; torchao's
  ``enable_fsdp_float8_all_gather`` with ``precompute_float8_dynamic_scale_for_fsdp``, torchtitan's
  ``--float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp``):
  each sharded weight that the layers read only through float8 casts is cast to float8 on the
  stream that gathers it (``Float8Cast(shard, scaling=precomputed, layouts=1)``: one pass, the
  whole weight's scale, as ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts the
  local shard) and gathered in float8, one byte an element; the layers take the gathered float8
  weight as it comes, forward and backward (``Float8Linear`` skips the cast of a
  ``Float8Tensor``; ``distir.parallel.fp8_cache``). Not modelled: the scales' computation after
  the optimizer step (one ``_foreach_norm`` over the fp32 shards and an all-reduce of one scalar
  per weight, well under a millisecond) and the transposed copy of the gathered weight for the
  input gradient (one byte an element read and written). Refused (the first missing condition
  named) outside a training step under torchao's float8 with fp32 masters, ZeRO-3 sharded over
  d > 1 data-parallel ranks (torchtitan passes the option on only with ``dp_shard_enabled``) and
  ``gather_cast``, and where a forward saves a weight's float8 cast for its backward (no
  recomputation: distir models the casts recomputed, as under ``rops`` and ``rfull``).
- ``fsdp1_root`` (ZeRO-3, one stage; PyTorch FSDP1 with FULL_SHARD, each block wrapped, the rest
  the root's flat parameter, as Composer wraps a model): the root's gathered weights stay from the
  forward to their last use in the backward, as ``fsdp2_root`` keeps them but without the last
  block's: ``_post_forward_reshard`` frees a unit's unsharded flat parameter after its forward
  unless the unit is the root ("Do not free the root's parameters in the post-forward for
  FULL_SHARD", torch/distributed/fsdp/_runtime_utils.py). With either, the root's gradients are
  reduced together in one call after every block's (the root unit's post-backward hook runs
  once all its gradients are complete, the embedding's last), not each as it completes.
- ``fsdp2_grad_accum`` (with ``fp32_grad_accum``; PyTorch FSDP2 with ``reduce_dtype=float32``
  in the backwards that do not reduce, as ``torch.distributed.pipelining`` runs all but a stage's
  last, ``set_requires_gradient_sync(False)``): each layer's gradients are cast to fp32 and added
  into the fp32 sums as soon as its backward completes them, not after the whole backward: FSDP2's
  post-backward hook, run per ``fully_shard`` group as autograd finishes it, casts the unsharded
  gradient into ``unsharded_accumulated_grad`` and then adds into it
  (``FSDPParam.to_accumulated_grad_if_needed`` / ``accumulate_unsharded_grad_if_needed``,
  torch/distributed/fsdp/_fully_shard/_fsdp_param.py), so one layer's low-precision gradient is
  live at a time. FSDP2 under a pipeline as torchtitan runs it is ZeRO-2 (whole gradients,
  reduce-scattered once, in the stage's last backward) with ``overlap_param_gather`` (torchtitan's
  ``apply_fsdp`` passes ``reshard_after_forward=False`` under PP: each chunk gathered in its first
  forward, kept unsharded for the step), ``fp32_grad_accum`` and this.
- ``grad_accum_fusion`` (mixed precision; Megatron-LM's ``--gradient-accumulation-fusion``, on by
  default, and Transformer Engine's ``fuse_wgrad_accumulation``; not with ZeRO-2/3 reducing every
  backward): the gradients accumulate in fp32 sums, Megatron's ``main_grad``, reduced as they are
  (no cast before or after the reduction). A linear layer's weight-gradient GEMM adds its product
  into the sum (``wgrad_gemm_accum_fp32``, beta = 1, fp32 C and D,
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``,
  megatron/core/tensor_parallel/layers.py at f2e5db4): the layer's backward takes the sums and
  returns them updated, the product cast and added right after its MatMul, which the fusion rule
  runs as the GEMM's epilogue — no Add kernel, no low-precision product written; the first
  microbatch's GEMM writes the fp32 gradient. Every other weight's gradient (norms, biases, the
  embedding, a weight a chunk uses twice) is added into its sum as the layer completes it by one
  fused cast-add, as Megatron's DDP hook runs ``param.main_grad.add_(param.grad)``
  (``distir.parallel.grad_accum_fusion``).
- ``pipelining_kept`` (``""`` | ``"every"`` | ``"last"``; training with p > 1;
  ``torch.distributed.pipelining``'s ``PipelineStage``, as torchtitan runs its pipelines): what
  the stages keep until the step's end (``distir.parallel.pipeline.stage_state``) — the
  activation and the gradient each stage receives per microbatch (one receive buffer per
  microbatch, never freed), the gradient of each received input (the buffer's ``.grad``,
  cleared by the next step's ``clear_runtime_states``), and its output per microbatch
  (``output_chunks``): ``"every"`` stage's (torch before pytorch#153383, May 2025, as the
  December 2024 torchtitan records ran), or the ``"last"``'s only — the logits, which the last
  chunk's forward returns after its other results; the last stage also concatenates them at
  the schedule's end (``_merge_outputs``: a transient copy of all of them). The kept values
  are the step's last results; the receive buffers are step parameters too (``<value>_buffer``,
  on the receiving stream, each donated to what it receives). With FSDP2 (``grad_copy_in =
  "cast"``) the last backward reduces its gradients after its computation, group by group, as
  the stages call FSDP's post-backward (``_Builder.late_post_backward``). Not with
  ``deepspeed_pipe``. Default: each freed after its last use.
- ``sac_eager`` (``rops`` run eagerly, as torchtitan without ``torch.compile``): PyTorch's
  selective checkpointing caches every result its policy saves until the block's backward,
  whether the backward reads it or not (``torch/utils/checkpoint.py``,
  ``_CachingTorchDispatchMode``): the layers are differentiated under ``ops-eager``
  (``distir.autodiff.reverse``), which keeps the block's last product too. Compiled blocks
  keep only what their backward reads: the default.
- ``fp8_weight_cache`` (training under ``fp8-delayed``, ZeRO 0-2; Megatron-Core with Transformer
  Engine, which passes TE ``is_first_microbatch``): each weight that every layer function reads
  only through its float8 cast (E4M3, delayed scaling: the linear layers' weights; directly or
  through a view, as context parallelism broadcasts them) is cast once
  per step and the float8 copy is what every chunk call receives — the forwards, the
  recomputation and the backwards of every microbatch — so a stage holds one float8 copy of its
  weights, not one per microbatch in flight, and runs one cast per weight, not k
  (``distir.parallel.fp8_cache``: TE's ``_fp8_workspaces``). The layer functions take the
  float8 weight as the parameter (``_f8w``, the casts of it dropped); the entry casts a chunk's
  compute copies right before the chunk's first forward (TE casts on a model chunk's first
  microbatch: Megatron's ``is_first_microbatch_for_model_chunk``), and under
  ``overlap_param_gather`` that forward casts each weight right after its gather and returns the
  float8 copy for the rest of the step. The gradients are the same (the casts are
  straight-through). ZeRO-3 is refused (FSDP passes TE no ``is_first_microbatch``; a weight
  gathered per use has no copy to keep);
  other precisions are left as they are. Default: a cast per call, as ``te.Linear`` called
  without ``is_first_microbatch`` (llm-foundry's Composer) casts.
- ``zero3_fetch`` (a ``Zero3Fetch``: ZeRO-3 training with d > 1 on one stage; DeepSpeed's
  ``PartitionedParameterCoordinator``, ``distir.parallel.zero3_fetch``): the layers' bodies are
  written inline in the chunk functions and each module's weights (a run of ops reading the same
  weights) gathered as DeepSpeed's coordinator fetches them — before the module, with its
  prefetch along the trace under the prefetch bucket and the live-parameter cap, released unless
  reused within the reuse distance, weights under the persistence threshold whole for the
  function — and each weight gradient joins the reduce bucket as its op makes it, a bucket closed
  before a gradient would take it past ``reduce_bucket`` elements (``_ModuleGathers``).
  Default: FSDP's whole-layer gathers, one layer ahead (``_Gathers``).
- ``master_remainders`` (training in mixed precision with bf16 copies and fp32 masters, ZeRO-1,
  fused Adam; refused elsewhere; Apex DistributedFusedAdam's ``store_param_remainders``, which
  NeMo sets): no fp32 master is a step input; each master shard is an int16 remainder (its low 16
  bits) beside the bf16 copy (its high 16 bits, rounded), and ``AdamRemainder`` updates this
  rank's shard of the copy and the remainder together, the fp32 master joined from them bit for
  bit; the new copy is the new bf16 shard all-gathered (with ``overlap_param_gather``, kept as the
  shard), not a cast. Default: fp32 masters.
- ``offload_optimizer`` (training in mixed precision with fp32 masters, ZeRO 1-3, Adam; not HSDP
  or context parallelism; DeepSpeed's ZeRO-Offload with its CPU Adam, as v0.6.2's ZeRO-3 runs
  it): the masters, Adam's m and v and the step are parameters on each stage's host mesh (program
  devices on the GPUs' ``host`` stream: ``device_map(host=True)``), partitioned as ZeRO partitions
  them; each reduced gradient partition is copied to the host (``_to_host``: per bucket in the
  backward under ``zero3_fetch`` with one microbatch, the compute stream waiting for the
  reduction as DeepSpeed's host does; else at the step), cast to fp32, clipped and updated
  there, and the new fp32 master partition is copied back and cast to the compute copy. Default:
  the optimizer on the GPUs.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, NamedTuple

from distir.autodiff.precision import Precision, PrecisionError, cast
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.model import Model
from distir.gcpause import paused_gc
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    axis_size,
)
from distir.ir.function import Function, Module
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs, Value
from distir.ops.dist import format_mesh_attr
from distir.ops.float8 import FLOAT8_CAST, PRECOMPUTED_SCALING
from distir.ops.linalg import DYNAMIC_SCALING
from distir.ops.registry import REGISTRY
from distir.parallel.context_model import context_model
from distir.parallel.fp8_cache import (
    CACHE_DTYPE,
    CACHE_SCALING,
    SavedGatheredWeight,
    cached_layers,
    cast_attrs,
    gathered_layers,
)
from distir.parallel.grad_accum_fusion import fused_backward, wgrad_products
from distir.parallel.grad_reduction import handover_waits_one_way, reduce_scatter_every_backward
from distir.parallel.layer_sharder import (
    LayerSharder,
    ShardedLayer,
    placement_text,
    sharded_layers,
    with_cp,
)
from distir.parallel.pipeline.analysis import time_order
from distir.parallel.pipeline.deepspeed import Event, step_order
from distir.parallel.pipeline.partition import partition, uniform_counts
from distir.parallel.pipeline.schedules import Action, build_schedule
from distir.parallel.pipeline.stage_state import PIPELINING_KEPT, StepState
from distir.parallel.sharding.shard_function import strip_types
from distir.parallel.strategy import Strategy, StrategyError
from distir.parallel.zero3_fetch import FetchStep, Zero3Fetch, plan_fetches
from distir.sim.devices import HOST_STREAM, DeviceMap, Slot

DDP_BUCKET_MB = 25.0  # PyTorch DDP's ``bucket_cap_mb`` default (MiB)
# Megatron-LM's default bucket: max(40M, 1M · dp) parameters (``DistributedDataParallel.__init__``,
# megatron/core/distributed/distributed_data_parallel.py at f2e5db4)
MEGATRON_BUCKET, MEGATRON_BUCKET_PER_RANK = 40_000_000, 1_000_000
# ``distribute(grad_copy_in=...)``: none, FSDP1's copy in the compute dtype, FSDP2's (casting)
GRAD_COPY_IN = ("", "copy", "cast")


@dataclass(frozen=True, slots=True)
class FsdpOptions:
    """``distribute``'s options that make ZeRO-3 run as PyTorch's FSDP does (module docstring,
    *Trainer options*), as ``_Builder`` takes them."""

    gather_copy_out: bool = False
    fsdp2_root: bool = False
    fsdp1_root: bool = False
    one_dp_stream: bool = False
    grad_copy_in: str = ""
    gather_cast: bool = False
    fsdp2_grad_accum: bool = False
    float8_gather: bool = False


HP_GRAD = "hp_grad"  # fp32 gradient accumulation: the function casting a gradient to fp32


def _zero_dim(w: TensorType, tp: Placement, d: int) -> int | None:
    if d == 1:
        return None
    for i, s in enumerate(w.shape):
        if s >= d and not (isinstance(tp, Shard) and tp.dim == i):
            return i
    return None


def chunk_weights(layers: Sequence[ShardedLayer]) -> list[Value]:
    """The weights of a chunk's layers, each once (a tied weight may serve two of them)."""
    return list(dict.fromkeys(w for L in layers for w in L.weights))


def _add_grads(
    fb: FunctionBuilder, grads: dict[Value, Value], ws: Sequence[Value], gs: Sequence[Value]
) -> None:
    """Record the gradients ``gs`` of the weights ``ws``, adding to one already there (a tied
    weight gets a gradient from each layer that uses it)."""
    for w, g in zip(ws, gs, strict=True):
        prev = grads.get(w)
        grads[w] = g if prev is None else fb.op("Add", prev, g, names=[f"g_{w.name}"])[0]


def _tied_copies(
    by_chunk: Sequence[Sequence[ShardedLayer]], stage_of: Sequence[int]
) -> tuple[dict[tuple[Value, int], Value], dict[Value, Value], dict[Value, tuple[Value, ...]]]:
    """Where each chunk finds each of its weights: ``home[(w, c)]`` is ``w`` itself on the stage
    of its first chunk, and on another stage (a tied weight: GPT-2's embedding, used again by the
    head) a copy — a new value named like ``w``, an entry parameter of that stage with its own
    optimizer state, as Megatron-LM keeps the word embeddings on the first and the last stage.
    ``partner`` pairs each copy with its weight both ways; a weight on more than two stages (one
    every block reads: an ONNX export's rotary frequencies) is in ``groups`` instead, each member
    (the weight, then its copies in stage order) mapped to them all."""
    home: dict[tuple[Value, int], Value] = {}
    by_stage: dict[tuple[Value, int], Value] = {}
    first: dict[Value, int] = {}
    for c, ls in enumerate(by_chunk):
        for w in chunk_weights(ls):
            st = first.setdefault(w, stage_of[c])
            key = (w, stage_of[c])
            if key not in by_stage:
                by_stage[key] = w if stage_of[c] == st else Value(w.name, None)
            home[(w, c)] = by_stage[key]
    members: dict[Value, list[Value]] = {}
    for (w, _st), h in by_stage.items():
        members.setdefault(w, []).append(h)
    partner: dict[Value, Value] = {}
    groups: dict[Value, tuple[Value, ...]] = {}
    for ms in members.values():
        if len(ms) == 2:
            partner[ms[0]], partner[ms[1]] = ms[1], ms[0]
        elif len(ms) > 2:
            groups.update(dict.fromkeys(ms, tuple(ms)))
    return home, partner, groups


def distribute(
    model: Model,
    strategy: Strategy,
    optimizer: Optimizer | None = None,
    train: bool = True,
    comm_streams: bool = False,
    precision: Precision | str = "pure",
    chunk_times: tuple[Sequence[float], Sequence[float]] | None = None,
    bucket_mb: float = DDP_BUCKET_MB,
    overlap_param_gather: bool = False,
    deepspeed_pipe: bool = False,
    fp32_grad_accum: bool = False,
    cp_ring: bool = True,
    gather_copy_out: bool = False,
    reduce_fp32: bool = False,
    sac_eager: bool = False,
    fsdp2_root: bool = False,
    one_dp_stream: bool = False,
    grad_copy_in: str = "",
    gather_cast: bool = False,
    fsdp1_root: bool = False,
    megatron_ddp: bool = False,
    fsdp2_grad_accum: bool = False,
    grad_accum_fusion: bool = False,
    pipelining_kept: str = "",
    called_only: bool = False,
    fp8_weight_cache: bool = False,
    zero3_fetch: Zero3Fetch | None = None,
    master_remainders: bool = False,
    p2p_blocking: bool = False,
    offload_optimizer: bool = False,
    float8_gather: bool = False,
) -> Module:
    """The distributed program of ``model`` under ``strategy`` (module docstring).

    ``chunk_times``: per pipeline chunk, its forward and backward seconds for one microbatch on its
    stage (``distir.search.profile.chunk_times`` gives them from the cost model). The schedule is
    written in the time order they give (a zero-bubble backward splits in two halves); without,
    forward times are taken ∝ each chunk's weights and backward = 2 × forward (a poor guess where
    compute does not follow the weights; under DistIR's semantics the order is the schedule).

    ``comm_streams``: pipeline transfers and data-parallel collectives on communication-stream
    devices (module docstring, *Streams*).

    ``precision="mixed"``: fp32 masters and optimizer state, computing in the model's dtype
    (``distir.autodiff.precision``); each weight's compute copy is a step input that persists
    between steps (whole; ZeRO-3: this rank's shard, gathered per use) and is made anew from the
    new master after the optimizer (ZeRO-1/2: the master shard cast, then an all-gather of the
    low-precision copy); gradients are reduced in the compute dtype and cast to fp32 for the
    optimizer. An inference program casts the masters instead.

    ``bucket_mb`` (MiB; PyTorch DDP's ``bucket_cap_mb`` default, 25): with d > 1, gradients are
    reduced in buckets of about this size during the backward (``_Buckets``); with
    ``comm_streams`` the reductions run on each GPU's ``dp_reduce`` stream, overlapping the rest of
    the backward, and ZeRO-3's gathers on its ``dp_gather`` stream, one layer ahead (``_Gathers``).
    The trainers' options (``overlap_param_gather`` …, default off): module docstring, *Trainer
    options*. ``called_only``: build only the chunk functions the schedule calls
    (``_LazyChunks``)."""
    if pipelining_kept and deepspeed_pipe:
        raise StrategyError(
            "pipelining_kept is torch.distributed.pipelining's, not DeepSpeed's pipeline engine's"
        )
    fsdp = FsdpOptions(gather_copy_out, fsdp2_root, fsdp1_root, one_dp_stream, grad_copy_in, gather_cast)
    fsdp = replace(fsdp, fsdp2_grad_accum=fsdp2_grad_accum, float8_gather=float8_gather)
    with paused_gc():  # hundreds of thousands of values, none garbage: see ``distir.gcpause``
        return (
            _Builder(
                model,
                strategy,
                optimizer or Optimizer(),
                train,
                comm_streams,
                precision,
                chunk_times,
                bucket_mb,
                overlap_param_gather,
                deepspeed_pipe,
                fp32_grad_accum,
                cp_ring,
                reduce_fp32,
                sac_eager,
                fsdp,
                megatron_ddp,
                grad_accum_fusion,
                pipelining_kept,
            )
            .with_fp8_cache(fp8_weight_cache)
            .with_zero3_fetch(zero3_fetch, fsdp)
            .with_remainders(master_remainders)
            .with_p2p_blocking(p2p_blocking)
            .with_offload(offload_optimizer)
            .build(called_only)
        )


def _layer_policy(s: Strategy, sac_eager: bool) -> str | None:
    """The recompute policy the layers are differentiated under when it is not the strategy's
    own: ``ops-eager`` for ``rops`` run eagerly (``distribute(sac_eager=True)``: eager selective
    checkpointing caches every result it saves), else None."""
    return "ops-eager" if sac_eager and s.recompute == "ops" else None


def _pipelining_kept(s: Strategy, train: bool, mode: str) -> str:
    """What torch.distributed.pipelining's stages keep until the step's end (``distribute``):
    ``mode`` for a training pipeline, nothing elsewhere."""
    if mode not in PIPELINING_KEPT:
        raise StrategyError(f"pipelining_kept must be one of {PIPELINING_KEPT}, got {mode!r}")
    return mode if train and s.p > 1 else ""


def _check_deepspeed(s: Strategy, prec: Precision, deepspeed_pipe: bool, fp32_grad_accum: bool) -> None:
    """Refuse what DeepSpeed's pipeline engine and BF16_Optimizer do not run (``distribute``)."""
    if deepspeed_pipe and s.zero >= 2:
        raise StrategyError(
            f"{s}: DeepSpeed's pipeline engine runs ZeRO 0 or 1 only (ZeRO-{s.zero} given; "
            "deepspeed/runtime/pipe/engine.py asserts it)"
        )
    if deepspeed_pipe and s.p > 1 and (s.schedule != "1f1b" or s.v != 1):
        raise StrategyError(
            f"{s}: DeepSpeed's pipeline engine runs its own 1F1B (TrainSchedule, "
            "deepspeed/runtime/pipe/schedule.py): use the 1f1b schedule with one chunk per rank"
        )
    if fp32_grad_accum and not prec.mixed:
        raise StrategyError(f"{s}: fp32 gradient accumulation needs mixed precision (an fp32 master)")


def check_switches(
    s: Strategy, precision: Precision | str, train: bool, switches: Mapping[str, object]
) -> None:
    """Refuse the trainer switches (``distribute``'s keywords) ``s`` cannot run with, as
    ``distribute`` refuses them: DeepSpeed's pipeline engine beyond ZeRO-1 or 1F1B, fp32 sums
    without masters, gradient-accumulation fusion where gradients are reduced every backward."""
    prec = Precision.parse(precision)
    _check_deepspeed(s, prec, bool(switches.get("deepspeed_pipe")), bool(switches.get("fp32_grad_accum")))
    _remainders(s, prec, train, None, bool(switches.get("master_remainders")))
    _offload(s, prec, train, None, bool(switches.get("offload_optimizer")))
    _fusion(s, prec, bool(switches.get("grad_accum_fusion")) and train)


def _fusion(s: Strategy, prec: Precision, fusion: bool) -> bool:
    """``fusion`` (``grad_accum_fusion`` in a training program), refused where it does not run:
    it accumulates into fp32 sums of mixed precision, and into whole gradients (Megatron-LM's
    distributed optimizer is ZeRO-1: ZeRO-2/3 reduce every microbatch's gradient before
    accumulating its shard)."""
    if fusion and not prec.mixed:
        raise StrategyError(f"{s}: gradient-accumulation fusion needs mixed precision (an fp32 main_grad)")
    if fusion and s.d * s.c > 1 and reduce_scatter_every_backward(s):
        raise StrategyError(
            f"{s}: gradient-accumulation fusion accumulates whole gradients: ZeRO-{s.zero} reduces "
            "each microbatch's gradient before accumulating"
        )
    return fusion


def _fp8_cache(s: Strategy, prec: Precision, train: bool, asked: bool) -> bool:
    """``fp8_weight_cache`` where it applies: a training step under delayed float8 scaling
    (``fp8-delayed``; TE's cache), ZeRO 0-2. ZeRO-3 is refused: FSDP passes TE no
    ``is_first_microbatch``, and a weight gathered per use has no step-long copy to cache."""
    if asked and s.zero == 3:
        raise StrategyError(
            f"{s}: the FP8 weight cache is Megatron-Core's (is_first_microbatch, ZeRO 0-2); "
            "ZeRO-3 gathers each weight per use, and FSDP passes Transformer Engine no "
            "is_first_microbatch"
        )
    return asked and train and prec.float8 and prec.float8_scaling == CACHE_SCALING


def _remainders(s: Strategy, prec: Precision, train: bool, opt: Optimizer | None, asked: bool) -> bool:
    """``master_remainders`` where it applies: a training step in mixed precision with bf16
    compute copies and fp32 masters, ZeRO-1's sharded optimizer, fused Adam (Apex's
    DistributedFusedAdam); refused elsewhere (``opt`` None: not checked)."""
    if not asked:
        return False
    if not train:
        raise StrategyError(f"{s}: master remainders are optimizer state: a training step only")
    if not (prec.mixed and prec.master is DType.f32):
        raise PrecisionError(
            f"{s}: master remainders split an fp32 master into its bf16 parameter and 16 low bits: "
            f"precision {prec} has no fp32 master beside a bf16 copy"
        )
    if s.zero != 1:
        raise StrategyError(
            f"{s}: master remainders are Apex DistributedFusedAdam's, a ZeRO-1 sharded optimizer "
            f"(ZeRO-{s.zero} given)"
        )
    if opt is not None and (opt.kind != "adam" or opt.kernels != "fused"):
        raise StrategyError(
            f"{s}: master remainders are kept by a fused Adam (Apex's), not {opt.kind} ({opt.kernels})"
        )
    return True


def _no_master(s: Strategy, prec: Precision, compute: DType, train: bool, fp32_acc: bool) -> bool:
    """Whether a training step keeps no master weights: mixed precision whose master (and
    optimizer state) dtype is the compute dtype, as Apex's DistributedFusedAdam runs with
    ``dtype`` bf16 (``store_params=False``: NeMo's ``optim.dtype: bf16``) or torch's AdamW on bf16
    parameters. A master dtype other than fp32 and the compute dtype, and fp32 gradient
    accumulation into such an optimizer, are refused."""
    if not (prec.mixed and train) or prec.master is DType.f32:
        return False
    if prec.master is not compute:
        raise PrecisionError(
            f"{s}: the optimizer keeps fp32 masters or none: its dtype must be f32 or the compute "
            f"dtype {compute}, got {prec.master}"
        )
    if fp32_acc:
        raise PrecisionError(
            f"{s}: fp32 gradient accumulation feeds fp32 masters; the optimizer's dtype is {prec.master}"
        )
    return True


def _comm_meshes(s: Strategy, meshes: Sequence[Mesh]) -> dict[tuple[str, int], Mesh]:
    """Per stream and stage, the devices of each stage's communication stream: per direction a
    stream that sends and one that receives, so activations going forward never queue behind
    gradients, and a receive never behind a send (``distribute``)."""
    n = s.devices
    return {
        (stream, st): Mesh(m.axes, tuple(Device((k + 1) * n + d.id) for d in m.devices))
        for k, stream in enumerate(STREAMS)
        for st, m in enumerate(meshes)
    }


def _reduce_fp32(s: Strategy, prec: Precision, train: bool, asked: bool, no_master: bool) -> bool:
    """``reduce_fp32`` where it applies (mixed-precision training with d·c > 1); refused
    beside an optimizer that keeps no fp32 masters."""
    on = asked and prec.mixed and train and s.d * s.c > 1
    if on and no_master:
        raise PrecisionError(
            f"{s}: gradients reduced in fp32 feed fp32 masters; the optimizer's dtype is {prec.master}"
        )
    return on


def _offload(s: Strategy, prec: Precision, train: bool, opt: Optimizer | None, asked: bool) -> bool:
    """``offload_optimizer`` where it applies: a training step in mixed precision with fp32
    masters, ZeRO 1–3, Adam (DeepSpeed's ZeRO-Offload with its CPU Adam), on one (dp, tp) mesh
    per stage (not HSDP, not context parallelism); refused elsewhere (``opt`` None: not checked)."""
    if not asked:
        return False
    if not train:
        raise StrategyError(f"{s}: an offloaded optimizer is a training step's: not under inference")
    if not (prec.mixed and prec.master is DType.f32):
        raise PrecisionError(
            f"{s}: ZeRO-Offload keeps fp32 masters and Adam's state on the host beside the GPUs' "
            f"half-precision copies: precision {prec} has no fp32 master beside a compute copy"
        )
    if s.zero not in (1, 2, 3):
        raise StrategyError(
            f"{s}: ZeRO-Offload offloads a ZeRO optimizer's partition (ZeRO 1-3, not {s.zero})"
        )
    if s.c > 1 or s.shard_group is not None:
        raise StrategyError(
            f"{s}: an offloaded optimizer with {'context parallelism' if s.c > 1 else 'HSDP'} is not modelled"
        )
    if opt is not None and opt.kind != "adam":
        raise StrategyError(f"{s}: ZeRO-Offload's host step is DeepSpeed's CPU Adam, not {opt.kind}")
    return True


def _zero3_fetch(
    s: Strategy, train: bool, cfg: Zero3Fetch | None, fsdp: FsdpOptions, f8_cache: bool, pipe: bool
) -> Zero3Fetch | None:
    """``zero3_fetch`` where it applies: training under ZeRO-3 with d > 1 (elsewhere nothing is
    gathered per use: a no-op). Refused with a pipeline (DeepSpeed's pipeline engine asserts
    ZeRO 0/1), context parallelism and HSDP (DeepSpeed's ZeRO-3 shards over the whole
    data-parallel group), the zero-bubble schedule, and FSDP's options (another trainer's)."""
    if cfg is None or not (train and s.zero == 3 and s.d * s.c > 1):
        return None
    bad = [
        (s.p > 1 or pipe, "a pipeline (DeepSpeed's pipeline engine runs ZeRO 0/1 only)"),
        (s.c > 1, "context parallelism"),
        (s.shard_group is not None, "HSDP (DeepSpeed's ZeRO-3 shards over all data-parallel ranks)"),
        (s.schedule == "zb1", "the zero-bubble schedule"),
        (fsdp != FsdpOptions(one_dp_stream=fsdp.one_dp_stream), "FSDP's options"),
        (f8_cache, "the FP8 weight cache"),
    ]
    for refused, what in bad:
        if refused:
            raise StrategyError(f"{s}: DeepSpeed's ZeRO-3 fetch (zero3_fetch) does not run with {what}")
    return cfg


def _check_context(s: Strategy, train: bool) -> None:
    """Refuse what context parallelism inside ``distribute`` does not combine with yet."""
    missing = [
        (s.shares is not None, "uneven batch shares"),
        (not train, "an inference program"),
    ]
    for bad, what in missing:
        if bad:
            raise StrategyError(f"{s}: context parallelism (c={s.c}) does not combine with {what} yet")


def check_batch(batch: int, s: Strategy) -> None:
    """Raise StrategyError unless the global ``batch`` splits into ``s.k`` microbatches of whole
    samples for every data-parallel replica (in proportion to the batch shares, if any): no replica
    ever gets a fraction of a sample. The message says which k would divide."""
    parts = sum(s.shares) if s.shares is not None else s.d
    if batch % (s.k * parts) == 0:
        return
    who = f"in the batch shares {'-'.join(map(str, s.shares))}" if s.shares is not None else f"over d={s.d}"
    if batch % parts:
        raise StrategyError(f"{s}: the batch {batch} does not split {who} (needs a multiple of {parts})")
    per = batch // parts
    ks = [k for k in range(1, per + 1) if per % k == 0]
    shown = ", ".join(map(str, ks[:12])) + (", …" if len(ks) > 12 else "")
    raise StrategyError(
        f"{s}: the batch {batch} does not split into k={s.k} microbatches of whole samples {who} "
        f"({batch} / ({parts}·{s.k}) = {batch / (parts * s.k):g} samples); k must divide {per}: {shown}"
    )


def check_model_batch(model: Model, s: Strategy) -> None:
    """Raise StrategyError unless ``model``'s batch splits as ``s`` asks (``check_batch``) and,
    if its layers fix the batch (``Model.fixed_batch``), ``s`` does not split it into microbatches."""
    check_batch(model.batch, s)
    if model.fixed_batch is not None and s.k > 1:
        raise StrategyError(
            f"{s}: {model.name}'s layers fix the batch at {model.fixed_batch} ({model.fixed_by}), so it "
            f"runs without microbatches (k=1): {model.fixed_advice}"
        )


# the communication streams of each GPU (``distribute``): program devices (k+1)·N .. (k+2)·N−1
# run on stream k of the N compute devices' GPUs; the last two run the data-parallel collectives
# (gradient buckets; ZeRO-3's prefetched parameter gathers)
STREAMS = ("fwd_send", "bwd_send", "fwd_recv", "bwd_recv", "dp_reduce", "dp_gather")


def device_map(strategy: Strategy, comm_streams: bool = False, host: bool = False) -> DeviceMap:
    """Where the program devices of ``distribute(model, strategy, comm_streams=…)`` run: d<i> on
    GPU ``placement[i]`` (GPU i by default) and, with communication streams, d<(k+1)·N+i> on that
    GPU's stream ``STREAMS[k]``; with ``host`` (an offloaded optimizer), d<(len(STREAMS)+1)·N+i>
    on that GPU's host (``HOST_STREAM``)."""
    n = strategy.devices
    order = strategy.gpus
    mapping = {Device(i): Slot(order[i]) for i in range(n)}
    if comm_streams:
        for k, stream in enumerate(STREAMS):
            mapping.update({Device((k + 1) * n + i): Slot(order[i], stream) for i in range(n)})
    if host:
        at = (len(STREAMS) + 1) * n
        mapping.update({Device(at + i): Slot(order[i], HOST_STREAM) for i in range(n)})
    return DeviceMap(mapping)


def _bwd_params(
    fb: FunctionBuilder, ws: Sequence[Value], layers: Sequence[ShardedLayer]
) -> tuple[dict[Value, Value], dict[Value, Value], list[list[Value]]]:
    """A chunk backward's leading parameters, declared in order: its weights ``ws``, its layers'
    extras, and per layer its saved residuals (the layer input first where its backward reads it)."""
    wp = {w: fb.param(w.name) for w in ws}
    ep = {e: fb.param(e.name) for L in layers for e in L.extras}
    res: list[list[Value]] = []
    for L in layers:
        assert L.vjp is not None
        n = (1 if 0 in L.vjp.bwd_params else 0) + L.vjp.n_residuals
        res.append([fb.param(f"r{L.index}_{j}") for j in range(n)])
    return wp, ep, res


class _Params(NamedTuple):
    """The entry's weight-side parameters (``_Builder._declare``)."""

    wparam: dict[Value, Value]  # each weight's (master) parameter
    wchunk: dict[Value, int]  # the chunk of each weight's first use
    home: dict[tuple[Value, int], Value]  # the value chunk c uses for weight w (``_tied_copies``)
    partner: dict[Value, Value]  # a tied weight and its copy, both ways
    groups: dict[Value, tuple[Value, ...]]  # a weight on more than two stages: each member -> all
    used: list[Value]  # the model's weights in order of use, then the tied copies
    state: dict[Value, list[Value]]  # optimizer state per weight
    step_of: dict[int, Value]  # Adam's step per stage
    half: dict[Value, Value]  # mixed precision: the persistent compute copies
    wuse: dict[Value, Value]  # what the chunks read for each weight
    sent: frozenset[Value]  # tied copies of transmitted weights: received from their owner


class _StepGrad(NamedTuple):
    """A weight's reduced gradient (``_Builder._step_grads``): on the mesh of ``stage``;
    ``counted`` in the gradient norm (a tied copy's, equal to its weight's, is not)."""

    w: Value
    g: Value
    stage: int
    counted: bool


def _check_chunk_times(
    s: Strategy, n_chunks: int, chunk_times: tuple[Sequence[float], Sequence[float]] | None, train: bool
) -> None:
    """The forward and backward times the schedule orders chunks by: one per chunk, each positive
    and finite (a zero-length action would end before it starts in the event order of ``build``)."""
    if chunk_times is None:
        return
    if any(len(x) != n_chunks for x in chunk_times):
        raise StrategyError(
            f"{s}: chunk_times give {[len(x) for x in chunk_times]} forward and backward times for "
            f"{n_chunks} chunks"
        )
    for xs in chunk_times[: 2 if train else 1]:
        for c, x in enumerate(xs):
            if not (isinstance(x, int | float) and 0 < x < math.inf):
                raise StrategyError(f"{s}: chunk_times must be positive and finite, got {x!r} for chunk {c}")


class _Builder:
    # TE's float8 weights cast once per step (``distribute``, ``distir.parallel.fp8_cache``): on,
    # and the weights cached (``_layers``)
    f8_cache: bool = False
    cached: frozenset[Value] = frozenset()
    # FSDP's float8 all-gather (``distribute(float8_gather=True)``): on, and the weights gathered
    # in float8 (``_layers``)
    float8_gather: bool = False
    f8_gathered: frozenset[Value] = frozenset()
    # DeepSpeed ZeRO-3's module-by-module fetch (``distribute(zero3_fetch=...)``): its knobs, or
    # None (whole layers, FSDP's)
    ds_fetch: Zero3Fetch | None = None
    # Apex's store_param_remainders (``distribute(master_remainders=True)``): the masters kept as
    # int16 remainders beside the bf16 copies; each weight's new bf16 shard from the update
    remainders: bool = False
    new_high: dict[Value, Value]
    # ZeRO-Offload (``distribute(offload_optimizer=True)``): the masters, their state and the step
    # on each stage's host mesh (``host_meshes``), where the optimizer runs
    offload: bool = False
    _wstage: dict[Value, int]  # each kept weight's stage (``_declare``)
    host_meshes: tuple[Mesh, ...] = ()  # each stage's devices' hosts, with ``offload``

    def __init__(
        self,
        model: Model,
        s: Strategy,
        opt: Optimizer,
        train: bool,
        comm_streams: bool,
        precision: Precision | str = "pure",
        chunk_times: tuple[Sequence[float], Sequence[float]] | None = None,
        bucket_mb: float = DDP_BUCKET_MB,
        overlap_param_gather: bool = False,
        deepspeed_pipe: bool = False,
        fp32_grad_accum: bool = False,
        cp_ring: bool = True,
        reduce_fp32: bool = False,
        sac_eager: bool = False,
        fsdp: FsdpOptions | None = None,
        megatron_ddp: bool = False,
        grad_accum_fusion: bool = False,
        pipelining_kept: str = "",
    ) -> None:
        self.prec = Precision.parse(precision)
        _check_deepspeed(s, self.prec, deepspeed_pipe, fp32_grad_accum)
        self.gaf = _fusion(s, self.prec, grad_accum_fusion and train)  # (``distribute``)
        # data parallel: gradients reduced in buckets inside the backward (``_Buckets``); DeepSpeed's
        # pipeline engine reduces them after the stage's last backward instead (``distribute``)
        self.bucketed = train and s.d * s.c > 1 and not deepspeed_pipe  # cp acts like dp for the weights
        self.fp32_acc = train and (fp32_grad_accum or grad_accum_fusion)
        self.compute = self.prec.compute_dtype(model)
        # an optimizer in the compute dtype (``Precision.master`` equal to it): no master copy,
        # the step updates the compute weights themselves; gradients reduced in the masters'
        # dtype (``distribute``)
        self.no_master = _no_master(s, self.prec, self.compute, train, self.fp32_acc)
        asked = reduce_fp32 and not self.fp32_acc
        self.reduce_fp32 = _reduce_fp32(s, self.prec, train, asked, self.no_master)
        # Megatron-LM's DDP reducing in the last backward (``distribute``)
        self.megatron = megatron_ddp and self.bucketed and not reduce_scatter_every_backward(s)
        self.bucket_bytes = self._bucket_bytes(s, bucket_mb)
        if s.c > 1:  # global positions as an input (``distir.parallel.context_model``)
            _check_context(s, train)
            model = context_model(model, s.c, cp_ring)
        model = self.prec.prepare(model)  # mixed: the loss layer in fp32
        self.model, self.s, self.opt, self.train = model, s, opt, train
        self.comm_streams, self.pipelining_kept = comm_streams, _pipelining_kept(s, train, pipelining_kept)
        # DeepSpeed's pipeline engine: transfers block the compute streams (``distribute``)
        self.p2p_streams = comm_streams and not deepspeed_pipe
        self.deepspeed_pipe = deepspeed_pipe
        # the compute copies gathered in the next step's first forward (``distribute``)
        self.gather_early = (
            overlap_param_gather and train and self.prec.mixed and s.zero in (1, 2) and s.d * s.c > 1
        )
        check_model_batch(model, s)
        self.mb = model.batch // s.k
        # program devices are numbered stage by stage; the placement maps them onto GPUs; uneven
        # batch shares are the dp axis' (``distir.ir.dtensor.AxisSize``): each replica's piece of
        # every microbatch in proportion
        dp = axis_size(s.d, s.shares)
        # context parallelism: a cp axis between dp and tp (``with_cp``)
        axes = (("dp", dp), ("cp", s.c), ("tp", s.t)) if s.c > 1 else (("dp", dp), ("tp", s.t))
        per = s.d * s.c * s.t
        self.meshes = [Mesh(axes, tuple(Device(st * per + j) for j in range(per))) for st in range(s.p)]
        # HSDP (``Strategy.shard_group``): each stage's devices seen as (dpr, dp, tp), ZeRO-3's
        # shards over the h replicas of a group (dp), replicated across the d/h groups (dpr);
        # weights, their state and sharded gradients live there, ``MeshView`` crosses over
        self.hsdp = train and s.zero == 3 and s.shard_group is not None
        h, groups = s.zero_degree, s.d * s.c // s.zero_degree  # with cp: n replicas' n·c ranks a group
        # context parallelism: weights, their state and reduced gradients live on each stage's
        # devices seen as (dp = d·c, tp) — cp merged into dp, as data parallelism over d·c ranks
        # (ZeRO shards over them: ``Strategy.zero_degree``) — and ``MeshView`` crosses over to
        # the (dp, cp, tp) mesh the layers run on (weights R, R; gradients pending P, P)
        self.cp_view = train and s.c > 1
        self.viewed = self.hsdp or self.cp_view  # weights on ``meshes3``, a view of ``meshes``
        self._fsdp_options(fsdp or FsdpOptions())
        if self.hsdp:
            self.meshes3 = [Mesh((("dpr", groups), ("dp", h), ("tp", s.t)), m.devices) for m in self.meshes]
        elif self.cp_view:
            self.meshes3 = [Mesh((("dp", s.d * s.c), ("tp", s.t)), m.devices) for m in self.meshes]
        else:
            self.meshes3 = []
        self.comm_meshes, self.comm_meshes3 = _comm_meshes(s, self.meshes), _comm_meshes(s, self.meshes3)
        self.layer_calls = model.layers  # a property that collects them anew at each access
        calls = self.layer_calls if train else self.layer_calls[:-1]
        self.chunks = partition(model, s, len(calls))
        _check_chunk_times(s, len(self.chunks), chunk_times, train)
        self.chunk_times = chunk_times
        self.n_in = len(model.inputs)
        self.weight_params = set(model.forward.params[self.n_in :])
        self.functions: dict[str, Function] = {}
        self.sharder = LayerSharder(model, s, train, self.mb, self.functions, _layer_policy(s, sac_eager))
        self._param_types: dict[tuple[object, ...], DTensorType] = {}  # ``_on_stage``
        self._made_attrs: dict[tuple[str, str], Attrs] = {}  # ``_attrs``
        self._mesh_text: dict[int, str] = {}  # ``format_mesh_attr`` of each mesh, by id (in ``meshes``)

    def with_fp8_cache(self, asked: bool) -> _Builder:
        """This builder with ``fp8_weight_cache`` where it applies (``_fp8_cache``)."""
        self.f8_cache = _fp8_cache(self.s, self.prec, self.train, asked)
        return self

    def with_p2p_blocking(self, asked: bool) -> _Builder:
        """This builder with ``p2p_blocking``: the pipeline's transfers between the stages'
        compute streams (``send``), as Megatron-LM's schedules wait on each send and receive."""
        if asked and self.s.p > 1:
            self.p2p_streams = False
        return self

    def with_remainders(self, asked: bool) -> _Builder:
        """This builder with ``master_remainders`` where it applies (``_remainders``)."""
        self.remainders = _remainders(self.s, self.prec, self.train, self.opt, asked)
        if self.remainders and self.no_master:
            raise PrecisionError(f"{self.s}: master remainders need fp32 masters, not {self.prec.master}")
        if self.remainders and self.compute is not DType.bf16:
            raise PrecisionError(
                f"{self.s}: master remainders need bf16 compute copies (the fp32 master's high half), "
                f"not {self.compute}"
            )
        self.new_high = {}
        return self

    def with_offload(self, asked: bool) -> _Builder:
        """This builder with ``offload_optimizer`` where it applies (``_offload``)."""
        self.offload = _offload(self.s, self.prec, self.train, self.opt, asked)
        self._wstage = {}
        if self.offload:  # program devices past the streams', on the GPUs' hosts (``device_map``)
            at = (len(STREAMS) + 1) * self.s.devices
            self.host_meshes = tuple(
                Mesh(m.axes, tuple(Device(at + d.id) for d in m.devices)) for m in self.meshes
            )
        if self.offload and (self.remainders or self.gather_cast):
            what = "master remainders" if self.remainders else "gather_cast (FSDP's cast at each gather)"
            raise StrategyError(f"{self.s}: an offloaded optimizer with {what} is not modelled")
        return self

    def copied_in_backward(self, w: Value) -> bool:
        """ZeRO-Offload under DeepSpeed's ZeRO-3 (``zero3_fetch``, communication streams):
        ``w``'s reduced gradient partition is copied to the host as its bucket is reduced, in the
        last backward (DeepSpeed 0.6.2's ``__partition_grads``, run by the gradient hook that
        closes the bucket: a blocking ``copy_`` into the host's fp32 gradient, so the host waits
        for the bucket's reduce-scatter on its stream before it issues more of the backward), with
        one microbatch (DeepSpeed copies at the accumulation boundary only; distir's fetch
        accumulates the microbatches' partitions in the step, so with k > 1 they are copied there,
        as is a sharded gradient summed over tp after)."""
        return (
            self.offload
            and self.s.k == 1
            and self.ds_fetch is not None
            and self.comm_streams
            and self._zdim(w) is not None
            and w not in self.tp_pending
        )

    def _state_mesh(self, stage: int) -> Mesh:
        """The mesh of ``stage`` that holds the masters, their optimizer state and the step: its
        host mesh when the optimizer is offloaded, else ``_mesh_for``'s."""
        return self.host_meshes[stage] if self.offload else self._mesh_for(stage)

    def _to_host(self, fb: FunctionBuilder, w: Value, g: Value, stage: int) -> Value:
        """ZeRO-Offload: ``w``'s reduced gradient partition copied to its host (device to host,
        in the dtype it was reduced in: DeepSpeed's ``__partition_grads`` copies the fp16
        partition into the host's fp32 gradient, converting there)."""
        return self._mesh_send(fb, g, self.host_meshes[stage], f"g_{w.name}_host")

    def with_zero3_fetch(self, cfg: Zero3Fetch | None, fsdp: FsdpOptions) -> _Builder:
        """This builder with DeepSpeed's ZeRO-3 fetch where it applies (``_zero3_fetch``); its
        gradient buckets then hold ``reduce_bucket`` elements (DeepSpeed's ``reduce_bucket_size``)."""
        self.ds_fetch = _zero3_fetch(self.s, self.train, cfg, fsdp, self.f8_cache, self.deepspeed_pipe)
        if self.ds_fetch is not None:
            size = (self.prec.master if self.fp32_acc else self.compute).itemsize
            self.bucket_bytes = float(self.ds_fetch.reduce_bucket * size)
        return self

    def _bucket_bytes(self, s: Strategy, bucket_mb: float) -> float:
        """A gradient bucket's size in the bytes ``_grad_bytes`` counts a gradient in:
        ``bucket_mb`` MiB, or with ``megatron_ddp`` Megatron-LM's max(40M, 1M·dp) parameters."""
        if not (isinstance(bucket_mb, int | float) and 0 < bucket_mb < math.inf):
            raise StrategyError(
                f"{s}: the gradient bucket size must be positive and finite, got {bucket_mb!r} MiB"
            )
        if not self.megatron:
            return float(bucket_mb * (1 << 20))
        size = (self.prec.master if self.fp32_acc else self.compute).itemsize
        return float(max(MEGATRON_BUCKET, MEGATRON_BUCKET_PER_RANK * s.d) * size)

    def _fsdp_options(self, f: FsdpOptions) -> None:
        """The options that make ZeRO-3 run as PyTorch's FSDP does (``distribute``), each on where
        it applies."""
        s, train = self.s, self.train
        z3 = train and s.zero == 3 and s.d * s.c > 1
        self.gather_copy_out = f.gather_copy_out  # FSDP2's copy-out of each gather
        self.fsdp2_root = f.fsdp2_root and z3 and s.p == 1  # the root (and last block) kept gathered
        self.fsdp1_root = f.fsdp1_root and z3 and s.p == 1  # the root kept gathered
        # ZeRO-3's gathers and gradient reductions on one stream, in issue order
        self.one_dp_stream = f.one_dp_stream and self.comm_streams and z3 and not self.hsdp
        if f.grad_copy_in not in GRAD_COPY_IN:
            raise StrategyError(f"{s}: grad_copy_in must be one of {GRAD_COPY_IN}, got {f.grad_copy_in!r}")
        self.grad_copy_in = f.grad_copy_in  # the gradients' copy into the reduction buffer
        # ZeRO-3's compute copies cast from the masters' shards at each gather
        self.gather_cast = f.gather_cast and self.prec.mixed and z3 and not self.no_master
        self.float8_gather = self._float8_gather(f.float8_gather)
        # fp32 accumulation as each layer's gradients complete (FSDP2's post-backward hook)
        if f.fsdp2_grad_accum and self.train and not self.fp32_acc:
            raise StrategyError(f"{s}: fsdp2_grad_accum adds into fp32 sums: it needs fp32_grad_accum")
        self.fsdp2_grad_accum = f.fsdp2_grad_accum and self.fp32_acc

    def _float8_gather(self, asked: bool) -> bool:
        """``float8_gather``: FSDP's gathers (``gather_cast``) of torchao's float8 weights in a
        training step, with fp32 masters, sharded over data-parallel ranks (torchtitan passes the
        option on only with ``dp_shard_enabled``, a shard degree over 1); refused elsewhere, the
        first missing condition named."""
        if not asked:
            return False
        s, prec = self.s, self.prec
        missing = [
            (
                prec.float8 and prec.float8_scaling == DYNAMIC_SCALING,
                f"precision fp8 (torchao's), not {prec}",
            ),
            (self.train, "a training step"),
            (s.zero == 3, f"ZeRO-3, not ZeRO-{s.zero}"),
            (not self.no_master, f"fp32 masters, not {prec.master}"),
            (
                (s.shard_group or s.d) > 1,
                "FSDP's sharding over d > 1 data-parallel ranks (torchtitan's dp_shard)",
            ),
            (self.gather_cast, "gather_cast (FSDP's cast of each shard as it is gathered)"),
        ]
        for ok, what in missing:
            if not ok:
                raise StrategyError(
                    f"{s}: float8_gather is torchao's float8 all-gather under FSDP: it needs {what}"
                )
        return True

    def _attrs(self, name: str, value: str) -> Attrs:
        """The attributes ``{name: value}`` of an op the entry emits again and again (a
        ``Redistribute`` per weight, a ``MeshSend`` per transfer), made once."""
        a = self._made_attrs.get((name, value))
        if a is None:
            a = self._made_attrs[(name, value)] = Attrs({name: value})
        return a

    def _mesh_attr(self, mesh: Mesh) -> str:
        """``format_mesh_attr(mesh)``, made once per mesh."""
        text = self._mesh_text.get(id(mesh))
        if text is None:
            text = self._mesh_text[id(mesh)] = format_mesh_attr(mesh)
        return text

    def _redistribute(
        self, fb: FunctionBuilder, v: Value, name: str, to: str, coalesced: bool = False
    ) -> Value:
        """``Redistribute(v, to=to)``, its result named ``name``; ``coalesced``: a later part of
        one collective call over a flat buffer (``distir.ops.dist``: no latency of its own)."""
        attrs = self._attrs("to", to)
        if coalesced:
            got = self._made_attrs.get(("to+coalesced", to))
            if got is None:
                got = self._made_attrs[("to+coalesced", to)] = Attrs({"to": to, "coalesced": True})
            attrs = got
        return fb.emit("Redistribute", (v,), attrs, (name,))[0]

    def _on_stage(
        self,
        dtype: DType,
        shape: tuple[int, ...],
        stage: int,
        zero_dim: int | None,
        tp: Placement,
        host: bool = False,
    ) -> DTensorType:
        """The entry parameter type of a weight or optimizer state on ``stage``'s mesh, sharded
        along ``zero_dim`` over ``dp`` (None: replicated) and placed ``tp`` over ``tp``; one
        object per distinct type: the simulator's memos find a type they met by identity before
        comparing it (comparing two DTensor types compares their meshes device by device)."""
        key = (dtype, shape, stage, zero_dim, tp, host)
        t = self._param_types.get(key)
        if t is None:
            if host:  # an offloaded master or state: on the stage's host mesh (``_state_mesh``)
                place: Placement = Shard(zero_dim) if zero_dim is not None else Replicate()
                t = self._param_types[key] = DTensorType(dtype, shape, self.host_meshes[stage], (place, tp))
                return t
            if self.hsdp:  # sharded within a group (if at all), replicated across groups
                inner: Placement = Shard(zero_dim) if zero_dim is not None else Replicate()
                t = DTensorType(dtype, shape, self.meshes3[stage], (Replicate(), inner, tp))
                self._param_types[key] = t
                return t
            dp: Placement = Shard(zero_dim) if zero_dim is not None else Replicate()
            t = self._param_types[key] = DTensorType(dtype, shape, self._mesh_for(stage), (dp, tp))
        return t

    # -- layers ----------------------------------------------------------------------------------
    def _wp(self, w: Value) -> str:
        """A whole weight's placement on the mesh that holds the weights (``_mesh_for``)."""
        return placement_text(Replicate(), self.model.weight(w.name).tp)

    def _layers(self) -> list[ShardedLayer]:
        """The layers, sharded; notes the weights whose gradients every layer using them leaves
        pending over tp (``tp_pending``, ``_tp_sum``)."""
        layers = self.sharder.layers(self.chunks[-1][-1] + 1)
        if self.f8_cache:
            layers, self.cached = cached_layers(layers, self.layer_calls, self.functions)
        if self.float8_gather:
            try:
                layers, self.f8_gathered = gathered_layers(
                    layers, self.layer_calls, self.functions, lambda w: self._zdim(w) is not None
                )
            except SavedGatheredWeight as e:
                raise StrategyError(
                    f"{self.s}: distir models the float8 all-gather with the weights' casts recomputed "
                    f"in the backward (rops, rfull), not saved by the forward: {e}"
                ) from None
        self._tp_summed: set[int] = set()  # stages whose tp sum has its first part (``_tp_sum``)
        uses = [
            (w, p)
            for L in layers
            for w, p in zip(L.weights, L.tp_pending or [False] * len(L.weights), strict=True)
        ]
        self.tp_pending: frozenset[Value] = frozenset(w for w, p in uses if p) - {w for w, p in uses if not p}
        return layers

    def _tp_sum(self, fb: FunctionBuilder, w: Value, g: Value, stage: int) -> Value:
        """``w``'s gradient, reduced over dp and still pending over tp (``tp_pending``), summed
        over tp: one call per stage for all of them, as Megatron-LM's ``finalize_model_grads``
        all-reduces the sequence-parallel parameters' gradients over the tensor-parallel group
        after the data-parallel reduction (``_allreduce_layernorm_grads``: flattened into one
        buffer, one all-reduce, on the compute stream)."""
        z = self._zdim(w)
        dp: list[Placement] = [Replicate()] if self.hsdp else []
        dp.append(Shard(z) if z is not None and self.s.zero >= 1 else Replicate())
        later = stage in self._tp_summed
        self._tp_summed.add(stage)
        to = placement_text(*dp, self.model.weight(w.name).tp)
        return self._redistribute(fb, g, f"g_{w.name}", to, later)

    # -- chunks ----------------------------------------------------------------------------------
    def _zero3_gather(
        self, fb: FunctionBuilder, w: Value, p: Value, mesh: Mesh, coalesced: bool = False
    ) -> Value:
        """ZeRO-3: the whole weight ``w`` from its shard ``p`` (an all-gather over dp; HSDP: over
        its group, then seen on ``mesh``, the (dp, tp) mesh of the same devices); ``coalesced``:
        a later part of its layer's one gather call (``_Gathers._issue``)."""
        if self.viewed:  # every weight lives on the (dpr, dp, tp) or (dp·cp, tp) view
            if self._zdim(w) is not None and (self.s.zero == 3 or self.gather_early):
                to = ("R, " if self.hsdp else "") + self._wp(w)
                p = self._redistribute(fb, p, w.name, to, coalesced)
            return fb.emit("MeshView", (p,), self._attrs("mesh", self._mesh_attr(mesh)), (w.name,))[0]
        if (self.s.zero == 3 or self.gather_early) and self._zdim(w) is not None:
            return self._redistribute(fb, p, w.name, self._wp(w), coalesced)
        return p

    def _layer_view(self, fb: FunctionBuilder, v: Value, stage: int) -> Value:
        """A whole weight ``v`` as the chunks take it: under context parallelism seen on the
        (dp, cp, tp) mesh (``MeshView``, once per step; ZeRO-3's and early-gathered shards are
        gathered and seen there inside the chunks); else ``v`` itself."""
        if not self.cp_view or self.s.zero == 3 or self.gather_early:
            return v
        return fb.emit("MeshView", (v,), self._attrs("mesh", self._mesh_attr(self.meshes[stage])), (v.name,))[
            0
        ]

    def _mesh_send(self, fb: FunctionBuilder, v: Value, mesh: Mesh, name: str) -> Value:
        """``v`` sent to ``mesh`` (a ``MeshSend``)."""
        text = self._mesh_text.get(id(mesh))
        if text is None:
            text = self._mesh_text[id(mesh)] = format_mesh_attr(mesh)
        return fb.emit("MeshSend", (v,), self._attrs("mesh", text), (name,))[0]

    def _mesh_for(self, stage: int, stream: str | None = None) -> Mesh:
        """The mesh (of ``stage``, or of its ``stream``) that holds the weights, their state and
        reduced gradients: HSDP's (dpr, dp, tp) view of it, else the (dp, tp) mesh itself."""
        if stream is None:
            return self.meshes3[stage] if self.viewed else self.meshes[stage]
        return self.comm_meshes3[(stream, stage)] if self.viewed else self.comm_meshes[(stream, stage)]

    def _compute_copy(self, fb: FunctionBuilder, w: Value, master: Value, high: Value | None = None) -> Value:
        """Mixed precision: the weight in the compute dtype, once per step; with ZeRO-1/2 the
        master is a shard, so the low-precision copy is all-gathered (ZeRO-3 gathers per use).
        ``high``: the copy's new shard as the update wrote it (``master_remainders``), not cast.
        Offloaded: the fp32 master's partition copied host to device first, then cast on the GPU
        (DeepSpeed 0.6.2's ``_reassign_or_swap_out_partitioned_parameters``: the fp16 partition's
        ``copy_`` of the fp32 one, which moves the fp32 bytes and converts on the device)."""
        if self.offload:
            master = self._mesh_send(fb, master, self._mesh_for(self._wstage[w]), f"{w.name}_dev")
        v = cast(fb, master, self.compute, f"{w.name}_{self.compute}") if high is None else high
        if self.s.zero in (1, 2) and self._zdim(w) is not None and not self.gather_early:
            v = self._redistribute(fb, v, f"{w.name}_{self.compute}", self._wp(w))
        return v

    def _to_master(self, fb: FunctionBuilder, w: Value, g: Value) -> Value:
        """Mixed precision: the reduced gradient cast to the masters' dtype for the optimizer
        (already in it when accumulated in fp32: ``fp32_grad_accum``, or reduced in it:
        ``reduce_fp32``)."""
        if not self.prec.mixed:
            return g
        held = DType.f32 if self.fp32_acc or self.reduce_fp32 else self.compute
        if held is self.prec.master:
            return g
        return cast(fb, g, self.prec.master, f"g_{w.name}_{self.prec.master}")

    def f8_copy(
        self, fb: FunctionBuilder, w: Value, v: Value, memo: dict[Value, Value] | None = None
    ) -> Value:
        """The float8 copy of weight ``w`` (whole, as the chunks read it: ``v``) that TE's cache
        holds for the step (``fp8_weight_cache``): one delayed-scaling E4M3 cast of ``v``, once
        per value (``memo``)."""
        got = memo.get(v) if memo is not None else None
        if got is None:
            got = fb.emit("Float8Cast", (v,), cast_attrs(), (f"{w.name}_f8",))[0]
            if memo is not None:
                memo[v] = got
        return got

    def _zdim(self, w: Value) -> int | None:
        spec = self.model.weight(w.name)
        return _zero_dim(spec.type, spec.tp, self.s.zero_degree) if self.s.zero else None

    def _chunk_fwd(self, c: int, layers: list[ShardedLayer], gather_once: bool = False) -> Function:
        """A chunk's forward; ``gather_once``: its weights arrive as shards, are gathered as the
        layers reach them and returned whole after the other results (``overlap_param_gather``)."""
        if self.ds_fetch is not None:
            return self._ds_chunk_fwd(c, layers)
        fb = FunctionBuilder(f"c{c}_fwd" + ("_gather" if gather_once else ""), REGISTRY.out_arity)
        x = fb.param("x")
        wp = {w: fb.param(w.name) for w in chunk_weights(layers)}
        ep = {e: fb.param(e.name) for L in layers for e in L.extras}
        res: list[Value] = []
        reads = [list(self.layer_calls[L.index].inputs) for L in layers]
        gather = _Gathers(self, fb, c, wp, reads, keep=gather_once)
        logits: list[Value] = []  # the loss layer's input, kept by the stage (``keeps_logits``)
        for i, L in enumerate(layers):
            call = self.layer_calls[L.index]
            args = []
            gather.before(i)
            for j, v in enumerate(call.inputs):
                args.append(x if j == 0 else gather.take(v) if v in wp else ep[v])
            if self.keeps_logits(c) and i == len(layers) - 1:
                logits.append(args[0])
            if L.vjp is None:
                (x,) = fb.call(L.fwd, *args, n_out=1)
                continue
            outs = fb.call(L.fwd, *args, n_out=len(L.fwd.outputs))
            if 0 in L.vjp.bwd_params:
                res.append(args[0])
            res.extend(outs[L.vjp.n_outputs :])
            x = outs[0]
        if gather_once:
            return fb.ret(x, *res, *(gather.take(w) for w in wp), *logits)
        return fb.ret(x, *res, *(gather.last_taken[w] for w in self._kept_gathered(layers)), *logits)

    def _ds_chunk_fwd(self, c: int, layers: list[ShardedLayer]) -> Function:
        """``_chunk_fwd`` under DeepSpeed's ZeRO-3 fetch (``zero3_fetch``): the layers' forward
        bodies written inline, each module's weights gathered where the coordinator's plan puts
        them (``_ModuleGathers``)."""
        fb = FunctionBuilder(f"c{c}_fwd", REGISTRY.out_arity)
        x = fb.param("x")
        wp = {w: fb.param(w.name) for w in chunk_weights(layers)}
        ep = {e: fb.param(e.name) for L in layers for e in L.extras}
        bodies: list[tuple[Function, list[Value]]] = []
        for L in layers:
            call = self.layer_calls[L.index]
            bodies.append((L.fwd, [v if j and v in wp else x for j, v in enumerate(call.inputs)]))
        gather = _ModuleGathers(self, fb, c, wp, bodies)
        res: list[Value] = []
        for i, L in enumerate(layers):
            call = self.layer_calls[L.index]
            args = [x if j == 0 else v if v in wp else ep[v] for j, v in enumerate(call.inputs)]
            if not any(v in wp for v in call.inputs[1:]):  # no weights (the loss): called
                outs = list(fb.call(L.fwd, *args, n_out=len(L.fwd.outputs)))
            else:
                outs = gather.run(i, args)
            if L.vjp is None:
                (x,) = outs
                continue
            if 0 in L.vjp.bwd_params:
                res.append(args[0])
            res.extend(outs[L.vjp.n_outputs :])
            x = outs[0]
        gather.finish()
        return fb.ret(x, *res)

    def _ds_chunk_bwd(
        self, c: int, layers: list[ShardedLayer], acc: bool, reduce: bool, final: bool
    ) -> Function:
        """``_chunk_bwd`` (a full backward) under DeepSpeed's ZeRO-3 fetch: the layers' backward
        bodies inline, gathered module by module (``_ModuleGathers``), each weight gradient handed
        to the reduce bucket as soon as the op making it is written, as DeepSpeed's gradient hook
        adds it (``reduce_ready_partitions_and_remove_grads``)."""
        fb = FunctionBuilder(self._chunk_bwd_name(c, acc, "", reduce, final), REGISTRY.out_arity)
        ws = chunk_weights(layers)
        buckets = _Buckets(self, fb, c, ws, acc, final, self.one_dp_stream) if reduce else None
        sink = _GradSink(self, fb, ws, layers, acc, buckets)
        wp, ep, res = _bwd_params(fb, ws, layers)
        dy = fb.param("dy")
        arglists: list[list[Value]] = []
        bodies: list[tuple[Function, Sequence[Value]]] = []
        for L, rs in zip(reversed(layers), reversed(res), strict=True):
            assert L.vjp is not None and L.bwd is not None
            call, it = self.layer_calls[L.index], iter(rs)
            args = [
                next(it) if j == 0 else u if u in wp else ep[u]
                for j in L.vjp.bwd_params
                for u in [call.inputs[j]]
            ]
            arglists.append([*args, *it, dy])  # ``dy``: a stand-in, passed anew per layer below
            bodies.append((L.bwd, arglists[-1]))
        gather = _ModuleGathers(self, fb, c, wp, bodies, sink.release)
        for i, L in enumerate(reversed(layers)):
            v = L.vjp
            assert v is not None and L.bwd is not None
            n_dx = 1 if 0 in v.wrt else 0
            args = [*arglists[i][:-1], dy]

            def grad(k: int, g: Value, L: ShardedLayer = L, n_dx: int = n_dx) -> None:
                if k >= n_dx:
                    sink.done_some(L, [(k - n_dx, g)])

            if L.weights:
                outs = gather.run(i, args, grad)
            else:  # no weights (the loss): called
                outs = list(fb.call(L.bwd, *args, n_out=len(L.bwd.outputs)))
            if n_dx:
                dy = outs[0]
        gather.finish()
        first = layers[0].vjp
        head = [dy] if first is not None and 0 in first.wrt else []
        return fb.ret(*head, *sink.results())

    def keeps_logits(self, c: int) -> bool:
        """Whether chunk ``c``'s forward also returns, last, its loss layer's input (the logits):
        the last chunk's under ``pipelining_kept``, whose stage keeps its output until the step's
        end (``distir.parallel.pipeline.stage_state``)."""
        return bool(self.pipelining_kept) and c == len(self.chunks) - 1

    def _kept_gathered(self, layers: list[ShardedLayer]) -> list[Value]:
        """``fsdp2_root`` / ``fsdp1_root``: the weights of ``layers`` (a chunk) whose gathered
        copies the forward keeps for the backward — the root's (the weights of layers other than
        the blocks, the calls of the most repeated layer function) and, with ``fsdp2_root``, the
        last block's — in a fixed order; else none."""
        if not (self.fsdp2_root or self.fsdp1_root):
            return []
        calls = self.layer_calls
        block = Counter(c.callee for c in calls).most_common(1)[0][0]
        last = max(i for i, c in enumerate(calls) if c.callee == block) if self.fsdp2_root else -1
        out = [w for L in layers if calls[L.index].callee != block or L.index == last for w in L.weights]
        return [w for w in dict.fromkeys(out) if self._zdim(w) is not None]

    def _root_weights(self, layers: list[ShardedLayer]) -> frozenset[Value]:
        """``fsdp1_root`` / ``fsdp2_root``: the root unit's weights among those of ``layers`` (a
        chunk): the weights of its layers other than the blocks (``_kept_gathered``), whose
        gradients FSDP reduces together in the root's post-backward hook, once the last of them
        (the embedding's, at the backward's end) is complete; else none."""
        if not (self.fsdp2_root or self.fsdp1_root):
            return frozenset()
        calls = self.layer_calls
        block = Counter(c.callee for c in calls).most_common(1)[0][0]
        return frozenset(w for L in layers if calls[L.index].callee != block for w in L.weights)

    @property
    def late_post_backward(self) -> bool:
        """Whether the last backward reduces its gradients after its computation, group by group,
        as ``torch.distributed.pipelining`` runs FSDP2 (``pipelining_kept`` with FSDP2's
        ``grad_copy_in = "cast"``): ``PipelineStage.backward_maybe_with_nosync`` runs every
        backward with gradient sync off and, after the last, calls each FSDP group's
        ``post_backward`` in the module's order (the root's group first, then the blocks in
        forward order), each of which waits for the previous group's reduce-scatter before its
        copy-in (torch/distributed/pipelining/stage.py at 1963fc8, torch 2.6.0;
        ``FSDPParamGroup.post_backward``) — all before the stage sends its input gradient, which
        the send's stream waits for. torch after pytorch#144535 (January 2025) also waits for the
        last group's reduce-scatter there (``_root_post_backward_final_callback``); not modelled."""
        return bool(self.pipelining_kept) and self.grad_copy_in == "cast" and self.bucketed

    def delayed_sync(self, c: int) -> bool:
        """Whether chunk ``c``'s gradients are reduced by a call of their own after its last
        backward (``_grad_sync``), not by that backward: Megatron-LM's chunks other than the
        first model chunk of the first stage (``megatron_ddp``) under a schedule of full
        backwards. Megatron's ``delay_grad_reduce`` (on by default) runs those backwards with
        grad sync off and launches ``grad_sync_func`` afterwards: under 1F1B after the cooldown
        loop, behind the last ``send_backward``; interleaved, ``pipeline_parallel_rank`` backward
        steps after the chunk's last one (megatron/core/pipeline_parallel/schedules.py at
        f2e5db4). ZB-H1's weight-gradient halves send nothing and keep their reduction."""
        return self.megatron and c > 0 and self.s.schedule != "zb1"

    def _grad_sync(self, c: int, layers: list[ShardedLayer]) -> Function:
        """``c<c>_grad_sync``: chunk ``c``'s accumulated gradients (in its weight order) reduced
        over dp as one bucket (``delayed_sync``; Megatron's ``start_grad_sync``)."""
        fb = FunctionBuilder(f"c{c}_grad_sync", REGISTRY.out_arity)
        ws = chunk_weights(layers)
        grads = [fb.param(f"g_{w.name}") for w in ws]
        buckets = _Buckets(self, fb, c, ws, False, True, False, self._root_weights(layers))
        buckets.add(ws, grads)
        return fb.ret(*buckets.results())

    def _chunk_bwd(
        self,
        c: int,
        layers: list[ShardedLayer],
        acc: bool,
        part: str = "",
        reduce: bool = False,
        final: bool = True,
    ) -> Function:
        """part: "" full backward, "i" input gradients (returns carried), "w" weight gradients.
        ``reduce``: the weight gradients are reduced over ``dp`` in buckets as the backward
        completes them (``_Buckets``; ZeRO-2/3 in every backward, DDP/ZeRO-0/1 in the last).
        ``final``: HSDP's last backward of the step, which all-reduces across the groups too
        (suffix ``_red``; the others, ``_rs``, reduce-scatter within the group only)."""
        if self.ds_fetch is not None:
            return self._ds_chunk_bwd(c, layers, acc, reduce, final)
        fb = FunctionBuilder(self._chunk_bwd_name(c, acc, part, reduce, final), REGISTRY.out_arity)
        ws = chunk_weights(layers)
        # one stream for gathers and reductions: a layer's reduction is issued after the next
        # layer's weights are handed back (``_Gathers.before``), as FSDP's hooks issue them
        defer = self.one_dp_stream and part != "w"
        buckets = _Buckets(self, fb, c, ws, acc, final, defer, self._root_weights(layers)) if reduce else None
        sink = _GradSink(self, fb, ws, layers, acc, buckets)
        if part == "w":
            # the input part returns the carried values of its layers in backward (reversed) order
            carried = [[fb.param(f"k{L.index}_{j}") for j in range(L.n_carried)] for L in reversed(layers)]
            for L, ks in zip(reversed(layers), carried, strict=True):
                assert L.bwd_w is not None
                fn_w, sums = sink.fused(L, L.bwd_w, 0)
                sink.done(L, fb.call(fn_w, *ks, *sums, n_out=len(fn_w.outputs)))
            return fb.ret(*sink.results())
        wp, ep, res = _bwd_params(fb, chunk_weights(layers), layers)
        held = {w: fb.param(f"{w.name}_full") for w in self._kept_gathered(layers)}
        dy = fb.param("dy")
        kept: list[Value] = []
        reads = []  # what each layer's backward reads, in backward order
        for L in reversed(layers):
            assert L.vjp is not None
            reads.append([self.layer_calls[L.index].inputs[j] for j in L.vjp.bwd_params])
        gather = _Gathers(self, fb, c, wp, reads)
        gather.kept.update(held)  # gathered in the forward (``fsdp2_root``)
        for i, (L, rs) in enumerate(zip(reversed(layers), reversed(res), strict=True)):
            v = L.vjp
            assert v is not None
            call = self.layer_calls[L.index]
            args: list[Value] = []
            it = iter(rs)
            gather.before(i, sink.release)
            for j in v.bwd_params:
                u = call.inputs[j]
                args.append(next(it) if j == 0 else gather.take(u) if u in wp else ep[u])
            args.extend(it)
            fn = L.bwd_i if part == "i" else L.bwd
            assert fn is not None
            n_dx = 1 if 0 in v.wrt else 0
            extra: list[Value] = []
            if part != "i":
                fn, extra = sink.fused(L, fn, n_dx)
            outs = fb.call(fn, *args, dy, *extra, n_out=len(fn.outputs))
            if part == "i":
                kept.extend(outs[n_dx:])
            else:
                sink.done(L, outs[n_dx:])
            if n_dx:
                dy = outs[0]
        first = layers[0].vjp
        head = [dy] if first is not None and 0 in first.wrt else []
        if part == "i":
            return fb.ret(*head, *kept)
        return fb.ret(*head, *sink.results())

    def _chunk_bwd_name(self, c: int, acc: bool, part: str, reduce: bool, final: bool) -> str:
        """The name of ``_chunk_bwd(c, layers, acc, part, reduce, final)``'s function."""
        red = ("_red" if final or not self.hsdp else "_rs") if reduce else ""
        return f"c{c}_bwd" + ("_" + part if part else "") + ("_acc" if acc else "") + red

    def _accum_cast(self, fb: FunctionBuilder, w: Value, g: Value) -> Value:
        """``w``'s gradient ``g`` in the dtype it is accumulated in: with ``fp32_grad_accum`` cast
        to fp32 by a call of ``@hp_grad`` (a function of one Cast), else ``g`` itself. The call
        keeps the cast a kernel of its own that writes the fp32 copy, as ``update_hp_grads``'s
        ``lp.grad.to(fp32)`` does before ``add_`` reads it (chains do not cross calls:
        ``distir.sim.fusion``); with ``grad_accum_fusion`` a Cast in the chunk, which the Add
        into the sum joins (Megatron-LM's hook adds the low-precision gradient into the fp32
        ``main_grad`` in one ``add_``)."""
        if not self.fp32_acc:
            return g
        if self.gaf:  # Megatron's hook: ``main_grad.add_(grad)``, one kernel with the Add after it
            return cast(fb, g, self.prec.master, f"g_{w.name}_{self.prec.master}")
        fn = self.functions.get(HP_GRAD)
        if fn is None:
            hb = FunctionBuilder(HP_GRAD, REGISTRY.out_arity)
            fn = self.functions[HP_GRAD] = hb.ret(cast(hb, hb.param("g"), self.prec.master, "g32"))
        return fb.call(fn, g, n_out=1, names=[f"g_{w.name}_{self.prec.master}"])[0]

    def _grad_target(self, w: Value) -> str:
        """The placement a bucket reduces ``w``'s gradient to: this rank's ZeRO shard
        (ZeRO-2/3, and ZeRO-1 with ``megatron_ddp``: a reduce-scatter), else replicated over dp
        (an all-reduce)."""
        z = self._zdim(w)
        dp = Shard(z) if z is not None and self._scattered() else Replicate()
        return placement_text(dp, self._tp_of(w))

    def grad_layout(self, w: Value) -> str:
        """The placement a layer's backward gives ``w``'s gradient: pending over dp (with d > 1),
        over cp too, and ``_tp_of`` over tp (``LayerSharder``)."""
        dp = [Partial()] if self.s.d * self.s.c > 1 else [Replicate()]
        return placement_text(*dp, *([Partial()] if self.s.c > 1 else []), self._tp_of(w))

    def _tp_of(self, w: Value) -> Placement:
        """``w``'s gradient's placement over tp until the step's end: pending (``tp_pending``),
        else its weight's."""
        return Partial() if w in self.tp_pending else self.model.weight(w.name).tp

    def _scattered(self) -> bool:
        """Whether buckets reduce-scatter the gradients to the ZeRO shards: ZeRO-2/3, and
        Megatron-LM's distributed optimizer (ZeRO-1: ``_reduce_scatter_base`` per bucket,
        megatron/core/distributed/param_and_grad_buffer.py)."""
        return self.s.zero >= 2 or (self.megatron and self.s.zero == 1)

    def _grad_bytes(self, w: Value) -> float:
        """A device's bytes of ``w``'s (unreduced) gradient, in the dtype it is reduced in."""
        spec = self.model.weight(w.name)
        size = (self.prec.master if self.fp32_acc else self.compute).itemsize
        return spec.type.numel * size / (self.s.t if isinstance(spec.tp, Shard) else 1)

    # -- entry -----------------------------------------------------------------------------------
    def _chunk_functions(
        self, by_chunk: list[list[ShardedLayer]], called_only: bool = False
    ) -> Mapping[str, Function]:
        """Each chunk's forward and (training) backward functions: the full backward, or the
        input- and weight-gradient halves (zero-bubble), each also accumulating and, with data
        parallelism, reducing in buckets (``_chunk_bwd``). Built here, in this order; with
        ``called_only``, each when the schedule first calls it (``_LazyChunks``)."""
        s = self.s
        cf: dict[str, Callable[[], Function]] = {}
        for c, ls in enumerate(by_chunk):
            cf[f"c{c}_fwd"] = functools.partial(self._chunk_fwd, c, ls)
            if self.gather_early:
                cf[f"c{c}_fwd_gather"] = functools.partial(self._chunk_fwd, c, ls, gather_once=True)
            if self.train:
                part = "w" if s.schedule == "zb1" else ""
                if part:
                    cf[f"c{c}_bwd_i"] = functools.partial(self._chunk_bwd, c, ls, False, "i")
                every = self.bucketed and reduce_scatter_every_backward(s)  # ZeRO-2/3 (not pipelined ZeRO-2)
                delayed = self.delayed_sync(c)
                for accumulate in (False, True):
                    variants = [(every, True)]
                    if self.bucketed and not every and not delayed:  # DDP: the last backward reduces
                        variants.append((True, True))
                    if self.hsdp and s.k > 1:  # HSDP: the others reduce-scatter within the group
                        variants.append((True, False))
                    for reduce, final in variants:
                        name = self._chunk_bwd_name(c, accumulate, part, reduce, final)
                        cf[name] = functools.partial(self._chunk_bwd, c, ls, accumulate, part, reduce, final)
                if delayed:
                    cf[f"c{c}_grad_sync"] = functools.partial(self._grad_sync, c, ls)
        if called_only:
            return _LazyChunks(cf)
        return {name: make() for name, make in cf.items()}

    def _declare(
        self, fb: FunctionBuilder, by_chunk: list[list[ShardedLayer]], stage_of: list[int]
    ) -> tuple[list[Value], dict[tuple[Value, int], list[Value]], _Params]:
        """The entry's parameters: the inputs (one per microbatch, on the mesh of each stage
        that reads them: ``_declare_inputs``), the weights (on the stage of their first use; a
        tied weight's copy on its other stage), the optimizer state and, under mixed precision,
        the persistent compute copies — all donated to their successors; returns the inputs, the
        microbatched inputs and the weights' parameters (``_Params``)."""
        s, model = self.s, self.model
        inputs = model.forward.params[: self.n_in]
        mbs = self._declare_inputs(fb, by_chunk, stage_of)
        wparam: dict[Value, Value] = {}
        wchunk: dict[Value, int] = {}
        # each weight's value on each stage that uses it: the weight on the stage of its first
        # layer; a tied weight used on another stage too gets a copy there (``_tied_copies``)
        home, partner, groups = _tied_copies(by_chunk, stage_of)
        for (_w, c), h in home.items():
            wchunk.setdefault(h, c)
        # the model's weights in order of use, then the tied copies (parameters and results last)
        used = [h for (w, _c), h in home.items() if h is w] + [h for (w, _c), h in home.items() if h is not w]
        used = list(dict.fromkeys(used))
        # a transmitted weight's copy is no parameter: it is received from its owner (below)
        sent = frozenset(h for (w, _c), h in home.items() if h is not w and w.name in model.transmitted)
        kept = [w for w in used if w not in sent]
        for w in kept:
            spec = model.weight(w.name)
            c = wchunk[w]
            z = self._zdim(w) if s.zero == 3 or self.prec.mixed else None  # mixed: masters as the state
            wt = self.prec.master_type(spec.type)
            if self.no_master:  # the compute copy is the weight (below)
                continue
            if self.remainders:  # the master's low half; its high half is the bf16 copy's
                wt_on = self._on_stage(DType.i16, wt.shape, stage_of[c], z, spec.tp)
                wparam[w] = fb.param(f"{w.name}_rem", wt_on, donated=True)
                continue
            self._wstage[w] = stage_of[c]
            wt_on = self._on_stage(wt.dtype, wt.shape, stage_of[c], z, spec.tp, self.offload)
            wparam[w] = fb.param(w.name, wt_on, donated=self.train)
        state: dict[Value, list[Value]] = {w: [] for w in used}
        step_of: dict[int, Value] = {}
        if self.train:
            for sname in self.opt.state:
                for w in kept:
                    spec = model.weight(w.name)
                    t = self._on_stage(
                        self.prec.master_type(spec.type).dtype,
                        spec.type.shape,
                        stage_of[wchunk[w]],
                        self._zdim(w),
                        spec.tp,
                        self.offload,
                    )
                    state[w].append(fb.param(f"{sname}_{w.name}", t, donated=True))
            if self.opt.kind == "adam":
                for st in sorted({stage_of[wchunk[w]] for w in kept}):
                    mesh = self._state_mesh(st)
                    step_of[st] = fb.param(
                        f"step_s{st}",
                        DTensorType(DType.i64, (), mesh, tuple(Replicate() for _ in mesh.axes)),
                        donated=True,
                    )
        # mixed precision: the compute copies persist between steps (step inputs, updated in place
        # from the new masters after the optimizer), as trainers keep them; inference casts
        half: dict[Value, Value] = {}
        if self.prec.mixed and self.train:
            for w in kept:
                spec = model.weight(w.name)
                z = self._zdim(w) if s.zero == 3 or self.gather_early else None
                t = self._on_stage(self.compute, spec.type.shape, stage_of[wchunk[w]], z, spec.tp)
                name = w.name if self.no_master else f"{w.name}_{self.compute}"
                half[w] = fb.param(name, t, donated=True)
                if self.no_master:
                    wparam[w] = half[w]
        # transmitted weights: the owner sends the value (and compute copy) once per step
        for h in sorted(sent, key=used.index):
            there = self._mesh_for(stage_of[wchunk[h]])
            owner = partner[h] if h in partner else groups[h][0]
            wparam[h] = self._mesh_send(fb, wparam[owner], self._state_mesh(stage_of[wchunk[h]]), h.name)
            if self.no_master:
                half[h] = wparam[h]
            elif owner in half:
                half[h] = self._mesh_send(fb, half[owner], there, f"{h.name}_{self.compute}")
        wuse = half or (
            {w: self._compute_copy(fb, w, wparam[w]) for w in used} if self.prec.mixed else wparam
        )
        if self.gather_cast:  # the chunks cast the masters' shards as they gather them
            wuse = {w: wparam[w] if self._zdim(w) is not None else v for w, v in wuse.items()}
        params = _Params(wparam, wchunk, home, partner, groups, used, state, step_of, half, wuse, sent)
        return list(inputs), mbs, params

    def _declare_inputs(
        self, fb: FunctionBuilder, by_chunk: list[list[ShardedLayer]], stage_of: list[int]
    ) -> dict[tuple[Value, int], list[Value]]:
        """Per (model input, stage that reads it), its microbatches: the first input on stage 0,
        the others (labels; positions) on the stage of each chunk that reads them — an input
        read on several stages (context parallelism's positions) is an input of each, named
        alike, as each stage's data loader makes it."""
        stages_of: dict[Value, list[int]] = {}
        for c, ls in enumerate(by_chunk):
            for L in ls:
                for e in L.extras:
                    at = stages_of.setdefault(e, [])
                    if stage_of[c] not in at:
                        at.append(stage_of[c])
        mbs: dict[tuple[Value, int], list[Value]] = {}
        inputs = self.model.forward.params[: self.n_in]
        later: list[tuple[Value, int]] = []  # the other stages' copies, declared after the inputs
        for k_in, x in enumerate(inputs):
            if k_in > 0 and x not in stages_of:
                continue
            at = [0] if k_in == 0 else stages_of[x]
            self._declare_input(fb, mbs, x, at[0])
            later += [(x, st) for st in at[1:]]
        for x, st in later:
            self._declare_input(fb, mbs, x, st)
        return mbs

    def _declare_input(
        self, fb: FunctionBuilder, mbs: dict[tuple[Value, int], list[Value]], x: Value, stage: int
    ) -> None:
        s, t = self.s, x.type
        assert isinstance(t, TensorType)
        seq = (Shard(1),) if s.c > 1 else ()  # context parallelism: split along the sequence
        dt = DTensorType(t.dtype, (self.mb, *t.shape[1:]), self.meshes[stage], (Shard(0), *seq, Replicate()))
        mbs[(x, stage)] = [fb.param(f"{x.name}_{m}" if s.k > 1 else x.name, dt) for m in range(s.k)]

    def _program_order(self, by_chunk: list[list[ShardedLayer]]) -> list[Any]:
        """The schedule's actions of every rank merged into one program order: by the given
        chunk times (I = W = B/2), else F ∝ the chunk's weights, B = 2F, I = W = F."""
        s, model = self.s, self.model
        if self.train:
            per_rank = build_schedule(s.schedule, s.p, s.k, s.v)
        else:
            per_rank = [
                [Action(c, m, "F") for m in range(s.k) for c in range(len(self.chunks)) if c % s.p == r]
                for r in range(s.p)
            ]
        # write the program in estimated time order: the given chunk times (I = W = B/2), else
        # F ∝ the chunk's weights, B = 2F, I = W = F
        if self.chunk_times is not None:
            f_s, b_s = self.chunk_times
            times = {"F": list(f_s), "B": list(b_s), "I": [b / 2 for b in b_s], "W": [b / 2 for b in b_s]}
            order = time_order(per_rank, s.p, s.v, lambda r, a: times[a.kind][a.stage])
        else:
            work = [
                1.0 + sum(model.weight(w.name).type.numel for L in ls for w in L.weights) for ls in by_chunk
            ]
            share = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
            order = time_order(per_rank, s.p, s.v, lambda r, a: work[a.stage] * share[a.kind])
        return order

    def build(self, called_only: bool = False) -> Module:
        """The module: layer and chunk functions (``called_only``: those the schedule calls), then
        the entry — its parameters, the schedule's chunk calls, and (training) gradient
        reduction, the optimizer and the results."""
        s = self.s
        layers = self._layers()
        by_chunk = [[layers[i] for i in r] for r in self.chunks]
        stage_of = [c % s.p for c in range(len(self.chunks))]
        cf = self._chunk_functions(by_chunk, called_only)
        fb = FunctionBuilder("step" if self.train else "infer", REGISTRY.out_arity)
        inputs, mbs, wp = self._declare(fb, by_chunk, stage_of)
        sched = _ScheduleWriter(self, fb, cf, by_chunk, stage_of, inputs, mbs, wp)
        if self.deepspeed_pipe and self.train:  # DeepSpeed's TrainSchedule, step by step
            sched._run(step_order(s.p, s.k))
        else:
            sched.write(self._program_order(by_chunk))
        if not self.train:
            return self._module(cf, fb.ret(*sched.outputs_inf))
        sched.state.merge(fb, layers[-1].fwd_args[0] if layers[-1].fwd_args else None)
        grads = self._gradient_sums(fb, by_chunk, wp, sched.acc)
        updates = self._apply_optimizer(fb, grads, wp, stage_of, sched.to_mesh)
        results = self._results(fb, sched.losses, updates, wp)
        return self._module(cf, fb.ret(*results, *sched.state.results()))

    def _gradient_sums(
        self,
        fb: FunctionBuilder,
        by_chunk: list[list[ShardedLayer]],
        wp: _Params,
        acc: dict[int, list[Value] | None],
    ) -> dict[Value, Value]:
        """Each weight's gradient from the chunks' last backward results (a weight two chunks of
        one stage use gets the sum)."""
        grads: dict[Value, Value] = {}
        for c, ls in enumerate(by_chunk):
            ws = chunk_weights(ls)
            got = acc[c]
            if ws:
                assert got is not None, f"chunk {c} never ran its backward"
                _add_grads(fb, grads, [wp.home[(w, c)] for w in ws], got)
        return grads

    def _apply_optimizer(
        self,
        fb: FunctionBuilder,
        grads: dict[Value, Value],
        wp: _Params,
        stage_of: list[int],
        to_mesh: Callable[[Value, Mesh, str], Value],
    ) -> dict[Value, tuple[Value, ...]]:
        """Reduce each weight's gradient and update it (and its state), weight by weight; with the
        optimizer's ``max_norm``, every gradient is reduced first and the step's gradients are
        clipped by their global norm (``_norm_totals``) before the updates."""
        updates: dict[Value, tuple[Value, ...]] = {}
        held: list[_StepGrad] = []

        def take(sg: _StepGrad) -> None:
            g = sg.g
            if self.offload and not self.copied_in_backward(sg.w):
                g = self._to_host(fb, sg.w, g, sg.stage)
            g = self._to_master(fb, sg.w, g)
            if self.opt.max_norm:
                held.append(sg._replace(g=g))
            else:
                updates[sg.w] = self._update(fb, sg.w, wp, g)

        self._step_grads(fb, grads, wp, stage_of, to_mesh, take)
        totals = self._norm_totals(fb, held, to_mesh) if held else {}
        if self.offload:  # the norm's total to each stage's host, where its gradients are clipped
            totals = {
                st: self._mesh_send(fb, v, self.host_meshes[st], "grad_sumsq_host")
                for st, v in totals.items()
            }
        for sg in held:
            g = self.opt.clipped(fb, sg.g, totals[sg.stage])
            updates[sg.w] = self._update(fb, sg.w, wp, g)
        return updates

    def _step_grads(
        self,
        fb: FunctionBuilder,
        grads: dict[Value, Value],
        wp: _Params,
        stage_of: list[int],
        to_mesh: Callable[[Value, Mesh, str], Value],
        take: Callable[[_StepGrad], None],
    ) -> None:
        """Each updated weight's reduced gradient, passed to ``take`` in update order; a tied
        weight and its copy on another stage exchange their gradients first so both take the same
        step (a transmitted copy's gradient goes back to its owner, added there), and the norm
        counts the pair once."""
        wchunk, partner = wp.wchunk, wp.partner
        reduced: dict[Value, Value] = {}  # a tied copy's reduced gradient, until its partner's is

        def step(w: Value, g: Value, counted: bool = True) -> None:
            take(_StepGrad(w, g, stage_of[wchunk[w]], counted))

        for w in wp.used:
            g = self._reduce_grad(fb, w, grads[w], to_mesh, stage_of[wchunk[w]])
            group = wp.groups.get(w)
            if group is not None:
                reduced[w] = g
                if all(m in reduced for m in group):
                    self._group_step(fb, wp, group, [reduced.pop(m) for m in group], stage_of, to_mesh, step)
                continue
            other = partner.get(w)
            if w in wp.sent:  # a transmitted copy's gradient goes back to its owner once, added there
                assert other is not None
                here = self._mesh_for(stage_of[wchunk[other]])
                (g_sum,) = fb.op(
                    "Add", reduced.pop(other), to_mesh(g, here, f"g_{w.name}_sent"), names=[f"g_{w.name}"]
                )
                step(other, g_sum)
                continue
            if other is not None:
                if other not in reduced:
                    reduced[w] = g
                    continue
                # Megatron's embedding group: each stage adds the other's gradient, so the copies
                # take the same step (an all-reduce of two, as two sends that cross)
                g_other = reduced.pop(other)
                here, there = (
                    self._mesh_for(stage_of[wchunk[w]]),
                    self._mesh_for(stage_of[wchunk[other]]),
                )
                (g_other_sum,) = fb.op(
                    "Add", g_other, to_mesh(g, there, f"g_{w.name}_tied"), names=[f"g_{w.name}"]
                )
                (g,) = fb.op("Add", g, to_mesh(g_other, here, f"g_{w.name}_tied"), names=[f"g_{w.name}"])
                step(other, g_other_sum)
                step(w, g, counted=False)  # the same gradient as its weight's: counted once
                continue
            step(w, g)

    def _group_step(
        self,
        fb: FunctionBuilder,
        wp: _Params,
        group: tuple[Value, ...],
        gs: list[Value],
        stage_of: list[int],
        to_mesh: Callable[[Value, Mesh, str], Value],
        step: Callable[[Value, Value, bool], None],
    ) -> None:
        """A weight used on more than two stages (``_tied_copies``' groups): the members'
        reduced gradients ``gs`` summed on the weight's stage and the sum sent back to each copy,
        so all take the same step (copies received from their owner each step take none); the
        norm counts it once."""
        owner = group[0]
        here = self._mesh_for(stage_of[wp.wchunk[owner]])
        total = gs[0]
        for m, g in zip(group[1:], gs[1:], strict=True):
            (total,) = fb.op("Add", total, to_mesh(g, here, f"g_{m.name}_tied"), names=[f"g_{owner.name}"])
        step(owner, total, True)
        for m in group[1:]:
            if m not in wp.sent:
                there = self._mesh_for(stage_of[wp.wchunk[m]])
                step(m, to_mesh(total, there, f"g_{m.name}_tied"), False)

    def _norm_totals(
        self, fb: FunctionBuilder, steps: list[_StepGrad], to_mesh: Callable[[Value, Mesh, str], Value]
    ) -> dict[int, Value]:
        """Gradient-norm clipping (``Optimizer.max_norm``; none: {}), as the trainers run it after
        the gradients' reduction, before the update, on the compute stream: each counted
        gradient's sum of squares (a ZeRO or tensor-parallel shard's: this rank's part), summed
        per stage and placement and all-reduced over the stage's mesh (one call per placement:
        Megatron-LM all-reduces once over the model-parallel group, or the world with its
        distributed optimizer; torchtitan's ``full_tensor`` over the DTensor mesh), then the
        stages' sums added on the first stage and the total passed back (Megatron's one
        all-reduce spans the stages; torchtitan all-reduces over the pipeline mesh after).
        Returns each stage's total."""
        if not self.opt.max_norm:
            return {}
        groups: dict[tuple[int, bool, bool], list[Value]] = {}
        for sg in steps:
            if sg.counted:
                key = (
                    sg.stage,
                    self._zdim(sg.w) is not None,
                    isinstance(self.model.weight(sg.w.name).tp, Shard),
                )
                groups.setdefault(key, []).extend(self.opt.norm_terms(fb, [sg.g]))
        sums: dict[int, list[Value]] = {}
        for (stage, dp_part, tp_part), terms in groups.items():
            v = terms[0] if len(terms) == 1 else fb.op("Sum", *terms, names=[f"grad_sumsq_s{stage}"])[0]
            if self.offload:  # summed on the host: the sum back to the GPU for the all-reduce
                v = self._mesh_send(fb, v, self._mesh_for(stage), f"grad_sumsq_s{stage}")
            if dp_part or tp_part:  # pending over the axes the gradients are sharded along
                rep = ", ".join("R" for _ in self._mesh_for(stage).axes)
                v = self._redistribute(fb, v, f"grad_sumsq_s{stage}", rep)
            sums.setdefault(stage, []).append(v)
        local = {
            st: vs[0] if len(vs) == 1 else fb.op("Sum", *vs, names=[f"grad_sumsq_s{st}"])[0]
            for st, vs in sums.items()
        }
        # the stages' sums gathered on the first stage, added, and the total sent back to each:
        # 2(p - 1) transfers, as a ring all-reduce over the stages takes 2(p - 1) steps
        stages = list(dict.fromkeys(sg.stage for sg in steps))
        first = stages[0]
        here = self._mesh_for(first)
        parts = [v if st == first else to_mesh(v, here, f"grad_sumsq_s{st}") for st, v in local.items()]
        total = parts[0] if len(parts) == 1 else fb.op("Sum", *parts, names=["grad_sumsq"])[0]
        totals = {
            st: total if st == first else to_mesh(total, self._mesh_for(st), "grad_sumsq") for st in stages
        }
        return totals

    def _results(
        self, fb: FunctionBuilder, losses: list[Value], updates: dict[Value, tuple[Value, ...]], wp: _Params
    ) -> list[Value]:
        """The step's results: the loss (summed over microbatches, replicated), the new weights
        and state as the sequential step returns them, then the tied copies', then (mixed
        precision) the new compute copies — each donated its predecessor's storage."""
        used, received = wp.used, wp.sent
        loss = losses[0] if len(losses) == 1 else fb.op("Sum", *losses, names=["loss"])[0]
        loss = self._redistribute(fb, loss, "loss", with_cp("R, R", self.s.c))
        results = [loss]
        if self.no_master:  # the new weights are the new compute copies
            mine = [w for w in used if w not in received]
            new = {w: self._compute_copy(fb, w, updates[w][0], updates[w][0]) for w in mine}
            updates = {w: (new[w], *u[1:]) for w, u in updates.items() if w in new}
        for group in (
            [w for w in used if w in self.weight_params],
            [w for w in used if w not in self.weight_params and w not in received],
        ):
            results += [updates[w][0] for w in group]
            results += [updates[w][1 + k] for k in range(len(self.opt.state)) for w in group]
        for w in (w for w in used if w not in received):
            fb.donate(wp.wparam[w], updates[w][0])
            for sv, old in zip(updates[w][1:], wp.state[w], strict=True):
                fb.donate(old, sv)
        for w in used:
            if w in wp.half and w not in received and not self.no_master:
                results.append(self._compute_copy(fb, w, updates[w][0], self.new_high.get(w)))
                if wp.wuse[w] is wp.half[w]:  # else (``gather_cast``) unread: freed at the start
                    fb.donate(wp.half[w], results[-1])
        return results

    def _reduce_grad(
        self,
        fb: FunctionBuilder,
        w: Value,
        g: Value,
        to_mesh: Callable[[Value, Mesh, str], Value],
        stage: int,
    ) -> Value:
        """A weight's gradient (a pending sum over dp, or already reduced in buckets by the
        backward) as its optimizer takes it: all-reduced, or reduce-scattered to its ZeRO shard
        (ZeRO-1: all-reduced, then sliced); a bucket's result comes back from the dp_reduce
        stream first."""
        tp = self._tp_of(w)
        rep = placement_text(Replicate(), tp)
        z = self._zdim(w)
        if self.copied_in_backward(w):  # on the host already (``_Buckets._offloaded``)
            return g
        if self.bucketed and self.comm_streams:  # reduced on the dp_reduce stream
            g = to_mesh(g, self._mesh_for(stage), f"g_{w.name}")
        if z is None:
            g = g if self.bucketed else self._redistribute(fb, g, f"g_{w.name}", rep)
        else:
            if self.s.zero == 1 and not self.bucketed:
                g = self._redistribute(fb, g, f"g_{w.name}", rep)
            if not self._scattered() or not self.bucketed:
                g = self._redistribute(fb, g, f"g_{w.name}", placement_text(Shard(z), tp))
        return self._tp_sum(fb, w, g, stage) if w in self.tp_pending else g

    def _update(self, fb: FunctionBuilder, w: Value, wp: _Params, g: Value) -> tuple[Value, ...]:
        """The optimizer step of weight ``w`` with its gradient ``g`` as the optimizer takes it
        (``_step_grads``): a ZeRO-1/2 replicated weight is updated by shards and all-gathered
        after; with ``master_remainders``, the master's shard joined from this rank's shard of the
        bf16 copy and its remainder (``AdamRemainder``), the new bf16 shard kept for the new
        compute copy (``new_high``)."""
        wv, wstate = wp.wparam[w], wp.state[w]
        tp = self.model.weight(w.name).tp
        z = self._zdim(w)
        step = wp.step_of.get(self._stage_of_value(wv))
        if self.no_master:  # this rank's shard of the compute weight, updated in place
            if z is not None and self.s.zero in (1, 2) and not self.gather_early:
                wv = self._redistribute(
                    fb, wv, f"{w.name}_{self.compute}_shard", placement_text(Shard(z), tp)
                )
            got = self.opt.emit(fb, wv, g, wstate, step)
            self.new_high[w] = got[0]
            return got
        if self.remainders:
            high = wp.half[w]
            if z is not None and not self.gather_early:  # the whole copy: this rank's shard of it
                high = self._redistribute(
                    fb, high, f"{w.name}_{self.compute}_shard", placement_text(Shard(z), tp)
                )
            assert step is not None
            got = self.opt.emit_remainder(fb, high, wv, g, wstate, step)
            self.new_high[w] = got[0]
            return got[1:]
        sliced = self.s.zero < 3 and not self.prec.mixed  # a replicated weight, updated by shards
        if z is None or not sliced:
            return self.opt.emit(fb, wv, g, wstate, step)
        wv = self._redistribute(fb, wv, f"{w.name}_shard", placement_text(Shard(z), tp))
        upd = self.opt.emit(fb, wv, g, wstate, step)
        full = self._redistribute(fb, upd[0], f"{w.name}_new", placement_text(Replicate(), tp))
        return (full, *upd[1:])

    def _stage_of_value(self, v: Value) -> int:
        """The pipeline stage whose mesh holds the entry parameter ``v``."""
        t = v.type
        assert isinstance(t, DTensorType)
        meshes = [*enumerate(self.meshes), *enumerate(self.meshes3), *enumerate(self.host_meshes)]
        return next(st for st, m in meshes if m == t.mesh)

    def _module(self, cf: Mapping[str, Function], entry: Function) -> Module:
        fns = [*self.functions.values(), *cf.values()]
        return Module((*fns, entry))


class _LazyChunks(Mapping[str, Function]):
    """The chunk functions by name, each built when first asked for (``distribute``'s
    ``called_only``): the schedule asks for the ones it calls. Iterated (``_Builder._module``),
    the ones built, in the order ``_Builder._chunk_functions`` lists them all. A chunk function
    is a function of the builder's state before the schedule is written (the layers, the
    chunks, the options) and of what it builds itself, so built later it is the same."""

    def __init__(self, makers: dict[str, Callable[[], Function]]) -> None:
        self._makers = makers
        self._built: dict[str, Function] = {}

    def __getitem__(self, name: str) -> Function:
        got = self._built.get(name)
        if got is None:
            got = self._built[name] = self._makers[name]()
        return got

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._makers if name in self._built)

    def __len__(self) -> int:
        return len(self._built)


class _ScheduleWriter:
    """Writes the schedule's actions, in program order, as chunk calls into the entry: forward
    and backward calls with their microbatch's activations, residuals and gradient accumulators,
    and the transfers between stages right after the producing action (``distribute``).
    Afterwards ``losses`` (training) or ``outputs_inf`` hold the last chunk's results per
    microbatch and ``acc`` each chunk's accumulated weight gradients."""

    def __init__(
        self,
        b: _Builder,
        fb: FunctionBuilder,
        cf: Mapping[str, Function],
        by_chunk: list[list[ShardedLayer]],
        stage_of: list[int],
        inputs: list[Value],
        mbs: dict[tuple[Value, int], list[Value]],
        wp: _Params,
    ) -> None:
        self.b, self.fb, self.cf, self.by_chunk, self.stage_of = b, fb, cf, by_chunk, stage_of
        self.inputs, self.mbs = inputs, mbs
        n = len(b.chunks)
        self.act: dict[tuple[int, int], Value] = {}
        self.dys: dict[tuple[int, int], Value] = {}
        self.res: dict[tuple[int, int], tuple[Value, ...]] = {}
        self.carried: dict[tuple[int, int], tuple[Value, ...]] = {}
        self.acc: dict[int, list[Value] | None] = {c: None for c in range(n)}
        self.grads_left = {c: 0 for c in range(n)}
        # the backward actions after whose transfer delayed gradient reductions run (``_syncs``)
        self.syncs_after: dict[Action, list[int]] = {}
        self.backwards: dict[int, list[Action]] = {}  # per pipeline rank, in program order
        self.ddp = b.bucketed and not reduce_scatter_every_backward(b.s)  # reduced in the last backward
        self.losses: list[Value] = []
        self.outputs_inf: list[Value] = []
        self.last = n - 1
        # a chunk's weights are the same values for every microbatch: listed once per chunk
        self.cw = [chunk_weights(ls) for ls in by_chunk]
        self.weights_of = [
            [b._layer_view(fb, wp.wuse[wp.home[(w, c)]], stage_of[c]) for w in self.cw[c]]
            for c in range(len(by_chunk))
        ]
        # TE's weight cache: each chunk's weights cast in its first forward (``_cast_once``)
        self.uncast = set(range(len(by_chunk))) if b.cached and not b.gather_early else set()
        self.f8: dict[Value, Value] = {}  # a weight's compute copy -> its float8 copy
        self.gathered: set[int] = set()  # chunks whose weights were gathered this step (gather_early)
        # gather_early, interleaved: a chunk's weights gathered ahead, during its rank's previous
        # chunk's first forward (``_prefetch``)
        self.prefetched: dict[int, _Gathers] = {}
        self.forwards_done = [0] * b.s.p  # per pipeline rank, its forward passes so far
        self.chunk_extras = [
            [mbs[(e, stage_of[c])] for L in ls for e in L.extras] for c, ls in enumerate(by_chunk)
        ]
        self.outbox: dict[Action, tuple[Value, int, int, str]] = {}
        # DeepSpeed's partitioned transfers: per chunk boundary, (part, whole) placements or None
        self.parts = [_pipe_partition(b, ls[0].fwd_args) for ls in by_chunk[1:]] if b.deepspeed_pipe else []
        # (chunk, microbatch) -> its sent output's part and the placement that makes it whole
        self.kept: dict[tuple[int, int], tuple[Value, str]] = {}
        # what torch.distributed.pipelining's stages hold until the step's end (``pipelining_kept``)
        self.state = StepState(b.pipelining_kept, self.last)
        self.buffers = self._receive_buffers() if self.state.on else {}

    def write(self, order: list[Any]) -> None:
        """Every action at its (estimated) start, its transfer at the end of the action."""
        events = sorted(
            [(ta.start, 1, i, ta.action) for i, ta in enumerate(order)]
            + [(ta.end, 0, i, ta.action) for i, ta in enumerate(order)],
            key=itemgetter(0, 1, 2),  # the action itself never breaks a tie
        )
        self._run([Event(phase == 0, a) for _t, phase, _i, a in events])

    def _run(self, events: list[Event]) -> None:
        """The events in program order: a pass, or the transfer of what a pass made."""
        # per chunk, the backward actions left that produce weight gradients (the last reduces)
        grad_kind = "W" if self.b.s.schedule == "zb1" else "B"
        for e in events:
            if not e.send and e.action.kind == grad_kind:
                self.grads_left[e.action.stage] += 1
            if not e.send and e.action.kind == "B":
                self.backwards.setdefault(self.stage_of[e.action.stage], []).append(e.action)
        self._prefetch_first()
        for send, a in events:
            if send:
                self._transfer(a)
                self._syncs(a)
            elif a.kind == "F":
                self._forward(a)
            elif a.kind in ("B", "I"):
                self._backward(a)
            elif a.kind == "W":
                self._weight_grads(a)

    def red(self, c: int) -> str:
        """The suffix of chunk ``c``'s backward that produces weight gradients now."""
        b = self.b
        self.grads_left[c] -= 1
        if b.hsdp and self.grads_left[c]:  # HSDP: across the groups in the last backward only
            return "_rs"
        return "_red" if b.bucketed and (not self.ddp or self.grads_left[c] == 0) else ""

    def to_mesh(self, v: Value, mesh: Mesh, name: str) -> Value:
        return self.b._mesh_send(self.fb, v, mesh, name)

    def send(self, v: Value, src: int, dst: int, name: str) -> Value:
        """Right after the producing action. With communication streams, the value moves to
        the sender's send stream (free) and across to the receiver's receive stream;
        ``receive`` hands it to the receiver's compute stream right before the consuming
        action."""
        a, b = self.stage_of[src], self.stage_of[dst]
        if a == b:
            return v
        if not self.b.p2p_streams:
            return self.to_mesh(v, self.b.meshes[b], name)
        way = "fwd" if dst > src else "bwd"
        out, into = self.b.comm_meshes[(f"{way}_send", a)], self.b.comm_meshes[(f"{way}_recv", b)]
        return self.to_mesh(self.to_mesh(v, out, name), into, name)

    def receive(self, v: Value, src: int, dst: int, name: str) -> Value:
        if not self.b.p2p_streams or self.stage_of[src] == self.stage_of[dst]:
            return v
        return self.to_mesh(v, self.b.meshes[self.stage_of[dst]], name)

    def _receive_buffers(self) -> dict[tuple[bool, int, int], Value]:
        """``pipelining_kept``: the receive buffers of each chunk, one per microbatch, as step
        parameters (they persist between steps) on the stream that receives into them, each
        donated to what it receives — by (forward, receiving chunk, microbatch)."""
        b, fb, bufs = self.b, self.fb, {}
        for c in range(1, len(self.by_chunk)):  # chunk c's input: received by c, its gradient by c - 1
            t = self.by_chunk[c][0].fwd_args[0]
            assert isinstance(t, DTensorType)
            for fwd, at in ((True, c), (False, c - 1)):
                st = self.stage_of[at]
                mesh = (
                    b.comm_meshes[("fwd_recv" if fwd else "bwd_recv", st)] if b.p2p_streams else b.meshes[st]
                )
                for m in range(b.s.k):
                    name = f"{'a' if fwd else 'dy'}{c if fwd else c - 1}_{m}_buffer"
                    bt = DTensorType(t.dtype, t.shape, mesh, t.placements)
                    bufs[(fwd, at, m)] = fb.param(name, bt, donated=True)
        return bufs

    def chunk_args(self, c: int, m: int) -> list[Value]:
        return [*self.weights_of[c], *(per_mb[m] for per_mb in self.chunk_extras[c])]

    def _transfer(self, a: Action) -> None:
        """The end of action ``a``: what it produced for another chunk is sent."""
        got_out = self.outbox.pop(a, None)
        if got_out is None:
            return
        val, src, dst, name = got_out
        part = self.parts[min(src, dst)] if self.parts and self.stage_of[src] != self.stage_of[dst] else None
        if part is not None:  # DeepSpeed's pipe_partitioned / grad_partitioned (``_pipe_partition``)
            val = self.b._redistribute(self.fb, val, f"{name}_part", part[0])
            if dst > src:
                self.kept[(src, a.microbatch)] = (val, part[1])
        sent = self.send(val, src, dst, name)
        buf = self.buffers.get((dst > src, dst, a.microbatch))
        if buf is not None:  # received into its microbatch's buffer, kept (``pipelining_kept``)
            self.state.keep(self.stage_of[dst], sent)
            self.fb.donate(buf, sent)
        if part is not None:
            sent = self.b._redistribute(self.fb, sent, name, part[1])
        if dst > src:
            self.act[(dst, a.microbatch)] = sent
        else:
            self.dys[(dst, a.microbatch)] = sent

    def _forward(self, a: Action) -> None:
        b, fb, c, m = self.b, self.fb, a.stage, a.microbatch
        if c == 0:
            x = self.mbs[(self.inputs[0], 0)][m]
        else:
            x = self.receive(self.act.pop((c, m)), c - 1, c, f"a{c}_{m}")
        self._cast_once(c)
        self._prefetch_next(self.stage_of[c])
        if c in self.prefetched:  # gathered ahead: taken over to the compute stream
            g = self.prefetched.pop(c)
            self.weights_of[c] = [g.take(w) for w in self.cw[c]]
            self.gathered.add(c)
        gathers = b.gather_early and c not in self.gathered
        f = self.cf[f"c{c}_fwd" + ("_gather" if gathers else "")]
        n_w = len(self.weights_of[c]) if gathers else 0
        n_l = int(b.keeps_logits(c))
        n_res = len(f.outputs) - 1 - n_w - n_l
        names = [f"a{c + 1}_{m}"] + [f"res{c}_{m}"] * n_res + [f"{w.name}_full" for w in self.cw[c]][:n_w]
        outs = fb.call(
            f, x, *self.chunk_args(c, m), n_out=len(f.outputs), names=names + [f"logits_{m}"] * n_l
        )
        self.res[(c, m)] = outs[1 : 1 + n_res]
        self.state.output(c, self.stage_of[c], outs[-1] if n_l else outs[0])
        if gathers:  # the whole compute copies, for the chunk's other calls this step
            self.gathered.add(c)
            self.weights_of[c] = list(outs[1 + n_res : len(outs) - n_l])
        if c < self.last:
            self.outbox[a] = (outs[0], c, c + 1, f"a{c + 1}_{m}")
        elif b.train:
            self.losses.append(outs[0])
            self.dys[(c, m)] = fb.op("FillLike", outs[0], names=[f"dloss_{m}"], value=1.0)[0]
        else:
            self.outputs_inf.append(outs[0])

    def _prefetching(self) -> bool:
        """``overlap_param_gather`` with model chunks (interleaved, communication streams): the
        chunks' weights gathered ahead as Megatron-LM's interleaved schedule launches each model
        chunk's parameter sync (``param_sync_func``, NeMo's and Megatron-LM's distributed
        optimizers; ``forward_backward_pipelining_with_interleaving`` in
        megatron/core/pipeline_parallel/schedules.py at f2e5db4): every rank's first two chunks
        before the first forward (``_prefetch_first``), each later one ``rank`` forward passes
        before the first forward of the chunk before it (``_prefetch_next``), so the gathers
        overlap the forwards — Megatron's schedule, so with ``megatron_ddp``. Otherwise each
        chunk's first forward gathers its weights layer by layer (``c<i>_fwd_gather``), as FSDP2
        under torch's pipeline schedules does (its gathers follow the modules' forwards)."""
        b = self.b
        return b.gather_early and b.comm_streams and b.s.v > 1 and b.megatron

    def _prefetch_first(self) -> None:
        """Every rank's first two chunks' weights handed to its gather stream, then gathered
        (``_prefetching``)."""
        if not self._prefetching():
            return
        p = self.b.s.p
        firsts = [c for c in range(min(2 * p, self.last + 1))]
        moved = {c: self._gathers(c) for c in firsts}
        for c in firsts:
            self.prefetched[c].gather_all(moved[c])

    def _prefetch_next(self, rank: int) -> None:
        """Before ``rank``'s next forward pass (its ``i``-th): the parameter sync Megatron-LM's
        schedule launches there — chunk ``j + 1``'s weights, where ``i + rank`` is the first
        forward of the rank's ``j``-th chunk in its group of p·v (``_prefetching``)."""
        i = self.forwards_done[rank]
        self.forwards_done[rank] += 1
        if not self._prefetching():
            return
        s = self.b.s
        x = i + rank
        if x >= s.k * s.v or x % s.p:
            return
        j = (x % (s.p * s.v)) // s.p + 1
        c = j * s.p + rank
        if 1 < j < s.v and c <= self.last and c not in self.gathered and c not in self.prefetched:
            g = self.prefetched[c] = _Gathers(self.b, self.fb, c, self._shards(c), [self.cw[c]], keep=True)
            g.gather_all(g.hand_over_all())

    def _gathers(self, c: int) -> list[Value]:
        """Chunk ``c``'s weights prefetched: their shards handed to the gather stream (the
        gathers issued by ``gather_all``)."""
        g = self.prefetched[c] = _Gathers(self.b, self.fb, c, self._shards(c), [self.cw[c]], keep=True)
        return g.hand_over_all()

    def _shards(self, c: int) -> dict[Value, Value]:
        return dict(zip(self.cw[c], self.weights_of[c], strict=True))

    def _cast_once(self, c: int) -> None:
        """``fp8_weight_cache``: chunk ``c``'s cached weights cast to float8 right before its
        first forward of the step (TE casts on the model chunk's first microbatch: Megatron's
        ``is_first_microbatch_for_model_chunk``), the copies what its calls take from then on
        (under ``overlap_param_gather`` the first forward casts them after its gathers)."""
        if c not in self.uncast:
            return
        self.uncast.discard(c)
        b, ws = self.b, self.weights_of[c]
        self.weights_of[c] = [
            b.f8_copy(self.fb, w, v, self.f8) if w in b.cached else v
            for w, v in zip(self.cw[c], ws, strict=True)
        ]

    def _has_dx(self, c: int) -> bool:
        v0 = self.by_chunk[c][0].vjp
        return v0 is not None and 0 in v0.wrt

    def _delay_sync(self, a: Action) -> None:
        """Chunk ``a.stage``'s gradients, complete with its last backward ``a``, reduced after
        the transfer of a later backward of its rank (``_Builder.delayed_sync``): ``a``'s own
        under 1F1B, the ``rank``-th after it when interleaved (its rank's last if fewer)."""
        rank = self.stage_of[a.stage]
        mine = self.backwards[rank]
        delay = rank if self.b.s.v > 1 else 0
        at = mine[min(mine.index(a) + delay, len(mine) - 1)]
        self.syncs_after.setdefault(at, []).append(a.stage)

    def _syncs(self, a: Action) -> None:
        """The delayed gradient reductions due after action ``a``'s transfer."""
        for c in self.syncs_after.pop(a, []):
            f = self.cf[f"c{c}_grad_sync"]
            got = self.acc[c]
            assert got is not None
            self.acc[c] = list(self.fb.call(f, *got, n_out=len(f.outputs), names=[f"g{c}"] * len(f.outputs)))

    def _backward(self, a: Action) -> None:
        """A full backward (B) or its input-gradient half (I, zero-bubble)."""
        fb, c, m = self.fb, a.stage, a.microbatch
        part = "i" if a.kind == "I" else ""
        base = f"c{c}_bwd" + ("_i" if part else "")
        prev = self.acc[c]
        red = "" if part else self.red(c)
        if red and self.b.delayed_sync(c):
            red = ""
            self._delay_sync(a)
        f = self.cf[base + ("_acc" if prev is not None and not part else "") + red]
        dy = self.dys.pop((c, m))
        if c < self.last:
            dy = self.receive(dy, c + 1, c, f"dy{c}_{m}")
        kept = self.kept.pop((c, m), None)
        if kept is not None:  # the engine restores the sent output whole before the backward
            self.b._redistribute(fb, kept[0], f"out{c}_{m}", kept[1])
        args = [*self.chunk_args(c, m), *self.res.pop((c, m)), dy]
        if prev is not None and not part:
            args.extend(prev)
        outs = fb.call(f, *args, n_out=len(f.outputs), names=[f"d{c}_{m}"] * len(f.outputs))
        has_dx = self._has_dx(c)
        rest = outs[1:] if has_dx else outs
        if part:
            self.carried[(c, m)] = tuple(rest)
        else:
            self.acc[c] = list(rest)
        if has_dx and c > 0:
            self.outbox[a] = (outs[0], c, c - 1, f"dy{c - 1}_{m}")
            self.state.keep(self.stage_of[c], outs[0])  # the receive buffer's ``.grad``

    def _weight_grads(self, a: Action) -> None:
        """The weight-gradient half of a zero-bubble backward (W)."""
        c, m = a.stage, a.microbatch
        prev = self.acc[c]
        f = self.cf[f"c{c}_bwd_w" + ("_acc" if prev is not None else "") + self.red(c)]
        args = [*self.carried.pop((c, m)), *(prev or [])]
        self.acc[c] = list(self.fb.call(f, *args, n_out=len(f.outputs), names=[f"g{c}_{m}"] * len(f.outputs)))


def _pipe_partition(b: _Builder, args: Sequence[Any]) -> tuple[str, str] | None:
    """DeepSpeed's partitioned pipeline transfers (``pipe_partitioned``/``grad_partitioned``,
    on by default, with t > 1: ``PipelineEngine._exec_forward_pass``/``_exec_backward_pass``,
    ``deepspeed/runtime/pipe/engine.py``; ``PartitionedTensor``, ``runtime/utils.py``): each
    tensor-parallel rank sends its 1/t part of the activation (or its gradient), the receiver
    all-gathers it whole over the tensor-parallel group (``PartitionedTensor.full``), and the
    sender all-gathers its own output again before that microbatch's backward. The (part,
    whole) placements of the activation at a chunk boundary (``args``: the next chunk's first
    layer's argument types), or None: one rank per tensor-parallel group, or an activation
    already sharded over tp or with no dimension t divides."""
    t = args[0] if args else None
    if b.s.t == 1 or not isinstance(t, DTensorType) or [ax for ax, _n in t.mesh.axes][-1] != "tp":
        return None
    *rest, tp = t.placements
    if not isinstance(tp, Replicate):
        return None
    sharded = {p.dim for p in rest if isinstance(p, Shard)}
    dims = [d for d in range(len(t.shape) - 1, -1, -1) if d not in sharded and t.shape[d] % b.s.t == 0]
    if not dims:
        return None
    return placement_text(*rest, Shard(dims[0])), placement_text(*rest, Replicate())


class _Gathers:
    """ZeRO-3's parameter gathers in a chunk function (FSDP's ``forward_prefetch`` /
    ``BACKWARD_PRE`` prefetch): each layer's weight shards are all-gathered right before it runs
    (forward, and again in the backward), the full weight freed after its use. With
    communication streams the gather runs on the stage's ``dp_gather`` stream one layer ahead —
    the next layer's gather is issued before this layer's compute and taken over to the compute
    stream right before that layer — so it overlaps compute; without, it blocks."""

    def __init__(
        self,
        b: _Builder,
        fb: FunctionBuilder,
        c: int,
        wp: dict[Value, Value],
        order: list[list[Value]],
        keep: bool = False,
    ) -> None:
        self.b, self.fb, self.wp, self.order = b, fb, wp, order
        # keep: gathered once and kept for the chunk's later layers (``overlap_param_gather``)
        self.keep = keep
        self.kept: dict[Value, Value] = {}
        self.on = (b.s.zero == 3 or keep) and b.s.d * b.s.c > 1
        self.stage = c % b.s.p
        self.stream = b.comm_meshes[("dp_gather", self.stage)] if b.comm_streams and self.on else None
        self.home = b.meshes[self.stage]
        self.ready: dict[Value, Value] = {}  # weight -> its full copy on the gather stream
        self.taken: dict[Value, Value] = {}  # weight -> its full copy for the layer running next
        self.last_taken: dict[Value, Value] = {}  # weight -> the last full copy taken
        self.prefetch_ws: list[Value] = []  # ``hand_over_all``'s weights

    def _needs(self, i: int) -> list[Value]:
        if i >= len(self.order):
            return []
        ws = dict.fromkeys(u for u in self.order[i] if u in self.wp)
        return [w for w in ws if self.b._zdim(w) is not None and w not in self.ready and w not in self.kept]

    def _issue(self, ws: Sequence[Value]) -> None:
        """A layer's shards handed to the gather stream together, then gathered there: a hand-over
        touches both streams, so one written after a gather would hold the compute stream until
        that gather ends. The layer's gathers are one coalesced call (FSDP all-gathers a unit's
        flat parameter in one collective, Megatron-LM a bucket of its contiguous parameter
        buffer): the first pays the call's latency, the others their bytes."""
        self._gather(ws, self._hand_over(ws))

    def _hand_over(self, ws: Sequence[Value]) -> list[Value]:
        """The shards of ``ws`` sent to the gather stream (``_issue``)."""
        text = self.b._mesh_attr(self.b._mesh_for(self.stage, "dp_gather"))
        attrs = self.b._attrs("mesh", text)
        return [self.fb.emit("MeshSend", (self.wp[w],), attrs, (w.name,))[0] for w in ws]

    def _gather(self, ws: Sequence[Value], moved: Sequence[Value]) -> None:
        """The shards ``moved`` to the gather stream gathered there, one call (``_issue``)."""
        assert self.stream is not None
        for i, (w, v) in enumerate(zip(ws, moved, strict=True)):
            v = self._cast_in(w, v)
            self.ready[w] = self.b._zero3_gather(self.fb, w, v, self.stream, coalesced=i > 0)

    def _cast_in(self, w: Value, shard: Value) -> Value:
        """``gather_cast``: ``w``'s fp32 ``shard`` cast to the compute dtype on the stream about
        to gather it (FSDP's copy-in), or to float8 (``float8_gather``); else ``shard`` itself."""
        if not (self.b.gather_cast and self.b._zdim(w) is not None):
            return shard
        if w in self.b.f8_gathered:
            attrs = Attrs({"to": CACHE_DTYPE, "scaling": PRECOMPUTED_SCALING, "layouts": 1})
            return self.fb.emit(FLOAT8_CAST.name, (shard,), attrs, (f"{w.name}_f8",))[0]
        return cast(self.fb, shard, self.b.compute, f"{w.name}_{self.b.compute}")

    def hand_over_all(self) -> list[Value]:
        """A prefetch's first half: every weight's shard handed to the gather stream."""
        assert self.stream is not None
        self.prefetch_ws = [w for i in range(len(self.order)) for w in self._needs(i)]
        return self._hand_over(self.prefetch_ws)

    def gather_all(self, moved: Sequence[Value]) -> None:
        """A prefetch's second half: the handed shards (``hand_over_all``) gathered in one
        call, each weight taken over to the compute stream later (``take``)."""
        self._gather(self.prefetch_ws, moved)

    def before(self, i: int, between: Callable[[], None] | None = None) -> None:
        """Layer ``i`` (of ``order``) runs next: with a stream, its gathers (unless prefetched)
        are issued and its weights handed back to the compute stream, then ``between`` runs (the
        backward's deferred reductions, ``one_dp_stream``), then the next layer's gathers are
        issued — in that order, since a hand-over (either way) written after a collective on the
        gather stream would hold the compute stream until it ends: the next layer's shards are
        handed over before ``between``, their gather issued after it."""
        self.taken = {}
        nxt: list[Value] = []
        moved: list[Value] = []
        if self.stream is not None:
            self._issue(self._needs(i))
            for w in dict.fromkeys(u for u in self.order[i] if u in self.wp):
                self.take(w)
            nxt = self._needs(i + 1)
            moved = self._hand_over(nxt)
        if between is not None:
            between()
        if self.stream is not None:
            self._gather(nxt, moved)

    def take(self, w: Value) -> Value:
        """The full weight ``w`` for the layer about to run."""
        if not self.on:
            return self.wp[w]
        if w in self.kept:
            return self.kept[w]
        got = self._take(w)
        if self.keep and w in self.b.cached:  # TE's weight cache: cast once, right after the gather
            got = self.b.f8_copy(self.fb, w, got)
        self.last_taken[w] = got
        if self.keep:
            self.kept[w] = got
        return got

    def _take(self, w: Value) -> Value:
        if self.stream is None:
            shard = self._cast_in(w, self.wp[w])
            return self._copied_out(w, self.b._zero3_gather(self.fb, w, shard, self.home))
        if w in self.taken:  # read twice by one layer
            return self.taken[w]
        got = self.ready.pop(w, None)
        if got is None:  # not sharded by ZeRO (no dimension divides): used as it is (HSDP: viewed)
            return self.b._zero3_gather(self.fb, w, self.wp[w], self.home) if self.b.viewed else self.wp[w]
        text = self.b._mesh_attr(self.home)
        got = self.fb.emit("MeshSend", (got,), self.b._attrs("mesh", text), (w.name,))[0]
        self.taken[w] = self._copied_out(w, got)
        return self.taken[w]

    def _copied_out(self, w: Value, gathered: Value) -> Value:
        """``gathered`` copied into the parameter's storage on the compute stream (FSDP2's
        copy-out, ``distribute(gather_copy_out=True)``), or itself."""
        if not self.b.gather_copy_out or self.b._zdim(w) is None:
            return gathered
        return self.fb.emit("Identity", (gathered,), Attrs(), (f"{w.name}_out",))[0]


class _ModuleGathers:
    """DeepSpeed ZeRO-3's module-by-module fetch in a chunk function (``zero3_fetch``,
    ``distir.parallel.zero3_fetch``): the layers' bodies (``bodies``: each layer function and its
    arguments, the chunk's weights among them as the model's weight values) are written inline,
    and a *module* is a run of consecutive ops reading the same weights. Before a module's first
    op its weights not yet gathered are all-gathered (one call) and taken over to the compute
    stream; then ``between`` runs (the deferred gradient reductions, ``one_dp_stream``); then
    its prefetch is gathered (one call) — ``plan_fetches`` says which weights each does and
    which it releases. A released weight's gathered copy is read no more (the simulator frees it
    after its last read); its next module gathers it again. Weights DeepSpeed keeps whole
    (``persistence``: fewer elements; or none of whose dimensions ZeRO can shard) are gathered
    once, at the function's start, in one call. Without communication streams every gather
    runs on the compute stream where the plan issues it."""

    def __init__(
        self,
        b: _Builder,
        fb: FunctionBuilder,
        c: int,
        wp: dict[Value, Value],
        bodies: Sequence[tuple[Function, Sequence[Value]]],
        between: Callable[[], None] | None = None,
    ) -> None:
        cfg = b.ds_fetch
        assert cfg is not None
        self.b, self.fb, self.wp, self.between = b, fb, wp, between
        stage = c % b.s.p
        self.stream = b.comm_meshes[("dp_gather", stage)] if b.comm_streams else None
        self.home = b.meshes[stage]
        ids = {w: k for k, w in enumerate(wp)}
        self.weights = list(wp)
        numel = {k: b.model.weight(w.name).type.numel for w, k in ids.items()}
        whole = frozenset(k for w, k in ids.items() if b._zdim(w) is None or numel[k] < cfg.persistence)
        # per module: where it starts (layer, op) and the weights it reads
        self.starts: dict[tuple[int, int], int] = {}
        trace: list[list[int]] = []
        for i, (fn, args) in enumerate(bodies):
            of = {p: ids[a] for p, a in zip(fn.params, args, strict=True) if a in wp}
            last: list[int] | None = None
            for k, instr in enumerate(fn.body):
                used = list(dict.fromkeys(of[v] for v in instr.inputs if v in of))
                if not used or used == last:
                    continue
                self.starts[(i, k)] = len(trace)
                trace.append(used)
                last = used
        self.trace, self.plan = trace, plan_fetches(trace, numel, whole, cfg)
        self.bodies = bodies
        self.ready: dict[Value, Value] = {}  # weight -> its gathered copy not yet taken
        self.taken: dict[Value, Value] = {}  # weight -> its gathered copy on the compute stream
        self.kept: dict[Value, Value] = {}  # weights kept whole (gathered at the start)
        self._gather_kept([self.weights[k] for k in sorted(whole) if b._zdim(self.weights[k]) is not None])
        self.done = -1  # the last module fetched
        self.queued: list[tuple[list[Value], list[Value]]] = []  # gather calls issued, not written
        # every gathered weight's shard handed to the gather stream at the start (``_fetch``)
        gw = [self.weights[k] for k in sorted({k for t in trace for k in t} - whole)]
        self.moved = dict(zip(gw, self._hand_over(gw), strict=True)) if self.stream is not None else {}

    def _gather_kept(self, ws: Sequence[Value]) -> None:
        self._gather(ws)
        for w in ws:
            self.kept[w] = self._take(w)

    def _gather(self, ws: Sequence[Value]) -> None:
        """``ws`` all-gathered in one call (on the gather stream, their shards handed over first)."""
        if self.stream is None:
            for j, w in enumerate(ws):
                self.ready[w] = self.b._zero3_gather(self.fb, w, self.wp[w], self.home, coalesced=j > 0)
            return
        self._gather_moved(ws, self._hand_over(ws))

    def _hand_over(self, ws: Sequence[Value]) -> list[Value]:
        """The shards of ``ws`` handed to the gather stream one way (``event``: the stream waits
        for the compute stream, never the reverse, as ``ProcessGroupNCCL`` syncs its stream)."""
        if self.stream is None or not ws:
            return []
        text = self.b._mesh_attr(self.stream)
        attrs = self.b._made_attrs.get(("mesh+event", text))
        if attrs is None:
            attrs = self.b._made_attrs[("mesh+event", text)] = Attrs({"mesh": text, "event": True})
        return [self.fb.emit("MeshSend", (self.wp[w],), attrs, (w.name,))[0] for w in ws]

    def _gather_moved(self, ws: Sequence[Value], moved: Sequence[Value]) -> None:
        if self.stream is None:
            self._gather(ws)
            return
        for j, (w, v) in enumerate(zip(ws, moved, strict=True)):
            self.ready[w] = self.b._zero3_gather(self.fb, w, v, self.stream, coalesced=j > 0)

    def _take(self, w: Value) -> Value:
        got = self.ready.pop(w)
        if self.stream is None:
            return got
        return self.fb.emit(
            "MeshSend", (got,), self.b._attrs("mesh", self.b._mesh_attr(self.home)), (w.name,)
        )[0]

    def _fetch(self, m: int) -> None:
        """Module ``m`` runs next (the previous module's releases first): its fetch queued, the
        queued calls up to the one holding its last weight written, its weights taken over,
        ``between`` (where it takes any: nothing is written between the ops of a module of
        whole weights, a norm or a bias, which would split a fused kernel), and its prefetch
        queued. Gathers are issued where DeepSpeed issues them but written where a module first
        needs them, in issue order: the simulator's streams run in the order written and a
        hand-over waits for everything written on its source stream before it, while DeepSpeed's
        compute waits for its module's own collective (``handle.wait()``), which NCCL runs after
        those issued before it only; written at issue, a deep prefetch would hold each module
        for the prefetches issued after its own. For the same reason every shard is handed to
        the gather stream at the function's start (``__init__``): DeepSpeed's all-gather reads
        the shard where it lies and waits for no compute (``ProcessGroupNCCL`` syncs its stream
        with the gather stream, not the compute stream), while a hand-over written later would
        hold the gather stream until the compute stream reached it; the copies it makes are
        counted from the start to their gather (together 1/d of the chunk's gathered weights)."""
        if self.done >= 0:
            for k in self.plan[self.done].release:
                self.taken.pop(self.weights[k], None)
        self.done = m
        step: FetchStep = self.plan[m]
        self._issue([self.weights[k] for k in step.fetch])
        need = [
            w
            for w in (self.weights[k] for k in self.trace[m])
            if w not in self.kept and w not in self.taken and self.b._zdim(w) is not None
        ]
        self._write(need)
        for w in need:
            self.taken[w] = self._take(w)
        if self.between is not None and need:
            self.between()
        self._issue([self.weights[k] for k in step.prefetch])

    def _issue(self, ws: Sequence[Value]) -> None:
        """One gather call issued, queued until a module needs it (``_write``)."""
        if ws:
            self.queued.append((list(ws), [self.moved[w] for w in ws] if self.stream is not None else []))

    def _write(self, need: Sequence[Value]) -> None:
        """The queued calls up to the last one holding a weight of ``need`` written, in order."""
        last = max((n for n, (ws, _) in enumerate(self.queued) if any(w in need for w in ws)), default=-1)
        for ws, moved in self.queued[: last + 1]:
            self._gather_moved(ws, moved)
        del self.queued[: last + 1]

    def finish(self) -> None:
        """The function's end: the calls still queued written (none when the trace ends in the
        function, as it does: the last modules prefetch nothing)."""
        self._write([w for ws, _ in self.queued for w in ws])

    def _value(self, w: Value) -> Value:
        """The whole weight ``w`` for the op about to be written."""
        got = self.kept.get(w)
        if got is None:
            got = self.taken.get(w) if self.b._zdim(w) is not None else self.wp[w]
        assert got is not None, f"{w.name} read but not fetched"
        return got

    def run(
        self, i: int, args: Sequence[Value], produced: Callable[[int, Value], None] | None = None
    ) -> list[Value]:
        """Layer ``i``'s body written inline on ``args`` (its weights as the model's weight
        values); ``produced(k, v)``: output ``k`` is ``v``, called as soon as the op making it is
        written (an output no op makes, once the body is written). Returns the outputs."""
        fn = self.bodies[i][0]
        vmap = ValueMap()
        weight_of: dict[Value, Value] = {}
        for p, a in zip(fn.params, args, strict=True):
            if a in self.wp:
                weight_of[p] = a
            else:
                vmap.bind(p, a)
        outs: dict[Value, list[int]] = {}
        for k, o in enumerate(fn.outputs):
            outs.setdefault(o, []).append(k)
        told: set[int] = set()

        def value(v: Value) -> Value:
            w = weight_of.get(v)
            return vmap(v) if w is None else self._value(w)

        for k, instr in enumerate(fn.body):
            m = self.starts.get((i, k))
            if m is not None:
                self._fetch(m)
            self.fb.append(copy_instr(instr, value))
            if produced is not None:
                for o in instr.outputs:
                    for j in outs.get(o, ()):
                        produced(j, vmap(o))
                        told.add(j)
        result = [value(o) for o in fn.outputs]
        if produced is not None:
            for j, r in enumerate(result):
                if j not in told:
                    produced(j, r)
        return result


class _GradSink:
    """Where a chunk's backward puts each weight gradient once it is complete — a tied weight's
    once every use in the chunk has added its part: reduced in buckets (``_Buckets``), or added
    into the accumulated ones right away (as a trainer accumulates into ``.grad``), or, with
    ``fp32_grad_accum``, cast and added into its fp32 sum after the whole backward
    (``BF16_Optimizer.update_hp_grads`` runs after ``autograd.backward``)."""

    def __init__(
        self,
        b: _Builder,
        fb: FunctionBuilder,
        ws: list[Value],
        layers: list[ShardedLayer],
        acc: bool,
        buckets: _Buckets | None,
    ) -> None:
        self.b, self.fb, self.ws, self.acc, self.buckets = b, fb, ws, acc, buckets
        self.grads: dict[Value, Value] = {}
        self.accs: dict[Value, Value] = {}
        self.left = Counter(w for L in layers for w in L.weights)  # uses still to differentiate
        self.uses = Counter(self.left)
        self.partial: dict[Value, Value] = {}  # a tied weight's gradient from its later uses
        self.late: list[tuple[Value, Value]] = []  # fp32 accumulation: added after the backward
        self.summed: set[Value] = set()  # ``grad_accum_fusion``: accumulated by the layer's GEMM

    def fused(self, L: ShardedLayer, fn: Function, first: int) -> tuple[Function, list[Value]]:
        """The backward ``fn`` of layer ``L`` (its weight gradients from output ``first`` on)
        to call, and the arguments to append: with ``grad_accum_fusion`` the layer's variant
        whose weight-gradient GEMMs write fp32 and, from the second microbatch on, add into the
        accumulated sums it takes (``distir.parallel.grad_accum_fusion``) — for each weight
        the chunk uses once and the layer leaves as it is (not summed over tp here); else
        ``fn`` itself."""
        b = self.b
        if not b.gaf:
            return fn, []
        pending = L.tp_pending or (False,) * len(L.weights)
        which = [
            j
            for j in wgrad_products(fn, first)
            if self.uses[L.weights[j]] == 1 and not (pending[j] and L.weights[j] not in b.tp_pending)
        ]
        if not which:
            return fn, []
        accs = self._accumulators()
        tag = "" if which == list(wgrad_products(fn, first)) else "_" + "-".join(map(str, which))
        name = f"{fn.name}_gaf{'_acc' if accs else ''}{tag}"
        got = b.functions.get(name)
        if got is None:
            got = fused_backward(fn, first, which, b.prec.master, bool(accs))
            got = b.functions[name] = Function(name, got.params, got.body, got.outputs)
        self.summed.update(L.weights[j] for j in which)
        return got, [accs[L.weights[j]] for j in which] if accs else []

    def _accumulators(self) -> dict[Value, Value]:
        """The accumulated gradients the chunk's backward takes (parameters after the others;
        none in a microbatch's first backward)."""
        if self.buckets is not None:
            return self.buckets.accumulators()
        if self.acc and not self.accs:  # after the other parameters (the call sites pass them last)
            self.accs.update((w, self.fb.param(f"acc_{w.name}")) for w in self.ws)
        return self.accs

    def done(self, L: ShardedLayer, outs: Sequence[Value]) -> None:
        """Layer ``L``'s weight gradients ``outs`` are computed."""
        if len(outs) != len(L.weights):
            raise ValueError(f"{len(outs)} gradients for the {len(L.weights)} weights of layer {L.index}")
        self.done_some(L, list(enumerate(outs)))

    def done_some(self, L: ShardedLayer, got: Sequence[tuple[int, Value]]) -> None:
        """Some of layer ``L``'s weight gradients are computed: ``(j, g)``, the gradient ``g``
        of its ``j``-th weight (``done`` gives them all at once; DeepSpeed's fetch one by one, as
        the backward makes them)."""
        fb = self.fb
        ready: list[tuple[Value, Value]] = []
        pending = L.tp_pending or (False,) * len(L.weights)
        for j, g in got:
            w, tp_sum = L.weights[j], pending[j]
            if tp_sum and w not in self.b.tp_pending:  # another use left it whole: sum it here
                g = self.b._redistribute(fb, g, g.name, self.b.grad_layout(w))
            prev = self.partial.pop(w, None)
            g = g if prev is None else fb.op("Add", prev, g, names=[f"g_{w.name}"])[0]
            self.left[w] -= 1
            if self.left[w]:
                self.partial[w] = g
            else:
                ready.append((w, g))
        if self.buckets is not None:
            gs = [g if w in self.summed else self.b._accum_cast(fb, w, g) for w, g in ready]
            self.buckets.add([w for w, _ in ready], gs, self.summed)
            return
        self._accumulators()
        if self.b.fp32_acc and not (self.b.fsdp2_grad_accum or self.b.gaf):
            self.late.extend(ready)
            return
        for w, g in ready:  # ``fsdp2_grad_accum``, ``grad_accum_fusion``: cast and added now
            self.grads[w] = g if w in self.summed else self._add(w, self.b._accum_cast(fb, w, g))

    def _add(self, w: Value, g: Value) -> Value:
        return self.fb.op("Add", self.accs[w], g, names=[f"g_{w.name}"])[0] if self.acc else g

    def release(self) -> None:
        """The reductions a deferring bucket holds back, issued now (``_Buckets.release``)."""
        if self.buckets is not None:
            self.buckets.release()

    def results(self) -> list[Value]:
        """The chunk's weight gradients in its weight order (reduced, with buckets)."""
        if self.buckets is not None:
            return list(self.buckets.results())
        for w, g in self.late:
            self.grads[w] = self._add(w, self.b._accum_cast(self.fb, w, g))
        return [self.grads[w] for w in self.ws]


class _Buckets:
    """Gradients reduced over ``dp`` in buckets while the backward runs (PyTorch DDP's
    ``bucket_cap_mb``; DeepSpeed ZeRO-2's ``reduce_bucket_size``; FSDP's per-module
    reduce-scatter): a layer's weight gradients join the open bucket as its backward completes
    them, and once the bucket holds ``bucket_bytes`` each of its gradients is reduced — sent to
    the stage's ``dp_reduce`` stream first when the program has communication streams, so the
    reduction overlaps the rest of the backward; the hand-over is one way (``MeshSend`` with
    ``event=true``: the stream waits for the gradient, the backward does not wait for reductions
    queued on the stream) but for FSDP2, whose compute waits for the previous reduction
    (``grad_reduction.handover_waits_one_way``). ZeRO-2/3 reduce-scatter (to this rank's shard)
    in every microbatch's backward and add the shard into the accumulated shard, so no replica
    holds the whole gradient; DDP / ZeRO-0/1 add the microbatch's gradient to the accumulated one
    and all-reduce the sum, in the last microbatch's backward, and ZeRO-2 under a pipeline
    reduce-scatters the sum there (``reduce_scatter_every_backward``). HSDP reduce-scatters within the
    shard group and accumulates the shard, a pending sum across the groups, which the ``final``
    backward all-reduces across them. A bucket is one collective call over a flat buffer, as the
    trainers issue it (DDP's and Megatron-LM's contiguous gradient buckets, DeepSpeed's IPG
    bucket, FSDP's flat parameter): its first gradient's Redistribute pays the call's latency,
    the others are ``coalesced`` parts (their bytes only). Results: the reduced gradients in the
    chunk's weight order (on the ``dp_reduce`` stream's mesh with communication streams)."""

    def __init__(
        self,
        b: _Builder,
        fb: FunctionBuilder,
        c: int,
        ws: list[Value],
        acc: bool,
        final: bool = True,
        defer: bool = False,
        root: frozenset[Value] = frozenset(),
    ) -> None:
        self.b, self.fb, self.ws, self.final = b, fb, ws, final
        # the root unit's gradients (``_Builder._root_weights``): held back, reduced together last
        self.root = root
        self.held: list[tuple[Value, Value]] = []
        self.scatter = reduce_scatter_every_backward(b.s)
        # Megatron-LM buckets the first model chunk of the first stage only: every other chunk's
        # gradients are one bucket, reduced after its last backward (``megatron_ddp``)
        self.one_bucket = b.megatron and c > 0
        # torch.distributed.pipelining's post-backward: the groups reduced after the backward
        self.late = b.late_post_backward and not self.scatter
        self.groups: list[list[tuple[Value, Value]]] = []
        stage = self.stage = c % b.s.p
        # ``one_dp_stream``: on the gathers' stream; a full bucket waits for ``release``
        self.stream_name = "dp_gather" if b.one_dp_stream else "dp_reduce"
        self.defer = defer
        self.stream = b.comm_meshes[(self.stream_name, stage)] if b.comm_streams else None
        self.stream_text = b._mesh_attr(self.stream) if self.stream is not None else ""
        # the hand-over to the stream: one way (the stream waits for the gradient) but for FSDP2
        # (``handover_waits_one_way``)
        self.handover = self._handover_attrs() if self.stream is not None else Attrs({})
        self.acc = acc
        self.accs: dict[Value, Value] = {}
        self.pending: list[tuple[Value, Value]] = []
        self.size = 0.0
        self.out: dict[Value, Value] = {}
        # DeepSpeed's ZeRO-3 (``zero3_fetch``): a gradient that would take a non-empty bucket past
        # its size closes it first (``reduce_independent_p_g_buckets_and_remove_grads``); the
        # closed buckets wait for ``release``
        self.ds_rule = b.ds_fetch is not None
        self.closed: list[list[tuple[Value, Value]]] = []

    def accumulators(self) -> dict[Value, Value]:
        """The accumulated gradients (parameters after the others; none in the first backward)."""
        if self.acc and not self.accs:
            self.accs = {w: self.fb.param(f"acc_{w.name}") for w in self.ws}
        return self.accs

    def add(
        self,
        weights: Sequence[Value],
        grads: Sequence[Value],
        summed: set[Value] | frozenset[Value] = frozenset(),
    ) -> None:
        """A layer's weight gradients are complete (those of ``summed`` already added into the
        accumulated ones: ``grad_accum_fusion``)."""
        self.accumulators()
        if self.late:
            self.groups.append([])
        for w, g in zip(weights, grads, strict=True):
            if self.accs and not self.scatter and w not in summed:  # DDP: the microbatches' sum, reduced once
                (g,) = self.fb.op("Add", self.accs[w], g, names=[f"g_{w.name}"])
            if self.b.grad_copy_in == "copy":  # FSDP1: autograd writes the flat gradient at once
                g = self._copied_in(w, g)
            if w in self.root:
                self.held.append((w, g))
                continue
            if self.late:
                self.groups[-1].append((w, g))
                continue
            size = self.b._grad_bytes(w)
            if self.ds_rule and self.pending and self.size + size > self.b.bucket_bytes:
                self.closed.append(self.pending)
                self.pending, self.size = [], 0.0
            self.pending.append((w, g))
            self.size += size
        if not self.defer:
            self.release()

    def release(self) -> None:
        """The open bucket reduced if it is full (DeepSpeed's rule: the closed buckets)."""
        if self.ds_rule:
            for bucket in self.closed:
                self.flush(bucket)
            self.closed = []
            return
        if self.size >= self.b.bucket_bytes and not self.one_bucket and not self.late:
            self.flush()

    def _copied_in(self, w: Value, g: Value) -> Value:
        """``g`` copied into the bucket's flat buffer on the compute stream (``grad_copy_in``):
        ``cast`` (FSDP2's ``chunk_cat``) writes it in the reduce dtype under ``reduce_fp32``;
        ``copy`` (FSDP1's flat gradient) in the compute dtype; else ``g`` itself. ``copy`` is
        written as the layer's gradients complete (``add``: autograd's own kernel, before the
        next layer's pre-backward hook waits for its gather), ``cast`` when the bucket is
        reduced (``flush``: FSDP2's post-backward hook; under ``one_dp_stream`` after the next
        layer's gather, whose wait also covers the wait FSDP2 makes for the previous
        reduce-scatter before the copy-in, ``reduce_scatter_state``, since that reduction is
        queued before the gather on the one stream)."""
        mode = self.b.grad_copy_in
        if mode == "cast" and self.b.reduce_fp32:
            master = self.b.prec.master
            return cast(self.fb, g, master, f"g_{w.name}_{master}")
        if mode:
            return self.fb.emit("Identity", (g,), Attrs(), (f"g_{w.name}_in",))[0]
        return g

    def flush(self, bucket: list[tuple[Value, Value]] | None = None) -> None:
        """The open bucket (or ``bucket``, a closed one) reduced, one call."""
        fb = self.fb
        cast_in = self.b.grad_copy_in == "cast"  # the copy-in already cast it (``_copied_in``)
        moved = []
        for w, g in self.pending if bucket is None else bucket:
            if cast_in:  # FSDP2: the post-backward hook's copy-in, right before the reduction
                g = self._copied_in(w, g)
            if self.b.megatron:
                g = self._megatron_prepared(w, g)
            if self.stream is not None:
                g = fb.emit("MeshSend", (g,), self.handover, (g.name,))[0]
            moved.append((w, g))
        for i, (w, g) in enumerate(moved):
            later = i > 0  # the bucket is one collective call: the first part pays its latency
            if self.b.reduce_fp32 and not cast_in:  # FSDP's reduce_dtype: cast on the reduction stream
                master = self.b.prec.master
                g = cast(fb, g, master, f"g_{w.name}_{master}")
            if self.b.hsdp:
                r = self._hsdp_scatter(w, g, later)
            elif self.b.cp_view:  # the pending sum over (dp, cp) seen over dp·cp, reduced there
                r = self.b._redistribute(fb, self._viewed(g), f"g_{w.name}", self.b._grad_target(w), later)
            else:
                r = self.b._redistribute(fb, g, f"g_{w.name}", self.b._grad_target(w), later)
            if self.accs and self.scatter:  # ZeRO-2/3: accumulated in the shard
                (r,) = fb.op("Add", self.accs[w], r, names=[f"g_{w.name}"])
            if self.b.hsdp and self.final:  # the accumulated shard, across the groups once
                r = self.b._redistribute(fb, r, f"g_{w.name}", "R, " + self.b._grad_target(w), later)
            if self.final and self.b.copied_in_backward(w):  # ZeRO-Offload: to the host at once
                r = self._offloaded(w, r)
            self.out[w] = r
        if bucket is None:
            self.pending, self.size = [], 0.0

    def _offloaded(self, w: Value, r: Value) -> Value:
        """``w``'s reduced partition ``r`` copied to the host (``_Builder.copied_in_backward``):
        handed back from the reduction stream without an event, so the compute stream waits for
        the reduction as DeepSpeed's host waits on its stream, then copied device to host."""
        b = self.b
        if self.stream is not None:
            r = b._mesh_send(self.fb, r, b._mesh_for(self.stage), f"g_{w.name}")
        return b._to_host(self.fb, w, r, self.stage)

    def _megatron_prepared(self, w: Value, g: Value) -> Value:
        """``w``'s gradient ``g`` as Megatron-LM's ``Bucket.start_grad_sync`` leaves it for the
        reduction (``megatron_ddp`` (4)), on the compute stream: the NaN check's norm, a
        reduction read once whose result only the host reads (a ``ReduceSum`` of every element:
        the same pass), then the in-place multiplication by ``gradient_scaling_factor`` (1/dp).
        distir's loss is normalized by the global batch already, so the ``Scale`` multiplies by
        1: it adds the kernel's time, not a change of value. Written per gradient, not per
        bucket: the bytes are the bucket's, the launches one per weight (Megatron: one per
        bucket). The norm is the gradient's first use, so the scale is a kernel of its own."""
        self.fb.op("ReduceSum", g, keepdims=0, names=[f"g_{w.name}_nan_norm"])
        return self.fb.op("Scale", g, alpha=1.0, names=[f"g_{w.name}_scaled"])[0]

    def _handover_attrs(self) -> Attrs:
        """The attributes of the ``MeshSend`` handing a gradient to the reduction stream, made
        once per stream: with ``event=true`` where the trainer's hand-over is one way."""
        if not handover_waits_one_way(self.b.grad_copy_in):
            return self.b._attrs("mesh", self.stream_text)
        key = ("mesh+event", self.stream_text)
        a = self.b._made_attrs.get(key)
        if a is None:
            a = self.b._made_attrs[key] = Attrs({"mesh": self.stream_text, "event": True})
        return a

    def _viewed(self, g: Value) -> Value:
        """``g`` on the weights' view of its mesh (of the ``dp_reduce`` stream, with one)."""
        b = self.b
        mesh = b._mesh_for(self.stage, self.stream_name if self.stream is not None else None)
        return self.fb.emit("MeshView", (g,), b._attrs("mesh", b._mesh_attr(mesh)), (g.name,))[0]

    def _hsdp_scatter(self, w: Value, g: Value, coalesced: bool = False) -> Value:
        """HSDP: ``w``'s pending gradient seen on the (dpr, dp, tp) mesh and reduce-scattered
        within the shard group (dp; a weight ZeRO does not shard: all-reduced within it), still
        a pending sum across the groups (dpr)."""
        b = self.b
        mesh = b._mesh_for(self.stage, self.stream_name if self.stream is not None else None)
        (g,) = self.fb.emit("MeshView", (g,), b._attrs("mesh", b._mesh_attr(mesh)), (g.name,))
        shard = b._grad_target(w)  # "S(z), <tp>"; "R, <tp>" for a weight ZeRO does not shard
        return b._redistribute(self.fb, g, f"g_{w.name}", "P(sum), " + shard, coalesced)

    def results(self) -> list[Value]:
        if self.late:  # ``_Builder.late_post_backward``: the root's group, then the blocks'
            for group in [self.held, *reversed(self.groups)]:
                self.pending = group
                self.flush()
            return [self.out[w] for w in self.ws]
        self.release() if self.ds_rule else None
        self.flush()
        if self.held:  # the root unit's post-backward: its gradients in one call, last
            self.pending = self.held
            self.flush()
        return [self.out[w] for w in self.ws]


__all__ = [
    "DDP_BUCKET_MB",
    "ShardedLayer",
    "distribute",
    "partition",
    "sharded_layers",
    "strip_types",
    "uniform_counts",
]
