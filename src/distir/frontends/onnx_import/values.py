"""The flat program under construction, with every value's type or known (concrete) value.

Each emitted op is typed at once by the checker's own mixed abstract/concrete interpretation
(``distir.interp.shapes.TypeDomain``): an op whose inputs are all known runs its reference, an
op with a partial evaluator (``Shape``, ``Constant``) gives known results from types alone, any
other op gets its type (a result over ``known_limit(batch)`` elements stays abstract). So a shape
subgraph — ``Shape → Slice → Concat → Reshape``, the DistIR paper's Figure 4 — keeps its ops in
the program *and* its values are known here, which is what lets the mapping turn ONNX inputs
that distir takes as attributes (Slice's starts, Unsqueeze's axes, Expand's shape, Split's
sizes) into attributes, and the checker later resolve the same shapes again from the program
alone.

Every op records the ONNX node it came from (its index; -1 for literals), which the module
assembly uses to group ops into layer functions. A literal that is a tensor of floats with more
than ``LITERAL_LIMIT`` elements is a weight (an entry parameter) rather than a ``Constant``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distir.frontends.onnx_import.reader import OnnxImportError
from distir.interp.shapes import Concrete, Mixed, TypeDomain, type_of
from distir.ir.ops import Op
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs, Value
from distir.ir.verify import OpSignatureError
from distir.ops.registry import REGISTRY, OpTypeError

LITERAL_LIMIT = 1  # float literals with more elements are weights, not Constants
# results of at most this many elements computed from known values are known too (a causal mask
# of batch·seq² computed from the sizes, for batch 8 and seq 512)
KNOWN_LIMIT = 1 << 21
# the same at batch 1, the import that finds which masks are causal (``attention``): a
# (1, 1, S, S) mask up to S = 8,192. Weights are never known, so only what the graph computes
# from constants and sizes (masks, positions) is evaluated: each piece at most 512 MiB (int64)
ONE_SAMPLE_LIMIT = 1 << 26


def known_limit(batch: int) -> int:
    """The most elements a known result of an import at ``batch`` has."""
    return ONE_SAMPLE_LIMIT if batch == 1 else KNOWN_LIMIT


@dataclass(frozen=True, slots=True)
class Param:
    """An entry parameter: a graph input (``value`` None) or a weight with its value."""

    name: str  # the distir name (ONNX's, made a valid identifier)
    onnx_name: str
    type: TensorType
    value: np.ndarray | None


@dataclass(slots=True)
class Program:
    """Entry parameters and ops in order, each op with the ONNX node index it came from."""

    device: Device
    known_limit: int = KNOWN_LIMIT
    floats: DType | None = None  # the dtype the file's floats compute in (None: the file's own)
    params: list[tuple[Value, Param]] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)
    state: dict[Value, Mixed] = field(default_factory=dict)
    domain: TypeDomain = field(init=False)
    _names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.domain = TypeDomain(concrete_limit=self.known_limit)

    def float_type(self, dt: DType) -> DType:
        """``dt`` as the model computes it: a float dtype the file declares is ``floats``."""
        return self.floats if self.floats is not None and dt.is_float else dt

    def name(self, hint: str) -> str:
        """A unique value name from an ONNX name (characters outside [A-Za-z0-9_.] become _)."""
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in hint) or "v"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "v" + base
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def param(self, onnx_name: str, t: TensorType, value: np.ndarray | None) -> Value:
        p = Param(self.name(onnx_name), onnx_name, t, value)
        v = Value(p.name, t)
        self.params.append((v, p))
        self.state[v] = t
        return v

    def emit(
        self,
        name: str,
        inputs: Sequence[Value],
        attrs: Mapping[str, Any],
        names: Sequence[str],
        origin: int,
        where: str,
        results: Sequence[Value] = (),
    ) -> tuple[Value, ...]:
        """Append op ``name`` and type it; a rule's rejection is an error naming ``where``.
        ``results``: the values it makes (those of the ops it replaces), else new ones named
        after ``names``."""
        d = REGISTRY[name]
        try:
            a = Attrs(attrs)
            d.check_attrs(a)
            n = d.num_outputs(len(inputs), a)
            if n >= 0 and n != len(names):
                raise OnnxImportError(f"{where}: {name} gives {n} results, the node has {len(names)}")
            outs = tuple(results) or tuple(Value(self.name(h)) for h in names)
            op = Op(name, tuple(inputs), outs, a)
            typed = self.domain.op(op, [self.state[v] for v in inputs])
        except (OpTypeError, OpSignatureError) as e:
            raise OnnxImportError(f"{where}: {name}: {e}") from None
        for v, r in zip(outs, typed, strict=True):
            if results and type_of(self.state[v]) != type_of(r):  # a fusion must keep what it replaces
                raise OnnxImportError(
                    f"{where}: {name} gives {type_of(r)} for %{v.name}, not {type_of(self.state[v])}"
                )
            self.state[v] = r
        self.ops.append(op)
        self.origin.append(origin)
        return outs

    def literal(self, hint: str, value: np.ndarray, dtype: DType, origin: int, where: str) -> Value:
        """A known tensor: a ``Constant`` op, or a weight when it is a large float tensor."""
        arr = np.asarray(value)
        if dtype.is_float and arr.size > LITERAL_LIMIT:
            return self.param(
                hint,
                TensorType(dtype, tuple(int(s) for s in arr.shape), self.device),
                arr.astype(dtype.to_numpy()),
            )
        attrs = {"value": arr.tolist(), "dtype": dtype, "device": self.device}
        (v,) = self.emit("Constant", (), attrs, [hint], origin, where)
        return v

    def dataflow(self, outputs: Sequence[Value]) -> tuple[dict[Value, Op], dict[Value, int]]:
        """Each value's producing op, and how many times each is read (by an op or as one of the
        ``outputs``): what a rewrite checks before it replaces a chain of ops."""
        made = {v: op for op in self.ops for v in op.outputs}
        uses: dict[Value, int] = {}
        for v in [*(v for op in self.ops for v in op.inputs), *outputs]:
            uses[v] = uses.get(v, 0) + 1
        return made, uses

    def drop_dead(self, outputs: Sequence[Value]) -> None:
        """Drop the ops none of whose results ``outputs`` need (what a rewrite left behind) and
        the weights no op reads."""
        live = set(outputs)
        keep = [False] * len(self.ops)
        for i in range(len(self.ops) - 1, -1, -1):
            if any(v in live for v in self.ops[i].outputs):
                keep[i] = True
                live.update(self.ops[i].inputs)
        self.ops = [op for op, kept in zip(self.ops, keep, strict=True) if kept]
        self.origin = [k for k, kept in zip(self.origin, keep, strict=True) if kept]
        self.params = [(v, p) for v, p in self.params if p.value is None or v in live]

    def type(self, v: Value) -> TensorType:
        m = self.state[v]
        t = m.type if isinstance(m, Concrete) else m
        assert isinstance(t, TensorType), t
        return t

    def known(self, v: Value) -> np.ndarray | None:
        m = self.state[v]
        return np.asarray(m.data) if isinstance(m, Concrete) else None
