"""When a strategy's data-parallel gradients are reduced, and so how much of them a replica holds.

Two ways of reducing gradients over the data-parallel replicas with gradient accumulation
(k microbatches per step), as the trainers run them:

- **in every backward** (``reduce_scatter_every_backward``): each microbatch's backward
  reduce-scatters its gradients in buckets and every replica adds the result into its shard of
  the accumulated gradient, so no replica ever holds the whole accumulated gradient — k
  reduce-scatters per step. ZeRO-2/3 without a pipeline run so: PyTorch FSDP without
  ``no_sync`` / FSDP2 with ``set_requires_gradient_sync(True)`` (the default), DeepSpeed's
  ZeRO-2 (``stage_1_and_2.py`` reduces into the partitions in every micro-step), Megatron-FSDP's
  ``optim_grads`` / ``optim_grads_params`` (``megatron_fsdp.py``: ``grad_reduce_every_bprop``).
- **in the last backward**: the microbatches' gradients accumulate whole on every replica and
  are reduced once per step, in the last microbatch's backward — all-reduced (DDP, ZeRO-0/1)
  or reduce-scattered to the replica's shard (ZeRO-2 under a pipeline).

ZeRO-2 under a pipeline (p > 1) accumulates whole, because no trainer shards the gradients of a
pipelined model between microbatches: DeepSpeed's ``PipelineEngine`` refuses ZeRO-2/3
(``deepspeed/runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism"); Megatron-LM's pipeline schedules run every microbatch but the last under the
model's ``no_sync`` (``megatron/core/pipeline_parallel/schedules.py``) and its distributed
optimizer keeps a whole gradient buffer and reduce-scatters it once
(``docs/source/api-guide/dist_optimizer.md``: "[no] distribute model gradients"); and
``torch.distributed.pipelining`` turns FSDP's gradient sync off for every backward
(``set_requires_gradient_sync(False)``) and reduce-scatters once after the last
(``_PipelineStageBase._post_backward``), as torchtitan runs FSDP with pipelining. ZeRO-3 keeps
its per-backward reduce-scatter here (its weights are gathered per use as well).

**The hand-over to the reduction stream.** A bucket passes from the compute stream to the
reduction stream one way: the reduction stream waits for the gradient, the compute stream goes on
(``MeshSend(..., event=true)``, ``handover_waits_one_way``), as the trainers enqueue it. PyTorch's
``ProcessGroupNCCL`` makes the NCCL stream wait for an event recorded on the current stream before
each collective (``syncStream``, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp) and never the
reverse at enqueue time, so DDP's ``Reducer`` and Megatron-LM's ``DistributedDataParallel``
(``start_grad_sync``'s asynchronous collective on a bucket of the persistent gradient buffer,
megatron/core/distributed/param_and_grad_buffer.py) let the backward run on while buckets queue,
and FSDP1 likewise (``_post_backward_hook``: the post-backward stream waits for the current
stream, torch/distributed/fsdp/_runtime_utils.py). The compute stream waits for the reductions
only where it reads their results: ``finish_grad_sync`` / the optimizer step (the results come
back by an ordinary ``MeshSend``, which waits for the reduction stream). FSDP2 (``grad_copy_in =
"cast"``) also makes the compute wait, for memory: each group's ``post_backward`` first waits for
the previous group's reduce-scatter (``comm_ctx.reduce_scatter_state.event``, so one reduce-scatter
input is in flight at a time; torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py), so its
hand-over stays two-way — with reductions on their own stream, waiting for that stream is waiting
for the previous bucket's reduction (FSDP2 waits before its copy-in, distir after it). DeepSpeed's
ZeRO-1/2 with ``overlap_comm`` waits both ways as well (``average_tensor``: each stream waits for
the other, deepspeed/runtime/zero/stage_1_and_2.py); distir's pipelined DeepSpeed engine
(``deepspeed_pipe``) reduces after the backward on the compute stream, without buckets.
"""

from __future__ import annotations

from distir.parallel.strategy import Strategy


def reduce_scatter_every_backward(s: Strategy) -> bool:
    """Whether ``s``'s gradients are reduce-scattered in every microbatch's backward, each
    replica accumulating only its shard (module docstring); False: they accumulate whole and
    are reduced in the last microbatch's backward."""
    return s.zero == 3 or (s.zero == 2 and s.p == 1)


def handover_waits_one_way(grad_copy_in: str) -> bool:
    """Whether a gradient bucket passes to its reduction stream by a one-way hand-over (the
    reduction stream waits for the gradient, the compute does not wait for the reduction stream):
    every trainer but FSDP2 (``grad_copy_in == "cast"``), whose post-backward waits for the
    previous reduce-scatter (module docstring)."""
    return grad_copy_in != "cast"


__all__ = ["handover_waits_one_way", "reduce_scatter_every_backward"]
