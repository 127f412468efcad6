"""Conversion: a traced program (``trace.Traced``) → layer functions of registry ops.

Every node of the exported graph is one of: a *constant* (computed from buffers, literals and
sizes alone: evaluated on the CPU by torch, then written as a ``Constant`` op in each layer that
uses it; one with a batch dim, OPT's positions from a mask of ones, is evaluated at ``PROBE``
samples and kept as one sample's, every sample's being equal), a *symbolic size* (the batch or
a multiple: it only ever appears in shapes, written as ``Reshape``'s ``0``/``-1``), or a
*tensor* of the program, written into the layer function its module path assigns it to
(``layers.assign``) by the ATen table (``aten_map``).
Dead nodes (unused by the output) are dropped first, so a mask the attention never reads costs
nothing; a constant mask that is the causal one (a model's ``sdpa`` path materializes it) makes
the attention causal and is not written (``_causal_sdpa``).

Between layers only one tensor may pass — the activation of the chain (``model.py``'s
contract); parameters become the layer function's parameters (named by their path relative to
the block, so identical blocks print identically and share one function), constants are
rebuilt inside each layer. A value passed from a layer to any but the next one, or a second
value passed, is a ``StructureError``; ATen ops with no mapping are collected and raised
together (``UnsupportedOpsError``), never imported in part.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from distir.frontends.torch_import import aten_map
from distir.frontends.torch_import.errors import StructureError, UnsupportedOpsError
from distir.frontends.torch_import.layers import LayerOf, assign, module_paths
from distir.frontends.torch_import.markers import is_marker
from distir.frontends.torch_import.patterns import (
    EagerAttentionMatch,
    GeluMatch,
    RMSMatch,
    RopeMatch,
    is_causal_mask,
    match_eager_attention,
    match_gelu_tanh,
    match_masked_attention,
    match_rms_norm,
    match_rope,
)
from distir.frontends.torch_import.stages import Body, Split, StageSpec, split_stages, stage_numbers
from distir.frontends.torch_import.trace import Traced
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.printer import print_function
from distir.ir.rewrite import eliminate_dead_code
from distir.ir.types import Device, DType
from distir.ir.values import Value
from distir.limits import MAX_CONSTANT, is_digits
from distir.ops.registry import REGISTRY

D0 = Device(0)
PROBE = 2  # the batch a constant with a batch dim is evaluated at


@dataclass(frozen=True, slots=True)
class Param:
    """A weight of the imported model: its torch name, distir shape, whether distir stores it
    transposed from torch's layout (an ``nn.Linear`` weight, kept (in, out)), and whether a
    linear layer reads it in torch's (out, in) layout (a tied embedding)."""

    name: str
    shape: tuple[int, ...]
    transposed: bool
    linear_layout: bool


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer call: its function, the torch names of its weights in the function's
    parameter order (after the activation), its key (``pre``, ``post``, ``body`` or the
    block's module path) and the module paths its ops came from."""

    fn: Function
    weights: tuple[str, ...]
    key: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Converted:
    layers: tuple[Layer, ...]
    params: dict[str, Param]
    input_name: str
    input_shape: tuple[int | None, ...]  # the first input's shape, None for the batch
    input_dtype: DType
    output_shape: tuple[int | None, ...]  # the last layer's result (the logits)
    # pipeline stages pass several values packed into one (batch, n) tensor (``stages``): the
    # activations between layers have no sequence dim
    packed: bool = False
    # weights of several stages sent from their owner stage (``Model.transmitted``)
    transmitted: tuple[str, ...] = ()


@dataclass
class TArg:
    """A tensor argument (``aten_map.Arg``): its value in the current layer and shape."""

    value: Value
    shape: tuple[int | None, ...]
    batch_dims: tuple[bool, ...]
    const: np.ndarray | None = None


@dataclass
class _Builder:
    key: str
    fb: FunctionBuilder
    x: Value | None = None  # the incoming activation parameter
    x_from: str | None = None  # the node it stands for
    weights: list[str] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)  # node name → value in this layer
    paths: list[str] = field(default_factory=list)


def _torch_dtype(dt: Any) -> DType:
    return DType.parse(str(dt).removeprefix("torch.").replace("float", "f").replace("int", "i"))


def _location(node: Any) -> str:
    """Where the user's code made ``node``: the innermost frame of its stack trace outside torch's
    own package (an ``nn.Conv1d``'s op is the line that called the module, not torch's
    ``conv.py``), with the module path it was traced in."""
    import torch

    own = str(Path(torch.__file__).parent) + os.sep
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    user = [ln for ln in lines if own not in ln]
    paths = module_paths(node.meta.get("nn_module_stack"))
    module = f"module {paths[-1]}" if paths and paths[-1] else ""
    if lines:
        where = (user or lines)[-1].removeprefix("File ").replace('"', "")
        return f"{where}, {module}" if module else where
    return module or f"node {node.name}"


class Converter:
    """One conversion (module docstring); ``run()`` returns the ``Converted`` model."""

    def __init__(self, traced: Traced, dtype: DType, stages: StageSpec | None = None) -> None:
        self.t = traced
        self.spec = stages or StageSpec()
        self.stage_of: dict[str, int] | None = None  # tensor node → its pipeline stage, if split
        self.op_stage: dict[Op, int] = {}
        self.shapes: dict[Value, tuple[int | None, ...]] = {}
        self.dtype = dtype
        self.graph = traced.program.graph
        self.batch = traced.batch
        self.kind: dict[str, str] = {}  # node → const | sym | tensor | input | param | none
        self.consts: dict[str, Any] = {}  # evaluated constants (torch tensors / numbers)
        self.unsupported: dict[str, list[str]] = defaultdict(list)
        self.poisoned: set[str] = set()
        self.causal_masks: dict[str, bool] = {}  # attention mask node → whether it is the causal one
        self.layer_of: dict[str, LayerOf] = {}
        self.builders: dict[str, _Builder] = {}
        self.order: list[str] = []
        self.value_layer: dict[str, str] = {}  # tensor node → the layer that made it
        self.tuples: dict[str, Any] = {}
        self.cur: _Builder | None = None
        self.node: Any = None
        # Transpose results of the current walk → (input, perm): a transpose of one cancels
        self._transposes: dict[Value, tuple[Value, tuple[int, ...]]] = {}
        self.params = self._params()

    # -- analysis ------------------------------------------------------------------------
    def _live(self) -> list[Any]:
        out = next(n for n in self.graph.nodes if n.op == "output")
        live: set[Any] = set()
        stack = [out]
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(n.all_input_nodes)
        return [n for n in self.graph.nodes if n in live]

    def _params(self) -> dict[str, Param]:
        out: dict[str, Param] = {}
        for n in self.graph.nodes:
            if n.op != "placeholder" or n.name not in self.t.params:
                continue
            name = self.t.params[n.name]
            shape = tuple(int(d) for d in n.meta["val"].shape)
            linear = [
                u for u in n.users if _packet(u) == "aten.linear" and len(u.args) > 1 and u.args[1] is n
            ]
            flips = [u for u in n.users if _is_flip(u)]  # x @ W.T (Falcon's, GPT-J's linear layers)
            transposed = (
                len(shape) == 2 and bool(linear or flips) and len(linear) + len(flips) == len(n.users)
            )
            stored = shape[::-1] if transposed else shape
            out[n.name] = Param(name, stored, transposed, bool(linear) and not transposed)
        return out

    def _classify(self, nodes: Sequence[Any]) -> None:
        for n in nodes:
            if n.op == "placeholder":
                self.kind[n.name] = (
                    "param" if n.name in self.t.params else "const" if n.name in self.t.buffers else "input"
                )
                if n.name in self.t.buffers:
                    self.consts[n.name] = self.t.buffers[n.name]
            elif n.op == "call_function":
                ins = [self.kind[a.name] for a in n.all_input_nodes]
                val = n.meta.get("val")
                if _packet(n) in aten_map.DROPPED:
                    self.kind[n.name] = "none"
                elif _is_symint(val):
                    self.kind[n.name] = "const" if not _symbolic(val) else "sym"
                elif all(k in ("const", "sym") for k in ins) and self._batch_only(val):
                    self.kind[n.name] = "const"  # the same for every sample (a mask of ones)
                else:
                    self.kind[n.name] = "tensor"

    def _batch_only(self, val: Any) -> bool:
        """Whether ``val``'s shape has no symbolic dim but the batch itself (not a multiple)."""
        if isinstance(val, list | tuple):
            return all(self._batch_only(v) for v in val)
        shape = getattr(val, "shape", ())
        return all(not _symbolic(d) or d.node.expr == self.batch for d in shape)

    # -- constants -------------------------------------------------------------------------
    def const(self, n: Any) -> Any:
        """The value of constant ``n``, a shape's size or a tensor computed from buffers, literals
        and sizes; a batch-sized dim is evaluated at ``PROBE`` samples (``_constant_value`` keeps
        one row of it, the rows being equal)."""
        if n.name in self.consts:
            return self.consts[n.name]
        import torch

        def real(a: Any) -> Any:
            if hasattr(a, "op") and hasattr(a, "name"):
                return self.const(a)
            if isinstance(a, list | tuple):
                return type(a)(real(x) for x in a)
            if isinstance(a, torch.device):
                return torch.device("cpu")
            return a

        val = n.meta.get("val")
        if _is_symint(val):
            v: Any = int(val) if not _symbolic(val) else val.node.expr.subs(self.batch, PROBE)
            if not isinstance(v, int) and not getattr(v, "is_number", False):
                raise StructureError(
                    f"size {n.name} ({_location(n)}) depends on more than the batch ({val.node.expr})"
                )
            v = int(v)
        else:
            args = real(n.args)
            kwargs = {k: real(v) for k, v in n.kwargs.items()}
            if "device" in kwargs:
                kwargs["device"] = torch.device("cpu")
            with torch.no_grad():
                v = n.target(*args, **kwargs)
        if _no_values(v):
            raise StructureError(
                f"constant {n.name} ({_location(n)}) is computed from a buffer on the meta device"
            )
        self.consts[n.name] = v
        return v

    def _constant_value(self, n: Any, b: _Builder) -> TArg:
        import torch

        c = self.const(n)
        if _no_values(c):  # a buffer made on meta
            name = self.t.program.graph_signature.inputs_to_buffers.get(n.name, n.name)
            raise StructureError(
                f"buffer {name} is on the meta device: the import needs a buffer's values (create "
                "buffers off the meta device; parameters may stay there)"
            )
        if isinstance(c, torch.Tensor) and c.is_floating_point() and c.dtype not in _numpy_floats():
            c = c.float()  # a float format numpy lacks (bfloat16)
        arr = c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c)
        arr = self._one_sample(n, arr)
        if arr.size > MAX_CONSTANT.max:
            raise StructureError(
                f"constant {n.name} ({_location(n)}) has {arr.size:,} elements, above the "
                f"{MAX_CONSTANT.max:,} an imported program holds as a literal (a table over a long "
                f"sequence: import at a shorter one, hf:CONFIG:seq=N or shorter example inputs)"
            )
        key = f"const:{n.name}"
        if key not in b.values:
            dt = self.dtype if arr.dtype.kind == "f" else DType.i64 if arr.dtype.kind in "iu" else DType.bool
            value = _nested(arr.astype(dt.to_numpy()) if arr.dtype.kind in "fiu" else arr)
            (b.values[key],) = b.fb.op("Constant", names=["const"], value=value, dtype=dt, device=D0)
        return TArg(b.values[key], tuple(arr.shape), (False,) * arr.ndim, arr)

    def _one_sample(self, n: Any, arr: np.ndarray) -> np.ndarray:
        """A constant with batch dims (evaluated at ``PROBE`` samples) as one sample (size 1 on
        them: broadcast where it is used), when every sample's value is the same; else an error."""
        _, batch = self.shape_of(n) if hasattr(n.meta.get("val"), "shape") else ((), ())
        for d, is_batch in enumerate(batch):
            if not is_batch:
                continue
            first = np.take(arr, [0], axis=d)
            if not np.array_equal(np.broadcast_to(first, arr.shape), arr):
                raise StructureError(
                    f"constant {n.name} ({_location(n)}) differs between the samples of a batch: "
                    "compute a value per sample from the model's input"
                )
            arr = first
        return arr

    # -- arguments ---------------------------------------------------------------------------
    def shape_of(self, n: Any) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
        val = n.meta["val"]
        shape = tuple(int(d) if not _symbolic(d) else None for d in val.shape)
        batch = tuple(_symbolic(d) and d.node.expr == self.batch for d in val.shape)
        return shape, batch

    def tensor_arg(self, n: Any, b: _Builder) -> TArg:
        kind = self.kind[n.name]
        if kind == "const":
            return self._constant_value(n, b)
        shape, batch = self.shape_of(n)
        if n.name in b.values:
            return TArg(b.values[n.name], shape, batch)
        if kind == "param":
            p = self.params[n.name]
            (v,) = (b.fb.param(self._relative(p.name, b.key)),)
            b.weights.append(p.name)
            b.values[n.name] = v
            self.shapes[v] = p.shape
            return TArg(v, p.shape if p.transposed else shape, (False,) * len(shape))
        if kind == "input" and n.name != self.t.inputs[0]:
            at = f" (at {_location(self.node)})" if self.node is not None else ""
            raise StructureError(
                f"input {n.name} is used by the model{at}; only its first input (the token ids) is "
                "supported: drop it from the example inputs, or compute it inside forward"
            )
        if b.x_from is not None:
            raise StructureError(
                f"layer {b.key} takes two values from before it ({b.x_from} and {n.name}): "
                "only the activation of the chain may pass between layers"
            )
        src = self.value_layer.get(n.name)
        if src is not None:
            prev = self.builders[self.order[self.order.index(b.key) - 1]] if self.order.index(b.key) else None
            if prev is None or prev.key != src:
                raise StructureError(
                    f"layer {b.key} uses {n.name} of layer {src}, which is not the one before it"
                )
        assert b.x is not None
        b.x_from = n.name
        b.values[n.name] = b.x
        self.shapes[b.x] = shape
        return TArg(b.x, shape, batch)

    def arg(self, a: Any, b: _Builder) -> Any:
        if isinstance(a, list | tuple):
            return type(a)(self.arg(x, b) for x in a)
        if not (hasattr(a, "op") and hasattr(a, "name")):
            return a
        kind = self.kind[a.name]
        if kind == "sym":
            return a.meta["val"]
        if a.name in self.tuples:
            return self.tuples[a.name]
        if kind == "const" and not _is_tensor(self.const(a)):
            return self.const(a)
        return self.tensor_arg(a, b)

    # -- emission (aten_map.Emit) -----------------------------------------------------------
    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        (y,) = self.ops(name, *inputs, n=1, **attrs)
        return y

    def ops(self, name: str, *inputs: Value, n: int, **attrs: Any) -> tuple[Value, ...]:
        assert self.cur is not None
        if name == "Transpose":
            folded = self._fold_transpose(inputs[0], tuple(attrs["perm"]))
            if folded is not None:
                return (folded,)
        moved = self._before_transpose(name, inputs, n, attrs)
        if moved is not None:
            return moved
        outs = self.cur.fb.op(name, *inputs, n_out=n, **attrs)
        if name == "Transpose":
            self._transposes[outs[0]] = (inputs[0], tuple(attrs["perm"]))
        return outs

    def _before_transpose(
        self, name: str, inputs: Sequence[Value], n: int, attrs: dict[str, Any]
    ) -> tuple[Value, ...] | None:
        """A Split, Slice or Concat of transposed values (all by one perm) run before the
        transpose instead, along the axis it maps to, and its results transposed: those
        transposes then cancel against the next ones (GPT-NeoX's head transposes around the
        rotary slices and the attention), and a dead transpose of the whole is dropped. Never more
        bytes moved: the pieces' transposes add up to the whole's at most."""
        axis_key = {"Split": "dim", "Slice": "axes", "Concat": "axis"}.get(name)
        if axis_key is None or not inputs or any(v not in self._transposes for v in inputs):
            return None
        perms = {self._transposes[v][1] for v in inputs}
        if len(perms) != 1 or (name != "Concat" and len(inputs) != 1):
            return None
        (perm,) = perms
        rank = len(perm)
        axis = attrs[axis_key]
        mapped = tuple(perm[a % rank] for a in axis) if isinstance(axis, list | tuple) else perm[axis % rank]
        assert self.cur is not None
        srcs = [self._transposes[v][0] for v in inputs]
        outs = self.cur.fb.op(name, *srcs, n_out=n, **{**attrs, axis_key: mapped})
        return tuple(self.op("Transpose", o, perm=perm) for o in outs)

    def _fold_transpose(self, x: Value, perm: tuple[int, ...]) -> Value | None:
        prev = self._transposes.get(x)
        if prev is None:
            return None
        src, p0 = prev
        return src if tuple(p0[i] for i in perm) == tuple(range(len(perm))) else None

    def weight_matrix(self, arg: Any) -> Value:
        p = next(
            (p for k, p in self.params.items() if self.cur and self.cur.values.get(k) is arg.value), None
        )
        if p is not None and p.transposed:
            return arg.value  # type: ignore[no-any-return]
        return self.op("Transpose", arg.value, perm=(1, 0))

    def target_shape(self, arg: Any, shape: Sequence[Any]) -> tuple[int, ...]:
        out: list[int] = []
        for i, d in enumerate(shape):
            if not _symbolic(d):
                out.append(int(d))
            elif d.node.expr == self.batch and i < len(arg.batch_dims) and arg.batch_dims[i]:
                out.append(0)
            else:
                out.append(-1)
        if out.count(-1) > 1:
            raise NotImplementedError(f"a reshape to {list(shape)} with two batch-dependent dims")
        return tuple(out)

    def expand_shape(self, arg: Any, shape: Sequence[Any]) -> tuple[int, ...]:
        lead = len(shape) - len(arg.shape)
        out: list[int] = []
        for i, d in enumerate(shape):
            j = i - lead
            if _symbolic(d) or d == -1:
                if j < 0 or (_symbolic(d) and arg.shape[j] == 1):
                    raise NotImplementedError(f"an expand to {list(shape)} that creates a batch dim")
                out.append(1)
            else:
                out.append(int(d))
        return tuple(out)

    def fill(self, like: Value, value: float) -> Value:
        """A tensor like ``like`` filled with ``value``, a constant for autodiff (FillLike has no
        gradient rule: a StopGradient view of it, which costs nothing, ends the gradient)."""
        return self.op("StopGradient", self.op("FillLike", like, value=float(value)))

    def is_tensor(self, x: object) -> bool:
        return isinstance(x, TArg)

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> Converted:
        nodes = self._live()
        self._classify(nodes)
        tensors = [n for n in nodes if n.op == "call_function" and self.kind[n.name] == "tensor"]
        stacks = [module_paths(n.meta.get("nn_module_stack")) for n in tensors]
        everything = list(self.graph.nodes)
        if self.spec.split or any(is_marker(n) for n in everything):
            self.stage_of = stage_numbers(everything, tensors, self.spec.split)
            for n, s in zip(tensors, stacks, strict=True):
                self.layer_of[n.name] = LayerOf("body", s[-1] if s else "")
        else:
            for n, lay in zip(tensors, assign(stacks, [n.name for n in tensors]), strict=True):
                self.layer_of[n.name] = lay
        self._match_patterns(tensors)
        for n in tensors:
            if n.name in self.skip:  # a pattern's node: poisoned with its inputs, for the pattern's
                if any(a.name in self.poisoned for a in n.all_input_nodes):
                    self.poisoned.add(n.name)
            else:
                before = len(self._builder(self.layer_of[n.name].key).fb)
                self._emit(n)
                if self.stage_of is not None:
                    b = self.builders["body"]
                    self.op_stage.update(
                        (i, self.stage_of[n.name]) for i in b.fb.since(before) if isinstance(i, Op)
                    )
        if self.unsupported:
            raise UnsupportedOpsError(self.unsupported)
        return self._finish(nodes)

    def _match_patterns(self, tensors: Sequence[Any]) -> None:
        """Rotary embeddings, written-out RMSNorms and tanh GELUs (``patterns``): the final node
        becomes a Rope, an RMSNormalization or a GeluTanh, the pattern's other nodes are skipped
        when nothing else reads them."""
        self.skip: set[str] = set()
        self.ropes: dict[str, RopeMatch] = {}
        self.norms: dict[str, RMSMatch] = {}
        self.gelus: dict[str, GeluMatch] = {}
        self.attentions: dict[str, EagerAttentionMatch] = {}
        tables: dict[tuple[str, str], Any] = {}  # the tables' check, once per pair (shared by layers)
        for n in tensors:
            m: RopeMatch | RMSMatch | GeluMatch | EagerAttentionMatch | None = match_rope(
                n, self.const, lambda a: self.kind.get(a.name) == "const", tables
            )
            m = m or match_rms_norm(n, lambda a: self.kind.get(a.name) == "param") or match_gelu_tanh(n)
            m = m or match_eager_attention(n, self.const, self._computable)
            m = m or match_masked_attention(n, self.const, self._computable)
            if m is None:
                continue
            inside = {x.name for x in m.interior} | {n.name}
            if all(
                u.name in inside or u.name not in self.kind or _packet(u) in aten_map.DROPPED
                for x in m.interior
                for u in x.users
            ):
                if isinstance(m, RopeMatch):
                    self.ropes[n.name] = m
                elif isinstance(m, RMSMatch):
                    self.norms[n.name] = m
                elif isinstance(m, GeluMatch):
                    self.gelus[n.name] = m
                else:
                    self.attentions[n.name] = m
                self.skip |= {x.name for x in m.interior}
                if isinstance(m, EagerAttentionMatch):  # its bias is evaluated, never emitted
                    self.skip |= {x.name for x in m.bias}

    def _computable(self, n: Any) -> tuple[Any, ...] | None:
        """The program's nodes ``n`` is computed by when it is computed from sizes and constants
        alone (a bias tensor whose dims are multiples of the batch), else None."""
        found: list[Any] = []
        stack, seen = [n], set()
        while stack:
            x = stack.pop()
            if not hasattr(x, "op") or x.name in seen:
                continue
            seen.add(x.name)
            kind = self.kind.get(x.name)
            if kind in ("input", "param") or (x.op == "placeholder" and kind != "const"):
                return None
            if kind == "tensor":
                found.append(x)
                stack.extend(x.all_input_nodes)
        return tuple(found)

    def _eager_attention(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        """Attention written out (``patterns.match_eager_attention``) as one Attention in BSHD
        (ALiBi's slopes an attribute), its result back in (B, h, S, d)."""
        m = self.attentions[self.node.name]
        assert self.cur is not None
        q, k, v = (
            self.op("Transpose", self.tensor_arg(x, self.cur).value, perm=aten_map.BHSD)
            for x in (m.q, m.k, m.v)
        )
        attrs: dict[str, Any] = {"causal": m.causal, "scale": m.scale}
        if m.alibi is not None:
            attrs["alibi"] = m.alibi
        if m.window:
            attrs["window"] = m.window
        out, _ = self.ops("Attention", q, k, v, n=2, **attrs)
        return self.op("Transpose", out, perm=aten_map.BHSD)

    def _rms_norm(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        m = self.norms[self.node.name]
        assert self.cur is not None
        x, w = self.tensor_arg(m.x, self.cur).value, self.tensor_arg(m.weight, self.cur).value
        return self.op("RMSNormalization", x, w, epsilon=m.eps)

    def _gelu_tanh(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        assert self.cur is not None
        return self.op("GeluTanh", self.tensor_arg(self.gelus[self.node.name].x, self.cur).value)

    def _rope(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        m = self.ropes[self.node.name]
        assert self.cur is not None
        x = self.tensor_arg(m.x, self.cur).value
        if m.seq_axis == 2:
            x = self.op("Transpose", x, perm=aten_map.BHSD)
        y = self.op("Rope", x, halves=m.halves, freqs=m.freqs)
        return self.op("Transpose", y, perm=aten_map.BHSD) if m.seq_axis == 2 else y

    def _builder(self, key: str) -> _Builder:
        b = self.builders.get(key)
        if b is None:
            b = self.builders[key] = _Builder(key, FunctionBuilder(key, REGISTRY.out_arity))
            b.x = b.fb.param("x")
            self.order.append(key)
        return b

    def _emit(self, n: Any) -> None:
        if any(a.name in self.poisoned for a in n.all_input_nodes):  # after an unsupported op:
            self.poisoned.add(n.name)  # nothing to emit, but its own op is still checked
            name = _packet(n)
            if (
                name not in aten_map.ATEN
                and name not in ("aten.to", "aten._to_copy")
                and n.target is not _getitem()
            ):
                self.unsupported[name].append(_location(n))
            return
        lay = self.layer_of[n.name]
        self.node = n
        b = self.cur = self._builder(lay.key)
        if lay.path and (not b.paths or b.paths[-1] != lay.path):
            b.paths.append(lay.path)
        name = _packet(n)
        emitter: Callable[..., Any] | None
        if n.name in self.ropes:
            emitter = self._rope
        elif n.name in self.norms:
            emitter = self._rms_norm
        elif n.name in self.gelus:
            emitter = self._gelu_tanh
        elif n.name in self.attentions:
            emitter = self._eager_attention
        elif n.target is _getitem():
            emitter = aten_map.GETITEM
        elif _is_flip(n) and n.args[0].name in self.params and self.params[n.args[0].name].transposed:
            emitter = aten_map.IDENTITY_EMITTER  # the weight is stored transposed already
        elif name.endswith("_") and any(u is not n for u in n.args[0].users):
            emitter = None  # in place on a value something else reads
        elif name in ("aten.to", "aten._to_copy"):
            emitter = self._cast
        else:
            emitter = aten_map.ATEN.get(name)
        if emitter is None:
            self.unsupported[name].append(_location(n))
            self.poisoned.add(n.name)
            return
        # a pattern's arguments are its skipped nodes: it reads its own input
        rope = any(n.name in found for found in (self.ropes, self.norms, self.gelus, self.attentions))
        node_args, node_kwargs = list(n.args), dict(n.kwargs)
        if name == "aten.scaled_dot_product_attention":
            self._causal_sdpa(node_args, node_kwargs)
        args = self.arg(node_args, b) if not rope else []
        kwargs = {k: self.arg(v, b) for k, v in node_kwargs.items()} if not rope else {}
        if name == "aten.embedding" and isinstance(args[1], TArg) and args[1].const is not None:
            emitter = self._embedding_rows
        try:
            y = emitter(self, args, kwargs)
        except NotImplementedError as e:
            self.unsupported[f"{name} ({e})"].append(_location(n))
            self.poisoned.add(n.name)
            return
        if isinstance(y, tuple | list):
            self.tuples[n.name] = [
                TArg(v, *self.shape_of_val(m)) if isinstance(v, Value) else v
                for v, m in zip(y, n.meta["val"], strict=False)
            ]
        else:
            v = y.value if isinstance(y, TArg) else y
            b.values[n.name] = v
            self.shapes[v] = self.shape_of(n)[0]
            self.value_layer[n.name] = lay.key

    def _causal_sdpa(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Attention's arguments with a mask known at import that is the causal one (a boolean
        lower triangle, or 0 on and below the diagonal and a large negative number above it:
        what a model's ``sdpa`` path builds) made ``is_causal`` without the mask, in place."""
        mask: Any = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
        if not hasattr(mask, "name") or self.kind.get(mask.name) != "const" or causal:
            return
        if mask.name not in self.causal_masks:
            self.causal_masks[mask.name] = is_causal_mask(self.const(mask))
        if not self.causal_masks[mask.name]:
            return
        if len(args) > 3:
            args[3] = None
        kwargs.pop("attn_mask", None)
        if len(args) > 5:
            args[5] = True
        else:
            kwargs["is_causal"] = True

    def shape_of_val(self, val: Any) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
        shape = tuple(int(d) if not _symbolic(d) else None for d in val.shape)
        return shape, tuple(_symbolic(d) and d.node.expr == self.batch for d in val.shape)

    def _cast(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Any:
        import torch

        x = a[0]
        dt = kw.get("dtype", next((v for v in a[1:] if isinstance(v, torch.dtype)), None))
        if dt is None:
            return x
        src = self.node.args[0].meta["val"].dtype if self.node is not None else torch.float32
        if dt.is_floating_point == src.is_floating_point:
            return x
        return TArg(
            self.op("Cast", x.value, to=self.dtype if dt.is_floating_point else _torch_dtype(dt)),
            x.shape,
            x.batch_dims,
        )

    def _embedding_rows(self, cx: Any, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        """An embedding of constant contiguous indices (positions): a Slice of the table."""
        w, idx = a[0], a[1]
        flat = np.asarray(idx.const).reshape(-1)
        if flat.size and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
            rows = self.op(
                "Slice", w.value, starts=(int(flat[0]),), ends=(int(flat[0] + flat.size),), axes=(0,)
            )
            return self.op("Reshape", rows, shape=(*idx.const.shape, w.shape[1]))
        return self.op("Gather", w.value, idx.value, axis=0)

    # -- the result --------------------------------------------------------------------------
    def _finish(self, nodes: Sequence[Any]) -> Converted:
        out = next(n for n in nodes if n.op == "output")
        results = [r for r in _flatten(out.args[0]) if hasattr(r, "name")]
        if not results:
            raise StructureError("the module returns no tensor")
        logits = results[0]
        if logits.name not in self.value_layer:
            raise StructureError(f"the module's output {logits.name} is not computed from its inputs")
        outputs: dict[str, str] = {}
        for key in self.order:
            b = self.builders[key]
            if b.x_from is not None and self.order.index(key) > 0:
                prev = self.order[self.order.index(key) - 1]
                outputs[prev] = b.x_from
        outputs[self.order[-1]] = logits.name
        if self.stage_of is not None:
            split, stages = self._stages(logits)
            conv = self._converted(nodes, logits, stages)
            return replace(conv, packed=split.packed, transmitted=split.transmitted)
        layers: list[Layer] = []
        for key in self.order:
            b = self.builders[key]
            if b.x_from is None:
                raise StructureError(f"layer {key} does not take the activation of the chain")
            fn = eliminate_dead_code(b.fb.ret(b.values[outputs[key]]))
            layers.append(Layer(fn, tuple(b.weights), key, tuple(b.paths)))
        return self._converted(nodes, logits, _share(layers))

    def _stages(self, logits: Any) -> tuple[Split, list[Layer]]:
        """The stage functions (``stages``): the program as one function, split."""
        assert self.stage_of is not None
        b = self.builders["body"]
        if b.x_from is None:
            raise StructureError("the model does not use its first input")
        body = Body(
            b.fb.ret(b.values[logits.name]),
            self.op_stage,
            tuple(b.weights),
            self.shapes,
            max(self.stage_of.values()) + 1,
        )
        paths: dict[int, list[str]] = {k: [] for k in range(body.stages)}
        for n, k in self.stage_of.items():
            path = self.layer_of[n].path
            if path and path not in paths[k]:
                paths[k].append(path)
        split = split_stages(body, self.spec)
        layers = [Layer(st.fn, st.weights, f"stage{k}", tuple(paths[k])) for k, st in enumerate(split.stages)]
        return split, layers

    def _converted(self, nodes: Sequence[Any], logits: Any, layers: Sequence[Layer]) -> Converted:
        first = next(n for n in nodes if n.name == self.t.inputs[0])
        in_shape, _ = self.shape_of(first)
        out_shape, _ = self.shape_of(logits)
        return Converted(
            tuple(layers),
            {p.name: p for p in self.params.values()},
            first.name,
            in_shape,
            _torch_dtype(first.meta["val"].dtype),
            out_shape,
        )

    def _relative(self, name: str, key: str) -> str:
        return (
            name[len(key) + 1 :]
            if key not in ("pre", "post", "body") and name.startswith(key + ".")
            else name
        )


def _share(layers: list[Layer]) -> list[Layer]:
    """Name the functions: ``embed``, ``head``, ``body``; blocks that print alike share one
    function, ``block`` (or ``block_0``, ``block_1``, ... for several kinds)."""
    kinds: dict[str, Function] = {}
    for lay in layers:
        if lay.key in ("pre", "post", "body"):
            continue
        text = print_function(replace(lay.fn, name="_"))
        kinds.setdefault(text, lay.fn)
    names = {t: ("block" if len(kinds) == 1 else f"block_{i}") for i, t in enumerate(kinds)}
    fixed = {"pre": "embed", "post": "head", "body": "body"}
    out: list[Layer] = []
    made: dict[str, Function] = {}
    for lay in layers:
        if lay.key in fixed:
            out.append(replace(lay, fn=replace(lay.fn, name=fixed[lay.key])))
            continue
        text = print_function(replace(lay.fn, name="_"))
        fn = made.setdefault(names[text], replace(kinds[text], name=names[text]))
        out.append(replace(lay, fn=fn))
    return out


def deepen(conv: Converted, blocks: int) -> Converted | None:
    """``conv`` with its blocks repeated to ``blocks`` of them, when it was traced at a smaller
    depth and its blocks share one function (``layer i``'s weights renamed from block 0's by
    the index in the module path); None when its blocks differ."""
    body = [lay for lay in conv.layers if lay.key not in ("pre", "post", "body")]
    if not body or any(lay.fn is not body[0].fn for lay in body):
        return None
    first = body[0]
    container, _, index = first.key.rpartition(".")
    if not is_digits(index):
        return None
    old = f"{first.key}."
    params = {
        p.name: p for p in conv.params.values() if not any(p.name.startswith(f"{b.key}.") for b in body)
    }
    layers: list[Layer] = [lay for lay in conv.layers if lay.key == "pre"]
    for i in range(blocks):
        new = f"{container}.{i}." if container else f"{i}."
        names = tuple(new + w[len(old) :] if w.startswith(old) else w for w in first.weights)
        for w, n in zip(first.weights, names, strict=True):
            if w.startswith(old):
                params[n] = replace(conv.params[w], name=n)
        paths = tuple(new[:-1] + p[len(old) - 1 :] if p.startswith(old[:-1]) else p for p in first.paths)
        layers.append(Layer(first.fn, names, new[:-1], paths))
    layers += [lay for lay in conv.layers if lay.key == "post"]
    return replace(conv, layers=tuple(layers), params=params)


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, list | tuple):
        return [y for e in x for y in _flatten(e)]
    if isinstance(x, dict):
        return [y for e in x.values() for y in _flatten(e)]
    return [x]


def _nested(arr: np.ndarray) -> Any:
    if arr.ndim == 0:
        return arr.item()
    return tuple(_nested(a) for a in arr) if arr.ndim > 1 else tuple(arr.tolist())


def _packet(n: Any) -> str:
    t = n.target
    pk = getattr(t, "_overloadpacket", None)
    return str(pk) if pk is not None else getattr(t, "__name__", str(t))


def _no_values(t: Any) -> bool:
    """Whether ``t`` is a tensor without storage: on the meta device, or a buffer made there
    that the trace saw as a fake CPU tensor (``trace``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, torch.Tensor) and (t.device.type == "meta" or isinstance(t, FakeTensor))


def _numpy_floats() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.float32, torch.float64)


def _is_flip(n: Any) -> bool:
    """Whether ``n`` transposes a matrix (``W.t()``, ``W.T``, ``W.transpose(0, 1)``)."""
    name = _packet(n)
    if name in ("aten.t", "aten.numpy_T"):
        return True
    return (
        name == "aten.transpose"
        and {a % 2 for a in n.args[1:3]} == {0, 1}
        and n.args[0].meta["val"].ndim == 2
    )


def _getitem() -> Any:
    import operator

    return operator.getitem


def _is_symint(v: Any) -> bool:
    import torch

    return isinstance(v, torch.SymInt | int) and not isinstance(v, bool)


def _symbolic(d: Any) -> bool:
    import torch

    return isinstance(d, torch.SymInt) and not d.node.expr.is_number


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


def convert(traced: Traced, dtype: DType = DType.f32, stages: StageSpec | None = None) -> Converted:
    """``traced`` as layer functions (by module path), or as pipeline stages when it has
    ``pipe_split()`` markers or ``stages`` names split points (``stages`` module)."""
    return Converter(traced, dtype, stages).run()


__all__ = ["Converted", "Layer", "Param", "convert", "deepen"]
