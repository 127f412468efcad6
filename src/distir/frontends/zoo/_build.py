"""Shared machinery of the zoo builders: writing layer functions, assembling the chain-shaped
``@forward`` entry (``model.py``'s contract) and counting forward FLOPs.

A family builder writes its layer functions with ``LayerFn`` (untyped parameters, one result,
ops named as in the registry) and lists the calls of the entry as ``LayerCall``s: the function
and the arguments after the incoming activation — weights (declared right there, as
``WeightSpec``s, so a weight's shape and its tensor-parallel placement sit next to its use; the
same spec passed to a later call again *ties* the weight, ``Model.tied``) or names of model
inputs (the labels of the loss layer). ``assemble`` turns that list into the
module and the ``Model``; it declares the entry's parameters (inputs, then weights in the order
of first use) and leaves the results of the calls untyped, so the same entry can be
interpreted at another batch size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from distir.frontends.zoo.model import REPLICATE, InputSpec, Model, ModelError, WeightSpec, check_model
from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Placement
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import Device, DType, TensorType, Type
from distir.ir.values import Value
from distir.ops.registry import REGISTRY

D0 = Device(0)


def tensor(dtype: DType, *shape: int) -> TensorType:
    """``Tensor[dtype, shape, d0]``: every zoo model is built on one device (the transforms
    place it later)."""
    return TensorType(dtype, tuple(shape), D0)


def weight(
    name: str,
    dtype: DType,
    shape: Sequence[int],
    tp: Placement = REPLICATE,
    *,
    std: float = 0.02,
    value: float | None = None,
) -> WeightSpec:
    return WeightSpec(name, tensor(dtype, *shape), tp, std, value)


class LayerFn:
    """Builds one layer function: untyped parameters, ops with one result each.

    ``x = f.param("x")``; ``y = f("MatMul", x, w)``; ``fn = f.ret(y)``.
    """

    def __init__(self, name: str) -> None:
        self._fb = FunctionBuilder(name, out_arity=REGISTRY.out_arity)

    def param(self, name: str) -> Value:
        return self._fb.param(name)

    def __call__(self, op: str, *inputs: Value, name: str | None = None, **attrs: Any) -> Value:
        (y,) = self._fb.op(op, *inputs, n_out=1, names=[name or op.lower()], **attrs)
        return y

    def results(self, op: str, *inputs: Value, names: Sequence[str], **attrs: Any) -> tuple[Value, ...]:
        """An op with several results, named ``names``."""
        return self._fb.op(op, *inputs, n_out=len(names), names=list(names), **attrs)

    def ret(self, y: Value) -> Function:
        return self._fb.ret(y)


@dataclass(frozen=True, slots=True)
class LayerCall:
    """One call of the entry: ``fn(previous activation, *args)``; an argument is a weight (a
    ``WeightSpec``, declared by this use) or the name of a model input."""

    fn: Function
    args: tuple[WeightSpec | str, ...]
    result: str


def assemble(
    name: str,
    config: Mapping[str, object],
    inputs: Sequence[InputSpec],
    calls: Sequence[LayerCall],
    seq_dim: int | None = None,
    ends: tuple[int, int] = (0, 0),
    loss_input_tp: Placement = REPLICATE,
    loss_dtype: DType | None = None,
) -> Model:
    """The ``Model`` whose entry ``@forward`` makes ``calls`` in order, starting from the first
    input; ``seq_dim`` declares the activations' sequence dim (``Model.seq_dim``) and
    ``loss_input_tp`` the loss layer's input's tensor-parallel placement. Runs ``check_model`` and
    counts ``flops_per_sample``. ``ends``: how many calls before and after the repeated blocks
    belong with the first and the last pipeline chunk (``Model.pre``, ``Model.post``)."""
    if not inputs:
        raise ModelError(f"model {name}: no inputs")
    batch = inputs[0].type.shape[0]
    by_input = {i.name: i for i in inputs}
    weights: list[WeightSpec] = []
    declared: set[int] = set()  # ids of the specs in ``weights``
    seen: set[str] = set(by_input)
    tied: list[str] = []  # weights passed to a second call (the same spec again)
    functions: dict[str, Function] = {}
    for c in calls:
        have = functions.setdefault(c.fn.name, c.fn)
        if have is not c.fn:
            raise ModelError(f"model {name}: two different layer functions are named @{c.fn.name}")
        for a in c.args:
            if isinstance(a, WeightSpec):
                if id(a) in declared:  # the very spec again: a tied weight
                    tied.append(a.name)
                    continue
                if a.name in seen:
                    raise ModelError(f"model {name}: the name {a.name!r} is declared twice")
                seen.add(a.name)
                declared.add(id(a))
                weights.append(a)
            elif a not in by_input:
                raise ModelError(f"model {name}: @{c.fn.name} takes {a!r}, which is not a model input")
    fb = FunctionBuilder("forward")
    vals = {i.name: fb.param(i.name, i.type) for i in inputs}
    vals.update({w.name: fb.param(w.name, w.type) for w in weights})
    prev = vals[inputs[0].name]
    for c in calls:
        args = [vals[a.name if isinstance(a, WeightSpec) else a] for a in c.args]
        (prev,) = fb.call(c.fn, prev, *args, names=[c.result])
    module = Module((*functions.values(), fb.ret(prev)))
    model = Model(
        name,
        dict(config),
        module,
        tuple(inputs),
        tuple(weights),
        batch,
        seq_dim=seq_dim,
        loss_input_tp=loss_input_tp,
        tied=tuple(dict.fromkeys(tied)),
        loss_dtype=loss_dtype,
    )
    check_model(model)
    flops = forward_flops(
        module,
        [_with_batch(p.type, 1) for p in module.entry.params[: len(inputs)]] + [w.type for w in weights],
    )
    pre, post = ends
    if pre < 0 or post < 0 or pre + post > len(calls):
        raise ModelError(f"model {name}: {pre} + {post} end calls but {len(calls)} calls")
    return replace(model, flops_per_sample=flops, pre=pre, post=post)


def _with_batch(t: Type | None, batch: int) -> TensorType:
    assert isinstance(t, TensorType)
    return TensorType(t.dtype, (batch, *t.shape[1:]), t.device)


def forward_flops(module: Module, arg_types: Sequence[Type]) -> float:
    """FLOPs of the entry on arguments of ``arg_types``, by the registry's ``flops`` of every
    op (calls are summed through their callees, each distinct (callee, argument types) once)."""
    memo: dict[tuple[str, tuple[Type, ...]], float] = {}

    def flops_of(fn: Function, args: Sequence[Type]) -> float:
        _, env = interpret(module, fn, list(args), TypeDomain())
        total = 0.0
        for instr in fn.body:
            ins = tuple(type_of(env[v]) for v in instr.inputs)
            if isinstance(instr, Op):
                outs = [type_of(env[v]) for v in instr.outputs]
                total += REGISTRY[instr.name].flops(ins, outs, instr.attrs)
            else:
                key = (instr.callee, ins)
                if key not in memo:
                    memo[key] = flops_of(module[instr.callee], ins)
                total += memo[key]
        return total

    return flops_of(module.entry, arg_types)


def inv_sqrt(n: float) -> float:
    return 1.0 / math.sqrt(n)


def probability_field() -> Any:
    """A probability option of a config (GPT's ``dropout``): a float in [0, 1), default 0; its
    metadata ``range`` is what ``check_config`` and the model-string parser check."""
    return field(default=0.0, metadata={"range": PROBABILITY})


PROBABILITY = (0.0, 1.0)  # the half-open range [0, 1) of a probability option


def in_range(v: object, bounds: tuple[float, float]) -> bool:
    """Whether ``v`` is a number (not a bool) in the half-open range ``[lo, hi)``."""
    lo, hi = bounds
    return isinstance(v, int | float) and not isinstance(v, bool) and lo <= v < hi


def check_config(family: str, cfg: object, divides: Sequence[tuple[str, str]] = ()) -> None:
    """Every int field of the dataclass ``cfg`` is positive (bool fields are flags), every
    enumerated field (a field whose metadata lists its ``choices``) holds one of them, every
    float field with a ``range`` (``probability_field``) lies in it, and for each ``(a, b)`` in
    ``divides`` field ``a`` divides field ``b``; else a ModelError naming key and value."""
    for f in fields(cfg):  # type: ignore[arg-type]
        v = getattr(cfg, f.name)
        choices = f.metadata.get("choices")
        bounds = f.metadata.get("range")
        if bounds is not None:
            if not in_range(v, bounds):
                raise ModelError(f"{family}: {f.name}={v!r} must be a number in [{bounds[0]}, {bounds[1]})")
        elif choices is not None:
            if v not in choices:
                raise ModelError(f"{family}: {f.name}={v!r} must be one of {', '.join(choices)}")
        elif isinstance(v, bool) and isinstance(f.default, bool):
            continue
        elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelError(f"{family}: {f.name}={v!r} must be a positive integer")
    for a, b in divides:
        va, vb = getattr(cfg, a), getattr(cfg, b)
        if vb % va:
            raise ModelError(f"{family}: {a}={va} must divide {b}={vb}")
