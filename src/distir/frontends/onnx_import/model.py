"""An imported ONNX model as a zoo ``Model`` (``distir.frontends.zoo.model``'s contract), so the
transforms, the simulator and the search take it: the import's layer calls (or its one
function as a single layer), then a loss layer — the cross entropy of the graph's one output,
read as logits ``(..., classes)``, against a new input ``labels`` of the logits' shape without
the last dim, summed and scaled by 1/(number of labels) (the zoo's vocabulary-parallel form,
``token_loss_fn``).

Weights take the tensor-parallel placements the modules reading them call for (``placements``;
the logits then reach the loss sharded on the vocabulary where the head is); a token model
split into layers has its sequence at dim 1 of the activations (``Model.seq_dim``), so sequence
parallelism splits it. What the contract cannot get from an ONNX graph is left at what is safe:
random-input ranges of integer inputs set to the number of classes (token ids below the
vocabulary). The layers take the sizes an export computes as constants of the imported batch
(``assemble``); with the same file imported at another batch (``other``: 1, or 2 for a batch
of 1), a Reshape target that follows the batch (one size, in proportion to it) becomes
batch-free, that size copied from the input (``0``) or inferred (``-1``), so microbatches and
replicas run the layers at their own share.
What cannot be written so (a mask or Range computed from the batch, several sizes moving, a
static export whose folded sizes do not type at another batch) fixes the batch:
``Model.fixed_batch``, and ``fixed_by`` names it; such a model runs at that batch only, without
microbatches. FLOPs per sample are the forward's at the model's batch divided by it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

import distir
from distir.frontends.onnx_import import OnnxImport
from distir.frontends.onnx_import.reader import OnnxImportError
from distir.frontends.zoo._build import forward_flops
from distir.frontends.zoo.gpt import token_loss_fn
from distir.frontends.zoo.model import (
    REPLICATE,
    STATIC_EXPORT,
    InputSpec,
    Model,
    ModelError,
    WeightSpec,
    check_model,
)
from distir.interp.loop import InterpretError
from distir.interp.shapes import Concrete, Mixed, TypeDomain, infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Placement, Shard
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.types import DType, TensorType
from distir.ir.values import Attrs, Value

LABELS = "labels"
# why a dynamic export's layers may still fix the batch (``Model.fixed_advice``)
_DYNAMIC_FIXED = (
    "the export's batch dim is dynamic, but the graph computes this for the whole batch, which "
    "distir writes batch-free only in Reshape targets and causal masks of up to 8,192 positions"
)


def to_model(
    imp: OnnxImport, name: str = "onnx", batch: int | None = None, other: OnnxImport | None = None
) -> Model:
    """``imp`` with a cross-entropy loss layer, as a ``Model`` at ``batch`` (the import's own by
    default; module docstring). ``other``: the same file imported at another batch, which tells
    a dynamic export's sizes that follow the batch (``BatchFolds``). A batch other than the
    import's needs layers that do not fix it, else ``OnnxImportError`` names what fixes it."""
    logits = _logits(imp, name)
    layers, fns = _layer_calls(imp.module)
    label = LABELS if all(p.name != LABELS for p in imp.inputs) else f"{LABELS}_"
    own = imp.inputs[0].type.shape[0]
    at_own = Module((*fns, *_entry(layers, imp, label, logits, own)[0]))
    two = other_batch(own)
    if other is not None and other.inputs[0].type.shape[0] == two:
        o_layers, o_fns = _layer_calls(other.module)
        at_other = Module((*o_fns, *_entry(o_layers, other, label, _logits(other, name), two)[0]))
    else:  # a static export: its own layers at the other batch
        at_other = Module((*fns, *_entry(layers, imp, label, logits, two)[0]))
    folds = _batch_folds(at_own, at_other, own, two)
    target = own if batch is None else batch
    advice = _DYNAMIC_FIXED if imp.batch_dims else f"{STATIC_EXPORT}: torch.onnx.export(dynamic_shapes=...)"
    if target != own and folds.fixed_by:
        raise OnnxImportError(
            f"model {name}: its layers fix the batch at {own} ({folds.fixed_by}); it runs at batch {own} "
            f"only, not {target} ({advice})"
        )
    entry, inputs, weights = _entry(layers, imp, label, logits, target)
    module = Module((*(_fold(fn, folds.envs.get(fn.name, {}), folds.batch_dims) for fn in fns), *entry))
    model = Model(
        name,
        {"family": "onnx", "opset": imp.opset, "layers": " ".join(imp.layers)},
        module,
        tuple(inputs),
        tuple(weights),
        target,
        tied=imp.shared,
        pre=int(bool(imp.layers) and imp.layers[0] == "pre"),
        post=1 + int(bool(imp.layers) and imp.layers[-1] == "post"),
        fixed_batch=own if folds.fixed_by else None,
        fixed_by=folds.fixed_by,
        fixed_advice=advice,
        loss_input_tp=_loss_input(layers, weights, logits),
        seq_dim=_seq_dim(imp, logits),
    )
    try:
        check_model(model)
    except ModelError as e:
        raise OnnxImportError(f"model {name} does not fit the model contract: {e}") from None
    flops = forward_flops(module, [p.type for p in module.entry.params if p.type is not None])
    return replace(model, flops_per_sample=flops / model.batch)


def _logits(imp: OnnxImport, name: str) -> TensorType:
    """The type of ``imp``'s one output, which the loss reads as logits."""
    outs = distir.check(imp.module).entry.outputs
    logits = outs[0].type if len(outs) == 1 else None
    if not (isinstance(logits, TensorType) and logits.dtype.is_float and logits.rank >= 2):
        got = ", ".join(str(v.type) for v in outs)
        raise OnnxImportError(f"model {name}: a loss needs one float output of rank >= 2 (logits), got {got}")
    return logits


def _entry(
    layers: list[Call], imp: OnnxImport, label: str, logits: TensorType, batch: int
) -> tuple[tuple[Function, Function], list[InputSpec], list[WeightSpec]]:
    """The loss layer and the entry calling ``layers`` then it, the graph's inputs (and the
    labels, of the ``logits``' shape without its last dim) typed at ``batch``."""
    classes = logits.shape[-1]
    inputs = [
        InputSpec(p.name, _at(p.type, batch), high=classes if p.type.dtype.is_int else 0) for p in imp.inputs
    ]
    items = _at(logits, batch).shape[:-1]
    inputs.append(InputSpec(label, TensorType(DType.i64, items, logits.device), high=classes))
    # in the order the layers first take them, as the transforms list them
    first = {v.name: i for i, v in reversed(list(enumerate(v for c in layers for v in c.inputs[1:])))}
    tp = dict(imp.tp)
    weights = sorted(
        (WeightSpec(p.name, p.type, tp.get(p.name, REPLICATE)) for p in imp.weights),
        key=lambda w: first.get(w.name, len(first)),
    )
    fb = FunctionBuilder("forward")
    specs: list[InputSpec | WeightSpec] = [*inputs, *weights]
    vals = {p.name: fb.param(p.name, p.type) for p in specs}
    by_entry = {p: vals[p.name] for p in imp.module.entry.params}
    prev = vals[inputs[0].name]
    for call in layers:
        args = (by_entry[v] for v in call.inputs[1:])
        (prev,) = fb.call(call.callee, prev, *args, names=[call.outputs[0].name])
    loss = token_loss_fn(classes, math.prod(items))
    (prev,) = fb.call(loss, prev, vals[label], names=["loss"])
    return (loss, fb.ret(prev)), inputs, weights


def _seq_dim(imp: OnnxImport, logits: TensorType) -> int | None:
    """1 for a token model split into layers (ids (B, S) in, logits (B, S, V) out: the
    activations between its layers are (B, S, hidden)), as the PyTorch importer has it; else
    None (no sequence parallelism)."""
    ids = imp.inputs[0].type
    token = ids.rank == 2 and logits.rank == 3 and logits.shape[1] == ids.shape[1]
    return 1 if token and imp.layers else None


def _loss_input(layers: list[Call], weights: list[WeightSpec], logits: TensorType) -> Placement:
    """The logits sharded on the vocabulary where the head is (its matrix, the last layer's last
    2-d weight, sharded on a dim of the vocabulary's size; ``placements``), else whole."""
    specs = {w.name: w for w in weights}
    last = [specs[v.name] for v in layers[-1].inputs[1:] if v.name in specs] if layers else []
    head = next((w for w in reversed(last) if w.type.rank == 2), None)
    vocab = logits.shape[-1]
    if head is not None and isinstance(head.tp, Shard) and head.type.shape[head.tp.dim] == vocab:
        return Shard(logits.rank - 1)
    return REPLICATE


def _at(t: TensorType, batch: int) -> TensorType:
    return replace(t, shape=(batch, *t.shape[1:])) if t.rank else t


class BatchFolds(NamedTuple):
    """What the layers' shape subgraphs give at the import's batch (``envs``: each function's
    values), the positions of their Reshape targets that follow the batch (``batch_dims``: a
    target computed at another batch differs there alone, in proportion), and what fixes the batch
    (``fixed_by``, "" if nothing does): a shape that does not follow it so, a Range or
    ConstantOfShape computed from it, or layers that do not type at another batch (a static
    export's folded sizes)."""

    envs: dict[str, dict[Value, Mixed]]
    batch_dims: dict[Value, tuple[int, int]]
    fixed_by: str


def other_batch(batch: int) -> int:
    """The batch a model at ``batch`` is compared with (``BatchFolds``): 1, the cheapest import."""
    return 2 if batch == 1 else 1


def _batch_folds(at_own: Module, at_other: Module, own: int, two: int) -> BatchFolds:
    """The model's layers at its own batch ``own`` and at ``two``, compared (``BatchFolds``)."""
    envs = _typed_envs(at_own)
    if isinstance(envs, str):
        raise OnnxImportError(f"the imported model does not type: {envs}")
    envs2 = _typed_envs(at_other)
    if isinstance(envs2, str):
        return BatchFolds(envs, {}, f"{envs2} does not type at batch {two}")
    dims: dict[Value, tuple[int, int]] = {}
    fns2 = {f.name: f for f in at_other.functions}
    for fn in at_own.functions[:-2]:  # the layers (not the loss and the entry)
        fn2 = fns2.get(fn.name)
        if fn2 is None or [_kind(i) for i in fn.body] != [_kind(i) for i in fn2.body]:
            return BatchFolds(envs, dims, f"@{fn.name} imports differently at batch {two}")
        pair = (envs.get(fn.name, {}), envs2.get(fn.name, {}))
        for instr, instr2 in zip(fn.body, fn2.body, strict=True):
            if not isinstance(instr, Op) or not isinstance(instr2, Op):
                continue
            got = _op_follows(instr, instr2, pair, own, two)
            if isinstance(got, str):
                return BatchFolds(envs, dims, f"{got} in @{fn.name}")
            if got is not None:
                dims[instr.outputs[0]] = got
    return BatchFolds(envs, dims, "")


def _op_follows(
    op: Op, op2: Op, envs: tuple[dict[Value, Mixed], dict[Value, Mixed]], own: int, two: int
) -> tuple[int, int] | str | None:
    """How ``op`` (``op2`` the same op at batch ``two``; ``envs``: their functions' values) follows
    the batch: a Reshape target's (position, 0 or -1) and an Expand shape's (position, 1) that
    make it batch-free (``BatchFolds.batch_dims``), what fixes the batch, or None (nothing moves)."""
    env1, env2 = envs
    x = (env1.get(op.inputs[0]), env2.get(op2.inputs[0])) if op.inputs else (None, None)
    if op.name == "Reshape" and len(op.inputs) == 2:
        t1, t2 = _known(env1, op.inputs[1]), _known(env2, op2.inputs[1])
        if t1 is None or t2 is None or np.array_equal(t1, t2):
            return None
        code = _follows(np.asarray(t1).reshape(-1), np.asarray(t2).reshape(-1), own, two, x)
        return code if code is not None else f"Reshape %{op.outputs[0].name}'s target"
    if op.name == "Expand" and len(op.inputs) == 1:
        a, b = (np.asarray(o.attrs.get("shape", ()), dtype=np.int64) for o in (op, op2))
        if np.array_equal(a, b):
            return None
        at = _broadcast_follows(a, b, own, two, x)
        return (at, 1) if at is not None else f"Expand %{op.outputs[0].name}'s shape"
    if op.name in ("Range", "ConstantOfShape"):
        v1, v2 = _known(env1, op.outputs[0]), _known(env2, op2.outputs[0])
        if v1 is not None and (v2 is None or not np.array_equal(v1, v2)):
            return f"{op.name} %{op.outputs[0].name}"
    return None


def _follows(
    a: np.ndarray, b: np.ndarray, own: int, two: int, x: tuple[Mixed | None, Mixed | None]
) -> tuple[int, int] | None:
    """How a Reshape whose target is ``a`` at the model's batch ``own`` and ``b`` at batch ``two``
    follows the batch: (position, 0) where it copies its input's dim at both batches (``x``: the
    input at each; ONNX's 0 without ``allowzero``), (position, -1) where it is inferred; None if it
    cannot (several sizes move, one not in proportion, or neither form)."""
    moved = np.flatnonzero(a != b) if a.shape == b.shape else np.arange(0)
    if len(moved) != 1 or int(b[moved[0]]) * own != int(a[moved[0]]) * two:
        return None
    i = int(moved[0])
    types = [type_of(m) if m is not None else None for m in x]
    copies = all(isinstance(t, TensorType) and i < t.rank for t in types) and [
        t.shape[i] for t in types if isinstance(t, TensorType)
    ] == [a[i], b[i]]
    if copies and 0 not in a.tolist():
        return (i, 0)
    return (i, -1) if -1 not in a.tolist() else None


def _broadcast_follows(
    a: np.ndarray, b: np.ndarray, own: int, two: int, x: tuple[Mixed | None, Mixed | None]
) -> int | None:
    """The position where an Expand's shape, ``a`` at the model's batch ``own`` and ``b`` at
    ``two``, follows the batch as a copy of its input's dim (``x``: the input at each), so that 1
    there (broadcasting keeps the input's dim) is the same at every batch; None if it does not."""
    moved = np.flatnonzero(a != b) if a.shape == b.shape else np.arange(0)
    if len(moved) != 1 or int(b[moved[0]]) * own != int(a[moved[0]]) * two:
        return None
    i = int(moved[0])
    types = [type_of(m) if m is not None else None for m in x]
    # the input's dim i, counted from the right as broadcasting aligns it
    back = len(a) - i
    dims = [t.shape[-back] if isinstance(t, TensorType) and back <= t.rank else None for t in types]
    return i if dims == [a[i], b[i]] else None


def _kind(instr: Instr) -> str:
    return instr.name if isinstance(instr, Op) else f"@{instr.callee}" if isinstance(instr, Call) else ""


def _typed_envs(module: Module) -> dict[str, dict[Value, Mixed]] | str:
    """Each function's values with ``module`` typed (shape subgraphs computed), or the op and
    function where it does not type."""
    domain = TypeDomain(concrete_limit=1 << 16, record=True)
    try:
        infer_types(module, domain=domain)
    except InterpretError as e:
        fn, op = e.frames[0] if e.frames else (module.entry.name, "")
        return f"`{op}` in @{fn}"
    return {name: seen[0][1] for name, seen in domain.envs.items() if seen}


def _known(env: dict[Value, Mixed], v: Value) -> Any:
    m = env.get(v)
    return m.data if isinstance(m, Concrete) else None


def _fold(fn: Function, env: dict[Value, Mixed], batch_dims: dict[Value, tuple[int, int]]) -> Function:
    """``fn`` with shape inputs made attributes: the transforms type layers abstractly (no known
    values), so a Reshape whose target is a shape subgraph gets the target as its ``shape``
    attribute (-1 where it follows the batch, ``batch_dims``), an Expand's shape 1 where it follows
    the batch (its input's dim kept), a Range or ConstantOfShape of known
    inputs becomes a ``Constant``, and the shape ops nothing uses any more are dropped."""
    body: list[Instr] = []
    for instr in fn.body:
        if isinstance(instr, Op) and instr.name == "Reshape" and len(instr.inputs) == 2:
            target = _known(env, instr.inputs[1])
            if target is not None:
                shape = [int(d) for d in np.asarray(target).reshape(-1)]
                extra: dict[str, Any] = {}
                if instr.outputs[0] in batch_dims:
                    at, code = batch_dims[instr.outputs[0]]
                    shape[at] = code
                    extra = {"allowzero": 0} if code == 0 else {}
                attrs = Attrs({**instr.attrs, **extra, "shape": tuple(shape)})
                instr = Op("Reshape", instr.inputs[:1], instr.outputs, attrs)
        elif isinstance(instr, Op) and instr.name == "Expand" and instr.outputs[0] in batch_dims:
            at, one = batch_dims[instr.outputs[0]]
            shape = [int(d) for d in np.asarray(instr.attrs["shape"]).reshape(-1)]
            shape[at] = one
            instr = Op("Expand", instr.inputs, instr.outputs, Attrs({**instr.attrs, "shape": tuple(shape)}))
        elif (
            isinstance(instr, Op)
            and instr.name in ("Range", "ConstantOfShape")
            and _known(env, instr.outputs[0]) is not None
        ):
            arr = np.asarray(_known(env, instr.outputs[0]))
            t = type_of(env[instr.outputs[0]])
            assert isinstance(t, TensorType)
            attrs = Attrs({"value": arr.tolist(), "dtype": t.dtype, "device": t.device})
            instr = Op("Constant", (), instr.outputs, attrs)
        body.append(instr)
    live = set(fn.outputs)
    kept: list[Instr] = []
    for instr in reversed(body):  # drop what no result depends on
        if isinstance(instr, Call) or any(v in live for v in instr.outputs):
            kept.append(instr)
            live.update(instr.inputs)
    return Function(fn.name, fn.params, tuple(reversed(kept)), fn.outputs, fn.donated)


def _layer_calls(module: Module) -> tuple[list[Call], list[Function]]:
    """The entry's layer calls and functions; a single-function import becomes one layer
    ``@net`` (untyped parameters) called with the entry's parameters."""
    entry = module.entry
    if entry.body and all(isinstance(i, Call) for i in entry.body):
        return [i for i in entry.body if isinstance(i, Call)], list(module.functions[:-1])
    params = tuple(Value(p.name) for p in entry.params)
    vmap = dict(zip(entry.params, params, strict=True))
    body = []
    for instr in entry.body:
        assert isinstance(instr, Op)
        body.append(Op(instr.name, tuple(vmap.get(v, v) for v in instr.inputs), instr.outputs, instr.attrs))
    outs = tuple(vmap.get(v, v) for v in entry.outputs)
    net = Function("net", params, tuple(body), outs)
    result = Value("logits")
    return [Call("net", entry.params, (result,))], [net]
