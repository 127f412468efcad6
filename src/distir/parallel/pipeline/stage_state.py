"""What ``torch.distributed.pipelining``'s stages hold through a training step
(``distribute(pipelining_kept=...)``), written into the entry as liveness.

``_PipelineStageBase`` (torch/distributed/pipelining/stage.py; read in torch 2.6.0, the release
of the December 2024 torch that torchtitan's records cite) keeps per microbatch, from the moment
it has it until the next step's ``clear_runtime_states``:

- the stage's output (``forward_one_chunk`` appends it to ``output_chunks``, read by
  ``get_fwd_send_ops`` and merged at the step's end): on every stage up to pytorch#153383 (May
  2025: "only used for last stage"), after it on the last stage only, whose output is the
  model's output, the logits the loss function takes (``_maybe_compute_loss`` runs it inside the
  schedule; ``backward_one_chunk`` detaches the output but keeps its storage);
- the activation it receives and the gradient it receives: each microbatch has its own receive
  buffer (``_prepare_forward_infra`` and ``_create_grad_recv_info`` allocate one per
  microbatch; the schedule never frees them: pytorch#136380 asks for fewer);
- the gradient of its received input: ``stage_backward`` runs ``torch.autograd.backward``, which
  accumulates it into the receive buffer's ``.grad``, cleared only by ``clear_runtime_states``
  (later torch, 2.13 here, sets it to None once a full backward has read it in
  ``torch/distributed/pipelining/_backward.py``; its split input pass, zero-bubble's, still
  keeps it: this is the earlier behaviour, which the modes here model).

And at the end of ``step`` the last stage returns ``_merge_outputs(output_chunks)``
(``merge_chunks``: ``torch.cat`` of every microbatch's output), which torchtitan's ``train.py``
drops: one transient tensor of all the microbatches' logits.

Here the kept values are results of the step, after its own (they outlive it), so the plan keeps
each live from its making to the step's end; the receive buffers are also parameters of the step
(they persist between steps), one per microbatch on the stream that receives (torch allocates
them on the compute stream: the same bytes in another pool), each donated to the value received
into it, so each holds its bytes from the step's start; the merge is a
``Concat`` of the kept logits along an axis no placement shards, freed at once.
"""

from __future__ import annotations

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.types import Type
from distir.ir.values import Value

# ``distribute(pipelining_kept=...)``: off, every stage's outputs kept (torch before
# pytorch#153383, as the December 2024 torchtitan records ran), the last stage's only (after it)
PIPELINING_KEPT = ("", "every", "last")


class StepState:
    """The values a pipeline's stages keep until the step's end, per stage (rank): ``mode`` is
    ``distribute``'s ``pipelining_kept`` (``""``: nothing is kept)."""

    def __init__(self, mode: str, last_chunk: int) -> None:
        if mode not in PIPELINING_KEPT:
            raise ValueError(f"pipelining_kept must be one of {PIPELINING_KEPT}, got {mode!r}")
        self.mode, self.last_chunk = mode, last_chunk
        self.kept: dict[int, list[Value]] = {}
        self.logits: list[Value] = []

    @property
    def on(self) -> bool:
        return bool(self.mode)

    def keep(self, stage: int, v: Value) -> None:
        """``v`` (a received activation or gradient, or the gradient of a received input) lives
        on ``stage`` until the step's end."""
        if self.on:
            self.kept.setdefault(stage, []).append(v)

    def output(self, chunk: int, stage: int, v: Value) -> None:
        """Chunk ``chunk``'s output of one microbatch (``output_chunks``): kept on every stage
        (``every``) or on the last only (``last``); the last stage's are the logits."""
        if not self.on or (self.mode == "last" and chunk != self.last_chunk):
            return
        self.keep(stage, v)
        if chunk == self.last_chunk:
            self.logits.append(v)

    def merge(self, fb: FunctionBuilder, t: Type | None) -> None:
        """The last stage's ``_merge_outputs``: every microbatch's logits (of type ``t``)
        concatenated (freed at once: nothing reads the result), along the first axis no placement
        shards (none, or ``t`` not a distributed tensor's: no merge is written)."""
        if len(self.logits) < 2 or not isinstance(t, DTensorType):
            return
        sharded = {p.dim for p in t.placements if isinstance(p, Shard)}
        free = [a for a in range(len(t.shape)) if a not in sharded]
        if free:
            fb.op("Concat", *self.logits, names=["merged_outputs"], axis=free[0])

    def results(self) -> list[Value]:
        """The kept values, stage by stage: the step's last results, since they outlive it (until
        the next step's ``clear_runtime_states``; the receive buffers for good)."""
        return [v for stage in sorted(self.kept) for v in self.kept[stage]]
