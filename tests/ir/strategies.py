"""Hypothesis strategies for DistIR: types, attribute values, name hints and whole modules.

``modules()`` draws random *valid* modules: several functions, the last one the entry, each
calling only functions defined before it (so there is no recursion), built from a small set of
registered ops with correct arity and attributes. Every drawn module passes
``verify(m, REGISTRY.check_op)``: local ops only see typed values on a single device, calls only
get arguments whose declared types match the callee's parameters.

``modules(registered=False)`` additionally draws unregistered op names with arbitrary attribute
names and values (only valid for ``verify(m)`` without an op checker); it exercises the printer
and parser on every attribute shape the text format can spell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

import distir.ops  # noqa: F401  (registers the ops)
from distir.ir import (
    Attrs,
    Device,
    DType,
    FunctionBuilder,
    Module,
    ScalarType,
    TensorType,
    TupleType,
    Type,
    Value,
)
from distir.ir.function import Function
from distir.ir.types import devices_of
from distir.ops.registry import REGISTRY

Draw = Callable[[st.SearchStrategy[Any]], Any]

# -- types ---------------------------------------------------------------------------------------

dtypes = st.sampled_from(list(DType))
device_ids = st.integers(0, 7) | st.integers(0, 10**9)
devices = st.builds(Device, device_ids)
dims = st.integers(0, 16) | st.integers(0, 2**13)
# includes () and (n,); at most 2**53 elements, distir's bound on a tensor (one large dim alone)
shapes = st.lists(dims, max_size=4).map(tuple) | st.tuples(st.integers(0, 2**40))


def tensor_types(device: st.SearchStrategy[Device] = devices) -> st.SearchStrategy[TensorType]:
    return st.builds(TensorType, dtypes, shapes, device)


def scalar_types(device: st.SearchStrategy[Device] = devices) -> st.SearchStrategy[ScalarType]:
    return st.builds(ScalarType, dtypes, device)


def types(device: st.SearchStrategy[Device] = devices) -> st.SearchStrategy[Type]:
    """Tensor, scalar and (nested, possibly empty) tuple types; all on ``device`` if given."""
    leaves: st.SearchStrategy[Type] = tensor_types(device) | scalar_types(device)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3).map(lambda es: TupleType(tuple(es))),
        max_leaves=6,
    )


def moved_to(t: Type, dev: Device) -> Type:
    """``t`` with every component placed on ``dev``."""
    if isinstance(t, TupleType):
        return TupleType(tuple(moved_to(e, dev) for e in t.elements))
    return t.with_device(dev)


ANY_TYPE = types()
MAYBE_TYPE = st.none() | ANY_TYPE


# -- names ---------------------------------------------------------------------------------------

NAME_CHARS = "abcxyzXY_019."
# Hints that collide, need sanitizing (spaces, unicode, %, -), are empty, or are digits only.
TRICKY_HINTS = [
    "x",
    "x",
    "y",
    "x_1",
    "x_2",
    "v",
    "v_1",
    "0",
    "1",
    "007",
    "a.b",
    "",
    " ",
    "a b",
    "ü",
    "日本",
    "%x",
    "-",
    "x-1",
    "_",
    ".",
    "tab\there",
    "new\nline",
    "x_1_1",
]
name_hints = st.one_of(
    st.sampled_from(TRICKY_HINTS),
    st.text(alphabet=NAME_CHARS, max_size=5),
    st.text(max_size=4),
)
# Function names must be valid (the verifier checks them): [A-Za-z0-9_.]+, digits-only allowed.
function_names = st.sampled_from(["main", "f", "g", "0", "42", "f.g", "_", ".", "layer_1"]) | st.text(
    alphabet=NAME_CHARS, min_size=1, max_size=6
)

# -- attribute values ----------------------------------------------------------------------------

SPECIAL_FLOATS = [
    math.inf,
    -2.5e-7,
    -math.inf,
    0.0,
    -0.0,
    1.0,
    -1.5,
    1e-7,
    1e22,
    -1e300,
    5e-324,
    1.7976931348623157e308,
    0.1,
    123456789.125,
]
floats = st.sampled_from(SPECIAL_FLOATS) | st.floats(allow_nan=False)
floats_with_nan = floats | st.just(math.nan)
ints = st.integers(-5, 5) | st.integers() | st.integers(-(10**40), 10**40)
TRICKY_STRINGS = [
    "a\nb",
    '"',
    "\\",
    "ü",
    "",
    '\\"',
    "\n",
    "\t",
    "\r\n",
    "\\n",
    "\\u0041",
    "\x00",
    "\x7f",
    "\x1b[0m",
    "ünïcødé",
    "日本語",
    "🙂",
    "\u2028",
    "\x85",
    "d0",
    "f32",
    "true",
    "nan",
    "[1, 2]",
    "%x",
    "// c",
    'say "hi"\n',
]
tricky_strings = st.sampled_from(TRICKY_STRINGS)
strings = tricky_strings | st.text(max_size=8)
scalar_attrs = st.one_of(ints, floats_with_nan, strings, st.booleans(), devices, dtypes)
attr_values = st.recursive(scalar_attrs, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)
# The registry's ``tensor`` kind: numbers, bools and nested lists of them.
tensor_attrs = st.recursive(
    st.sampled_from(SPECIAL_FLOATS) | ints | floats_with_nan | st.booleans(),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)
identifiers = st.tuples(st.sampled_from("abzAZ_"), st.text(alphabet="abzAZ_09.", max_size=6)).map(
    "".join
)  # [A-Za-z_][A-Za-z0-9_.]*
attr_names = st.sampled_from(["axis", "x", "_", "a.b", "func", "return", "true", "d0", "f32"]) | (identifiers)
# An op named "return" with no results would print as a return statement.
free_op_names = st.sampled_from(["Foo", "foo.bar", "_", "Add", "d0", "true", "func"]) | (
    identifiers.filter(lambda s: s != "return")
)
free_attrs = st.dictionaries(attr_names, attr_values, max_size=4)
REDUCE_OPS = ("sum", "max", "min", "mean", "prod")
# rank.* ops take an attribute of any kind (`shapes`): weighted up so valid modules carry
# strings, floats, bools and nested lists often.
LOCAL_OPS = st.sampled_from(
    ["Add", "Relu", "MatMul", "Identity", "Split", "Concat", "Constant", "Gemm", "SGD", "Cast", "rank.Send"]
) | st.sampled_from(["rank.AllReduce", "rank.Broadcast", "Constant"])


# -- modules -------------------------------------------------------------------------------------


class _Gen:
    """Draws the body of one function, tracking the values defined so far."""

    def __init__(self, draw: Draw, fb: FunctionBuilder) -> None:
        self.draw = draw
        self.fb = fb
        self.avail: list[Value] = []

    # helpers
    def d(self, s: st.SearchStrategy[Any]) -> Any:
        return self.draw(s)

    def maybe_type(self, dev: Device | None = None) -> Type | None:
        """No type, or a random type (on ``dev`` only, if given)."""
        t = self.d(MAYBE_TYPE)
        return moved_to(t, dev) if t is not None and dev is not None else t

    def op(
        self,
        name: str,
        inputs: list[Value],
        attrs: dict[str, object],
        local_dev: Device | None,
        n_out: int | None = None,
    ) -> tuple[Value, ...]:
        """Append ``name``; results are typed on ``local_dev`` (local ops) or anywhere."""
        if n_out is None:
            n_out = REGISTRY.out_arity(name, len(inputs), Attrs(attrs))
        if n_out < 0:  # only the input types tell: any count passes the verifier
            n_out = self.d(st.integers(0, 3))
        outs = self.fb.op(
            name,
            *inputs,
            names=[self.d(name_hints) for _ in range(n_out)],
            types=[self.maybe_type(local_dev) for _ in range(n_out)],
            **attrs,
        )
        self.avail.extend(outs)
        return outs

    def constant(self, dev: Device, typ: Type | None = None) -> Value:
        attrs: dict[str, object] = {"value": self.d(tensor_attrs), "device": dev}
        if self.d(st.booleans()):
            attrs["dtype"] = self.d(dtypes)
        (v,) = self.fb.op("Constant", names=[self.d(name_hints)], types=[typ], **attrs)
        self.avail.append(v)
        return v

    def local_inputs(self, k: int, dev: Device) -> list[Value]:
        """``k`` values (repeats allowed) whose declared types, if any, live only on ``dev``."""
        ok = [v for v in self.avail if v.type is None or set(devices_of(v.type)) <= {dev}]
        while len(ok) < 1 and k > 0:
            ok.append(self.constant(dev, self.maybe_type(dev)))
        return [self.d(st.sampled_from(ok)) for _ in range(k)]

    def any_inputs(self, k: int) -> list[Value]:
        if not self.avail and k > 0:
            self.constant(self.d(devices), None)
        return [self.d(st.sampled_from(self.avail)) for _ in range(k)]

    # one instruction
    def local_op(self) -> None:
        dev: Device = self.d(devices)
        kind = self.d(LOCAL_OPS)
        attrs: dict[str, object] = {}
        if kind in ("Add", "MatMul"):
            ins = self.local_inputs(2, dev)
        elif kind in ("Relu", "Identity"):
            ins = self.local_inputs(1, dev)
        elif kind == "Split":
            ins = self.local_inputs(1, dev)
            choice = self.d(st.sampled_from(["default", "num_splits", "sizes"]))
            if choice == "num_splits":
                attrs["num_splits"] = self.d(st.integers(1, 4))
            elif choice == "sizes":
                attrs["sizes"] = tuple(self.d(st.lists(st.integers(0, 8), min_size=1, max_size=4)))
            if self.d(st.booleans()):
                attrs["dim"] = self.d(st.integers(-3, 3))
        elif kind == "Concat":
            ins = self.local_inputs(self.d(st.integers(1, 4)), dev)
            attrs["axis"] = self.d(ints)
        elif kind == "Constant":
            self.constant(dev, self.maybe_type(dev))
            return
        elif kind == "Gemm":
            ins = self.local_inputs(self.d(st.integers(2, 3)), dev)
            for a in ("alpha", "beta"):
                if self.d(st.booleans()):
                    attrs[a] = self.d(floats | st.integers(-3, 3))
            if self.d(st.booleans()):
                attrs["transA"] = self.d(st.sampled_from([0, 1]))
        elif kind == "SGD":
            ins = self.local_inputs(2, dev)
            if self.d(st.booleans()):
                attrs["lr"] = self.d(floats)
        elif kind == "Cast":
            ins = self.local_inputs(1, dev)
            attrs["to"] = self.d(dtypes)
        elif kind == "rank.Send":  # no results: printed without "... ="
            ins = self.local_inputs(1, dev)
            attrs["dst"] = self.d(devices)
        else:  # rank.AllReduce/Broadcast: optional input, `shapes` takes any attribute value
            ins = self.local_inputs(self.d(st.integers(0, 1)), dev)
            attrs.update(
                group=tuple(self.d(st.lists(devices, max_size=3))),
                shapes=self.d(tricky_strings | st.lists(strings, max_size=2).map(tuple) | attr_values),
                dtype=self.d(dtypes),
                device=dev,
            )
            if self.d(st.booleans()):
                attrs["root"] = self.d(devices)
            if kind == "rank.AllReduce" and self.d(st.booleans()):
                attrs["op"] = self.d(st.sampled_from(REDUCE_OPS))
        self.op(kind, ins, attrs, dev)

    def comm_op(self) -> None:
        kind = self.d(st.sampled_from(["Send", "AllReduce", "Broadcast"]))
        attrs: dict[str, object] = {}
        if kind == "Send":
            ins = self.any_inputs(1)
            attrs["dst"] = self.d(devices)
        elif kind == "AllReduce":
            ins = self.any_inputs(self.d(st.integers(1, 4)))
            if self.d(st.booleans()):
                attrs["op"] = self.d(st.sampled_from(REDUCE_OPS))
        else:
            ins = self.any_inputs(1)
            attrs["devices"] = tuple(self.d(st.lists(devices, min_size=1, max_size=3)))
        self.op(kind, ins, attrs, None)

    def free_op(self) -> None:
        name: str = self.d(free_op_names)
        ins = self.any_inputs(self.d(st.integers(0, 3)))
        attrs = self.d(free_attrs)
        n = self.d(st.integers(0, 3))
        self.op(name, ins, attrs, None, n_out=n)

    def call(self, callee: Function) -> None:
        args = []
        for p in callee.params:
            ok = [v for v in self.avail if v.type is None or p.type is None or v.type == p.type]
            exact = [v for v in ok if v.type is not None and v.type == p.type]
            if exact and self.d(st.booleans()):
                ok = exact
            if not ok:  # make a value of the parameter's type (Send may retype anything)
                (v,) = self.fb.op(
                    "Send",
                    *self.any_inputs(1),
                    dst=self.d(devices),
                    names=[self.d(name_hints)],
                    types=[p.type],
                )
                self.avail.append(v)
                ok = [v]
            args.append(self.d(st.sampled_from(ok)))
        res_types = [
            self.d(st.sampled_from([None, o.type])) if o.type is not None else self.maybe_type()
            for o in callee.outputs
        ]
        outs = self.fb.call(
            callee, *args, names=[self.d(name_hints) for _ in callee.outputs], types=res_types
        )
        self.avail.extend(outs)


@st.composite
def functions_of(
    draw: Draw,
    name: str,
    callees: tuple[Function, ...],
    registered: bool = True,
    max_params: int = 4,
    max_instrs: int = 8,
) -> Function:
    fb = FunctionBuilder(name)
    g = _Gen(draw, fb)
    for _ in range(draw(st.integers(0, max_params))):
        g.avail.append(fb.param(draw(name_hints), draw(MAYBE_TYPE)))
    kinds = ["local", "comm"] + (["call"] if callees else []) + ([] if registered else ["free"])
    for _ in range(draw(st.integers(0, max_instrs))):
        kind = draw(st.sampled_from(kinds))
        if kind == "local":
            g.local_op()
        elif kind == "comm":
            g.comm_op()
        elif kind == "free":
            g.free_op()
        else:
            g.call(draw(st.sampled_from(callees)))
    outs = draw(st.lists(st.sampled_from(g.avail), max_size=3)) if g.avail else []
    return fb.ret(*outs)


@st.composite
def modules(draw: Draw, registered: bool = True, max_functions: int = 4, max_instrs: int = 8) -> Module:
    """A random valid module; the entry (last function) may call every earlier function."""
    names = draw(st.lists(function_names, min_size=1, max_size=max_functions, unique=True))
    fns: list[Function] = []
    for name in names:
        fns.append(draw(functions_of(name, tuple(fns), registered, max_instrs=max_instrs)))
    return Module(tuple(fns))
