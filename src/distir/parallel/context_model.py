"""A model with explicit global positions: what ``distribute`` runs under context parallelism.

Context parallelism (``Strategy.c`` = c > 1) splits each sequence over the c GPUs of a ``cp``
mesh axis in the load-balanced layout of ``distir.parallel.context``: the sequence is cut into
2c chunks and rank i holds chunks i and 2c−1−i, so under a causal mask every rank does the same
work (Megatron-LM's and torchtitan's layout). ``distribute`` expresses that split as an ordinary
contiguous ``Shard(1)`` over ``cp`` of a *reordered* sequence: the inputs arrive in
``balanced_order`` (rank 0's two chunks, then rank 1's, …), as a context-parallel data loader
hands each rank its chunks (torchtitan's ``context_parallel`` reorders its buffers so). What
depends on a token's position must then use its global position, not its index:

``context_model(model, c)`` adds an input ``pos`` (int64, the inputs' (batch, seq)): each token's
global position, in the same order as the tokens (``balanced_positions``; ``arange`` in the
original order gives the original model exactly). Every layer function that uses positions gets
``pos`` as a last parameter, and:

- ``Rope(x)`` becomes ``Rope(x, pos)`` (each row rotated by its global position);
- ``Attention(q, k, v)`` becomes ``Attention(q, k, v, pos, pos; ring=c)`` (the causal mask by
  position): sharded along the sequence over cp it runs as ring attention, K/V and dK/dV passed
  rank to rank (``distir.ops.attention``: ring; lowered by ``distir.parallel.sharding.ring``);
  with ``ring=False`` (``distribute(..., cp_ring=False)``) without the attribute: the queries'
  rows against all-gathered K/V (``distir.ops.attention``: positions);
- a learned position table read as ``Slice(w, 0:S)`` (GPT-2's ``wpe``) becomes
  ``Gather(w, pos)`` (each token's row).

And one rewrite for the sharding layer's sake: a weight applied to activations,
``MatMul(x (B, S, H), w (H, F))``, becomes ``MatMul(x, Reshape(w))`` (w as (1, H, F),
broadcast over the batch). The same product; but its weight gradient is then the batched
``xᵀ·dy`` summed over the batch — a pending sum over dp (batch) *and* cp (sequence) — where the
2-D form's gradient flattens (B, S) into one dim, which the sharding layer nests along two
mesh axes only where the annotations nest one (it would gather the sequence and compute every
weight gradient c times over).

And one for the loss: the zoo's cross entropy flattens (batch, sequence) into one dim
(``Reshape`` to (B·S, V)), which dp and cp cannot both shard (with more than one sequence per
microbatch and stage the logits would be gathered over cp: c times the loss layer's memory and
compute). ``SoftmaxCrossEntropyParts`` takes rows of any rank, classes last, so the flattening
``Reshape``s of its scores and labels are dropped and the max over the classes taken on the last
axis: the loss runs on (batch, sequence) rows sharded over dp and cp (and the vocabulary over
tp), as Megatron-LM's vocabulary-parallel cross entropy runs on its [s, b, v] logits. The
``torch`` loss form (``LogSoftmax`` over the classes, then ``NegativeLogLikelihoodLoss``) drops
its flattening alike: the log-softmax over the last axis of the (batch, sequence, vocab) logits
and the negative log-likelihood with its classes on that axis (``axis=-1``), so each cp rank's
cross entropy runs on its own (B, S/c, V) logits and nothing is gathered, as torchtitan's
``F.cross_entropy`` runs on each rank's local logits under ``context_parallel``.

Models whose activations carry no sequence dim 1, whose inputs are not (batch, seq), or whose
attention is the explicit ``CausalMask`` form (``attention=naive``) are refused
(``StrategyError``): their positions are not ops this pass knows. The loss is a mean over
tokens, so it does not depend on their order; gradients neither.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from distir.autodiff.reverse import value_types
from distir.autodiff.train import layer_types
from distir.frontends.zoo.model import InputSpec, Model
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops.attention import ATTENTION, ROPE
from distir.ops.linalg import MATMUL
from distir.ops.loss import NEGATIVE_LOG_LIKELIHOOD_LOSS, SOFTMAX_CROSS_ENTROPY_PARTS
from distir.ops.nn import CAUSAL_MASK, LOG_SOFTMAX
from distir.ops.reduce import REDUCE_MAX
from distir.ops.shape.select import SLICE
from distir.ops.shape.views import RESHAPE
from distir.parallel.context import balanced_positions
from distir.parallel.strategy import StrategyError

POS = "pos"
_POSITIONED = (ROPE.name, ATTENTION.name)  # ops that take the global positions (module docstring)
_REFUSED = (CAUSAL_MASK.name,)  # a mask by index, which a reordered sequence breaks


def balanced_order(seq: int, c: int) -> np.ndarray:
    """The global positions in the order ``distribute`` takes the sequence under context
    parallelism over c ranks: rank 0's two chunks, then rank 1's, … (``balanced_positions``)."""
    return np.concatenate([balanced_positions(seq, c, r) for r in range(c)])


def context_inputs(model: Model, c: int, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs of ``model`` (by name, in the original order) as ``distribute`` under context
    parallelism over c ranks takes them: each reordered along the sequence (``balanced_order``),
    and the positions ``pos`` added."""
    out = dict(values)
    seq = model.inputs[0].type.shape[1]
    order = balanced_order(seq, c)
    for spec in model.inputs:
        out[spec.name] = np.take(values[spec.name], order, axis=1)
    batch = values[model.inputs[0].name].shape[0]
    out[POS] = np.broadcast_to(order, (batch, seq)).astype(np.int64)
    return out


def context_model(model: Model, c: int, ring: bool = True) -> Model:
    """``model`` with global positions as an input (module docstring); with ``ring``, its
    attention ops run as a ring over the c ranks (``ring=c``), else on all-gathered K/V."""
    _check(model, c)
    n_in = len(model.inputs)
    weights = set(model.forward.params[n_in:])
    first = model.inputs[0].type
    pos_type = TensorType(DType.i64, first.shape[:2], first.device)
    fb_params = list(model.forward.params)
    pos = Value(POS, pos_type)
    fb_params.insert(n_in, pos)
    rewritten: dict[str, Function] = {}
    for fn in model.module.functions:
        if fn is model.forward:
            continue
        calls = [i for i in model.forward.body if isinstance(i, Call) and i.callee == fn.name]
        tables = {
            j
            for call in calls
            for j, v in enumerate(call.inputs)
            if v in weights  # parameters a call binds to a weight: position tables may be among them
        }
        new = _with_positions(fn, tables, c if ring else 1)
        if new is not None:
            rewritten[fn.name] = new
    body: list[Instr] = []
    for instr in model.forward.body:
        if isinstance(instr, Call) and instr.callee in rewritten:
            instr = Call(instr.callee, (*instr.inputs, pos), instr.outputs)
        body.append(instr)
    entry = replace(model.forward, params=tuple(fb_params), body=tuple(body))
    fns = [rewritten.get(f.name, f) for f in model.module.functions if f is not model.forward]
    spec = InputSpec(POS, pos_type, high=first.shape[1])
    positioned = replace(model, module=Module((*fns, entry)), inputs=(*model.inputs, spec))
    return _batched_weight_products(_unflattened_loss(positioned))


def _unflattened_loss(model: Model) -> Model:
    """The cross entropy on (batch, sequence) rows (module docstring): in every function, a loss
    whose scores and labels are ``Reshape``s flattening (B, S, V) and (B, S) to (B·S, V) and
    (B·S,) takes them unflattened, classes last: ``SoftmaxCrossEntropyParts`` directly, the max
    over the classes (``ReduceMax`` of the flattened scores on axis 1) taken on the last axis;
    the ``torch`` form's ``LogSoftmax`` (axis 1 of the flattened scores) on the last axis and its
    ``NegativeLogLikelihoodLoss`` with ``axis=-1``."""
    fns = tuple(_unflattened(fn) for fn in model.module.functions)
    return replace(model, module=Module(fns))


class _Rows(NamedTuple):
    """What a loss on flattened rows reads: the flattening ``Reshape``s of its scores and labels,
    and the ``LogSoftmax`` between the scores and the loss (the ``torch`` form; else None)."""

    scores: Op
    labels: Op
    logp: Op | None


def _rows(op: Op, made: dict[Value, Op]) -> _Rows | None:
    """The flattened rows ``op`` reads, when it is a loss on them (``_Rows``)."""
    logp: Op | None = None
    if op.name == SOFTMAX_CROSS_ENTROPY_PARTS.name:
        scores, labels = made.get(op.inputs[0]), made.get(op.inputs[2])
    elif op.name == NEGATIVE_LOG_LIKELIHOOD_LOSS.name and op.attrs.get("axis", 1) in (1, -1):
        logp, labels = made.get(op.inputs[0]), made.get(op.inputs[1])
        if logp is None or logp.name != LOG_SOFTMAX.name or logp.attrs.get("axis", -1) not in (1, -1):
            return None
        scores = made.get(logp.inputs[0])
    else:
        return None
    if not (_flattens(scores, 2) and _flattens(labels, 1)):
        return None
    assert scores is not None and labels is not None
    return _Rows(scores, labels, logp)


def _unflattened(fn: Function) -> Function:
    made = {o: op for op in fn.ops() for o in op.outputs}
    flat: dict[Value, Value] = {}  # a flattened value -> the value it flattens
    logps: set[Value] = set()  # the torch form's log-probabilities: (B, S, V) once rewritten
    for op in fn.ops():
        found = _rows(op, made)
        if found is not None:
            flat[found.scores.outputs[0]] = found.scores.inputs[0]
            flat[found.labels.outputs[0]] = found.labels.inputs[0]
            if found.logp is not None:
                logps.add(found.logp.outputs[0])
    if not flat:
        return fn
    flat_users = {
        *(RESHAPE.name, REDUCE_MAX.name, SOFTMAX_CROSS_ENTROPY_PARTS.name),
        *(LOG_SOFTMAX.name, NEGATIVE_LOG_LIKELIHOOD_LOSS.name),
    }
    for op in fn.ops():
        torch_form = op.name == LOG_SOFTMAX.name or op.name == NEGATIVE_LOG_LIKELIHOOD_LOSS.name
        if any(v in flat for v in op.inputs) and (
            op.name not in flat_users or (torch_form and not _of_torch_form(op, logps))
        ):
            return fn  # the flattened values have other users: left as they are
        if any(v in logps for v in op.inputs) and op.name != NEGATIVE_LOG_LIKELIHOOD_LOSS.name:
            return fn  # so have the log-probabilities
    if any(v in flat or v in logps for v in fn.outputs):
        return fn
    body: list[Instr] = []
    for instr in fn.body:
        if isinstance(instr, Op) and instr.outputs[0] in flat:
            continue
        if isinstance(instr, Op) and any(v in flat or v in logps for v in instr.inputs):
            instr = Op(
                instr.name, tuple(flat.get(v, v) for v in instr.inputs), instr.outputs, _classes_last(instr)
            )
        body.append(instr)
    return replace(fn, body=tuple(body))


def _of_torch_form(op: Op, logps: set[Value]) -> bool:
    """Whether ``op`` (a LogSoftmax or NegativeLogLikelihoodLoss) is a matched torch-form loss's:
    the log-softmax making, or the loss reading, one of ``logps``."""
    return op.outputs[0] in logps or op.inputs[0] in logps


def _classes_last(op: Op) -> Attrs:
    """``op``'s attributes with the classes on the last axis of the unflattened rows: the max over
    them (``axes``), the log-softmax's ``axis``, the negative log-likelihood's ``axis``."""
    over = {REDUCE_MAX.name: "axes", LOG_SOFTMAX.name: "axis", NEGATIVE_LOG_LIKELIHOOD_LOSS.name: "axis"}
    key = over.get(op.name)
    if key is None:
        return op.attrs
    return Attrs({**dict(op.attrs.items()), key: (-1,) if key == "axes" else -1})


def _flattens(op: Op | None, rank: int) -> bool:
    """Whether ``op`` is a ``Reshape`` to ``rank`` dims whose first is -1 (rows merged)."""
    if op is None or op.name != RESHAPE.name or len(op.inputs) != 1:
        return False
    shape = op.attrs.get("shape")
    return isinstance(shape, tuple) and len(shape) == rank and shape[0] == -1


def _batched_weight_products(model: Model) -> Model:
    """Every ``MatMul`` of a 3-D activation by a 2-D operand as a broadcast batched product
    (module docstring)."""
    types = layer_types(model)
    seen: dict[str, Function] = {}
    for call, ts in zip(model.layers, types, strict=True):
        if call.callee in seen:
            continue
        fn = model.module[call.callee]
        env = value_types(model.module, fn, ts)
        body: list[Instr] = []
        changed = False
        for instr in fn.body:
            if isinstance(instr, Op) and instr.name == MATMUL.name and _ranks(env, instr) == (3, 2):
                a, b = instr.inputs
                wide = Value(f"{b.name}_b", None)
                bt = env[b]
                assert isinstance(bt, TensorType)
                body.append(Op("Reshape", (b,), (wide,), Attrs({"shape": (1, *bt.shape)})))
                body.append(Op("MatMul", (a, wide), instr.outputs, instr.attrs))
                changed = True
                continue
            body.append(instr)
        seen[call.callee] = replace(fn, body=tuple(body)) if changed else fn
    fns = [seen.get(f.name, f) for f in model.module.functions]
    return replace(model, module=Module(tuple(fns)))


def _ranks(env: dict[Value, Type], op: Op) -> tuple[int, ...]:
    ts = [env.get(v) for v in op.inputs]
    return tuple(t.rank if isinstance(t, TensorType) else -1 for t in ts)


def _check(model: Model, c: int) -> None:
    """Refuse what this pass cannot give positions to (module docstring)."""
    if model.seq_dim != 1:
        raise StrategyError(
            f"context parallelism (c={c}) splits the sequence (dim 1) of the activations; "
            f"{model.name} declares seq_dim={model.seq_dim}"
        )
    seqs = {i.type.shape[1] if i.type.rank == 2 else None for i in model.inputs}
    if len(seqs) != 1 or None in seqs:
        shapes = ", ".join(f"{i.name} {i.type.shape}" for i in model.inputs)
        raise StrategyError(
            f"context parallelism (c={c}) needs every input of {model.name} shaped (batch, seq); got {shapes}"
        )
    seq = next(iter(seqs))
    assert seq is not None
    if seq % (2 * c):
        raise StrategyError(
            f"context parallelism over c={c} cuts the sequence into 2c = {2 * c} equal chunks; "
            f"{seq} positions of {model.name} do not divide"
        )
    why = context_refusal(model)
    if why:
        raise StrategyError(f"context parallelism (c={c}): {why}")


def context_refusal(model: Model) -> str:
    """Why ``model``'s attention cannot run context-parallel ("" if it can): a mask by index
    (the explicit attention form), or a sliding window, which the ring does not take."""
    for fn in model.module.functions:
        for op in fn.ops():
            if op.name in _REFUSED:
                return (
                    f"@{fn.name} masks by index ({op.name}, the explicit attention form); build the "
                    "model with the fused Attention op"
                )
            if op.name == ATTENTION.name and op.attrs.get("window", 0):
                window = op.attrs["window"]
                return f"@{fn.name}'s attention has a sliding window (window={window}): the ring takes none"
    return ""


def _with_positions(fn: Function, tables: set[int], ring: int) -> Function | None:
    """``fn`` with a last parameter ``pos`` and its positioned ops rewritten; None when it has
    none. ``tables``: the parameters bound to weights (a ``Slice(w, 0:S)`` of one is a learned
    position table)."""
    table_params = {fn.params[j] for j in tables if j < len(fn.params)}
    if not any(_positioned(op, table_params) for op in fn.ops()):
        return None
    vmap = ValueMap()
    params = [vmap(p) for p in fn.params]
    pos = Value(POS, None)
    body: list[Instr] = []
    for instr in fn.body:
        new = copy_instr(instr, vmap)
        if isinstance(instr, Op) and _positioned(instr, table_params):
            assert isinstance(new, Op)
            new = _rewrite(new, pos, ring)
        body.append(new)
    return Function(fn.name, (*params, pos), tuple(body), tuple(vmap(v) for v in fn.outputs), fn.donated)


def _positioned(op: Op, tables: set[Value]) -> bool:
    if op.name in _POSITIONED:
        return True
    return op.name == SLICE.name and op.inputs[0] in tables and _table_slice(op.attrs)


def _table_slice(attrs: Attrs) -> bool:
    """A slice of the first rows of a table (``starts=(0,)`` on axis 0)."""
    return tuple(attrs.get("axes") or (0,)) == (0,) and tuple(attrs.get("starts") or (0,)) == (0,)  # type: ignore[arg-type]


def _rewrite(op: Op, pos: Value, ring: int) -> Op:
    if op.name == ROPE.name:
        return Op(ROPE.name, (op.inputs[0], pos), op.outputs, op.attrs)
    if op.name == ATTENTION.name:
        attrs = Attrs({**dict(op.attrs.items()), "ring": ring}) if ring > 1 else op.attrs
        return Op(ATTENTION.name, (*op.inputs[:3], pos, pos), op.outputs, attrs)
    # Slice(table, 0:S): each token's row of the table, by its global position
    return Op("Gather", (op.inputs[0], pos), op.outputs, Attrs({"axis": 0}))


__all__ = ["POS", "balanced_order", "context_inputs", "context_model", "context_refusal"]
