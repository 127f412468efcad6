"""An imported ONNX model as a zoo ``Model`` (``distir.frontends.zoo.model``'s contract), so the
transforms, the simulator and the search take it: the import's layer calls (or its one
function as a single layer), then a loss layer — the cross entropy of the graph's one output,
read as logits ``(..., classes)``, against a new input ``labels`` of the logits' shape without
the last dim, summed and scaled by 1/(number of labels) (the zoo's vocabulary-parallel form,
``token_loss_fn``).

What the contract cannot get from an ONNX graph is left at what is safe: no tensor-parallel
declarations (every weight ``Replicate``), no sequence dim, random-input ranges of integer
inputs set to the number of classes (token ids below the vocabulary). The sizes an export
folded into its constants stay: a static-shape export (or the layers of a dynamic one, which
take the sizes as constants) runs at the imported batch only — strategies that split the batch
(data parallelism, microbatches) need an import at the per-replica microbatch. FLOPs per sample
are the forward's at the imported batch divided by it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

import distir
from distir.frontends.onnx_import import OnnxImport
from distir.frontends.onnx_import.reader import OnnxImportError
from distir.frontends.zoo._build import forward_flops
from distir.frontends.zoo.gpt import token_loss_fn
from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec, check_model
from distir.interp.shapes import Concrete, Mixed, TypeDomain, infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.types import DType, TensorType
from distir.ir.values import Attrs, Value

LABELS = "labels"


def to_model(imp: OnnxImport, name: str = "onnx") -> Model:
    """``imp`` with a cross-entropy loss layer, as a ``Model`` (module docstring)."""
    typed = distir.check(imp.module)
    outs = typed.entry.outputs
    logits = outs[0].type if len(outs) == 1 else None
    if not (isinstance(logits, TensorType) and logits.dtype.is_float and logits.rank >= 2):
        got = ", ".join(str(v.type) for v in outs)
        raise OnnxImportError(f"model {name}: a loss needs one float output of rank >= 2 (logits), got {got}")
    classes, items = logits.shape[-1], logits.shape[:-1]
    layers, fns = _layer_calls(imp.module)
    entry = imp.module.entry
    label = LABELS if all(p.name != LABELS for p in imp.inputs) else f"{LABELS}_"
    inputs = [InputSpec(p.name, p.type, high=classes if p.type.dtype.is_int else 0) for p in imp.inputs]
    inputs.append(InputSpec(label, TensorType(DType.i64, items, logits.device), high=classes))
    weights = [WeightSpec(p.name, p.type) for p in imp.weights]
    fb = FunctionBuilder("forward")
    specs: list[InputSpec | WeightSpec] = [*inputs, *weights]
    vals = {p.name: fb.param(p.name, p.type) for p in specs}
    by_entry = {p: vals[p.name] for p in entry.params}
    prev = vals[inputs[0].name]
    for call in layers:
        (prev,) = fb.call(
            call.callee, prev, *(by_entry[v] for v in call.inputs[1:]), names=[call.outputs[0].name]
        )
    loss = token_loss_fn(classes, int(logits.numel // classes))
    (prev,) = fb.call(loss, prev, vals[label], names=["loss"])
    module = _fold_shapes(Module((*fns, loss, fb.ret(prev))))
    model = Model(
        name,
        {"family": "onnx", "opset": imp.opset, "layers": " ".join(imp.layers)},
        module,
        tuple(inputs),
        tuple(weights),
        inputs[0].type.shape[0],
        tied=imp.shared,
        pre=int(bool(imp.layers) and imp.layers[0] == "pre"),
        post=1 + int(bool(imp.layers) and imp.layers[-1] == "post"),
    )
    try:
        check_model(model)
    except ModelError as e:
        raise OnnxImportError(f"model {name} does not fit the model contract: {e}") from None
    flops = forward_flops(module, [p.type for p in module.entry.params if p.type is not None])
    return replace(model, flops_per_sample=flops / model.batch)


def _fold_shapes(module: Module) -> Module:
    """Shape inputs made attributes: the transforms type layers abstractly (no known values), so
    a Reshape whose target is a shape subgraph gets the target as its ``shape`` attribute, a
    Range or ConstantOfShape of known inputs becomes a ``Constant``, and the shape ops nothing
    uses any more are dropped."""
    domain = TypeDomain(concrete_limit=1 << 16, record=True)
    infer_types(module, domain=domain)
    fns = []
    for fn in module.functions:
        seen = domain.envs.get(fn.name)
        fns.append(_fold(fn, seen[0][1]) if seen and fn is not module.entry else fn)
    return Module(tuple(fns))


def _fold(fn: Function, env: dict[Value, Mixed]) -> Function:
    def known(v: Value) -> Any:
        m = env.get(v)
        return m.data if isinstance(m, Concrete) else None

    body: list[Instr] = []
    for instr in fn.body:
        if isinstance(instr, Op) and instr.name == "Reshape" and len(instr.inputs) == 2:
            target = known(instr.inputs[1])
            if target is not None:
                shape = tuple(int(d) for d in np.asarray(target).reshape(-1))
                instr = Op("Reshape", instr.inputs[:1], instr.outputs, Attrs({**instr.attrs, "shape": shape}))
        elif (
            isinstance(instr, Op)
            and instr.name in ("Range", "ConstantOfShape")
            and known(instr.outputs[0]) is not None
        ):
            arr = np.asarray(known(instr.outputs[0]))
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
