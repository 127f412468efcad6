"""ONNX node → registry ops, with each opset's attribute forms converted.

One converter per ONNX op (``CONVERTERS``); it sees the node through ``Node`` — its inputs as
DistIR values (None for an omitted optional input), its attributes decoded, and the opset — and
emits registry ops, returning one value per node output. Conversions that depend on the opset:

- inputs distir takes as attributes must be known when the node is imported (constants or shape
  subgraphs, see ``values``): Slice's starts/ends/axes/steps (inputs since opset 10), Unsqueeze /
  Squeeze axes (13), ReduceSum axes (13) and ReduceMean/Max axes (18), Split's sizes (the
  ``split`` attribute before 13, an input since; ``num_outputs`` since 18), Expand's shape,
  Trilu's k, CumSum's axis, Range's bounds, ConstantOfShape's shape; Reshape keeps its shape as
  an input (the checker resolves it);
- ``GatherND`` (batch_dims 0) is written as a ``Gather`` of flat offsets (so it has a gradient
  and sharding rules without an op of its own); ONNX's variadic ``Max`` / ``Min`` as a chain;
- ``Shape``'s start/end (15) become a Slice of the shape; ``Softmax`` before opset 13 flattens to
  2-d: only its last-axis form maps; ``Gemm`` keeps alpha/beta/transA/transB; ``Cast``'s ``to``
  maps to a dtype; ``Constant``'s value/value_float(s)/value_int(s) become a literal;
  ``LayerNormalization`` keeps axis/epsilon (stash_type is the precision it computes statistics
  in, which the reference always does in the input dtype); ``Dropout`` at inference is the
  identity; ``Gelu``'s tanh approximation is written out in its ops.

A node output distir cannot produce (LayerNormalization's mean and inverse std, Dropout's mask)
is an error when something uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.frontends.onnx_import.reader import OnnxImportError, dtype_of, require_onnx
from distir.frontends.onnx_import.values import Program
from distir.ir.types import DType
from distir.ir.values import Attrs, Value
from distir.ops.registry import REGISTRY


@dataclass(frozen=True, slots=True)
class Node:
    """One ONNX node as a converter sees it."""

    proto: Any  # onnx.NodeProto
    index: int
    opset: int
    inputs: tuple[Value | None, ...]
    attrs: dict[str, Any]
    program: Program

    @property
    def where(self) -> str:
        return f"node {self.proto.name or '#' + str(self.index)} ({self.proto.op_type})"

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def input(self, i: int) -> Value:
        v = self.inputs[i] if i < len(self.inputs) else None
        if v is None:
            raise OnnxImportError(f"{self.where}: input {i + 1} is missing")
        return v

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def const(self, i: int, what: str) -> np.ndarray:
        """The known value of input ``i``; an error if it is only known at run time."""
        v = self.program.known(self.input(i))
        if v is None:
            raise OnnxImportError(
                f"{self.where}: its {what} (input {i + 1}) is computed at run time from abstract values; "
                "distir needs it known when importing"
            )
        return v

    def ints(self, i: int, what: str) -> tuple[int, ...]:
        return tuple(int(x) for x in self.const(i, what).reshape(-1))

    def op(self, name: str, *inputs: Value, **attrs: Any) -> tuple[Value, ...]:
        """Emit the op making the node's outputs (named as ONNX names them)."""
        n = REGISTRY.out_arity(name, len(inputs), Attrs(attrs))
        outs = list(self.proto.output)
        names = outs if n == len(outs) else [f"{outs[0] if outs else name.lower()}_{k}" for k in range(n)]
        return self.program.emit(name, inputs, attrs, names, self.index, self.where)

    def tmp(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        """An intermediate op of a node written out in several ops."""
        hint = f"{self.proto.output[0]}_{name.lower()}" if self.proto.output else name.lower()
        (v,) = self.program.emit(name, inputs, attrs, [hint], self.index, self.where)
        return v

    def scalar(self, value: float, like: Value) -> Value:
        t = self.program.type(like)
        return self.program.literal(f"{name_of(like)}_c", np.asarray(value), t.dtype, self.index, self.where)


def name_of(v: Value) -> str:
    return v.name


Converter = Callable[[Node], Sequence[Value]]
CONVERTERS: dict[str, Converter] = {}


def converter(*names: str) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return deco


def same(name: str) -> Converter:
    """A node that is the registry op of the same meaning, inputs in order, no attributes."""

    def conv(n: Node) -> Sequence[Value]:
        return n.op(name, *(n.input(i) for i in range(len(n.inputs))))

    return conv


for _name in (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sqrt",
    "Neg",
    "Exp",
    "Relu",
    "Tanh",
    "Sigmoid",
    "Log",
    "Reciprocal",
    "Sin",
    "Cos",
    "Where",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "IsNaN",
    "Not",
    "And",
    "Or",
    "MatMul",
    "Identity",
    "Sum",
):
    CONVERTERS[_name] = same(_name)


@converter("Pow")
def _pow(n: Node) -> Sequence[Value]:
    base, exp = n.input(0), n.input(1)
    bt, et = n.program.type(base), n.program.type(exp)
    if et.dtype is not bt.dtype:  # ONNX allows an exponent of another dtype
        exp = n.tmp("Cast", exp, to=bt.dtype)
    return n.op("Pow", base, exp)


@converter("Gelu")
def _gelu(n: Node) -> Sequence[Value]:
    x = n.input(0)
    if n.attr("approximate", "none") == "none":
        return n.op("Gelu", x)
    # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
    cube = n.tmp("Mul", x, n.tmp("Mul", x, x))
    inner = n.tmp("Add", x, n.tmp("Mul", cube, n.scalar(0.044715, x)))
    t = n.tmp("Tanh", n.tmp("Mul", inner, n.scalar(math.sqrt(2 / math.pi), x)))
    half = n.tmp("Mul", x, n.scalar(0.5, x))
    return n.op("Mul", half, n.tmp("Add", t, n.scalar(1.0, x)))


@converter("Cast")
def _cast(n: Node) -> Sequence[Value]:
    return n.op("Cast", n.input(0), to=n.program.float_type(dtype_of(int(n.attr("to")), n.where)))


@converter("Constant")
def _constant(n: Node) -> Sequence[Value]:
    onnx = require_onnx()
    a = n.attrs
    if "value" in a:
        t = a["value"]
        arr, dt = onnx.numpy_helper.to_array(t), n.program.float_type(dtype_of(t.data_type, n.where))
    elif "value_float" in a or "value_floats" in a:
        arr = np.asarray(a.get("value_float", a.get("value_floats")), np.float32)
        dt = n.program.float_type(DType.f32)
    elif "value_int" in a or "value_ints" in a:
        arr, dt = np.asarray(a.get("value_int", a.get("value_ints")), np.int64), DType.i64
    else:
        raise OnnxImportError(f"{n.where}: only tensor, float(s) and int(s) constants are supported")
    return (n.program.literal(n.proto.output[0], arr, dt, n.index, n.where),)


@converter("Reshape")
def _reshape(n: Node) -> Sequence[Value]:
    if n.opset < 5:  # pragma: no cover - below MIN_OPSET
        return n.op("Reshape", n.input(0), shape=tuple(n.attr("shape")))
    return n.op("Reshape", n.input(0), n.input(1), allowzero=int(n.attr("allowzero", 0)))


@converter("Flatten")
def _flatten(n: Node) -> Sequence[Value]:
    shape = n.program.type(n.input(0)).shape
    axis = int(n.attr("axis", 1)) % (len(shape) + 1) if shape else 0
    return n.op("Reshape", n.input(0), shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))


@converter("Gemm")
def _gemm(n: Node) -> Sequence[Value]:
    ins = [n.input(0), n.input(1)] + ([n.input(2)] if n.has(2) else [])
    return n.op(
        "Gemm",
        *ins,
        alpha=float(n.attr("alpha", 1.0)),
        beta=float(n.attr("beta", 1.0)),
        transA=int(n.attr("transA", 0)),
        transB=int(n.attr("transB", 0)),
    )


@converter("Softmax")
def _softmax(n: Node) -> Sequence[Value]:
    rank = len(n.program.type(n.input(0)).shape)
    axis = int(n.attr("axis", -1 if n.opset >= 13 else 1))
    if n.opset < 13 and axis % max(rank, 1) != rank - 1:
        raise OnnxImportError(
            f"{n.where}: opset {n.opset} Softmax over the flattened dims {axis}.. of a "
            f"rank-{rank} input is not supported (only the last axis)"
        )
    return n.op("Softmax", n.input(0), axis=axis)


@converter("LayerNormalization")
def _layer_norm(n: Node) -> Sequence[Value]:
    ins = [n.input(0), n.input(1)] + ([n.input(2)] if n.has(2) else [])
    out = n.program.emit(
        "LayerNormalization",
        ins,
        {"axis": int(n.attr("axis", -1)), "epsilon": float(n.attr("epsilon", 1e-5))},
        [n.proto.output[0]],
        n.index,
        n.where,
    )
    return out


@converter("Transpose")
def _transpose(n: Node) -> Sequence[Value]:
    perm = n.attr("perm")
    return n.op("Transpose", n.input(0), **({} if perm is None else {"perm": tuple(perm)}))


@converter("Gather")
def _gather(n: Node) -> Sequence[Value]:
    return n.op("Gather", n.input(0), n.input(1), axis=int(n.attr("axis", 0)))


@converter("Concat")
def _concat(n: Node) -> Sequence[Value]:
    return n.op("Concat", *(n.input(i) for i in range(len(n.inputs))), axis=int(n.attr("axis")))


def _axes(n: Node, since: int) -> tuple[int, ...] | None:
    """An ``axes`` list: an attribute before opset ``since``, an optional input from it on."""
    if n.opset < since:
        a = n.attr("axes")
        return None if a is None else tuple(int(x) for x in a)
    return n.ints(1, "axes") if n.has(1) else None


@converter("Unsqueeze")
def _unsqueeze(n: Node) -> Sequence[Value]:
    axes = _axes(n, 13)
    if axes is None:
        raise OnnxImportError(f"{n.where}: Unsqueeze needs axes")
    return n.op("Unsqueeze", n.input(0), axes=axes)


@converter("Squeeze")
def _squeeze(n: Node) -> Sequence[Value]:
    axes = _axes(n, 13)
    return n.op("Squeeze", n.input(0), **({} if axes is None else {"axes": axes}))


@converter("Shape")
def _shape(n: Node) -> Sequence[Value]:
    start, end = n.attr("start"), n.attr("end")
    if start is None and end is None:
        return n.op("Shape", n.input(0))
    rank = len(n.program.type(n.input(0)).shape)
    s = n.tmp("Shape", n.input(0))
    return n.op("Slice", s, starts=(int(start or 0),), ends=(rank if end is None else int(end),))


@converter("Slice")
def _slice(n: Node) -> Sequence[Value]:
    if n.opset < 10:
        starts, ends = tuple(n.attr("starts")), tuple(n.attr("ends"))
        axes = n.attr("axes")
        return n.op(
            "Slice", n.input(0), starts=starts, ends=ends, **({} if axes is None else {"axes": tuple(axes)})
        )
    attrs: dict[str, Any] = {"starts": n.ints(1, "starts"), "ends": n.ints(2, "ends")}
    if n.has(3):
        attrs["axes"] = n.ints(3, "axes")
    if n.has(4):
        attrs["steps"] = n.ints(4, "steps")
    return n.op("Slice", n.input(0), **attrs)


@converter("Split")
def _split(n: Node) -> Sequence[Value]:
    k = len(n.proto.output)
    axis = int(n.attr("axis", 0))
    # the split sizes: an attribute before opset 13, an optional input from 13 on
    sizes = n.attr("split") if n.opset < 13 else n.ints(1, "split") if n.has(1) else None
    attrs: dict[str, Any] = {"dim": axis}
    if sizes is not None:
        attrs["sizes"] = tuple(int(s) for s in sizes)
    else:
        dim = n.program.type(n.input(0)).shape[axis]
        # ONNX: equal parts of ceil(dim / k), the last one smaller (distir's split_sizes makes
        # the first ones larger: the same when k divides dim)
        step = -(-dim // k)
        attrs["sizes"] = tuple(max(0, min(step, dim - step * j)) for j in range(k))
    return n.op("Split", n.input(0), **attrs)


@converter("Expand")
def _expand(n: Node) -> Sequence[Value]:
    return n.op("Expand", n.input(0), shape=n.ints(1, "shape"))


def _reduce(name: str, since: int) -> Converter:
    def conv(n: Node) -> Sequence[Value]:
        axes = _axes(n, since)
        keep = int(n.attr("keepdims", 1))
        if axes is None and int(n.attr("noop_with_empty_axes", 0)):
            return n.op("Identity", n.input(0))
        return n.op(name, n.input(0), keepdims=keep, **({} if axes is None else {"axes": axes}))

    return conv


CONVERTERS["ReduceSum"] = _reduce("ReduceSum", 13)
CONVERTERS["ReduceMean"] = _reduce("ReduceMean", 18)
CONVERTERS["ReduceMax"] = _reduce("ReduceMax", 18)


@converter("Dropout")
def _dropout(n: Node) -> Sequence[Value]:
    """Inference: the identity (a mask output is an error if used, see ``unproducible``)."""
    (y,) = n.program.emit("Identity", [n.input(0)], {}, [n.proto.output[0]], n.index, n.where)
    return (y,)


@converter("Range")
def _range(n: Node) -> Sequence[Value]:
    return n.op("Range", n.input(0), n.input(1), n.input(2))


@converter("ConstantOfShape")
def _constant_of_shape(n: Node) -> Sequence[Value]:
    onnx = require_onnx()
    t = n.attr("value")
    if t is None:
        return n.op("ConstantOfShape", n.input(0))
    value = onnx.numpy_helper.to_array(t).reshape(-1)[0].item()
    dt = n.program.float_type(dtype_of(t.data_type, n.where))
    return n.op("ConstantOfShape", n.input(0), value=float(value), dtype=dt)


@converter("CumSum")
def _cumsum(n: Node) -> Sequence[Value]:
    axis = n.ints(1, "axis")[0]
    return n.op(
        "CumSum",
        n.input(0),
        axis=axis,
        exclusive=int(n.attr("exclusive", 0)),
        reverse=int(n.attr("reverse", 0)),
    )


@converter("GatherND")
def _gather_nd(n: Node) -> Sequence[Value]:
    """GatherND (batch_dims=0) written as a Gather: the index tuples (negative ones counted from
    the end) made flat offsets into data with its first k dims merged."""
    if int(n.attr("batch_dims", 0)):
        raise OnnxImportError(f"{n.where}: GatherND with batch_dims > 0 is not supported")
    data, idx = n.input(0), n.input(1)
    shape, it = n.program.type(data).shape, n.program.type(idx)
    k = it.shape[-1] if it.shape else 0
    if not 1 <= k <= len(shape):
        raise OnnxImportError(f"{n.where}: index tuples of length {k} for data of rank {len(shape)}")
    dims, hint = shape[:k], n.proto.output[0]
    strides = [math.prod(dims[j + 1 :]) for j in range(k)]

    def ints(name: str, values: Any) -> Value:
        return n.program.literal(f"{hint}_{name}", np.asarray(values, np.int64), it.dtype, n.index, n.where)

    negative = n.tmp("Less", idx, ints("zero", 0))
    idx = n.tmp("Where", negative, n.tmp("Add", idx, ints("dims", dims)), idx)
    flat = n.tmp("ReduceSum", n.tmp("Mul", idx, ints("strides", strides)), axes=(-1,), keepdims=0)
    rows = n.tmp("Reshape", data, shape=(-1, *shape[k:]))
    return n.op("Gather", rows, flat, axis=0)


@converter("Trilu")
def _trilu(n: Node) -> Sequence[Value]:
    k = n.ints(1, "k")[0] if n.has(1) else 0
    return n.op("Trilu", n.input(0), upper=int(n.attr("upper", 1)), k=k)


def _windowed(name: str, keys: tuple[str, ...]) -> Converter:
    def conv(n: Node) -> Sequence[Value]:
        pad = n.attr("auto_pad", "NOTSET")
        if pad not in ("NOTSET", b"NOTSET"):
            raise OnnxImportError(f"{n.where}: auto_pad={pad!r} is not supported (explicit pads only)")
        attrs = {
            k: (tuple(v) if isinstance(v, list) else int(v)) for k in keys if (v := n.attr(k)) is not None
        }
        ins = [n.input(i) for i in range(len(n.inputs)) if n.has(i)]
        outs = n.program.emit(name, ins, attrs, [n.proto.output[0]], n.index, n.where)
        return outs

    return conv


CONVERTERS["Conv"] = _windowed("Conv", ("strides", "pads", "dilations", "group", "kernel_shape"))
CONVERTERS["MaxPool"] = _windowed("MaxPool", ("kernel_shape", "strides", "pads", "dilations", "ceil_mode"))
CONVERTERS["AveragePool"] = _windowed(
    "AveragePool", ("kernel_shape", "strides", "pads", "ceil_mode", "count_include_pad")
)

# node outputs beyond the ones listed are not produced (an error if used): op -> outputs made
PRODUCED = {"LayerNormalization": 1, "Dropout": 1, "MaxPool": 1, "Conv": 1, "AveragePool": 1}


def supported_ops() -> frozenset[str]:
    return frozenset(CONVERTERS)


@converter("Max", "Min")
def _max_min(n: Node) -> Sequence[Value]:
    """ONNX's variadic Max / Min as a chain of two-input ones."""
    name = n.proto.op_type
    ins = [n.input(i) for i in range(len(n.inputs))]
    if len(ins) == 1:
        return n.op("Identity", ins[0])
    acc = ins[0]
    for x in ins[1:-1]:
        acc = n.tmp(name, acc, x)
    return n.op(name, acc, ins[-1])
