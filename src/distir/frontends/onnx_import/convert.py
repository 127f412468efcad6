"""An ONNX graph → the flat program (``values.Program``): graph inputs and initializers become
entry parameters, every node its registry ops (``mapping``), in the graph's (topological) order.

Graph inputs: a dim with a value keeps it; a dynamic dim (``dim_param``, e.g. ``batch``) takes
the size the caller gives for its name (``dims={"batch": 8, "seq": 128}``), else the default
``batch`` when it is dim 0, else it is an error naming the input and the dim. Initializers that
are float tensors of more than ``values.LITERAL_LIMIT`` elements are weights (entry parameters
named after them, their values kept for running the program); the others (integer shapes,
scalars) are ``Constant`` ops, so shape subgraphs built on them resolve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.frontends.onnx_import.mapping import CONVERTERS, PRODUCED, Node, supported_ops
from distir.frontends.onnx_import.reader import (
    OnnxImportError,
    OnnxModel,
    check_supported,
    dtype_of,
    require_onnx,
)
from distir.frontends.onnx_import.values import LITERAL_LIMIT, Program, known_limit
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Value


@dataclass(frozen=True, slots=True)
class Converted:
    """The flat program, its graph inputs' and outputs' values (graph order)."""

    program: Program
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    output_names: tuple[str, ...]


def convert(
    model: OnnxModel, dims: Mapping[str, int], batch: int, device: Device, floats: DType | None = None
) -> Converted:
    check_supported(model, supported_ops())
    onnx = require_onnx()
    g = model.graph
    program = Program(device, known_limit(batch), floats)
    env: dict[str, Value] = {}
    inits = {t.name: t for t in g.initializer}
    _check_dim_names(g, inits, dims)  # first: a misspelt name is why a dim has no size
    inputs = []
    for vi in g.input:
        if vi.name not in inits:
            t = _input_type(vi, dims, batch, device)
            t = TensorType(program.float_type(t.dtype), t.shape, t.device)
            env[vi.name] = v = program.param(vi.name, t, None)
            inputs.append(v)
    literals: dict[str, tuple[np.ndarray, Any]] = {}
    arrays = {name: onnx.numpy_helper.to_array(t) for name, t in inits.items()}
    transposed = _transposed_copies(arrays)
    for name, t in inits.items():
        arr = arrays[name]
        dt = program.float_type(dtype_of(t.data_type, f"initializer {name}"))
        if name in transposed:  # made where first used: the weight, transposed
            literals[name] = (arr, _Transposed(transposed[name]))
            continue
        if dt.is_float and arr.size > LITERAL_LIMIT:
            env[name] = program.param(
                name,
                TensorType(dt, tuple(int(s) for s in arr.shape), device),
                np.ascontiguousarray(arr, dtype=dt.to_numpy()),
            )
        else:
            literals[name] = (arr, dt)
    unproduced: dict[str, str] = {}
    for k, node in enumerate(g.node):
        ins = tuple(_lookup(program, env, literals, unproduced, name, node, k) for name in node.input)
        attrs = {a.name: _attr_value(onnx, a) for a in node.attribute}
        n = Node(node, k, model.opset, ins, attrs, program)
        outs = CONVERTERS[node.op_type](n)
        made = PRODUCED.get(node.op_type, len(node.output))
        for name, v in zip(node.output, outs, strict=False):
            if name:
                env[name] = v
        for name in node.output[made:]:
            if name:
                unproduced[name] = n.where
    out_values = []
    for vi in g.output:
        out = _lookup(program, env, literals, unproduced, vi.name, None, -1)
        if out is None:
            raise OnnxImportError("a graph output has no name")
        out_values.append(out)
    return Converted(program, tuple(inputs), tuple(out_values), tuple(vi.name for vi in g.output))


@dataclass(frozen=True, slots=True)
class _Transposed:
    of: str  # the initializer this one is the transpose of


def _transposed_copies(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Float matrices the exporter stored as the transpose of another initializer (a tied
    embedding's ``wte.T`` for the head, folded by ``torch.onnx``'s optimizer into ``val_N``): each
    by name, with the initializer it copies. Of two alike, the one the graph lists first stays."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, arr in arrays.items():
        if arr.ndim == 2 and arr.dtype.kind == "f" and arr.size > LITERAL_LIMIT:
            by_shape.setdefault(arr.shape, []).append(name)
    out: dict[str, str] = {}
    for name, arr in reversed(list(arrays.items())):  # a later one is the copy of an earlier one
        if arr.ndim != 2 or arr.dtype.kind != "f" or name in out.values() or name in out:
            continue
        for other in by_shape.get(arr.shape[::-1], ()):
            if other != name and other not in out and _transpose_of(arr, arrays[other]):
                out[name] = other
                break
    return out


def _transpose_of(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` is ``b`` transposed: ``a``'s first row against ``b``'s first column, then
    (only when they agree) the whole (most pairs of weights differ in their first elements)."""
    return bool(np.array_equal(a[0], b[:, 0])) and bool(np.array_equal(b.T, a))


def _lookup(
    program: Program,
    env: dict[str, Value],
    literals: dict[str, tuple[np.ndarray, Any]],
    unproduced: dict[str, str],
    name: str,
    node: Any,
    k: int,
) -> Value | None:
    if not name:
        return None
    v = env.get(name)
    if v is not None:
        return v
    where = f"node {node.name or '#' + str(k)} ({node.op_type})" if node is not None else "graph output"
    if name in literals:
        arr, dt = literals.pop(name)
        if isinstance(dt, _Transposed):  # in the layer of its first user, not a weight of its own
            (v,) = program.emit(
                "Transpose", (env[dt.of],), {"perm": (1, 0)}, [name], k, f"initializer {name}"
            )
        else:
            v = program.literal(name, arr, dt, -1, f"initializer {name}")
        env[name] = v
        return v
    if name in unproduced:
        raise OnnxImportError(
            f"{where}: uses {name!r}, an output of {unproduced[name]} distir does not compute"
        )
    raise OnnxImportError(f"{where}: uses {name!r}, which no node, input or initializer defines")


def _check_dim_names(graph: Any, inits: Mapping[str, Any], dims: Mapping[str, int]) -> None:
    """Every size in ``dims`` names a dynamic dim of a graph input (a misspelt one is an error,
    not a size ignored)."""
    names = {
        d.dim_param
        for vi in graph.input
        if vi.name not in inits and vi.type.HasField("tensor_type")
        for d in vi.type.tensor_type.shape.dim
        if d.dim_param
    }
    unknown = sorted(set(dims) - names)
    if unknown:
        have = ", ".join(sorted(names)) or "none"
        raise OnnxImportError(
            f"dims {', '.join(unknown)}: no graph input has a dynamic dim so named (they have: {have})"
        )


def _input_type(vi: Any, dims: Mapping[str, int], batch: int, device: Device) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise OnnxImportError(f"graph input {vi.name}: only tensor inputs are supported")
    dt = dtype_of(tt.elem_type, f"graph input {vi.name}")
    shape = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        elif d.dim_param in dims:
            shape.append(int(dims[d.dim_param]))
        elif i == 0:
            shape.append(batch)
        else:
            name = d.dim_param or "unnamed"
            raise OnnxImportError(
                f"graph input {vi.name}: dim {i} ({name}) is dynamic; give its size "
                f"(dims={{{name!r}: n}}; on the command line model.onnx:{name}=n)"
            )
    return TensorType(dt, tuple(shape), device)


def _attr_value(onnx: Any, a: Any) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v
