"""The op registry: one ``OpDef`` per op holds everything about it.

An ``OpDef`` carries the op's signature (named inputs, optional and variadic ones, its result
count), attribute schema, type/shape rule, optional partial evaluator (outputs computable from
types and the known inputs, e.g. ``Shape``), numpy reference implementation, cost descriptors
(its ``CostClass``, FLOPs, bytes read and written, the GEMM shape of a matrix product, how it
fuses with its neighbours: ``Fusion``), whether it belongs to attention's core (``attention_core``: what
selective recomputation recomputes) and named slots that later layers fill once each
(``grad``, ``sharding``, ``torch``, ``kink``).

Ops are registered by their family's module (``distir.ops.tensor``, ``distir.ops.comm``, ...) when
``distir.ops`` is imported. Registering a name twice raises ``RegistryError``; looking up an unknown
name raises ``UnknownOpError`` listing the known ones.

Device discipline: a ``LOCAL`` op runs on one device; all its tensor inputs must live there and
its results are placed there (ops without inputs take a ``device`` attribute). The registry
enforces this around the op's rule, so rules only deal with dtypes and shapes. A ``COMM`` op's
rule places its results itself. Every op runs on the union of the devices of its inputs and
results.

A local op on DTensors is typed by ``distir.ops.dtensor_inference`` (its rule on the global view,
its sharding strategy for the placements); the errors raised here are in ``distir.ops.errors``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, NamedTuple, NoReturn

import numpy as np

from distir.hardware.attention import FlashShape
from distir.hardware.gemm import GemmShape
from distir.ir.dtensor import DTensorType
from distir.ir.ops import Op
from distir.ir.types import Device, DType, ScalarType, TensorType, TupleType, Type, devices_of
from distir.ir.values import Attrs, AttrValue, Value
from distir.ir.verify import OpSignatureError
from distir.ops.dtensor_inference import infer_distributed
from distir.ops.errors import OpTypeError as OpTypeError
from distir.ops.errors import RegistryError as RegistryError
from distir.ops.errors import UnknownOpError as UnknownOpError


class OpKind(Enum):
    """LOCAL: computes on one device. COMM: a global communication op spanning devices (its rule
    places results). RANK_COMM: one rank's part of a communication (typed like LOCAL, but it
    must meet its peers: see ``OpDef.rendezvous``)."""

    LOCAL = "local"
    COMM = "comm"
    RANK_COMM = "rank_comm"

    __hash__ = object.__hash__  # by identity, as ``DType``'s: members key memos


class CommPattern(Enum):
    """What a communication op does, for cost models (alpha-beta formulas per pattern)."""

    P2P = "p2p"
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SCATTER = "scatter"
    GATHER = "gather"
    ALLTOALL = "alltoall"

    __hash__ = object.__hash__  # by identity, as ``DType``'s: members key memos


class CostClass(StrEnum):
    """How a cost model prices an op's compute, declared by every op (``OpDef.cost_class``):
    the class picks the roofline efficiency of ops without a better descriptor (``gemm``,
    ``flash``) and keys a calibrated device's measured rates (``DeviceSpec.families``, measured
    per class by ``distir calibrate``). Today each family's ops share the class named like the
    family; a family may declare another class for an op that costs unlike its siblings. The
    value is the name calibration files use."""

    LINALG = "linalg"
    NN = "nn"
    LOSS = "loss"
    ELEMENTWISE = "elementwise"
    GRAD = "grad"
    OPTIM = "optim"
    REDUCE = "reduce"
    ATTENTION = "attention"
    CONV = "conv"
    MOE = "moe"
    COMPARE = "compare"
    SHAPE = "shape"
    TUPLES = "tuples"
    COMM = "comm"
    DIST = "dist"


class Fusion(Enum):
    """How an op fuses with the op producing its input into one kernel (``distir.sim.fusion``).

    NONE: a kernel of its own. GEMM: a matrix product; pointwise ops can follow it as its
    epilogue (cuBLASLt's bias/GeLU epilogues). POINTWISE: elementwise; joins the kernel of the
    op right before it when it consumes that op's result and that op is GEMM or POINTWISE
    (bias+GeLU, bias+dropout+residual add, scale+mask). ROWWISE: a row-wise reduction (Softmax,
    LayerNorm, RMSNorm): one kernel of its own that can take a pointwise prologue (Megatron's
    fused scale-mask-softmax) but nothing joins after it. TRANSPARENT: a layout change
    (Redistribute) that a chain passes through when it moves nothing (a view: e.g. on a mesh axis
    of one device); when it moves data it ends the chain."""

    NONE = "none"
    GEMM = "gemm"
    POINTWISE = "pointwise"
    ROWWISE = "rowwise"
    TRANSPARENT = "transparent"


@dataclass(frozen=True, slots=True)
class CommCost:
    """A communication op's cost descriptor: its pattern, the message size in bytes (the meaning
    per pattern is documented on the op) and the participating devices (P2P: source, dest)."""

    pattern: CommPattern
    nbytes: float
    devices: tuple[Device, ...]
    root: Device | None = None  # the source of a Scatter / the destination of a Gather
    # a later part of one collective call over a flat buffer (``coalesced=true``): the call's
    # latency is paid by its first part, this one costs its bytes (``distir.sim.cost.charged``)
    coalesced: bool = False


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

_ATTR_KINDS = ("int", "float", "str", "bool", "device", "dtype", "ints", "floats", "devices", "tensor", "any")


def _kind_ok(kind: str, v: AttrValue) -> bool:
    def num(x: AttrValue) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool)

    def integer(x: AttrValue) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if kind == "int":
        return integer(v)
    if kind == "float":
        return num(v)
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "device":
        return isinstance(v, Device)
    if kind == "dtype":
        return isinstance(v, DType)
    if kind == "ints":
        return isinstance(v, tuple) and all(integer(x) for x in v)
    if kind == "floats":
        return isinstance(v, tuple) and all(num(x) for x in v)
    if kind == "devices":
        return isinstance(v, tuple) and all(isinstance(x, Device) for x in v)
    if kind == "tensor":
        return (
            num(v) or isinstance(v, bool) or (isinstance(v, tuple) and all(_kind_ok("tensor", x) for x in v))
        )
    return True


@dataclass(frozen=True, slots=True)
class AttrSpec:
    kind: str
    default: Any = REQUIRED
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in _ATTR_KINDS:
            raise RegistryError(f"unknown attribute kind {self.kind!r}; known: {_ATTR_KINDS}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


_INTERNED: dict[tuple[Any, ...], TensorType] = {}


class TypeCtx:
    """What a type rule sees: input types, attributes, known input values, the op's device."""

    __slots__ = ("attrs", "device", "known", "op", "types")

    def __init__(
        self,
        op: OpDef,
        types: Sequence[Type],
        attrs: Attrs,
        known: Sequence[np.ndarray | None],
        device: Device | None,
    ) -> None:
        self.op = op
        self.types = types
        self.attrs = attrs
        self.known = known
        self.device = device

    def attr(self, name: str) -> Any:
        """The attribute's value, or its schema default."""
        v = self.attrs.get(name)
        if v is None:
            spec = self.op.attrs[name]
            return None if spec.required else spec.default
        return v

    def tensor(self, i: int) -> TensorType:
        """Input ``i`` as a tensor type (scalars count as 0-d tensors)."""
        t = self.types[i]
        if isinstance(t, ScalarType):
            return TensorType(t.dtype, (), t.device)
        if not isinstance(t, TensorType):
            self.fail(f"input {i + 1} must be a tensor", i, "Tensor[...]", t)
        return t

    def out(self, dtype: DType, shape: Sequence[int]) -> TensorType:
        """A result type on this op's device (interned: type propagation makes many alike)."""
        assert self.device is not None, "out() is for LOCAL ops"
        key = (dtype, tuple(shape), self.device)
        t = _INTERNED.get(key)
        if t is None:
            t = TensorType(dtype, tuple(int(s) for s in shape), self.device)
            if len(_INTERNED) < 1 << 16:
                _INTERNED[key] = t
        return t

    def const(self, i: int, what: str) -> np.ndarray:
        """The concrete value of input ``i``; a rule needing it fails if it is abstract."""
        v = self.known[i] if i < len(self.known) else None
        if v is None:
            self.fail(f"needs the value of input {i + 1} ({what}) to be known, but it is abstract", i)
        return v

    def fail(
        self, message: str, index: int | None = None, expected: object = None, actual: object = None
    ) -> NoReturn:
        raise OpTypeError(message, index, expected, actual)


TypeRule = Callable[[TypeCtx], Sequence[Type]]
PartialRule = Callable[[TypeCtx], Sequence[np.ndarray | None]]
RefImpl = Callable[[Sequence[Any], Attrs], Sequence[Any]]
CostFn = Callable[[Sequence[Type], Sequence[Type], Attrs], float]
GemmFn = Callable[[Sequence[Type], Sequence[Type], Attrs], GemmShape]
FlashFn = Callable[[Sequence[Type], Sequence[Type], Attrs], FlashShape]


def _nbytes(ts: Sequence[Type]) -> float:
    return float(sum(t.nbytes for t in ts))


def default_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _nbytes(ins)


def default_bytes_written(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _nbytes(outs)


def zero_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return 0.0


SLOTS = ("grad", "sharding", "torch", "kink")


class Kink(NamedTuple):
    """A piecewise op's decision (``OpDef.kink``): each element of its result takes one branch or
    the other by the sign of ``inputs[x] - inputs[at]`` (``at`` None: of ``inputs[x]``, a kink at
    0), the inputs broadcast to the result's shape. Where that difference is within rounding of
    0, a run in finite precision may decide otherwise than exact arithmetic
    (``distir.interp.kinks``)."""

    x: int
    at: int | None = None


class LocalPiece(NamedTuple):
    """One device's piece of a distributed value, as ``OpDef.localize`` sees it: where it starts
    in the global tensor and its shape, per dim, and the global shape."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]
    global_shape: tuple[int, ...]


LocalizeRule = Callable[[Attrs, Sequence["LocalPiece | None"], Sequence["LocalPiece | None"]], Attrs]


_OPTIONS_MAX = 1 << 14  # memoized sharding answers per op


class EagerRate(NamedTuple):
    """The fraction of HBM bandwidth (``memory``, in (0, 1]) an op's eager PyTorch kernel reaches
    on large inputs, counted over the bytes the op's cost descriptors count, and where it was
    measured (``source``)."""

    memory: float
    source: str


class InductorSplit(NamedTuple):
    """How ``torch.compile``'s Inductor (default mode) runs an op as two kernels where the cost
    descriptors count one: a second kernel reads the inputs at positions ``reread`` again (a
    reduction over another axis, which Inductor cannot fuse with the first); ``source`` says
    where that is stated."""

    reread: tuple[int, ...]
    source: str


@dataclass(slots=True, eq=False)
class OpDef:
    """Everything about one op. See the module docstring."""

    name: str
    family: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] | Callable[[int, Attrs], int]
    infer: TypeRule
    reference: RefImpl | None = None
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    kind: OpKind = OpKind.LOCAL
    partial: PartialRule | None = None
    flops: CostFn = zero_flops
    bytes_read: CostFn = default_bytes_read
    bytes_written: CostFn = default_bytes_written
    gemm: GemmFn | None = None  # a matrix product's (batch, M, N, K), for the GEMM efficiency curve
    # a fused-attention kernel's call shape, for the kernel's published speed (hardware.attention)
    flash: FlashFn | None = None
    fusion: Fusion = Fusion.NONE
    # the fraction of HBM bandwidth PyTorch's own eager kernel for the op reaches, where a
    # published benchmark measured one far from the cost model's default (``EagerRate``; None:
    # the default): the cost model uses it for programs run as eager PyTorch
    eager_memory: EagerRate | None = None
    # the second kernel Inductor runs it with (``InductorSplit``; None: one kernel): the cost
    # model charges it for programs run as torch.compile's default mode generates them
    inductor_split: InductorSplit | None = None
    doc: str = ""
    project: Any = None
    rendezvous: Any = None
    comm_cost: Callable[[Sequence[Type], Sequence[Type], Attrs], CommCost] | None = None
    # part of attention's core, which selective recomputation recomputes
    # (``distir.autodiff.reverse.attention_core``)
    attention_core: bool = False
    # how cost models price its compute (declared by every op, by keyword)
    cost_class: CostClass = field(kw_only=True)
    grad: Any = None
    sharding: Any = None
    # a piecewise op's decision (``Kink``): the input whose sign against a threshold picks the branch
    kink: Kink | None = None
    # the torch implementation: ``impl(ctx, inputs, attrs) -> outputs`` with ``ctx`` a
    # ``distir.backend.context.TorchContext`` (``ctx.torch`` is the module; see there)
    torch: Any = None
    # a rank collective's torch implementation over several parts issued as ONE call (the parts
    # of a ``coalesced`` collective, ``distir.ops.dist``): ``impl(ctx, parts, buffer) -> outputs
    # per part`` with ``parts`` a sequence of (inputs, attrs) and ``buffer(slot, numel, dtype)``
    # the call's flat buffers, kept across steps; None when the parts cannot share a call
    torch_coalesced: Any = None
    # the attributes of the op run on one device's pieces (``distir.parallel.sharding.materialize``), from
    # its global attributes and the pieces of its inputs and results (None: not distributed);
    # for ops whose attributes hold global sizes or positions of a dim a sharding rule splits
    localize: LocalizeRule | None = None
    min_inputs: int = field(init=False)
    max_inputs: int | None = field(init=False)
    # ``strategy_options``' answers: (rule, global types, attributes, axis size) -> strategies
    _options: dict[tuple[object, ...], tuple[Any, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._options = {}
        names = self.inputs
        variadic = [i for i, n in enumerate(names) if n.startswith("*")]
        if variadic and variadic != [len(names) - 1]:
            raise RegistryError(f"{self.name}: only the last input may be variadic")
        required = [n for n in names if not n.endswith("?") and not n.startswith("*")]
        first_opt = next((i for i, n in enumerate(names) if n.endswith("?")), len(names))
        if any(not n.endswith("?") and not n.startswith("*") for n in names[first_opt:]):
            raise RegistryError(f"{self.name}: optional inputs must come last")
        self.min_inputs = len(required) + (1 if variadic else 0)
        self.max_inputs = None if variadic else len(names)
        if self.eager_memory is not None and not 0 < self.eager_memory.memory <= 1:
            raise RegistryError(f"{self.name}: eager_memory must be a fraction in (0, 1]")

    def fill(self, slot: str, rule: Any) -> None:
        """Fill a named slot (``grad``, ``sharding``, ``torch``, ``kink``) once."""
        if slot not in SLOTS:
            raise RegistryError(f"unknown slot {slot!r}; slots: {', '.join(SLOTS)}")
        if getattr(self, slot) is not None:
            raise RegistryError(f"{self.name}.{slot} is already filled")
        setattr(self, slot, rule)

    def num_outputs(self, n_inputs: int, attrs: Attrs) -> int:
        """How many results the op has; -1 when only the input types tell (``UnpackTuple``)."""
        if callable(self.outputs):
            return self.outputs(n_inputs, attrs)
        return len(self.outputs)

    def signature(self) -> str:
        outs = ", ".join(self.outputs) if not callable(self.outputs) else "..."
        ins = ", ".join(self.inputs)
        at = ", ".join(
            f"{k}: {s.kind}" + ("" if s.required else f" = {s.default!r}") for k, s in self.attrs.items()
        )
        call = f"{self.name}({ins}{'; ' + at if at else ''})"
        return f"{outs} = {call}" if outs else call

    # -- checks ---------------------------------------------------------------------------------
    def check_arity(self, n_inputs: int) -> None:
        lo, hi = self.min_inputs, self.max_inputs
        if n_inputs < lo or (hi is not None and n_inputs > hi):
            want = f"{lo}" if hi == lo else f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise OpSignatureError(f"{self.name} takes {want} inputs", None, want, n_inputs)

    def check_attrs(self, attrs: Attrs) -> None:
        for k, v in attrs.items():
            spec = self.attrs.get(k)
            if spec is None:
                known = ", ".join(self.attrs) or "none"
                raise OpSignatureError(f"{self.name} has no attribute {k!r}; its attributes: {known}")
            if not _kind_ok(spec.kind, v):
                raise OpSignatureError(
                    f"attribute {k!r} of {self.name} must be {spec.kind}", None, spec.kind, repr(v)
                )
            if spec.choices is not None and v not in spec.choices:
                raise OpSignatureError(
                    f"attribute {k!r} of {self.name} must be one of {list(spec.choices)}",
                    None,
                    list(spec.choices),
                    repr(v),
                )
        for k, spec in self.attrs.items():
            if spec.required and k not in attrs:
                raise OpSignatureError(f"{self.name} requires attribute {k!r} ({spec.kind})")

    # -- typing ---------------------------------------------------------------------------------
    def local_device(self, types: Sequence[Type], attrs: Attrs) -> Device:
        """The one device a LOCAL op runs on; raises if inputs disagree."""
        dev: Device | None = None
        first = -1
        for i, t in enumerate(types):
            for d in (t.device,) if type(t) is TensorType else devices_of(t):
                if dev is None:
                    dev, first = d, i
                elif d != dev:
                    raise OpTypeError(
                        f"{self.name} runs on one device, but input {first + 1} is on {dev} and "
                        f"input {i + 1} is on {d}",
                        i,
                        dev,
                        d,
                    )
        a = attrs.get("device")
        if dev is None:
            if not isinstance(a, Device):
                raise OpTypeError(f"{self.name} has no inputs, so it needs a device= attribute")
            return a
        if isinstance(a, Device) and a != dev:
            raise OpTypeError(f"{self.name} has device={a} but its inputs are on {dev}", None, a, dev)
        return dev

    def infer_types(
        self, types: Sequence[Type], attrs: Attrs, known: Sequence[np.ndarray | None]
    ) -> tuple[Type, ...]:
        if self.kind is OpKind.LOCAL and any(type(t) is DTensorType for t in types):
            return infer_distributed(self, types, attrs, known)
        dev = self.local_device(types, attrs) if self.kind is not OpKind.COMM else None
        outs = tuple(self.infer(TypeCtx(self, types, attrs, known, dev)))
        n = self.num_outputs(len(types), attrs)
        if n >= 0 and len(outs) != n:  # pragma: no cover - a bug in the op's rule
            raise RegistryError(f"{self.name}'s type rule returned {len(outs)} types, not {n}")
        return outs

    def strategies(self, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Any]:
        """This op's sharding strategies for one mesh axis of size ``n`` (global types);
        an op without a sharding rule runs replicated only."""
        if self.sharding is None:
            from distir.ops.sharding import replicated

            return [replicated(ins, outs)]
        return list(self.sharding(ins, outs, attrs, n))

    def strategy_options(
        self, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
    ) -> tuple[Any, ...]:
        """``strategies``, memoized: a sharding rule is a pure function of the global types, the
        attributes and the axis size, and propagation, legalization and DTensor type inference
        ask it the same questions again and again (every layer, microbatch size and TP degree).
        Keyed by the rule too (a test may fill the slot of a fresh op); bounded: cleared when full."""
        key = (self.sharding, tuple(ins), tuple(outs), attrs, n)
        got = self._options.get(key)
        if got is None:
            if len(self._options) >= _OPTIONS_MAX:
                self._options.clear()
            got = self._options[key] = tuple(self.strategies(ins, outs, attrs, n))
        return got


class OpRegistry:
    def __init__(self) -> None:
        self._ops: dict[str, OpDef] = {}

    def register(self, op: OpDef) -> OpDef:
        if op.name in self._ops:
            raise RegistryError(f"op {op.name} is already registered (family {self._ops[op.name].family})")
        self._ops[op.name] = op
        return op

    def __getitem__(self, name: str) -> OpDef:
        op = self._ops.get(name)
        if op is None:
            close = difflib.get_close_matches(name, self._ops, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownOpError(f"unknown op {name!r}{hint}; known ops: {', '.join(sorted(self._ops))}")
        return op

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __iter__(self) -> Iterator[OpDef]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def out_arity(self, name: str, n_inputs: int, attrs: Attrs) -> int:
        return self[name].num_outputs(n_inputs, attrs)

    def check_op(self, op: Op) -> None:
        """The verifier's per-op check: known op, arity, attributes, declared devices."""
        try:
            d = self[op.name]
        except UnknownOpError as e:
            raise OpSignatureError(str(e)) from None
        d.check_arity(len(op.inputs))
        d.check_attrs(op.attrs)
        n = d.num_outputs(len(op.inputs), op.attrs)
        if n >= 0 and len(op.outputs) != n:
            raise OpSignatureError(f"{op.name} returns {n} results", None, n, len(op.outputs))
        if d.kind is not OpKind.COMM:
            _check_one_device(d, op)


def _check_one_device(d: OpDef, op: Op) -> None:
    dev: Device | None = None
    first: Value | None = None
    if any(isinstance(v.type, DTensorType) for v in (*op.inputs, *op.outputs)):
        return  # a local op of a sharded program runs on every device of its mesh
    for v in (*op.inputs, *op.outputs):
        if v.type is None:
            continue
        for x in devices_of(v.type):
            if dev is None:
                dev, first = x, v
            elif x != dev:
                assert first is not None
                raise OpSignatureError(
                    f"{op.name} runs on one device, but %{first.name} is on {dev} and %{v.name} is on {x}",
                    v,
                    dev,
                    x,
                )


REGISTRY = OpRegistry()


def register(op: OpDef) -> OpDef:
    return REGISTRY.register(op)


def tuple_elements(t: Type) -> tuple[Type, ...]:
    if isinstance(t, TupleType):
        return t.elements
    return (t,)
