"""The contract between model builders (the zoo) and the transforms.

A ``Model`` is a DistIR module whose entry ``@forward`` is a *chain of layer calls*:

    func @forward(%ids: Tensor[i64, (B, S), d0], %labels: ..., %wte: ..., %w_0: ..., ...) {
      %a0 = @embed(%ids, %wte, %wpe)            // layer 0: first model input + its weights
      %a1 = @block(%a0, %ln1_0, %wq_0, ...)      // layer 1 ... L: previous activation + weights
      ...
      %logits = @head(%aL, %lnf, %wlm)          // activation + weights
      %loss = @loss(%logits, %labels)           // last layer: the loss, activation + labels only
      return %loss
    }

Invariants (``check_model`` enforces them, with errors naming the call and value):
- the entry's parameters are the model inputs (``Model.inputs``, in order) then the weights
  (``Model.weights``, in order), all typed ``Tensor[..., d0]``; dim 0 of every input is the batch;
- the entry body holds only calls, one per layer; call 0 takes the first input as its first
  argument; call i > 0 takes the result of call i-1 as its first argument; the other arguments
  of a call are weights (each weight used by exactly one call, but for the *tied* ones,
  ``Model.tied``: GPT-2's token embedding, used again by the head) or model inputs other than the
  first (e.g. labels, consumed by the last layer);
- each call has exactly one result; the last one is the scalar loss (a 0-d f32 tensor), already
  normalized by the *global* batch (so that summing the losses of microbatches gives the
  full-batch loss, and gradients add up the same way);
- the last layer is the *loss layer* and takes no weights: only the previous activation and
  model inputs (the labels). So dropping the last call gives the inference program, and a
  pipeline stage boundary never splits a loss from its weights. Loss layers reduce with "sum"
  and then ``Scale(alpha=1/normalizer)``, the normalizer counting the global batch's items
  (e.g. batch·seq tokens), so the losses of microbatches add up to the full-batch loss;
- layer functions have untyped parameters and never bake the batch size into their code
  (``Reshape`` uses 0/-1 for batch-like dims), so the same function serves any microbatch size.

Sequence parallelism needs to know one more thing: ``Model.seq_dim``, the dim of the activations
passed between layers (the first input and the result of every layer but the loss) that indexes
the sequence (tokens), e.g. 1 for (batch, seq, hidden); None for a model without one. Transforms
may shard that dim (Megatron-LM sequence parallelism), so no layer may mix positions *across*
sequences and batch items differently than its ops' sharding rules say (attention gathers what it
needs by itself).

The loss layer's input may be declared sharded along the tensor-parallel axis
(``Model.loss_input_tp``, e.g. ``Shard(2)``: logits (batch, seq, vocab) sharded on the vocabulary,
Megatron-LM's vocabulary-parallel cross entropy); the transforms then pass it so between the last
two layers, and the loss layer's ops must compute the loss from such pieces (pending reductions
their sharding rules express), never gathering them whole.

Which weights are column / row parallel is declared per weight (``WeightSpec.tp``: the
placement along a tensor-parallel mesh axis — ``Shard(1)`` column, ``Shard(0)`` row,
``Replicate()`` otherwise); nothing model-specific lives in the transforms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from distir.ir.dtensor import Placement, Replicate, Shard
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import DType, TensorType

REPLICATE: Placement = Replicate()


class ModelError(ValueError):
    """A model (or a model string) is malformed; the message names what and where."""


# what lets a model whose layers fix the batch split it (``Model.fixed_advice``)
STATIC_EXPORT = "export it with a dynamic batch dim"


@dataclass(frozen=True, slots=True)
class WeightSpec:
    name: str
    type: TensorType
    tp: Placement = REPLICATE
    init_std: float = 0.02  # random initialization: normal(0, init_std)
    init_value: float | None = None  # or a constant (1.0 for norm scales, 0.0 for biases)


@dataclass(frozen=True, slots=True)
class InputSpec:
    name: str
    type: TensorType  # full-batch type; dim 0 is the batch
    high: int = 0  # integer inputs (token ids, labels) are drawn from [0, high)


@dataclass(frozen=True)
class Model:
    """A built model: the module (entry = ``@forward``) and what the transforms need to know."""

    name: str
    config: Mapping[str, object]
    module: Module
    inputs: tuple[InputSpec, ...]
    weights: tuple[WeightSpec, ...]
    batch: int
    # forward FLOPs per sample (for MFU): the registry's ``flops`` of every op of the entry typed at
    # batch 1, loss layer included (the zoo's ``assemble`` counts them); 0 when unknown
    flops_per_sample: float = 0.0
    # the sequence dim of the activations between layers (module docstring); None: no sequence
    seq_dim: int | None = None
    # the tensor-parallel placement of the loss layer's input (module docstring): Replicate, or
    # Shard(d) when the loss is written to work on a sharded dim d (the vocabulary of the logits)
    loss_input_tp: Placement = REPLICATE
    # weights used by more than one layer (tied: GPT-2's embedding and output projection); their
    # gradient is the sum of the layers' (the transforms add them up)
    tied: tuple[str, ...] = ()
    # tied weights that are *transmitted* rather than replicated across pipeline stages: only the
    # stage of their first layer keeps them (and their optimizer state); the transforms send the
    # value to the other stage once per step and its gradient back once, added before the update
    transmitted: tuple[str, ...] = ()
    # the layer calls that are not repeated blocks: ``pre`` before them (the embedding) always
    # runs on the first pipeline chunk, ``post`` after them (head, loss) on the last; a
    # strategy's partition (``L…``) counts the blocks in between (``distir.parallel.layer_sharder``)
    pre: int = 0
    post: int = 0
    # the dtype the loss layer computes in by itself (a fused cross entropy: fp32 inside, the
    # logits read in the compute dtype); None: its inputs' dtype, so mixed precision casts the
    # logits to fp32 first (``distir.autodiff.precision.with_fp32_loss``)
    loss_dtype: DType | None = None
    # the batch the layers fix, if they do (an ONNX export's sizes folded into its Reshapes): the
    # program then runs at that batch only, without microbatches; ``fixed_by`` says what fixes it
    # and ``fixed_advice`` what would not
    fixed_batch: int | None = None
    fixed_by: str = ""
    fixed_advice: str = STATIC_EXPORT
    _by_name: dict[str, WeightSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a declared split of a dim one wide keeps it whole: there is nothing to split, and the
        # sharding rules never shard a dim of size 1 (``distir.ops.sharding``)
        if any(_one_wide(w) for w in self.weights):
            whole = tuple(replace(w, tp=REPLICATE) if _one_wide(w) else w for w in self.weights)
            object.__setattr__(self, "weights", whole)
        object.__setattr__(self, "_by_name", {w.name: w for w in self.weights})

    @property
    def forward(self) -> Function:
        return self.module.entry

    @property
    def layers(self) -> tuple[Call, ...]:
        return tuple(i for i in self.forward.body if isinstance(i, Call))

    def weight(self, name: str) -> WeightSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise ModelError(f"model {self.name} has no weight {name!r}") from None

    def step_flops(self, train: bool = True) -> float | None:
        """The model's FLOPs for one step at its batch — forward, plus backward = 2 × forward when
        training (the 6·N·tokens convention with attention included; recomputation never
        counts) — or None when the model does not know its forward FLOPs."""
        if self.flops_per_sample <= 0:
            return None
        return self.flops_per_sample * self.batch * (3 if train else 1)

    @property
    def num_params(self) -> int:
        return sum(math.prod(w.type.shape) for w in self.weights)

    def random_inputs(self, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
        """Random values for inputs and weights, by entry parameter name (for tests and demos)."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for i in self.inputs:
            shape = (batch, *i.type.shape[1:]) if batch is not None else i.type.shape
            if i.type.dtype.is_int:
                out[i.name] = rng.integers(0, max(i.high, 1), size=shape).astype(i.type.dtype.to_numpy())
            else:
                out[i.name] = rng.standard_normal(shape).astype(i.type.dtype.to_numpy())
        for w in self.weights:
            if w.init_value is not None:
                out[w.name] = np.full(w.type.shape, w.init_value, dtype=w.type.dtype.to_numpy())
            else:
                x = rng.standard_normal(w.type.shape) * w.init_std
                out[w.name] = x.astype(w.type.dtype.to_numpy())
        return out


def _one_wide(w: WeightSpec) -> bool:
    """``w`` is declared split along a dim of size 1."""
    tp = w.tp
    return isinstance(tp, Shard) and tp.dim < len(w.type.shape) and w.type.shape[tp.dim] == 1


def check_model(model: Model) -> None:
    """Raise ModelError unless ``model`` keeps the chain contract (module docstring)."""
    fn = model.forward
    n_in = len(model.inputs)
    names = [p.name for p in fn.params]
    want = [i.name for i in model.inputs] + [w.name for w in model.weights]
    if names != want:
        raise ModelError(f"@{fn.name}: parameters {names} should be inputs then weights {want}")
    specs: list[InputSpec | WeightSpec] = [*model.inputs, *model.weights]
    for p, spec in zip(fn.params, specs, strict=True):
        if p.type != spec.type:
            raise ModelError(f"@{fn.name}: %{p.name} is typed {p.type}, its spec says {spec.type}")
    inputs = set(fn.params[:n_in])
    weights = set(fn.params[n_in:])
    used: set[object] = set()
    prev = fn.params[0]
    if not fn.body:
        raise ModelError(f"@{fn.name} has no layers")
    for k, instr in enumerate(fn.body):
        if isinstance(instr, Op):
            raise ModelError(f"@{fn.name}: layer {k} is the op {instr.name}; the entry may only call layers")
        if len(instr.outputs) != 1:
            raise ModelError(f"@{fn.name}: layer {k} (@{instr.callee}) must have one result")
        if not instr.inputs or instr.inputs[0] is not prev:
            raise ModelError(
                f"@{fn.name}: layer {k} (@{instr.callee}) must take %{prev.name} as its first argument"
            )
        for v in instr.inputs[1:]:
            if v in weights:
                if v in used and v.name not in model.tied:
                    raise ModelError(f"@{fn.name}: weight %{v.name} is used by two layers (and not tied)")
                used.add(v)
            elif v not in inputs or v is fn.params[0]:
                raise ModelError(
                    f"@{fn.name}: layer {k} (@{instr.callee}) takes %{v.name}, which is neither a weight "
                    "nor a model input"
                )
        prev = instr.outputs[0]
    if fn.outputs != (prev,):
        raise ModelError(f"@{fn.name} must return the last layer's result (the loss)")
    last = fn.body[-1]
    assert isinstance(last, Call)
    loss_weights = [v.name for v in last.inputs[1:] if v in weights]
    if loss_weights:
        raise ModelError(
            f"@{fn.name}: the loss layer @{last.callee} takes weights {loss_weights}; it may only take "
            "the previous activation and model inputs"
        )
    unused = [v.name for v in weights if v not in used]
    if unused:
        raise ModelError(f"@{fn.name}: weights never used: {unused}")
    loose = [n for n in model.transmitted if n not in model.tied]
    if loose:
        raise ModelError(f"model {model.name}: transmitted weights {loose} are not tied")
    tp = model.loss_input_tp
    if isinstance(tp, Shard) and tp.dim == 0:
        raise ModelError(
            f"model {model.name}: the loss layer's input cannot be tensor-parallel on dim 0 (the batch)"
        )
    rank = len(model.inputs[0].type.shape)
    if model.seq_dim is not None and not 0 < model.seq_dim < rank:
        raise ModelError(
            f"model {model.name}: seq_dim {model.seq_dim} must index a non-batch dim of the first input "
            f"(rank {rank})"
        )
    for i in model.inputs:
        if i.type.shape[:1] != (model.batch,):
            raise ModelError(
                f"input {i.name}: dim 0 must be the batch {model.batch}, got shape {i.type.shape}"
            )
