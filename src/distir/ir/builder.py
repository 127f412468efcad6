"""Mutable builders that freeze into immutable functions and modules.

    fb = FunctionBuilder("mlp", out_arity=REGISTRY.out_arity)
    x = fb.param("x", TensorType(DType.f32, (8, 4), Device(0)))
    w = fb.param("w", TensorType(DType.f32, (4, 2), Device(0)))
    (h,) = fb.op("MatMul", x, w)
    fn = fb.ret(h)

The builder does no checking beyond what it needs to build; run ``verify`` on the result.
``out_arity`` tells the builder how many results a primitive op has when the caller does not
say (``n_out=``); it is injected so the IR layer stays independent of the op registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

from distir.ir.function import Donation, Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.types import Type
from distir.ir.values import EMPTY_ATTRS, Attrs, Value, freeze_attr, typed_key

OutArity = Callable[[str, int, Attrs], int]


class BuilderError(ValueError):
    pass


_ATTRS: dict[tuple[object, ...], Attrs] = {}


def _interned(attrs: dict[str, object]) -> Attrs:
    """Equal attributes built again and again by a transform share one ``Attrs`` object, so
    comparing and hashing them (cost keys in the simulator) is an identity check."""
    try:
        key = tuple((k, typed_key(freeze_attr(v))) for k, v in attrs.items())
        got = _ATTRS.get(key)
    except TypeError:  # unhashable values (lists): not interned
        return Attrs(attrs)
    if got is None:
        got = Attrs(attrs)
        if len(_ATTRS) < 1 << 16:
            _ATTRS[key] = got
    return got


class FunctionBuilder:
    def __init__(self, name: str, out_arity: OutArity | None = None) -> None:
        self.name = name
        self._params: list[Value] = []
        self._body: list[Instr] = []
        self._out_arity = out_arity
        self._done = False
        self._donated: dict[Value, Value | None] = {}  # donated parameter -> result written into it

    def __len__(self) -> int:
        """The number of instructions appended so far."""
        return len(self._body)

    def since(self, start: int) -> tuple[Instr, ...]:
        """The instructions appended after the first ``start`` ones."""
        return tuple(self._body[start:])

    def param(self, name: str, type: Type | None = None, donated: bool = False) -> Value:
        """A new parameter; ``donated``: the function may reuse its storage (``Function.donated``)."""
        self._check_open()
        v = Value(name, type)
        if donated:
            self._donated[v] = None
        self._params.append(v)
        return v

    def donate(self, param: Value, into: Value) -> None:
        """``param`` (donated) is updated in place: the result ``into`` (returned by ``ret``)
        is written into its storage (``Donation``)."""
        if param not in self._donated:
            raise ValueError(f"%{param.name} is not a donated parameter of @{self.name}")
        self._donated[param] = into

    def op(
        self,
        name: str,
        *inputs: Value,
        n_out: int | None = None,
        names: Sequence[str] | None = None,
        types: Sequence[Type | None] | None = None,
        **attrs: object,
    ) -> tuple[Value, ...]:
        """Append a primitive op and return its result values."""
        self._check_open()
        a = _interned(attrs) if attrs else EMPTY_ATTRS
        if n_out is None:
            if names is not None:
                n_out = len(names)
            elif types is not None:
                n_out = len(types)
            elif self._out_arity is not None:
                n_out = self._out_arity(name, len(inputs), a)
            else:
                n_out = 1
        outs = self._results(name.lower(), n_out, names, types)
        self._body.append(Op(name, tuple(inputs), outs, a))
        return outs

    def emit(
        self,
        name: str,
        inputs: Sequence[Value],
        attrs: Attrs,
        names: Sequence[str],
        types: Sequence[Type | None] | None = None,
    ) -> tuple[Value, ...]:
        """Append a primitive op with ready-made attributes (transforms copying ops use this)."""
        self._check_open()
        outs = self._results(name.lower(), len(names), names, types)
        self._body.append(Op(name, tuple(inputs), outs, attrs))
        return outs

    def call(
        self,
        callee: Function | str,
        *inputs: Value,
        n_out: int | None = None,
        names: Sequence[str] | None = None,
        types: Sequence[Type | None] | None = None,
    ) -> tuple[Value, ...]:
        """Append a call of ``callee`` (a function or its name) and return its results."""
        self._check_open()
        if isinstance(callee, Function):
            cname = callee.name
            if n_out is None:
                n_out = len(callee.outputs)
        else:
            cname = callee
        if n_out is None:
            n_out = len(names) if names is not None else len(types) if types is not None else 1
        outs = self._results(cname, n_out, names, types)
        self._body.append(Call(cname, tuple(inputs), outs))
        return outs

    def append(self, instr: Instr) -> None:
        """Append an already-built op or call (used by transforms that copy code)."""
        self._check_open()
        self._body.append(instr)

    def ret(self, *outputs: Value) -> Function:
        """Finish the function, returning ``outputs``. The builder cannot be used afterwards."""
        self._check_open()
        self._done = True
        index = {p: j for j, p in enumerate(self._params)}
        at = {v: j for j, v in reversed(list(enumerate(outputs)))}
        donated = tuple(Donation(index[p], -1 if r is None else at[r]) for p, r in self._donated.items())
        return Function(self.name, tuple(self._params), tuple(self._body), tuple(outputs), donated)

    def _results(
        self,
        hint: str,
        n: int,
        names: Sequence[str] | None,
        types: Sequence[Type | None] | None,
    ) -> tuple[Value, ...]:
        if names is not None and len(names) != n:
            raise BuilderError(f"{len(names)} names given for {n} results")
        if types is not None and len(types) != n:
            raise BuilderError(f"{len(types)} types given for {n} results")
        # map over the class: no Python frame per value (a pipeline call returns hundreds)
        hints = names if names is not None else repeat(hint, n)
        if types is None:
            return tuple(map(Value, hints))
        return tuple(map(Value, hints, types))

    def _check_open(self) -> None:
        if self._done:
            raise BuilderError(f"function @{self.name} is already finished")


def module(functions: Iterable[Function]) -> Module:
    return Module(tuple(functions))
