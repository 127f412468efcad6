"""Type and shape propagation over a mixed abstract/concrete domain.

A value is either abstract (its ``Type``) or ``Concrete`` (its type plus a small numpy array).
Per op, the dispatcher picks the most precise implementation:

1. ``reference`` — all inputs concrete, a local op with a reference, results small: run it;
2. ``partial``  — the op can compute some results from types and known inputs (``Shape``,
   ``Constant``): those results become concrete;
3. ``abstract`` — the op's type rule (which may still read known inputs, e.g. Reshape's shape).

This is what makes ``Shape → Gather → Concat → Reshape → Gemm`` (the paper's Figure 4) give the
concrete output shape. Declared result types are checked against inferred ones. Calls on
all-abstract arguments are cached per (function, argument types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, cast

import numpy as np

from distir.interp.dispatch import Dispatcher, Impl, always
from distir.interp.loop import InterpretError, interpret
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import Type
from distir.ir.values import Value
from distir.ops.dtensor_inference import global_view
from distir.ops.infer_memo import abstract_types
from distir.ops.registry import REGISTRY, OpDef, OpKind, OpTypeError, RegistryError, TypeCtx


class Concrete:
    """A value known exactly: its type and its data."""

    __slots__ = ("data", "type")

    def __init__(self, type: Type, data: Any) -> None:
        self.type = type
        self.data = data

    def __repr__(self) -> str:
        return f"Concrete({self.type}, {np.asarray(self.data).tolist()})"


Mixed = Type | Concrete


def type_of(v: Mixed) -> Type:
    return v.type if isinstance(v, Concrete) else v


def _known(args: Sequence[Mixed]) -> list[Any]:
    return [a.data if isinstance(a, Concrete) else None for a in args]


_TYPE = attrgetter("type")


def check_declared(values: Sequence[Value], results: Sequence[Mixed], producer: str) -> None:
    """Declared result types must be what the op or call produces."""
    # many results, none declared (a call returning hundreds of values): checked at C level
    if len(values) > 8 and list(map(_TYPE, values)).count(None) == len(values):
        return
    for v, o in zip(values, results, strict=False):
        if v.type is not None and v.type != type_of(o):
            raise OpTypeError(
                f"%{v.name} is declared {v.type} but {producer} gives {type_of(o)}", None, v.type, type_of(o)
            )


def check_arguments(callee: Function, types: Sequence[Type]) -> None:
    """Arguments of a call must have the types the callee declares for its parameters."""
    for k, (p, t) in enumerate(zip(callee.params, types, strict=False)):
        if p.type is not None and p.type != t:
            raise OpTypeError(f"argument for %{p.name} of @{callee.name} has the wrong type", k, p.type, t)


def _has_partial(d: OpDef, concrete: Sequence[bool]) -> bool:
    return d.partial is not None


class TypeDomain:
    """Mixed abstract/concrete type propagation. See the module docstring.

    A domain holds no reference to itself (no bound method in its dispatcher): it is freed by
    reference counting as soon as its user drops it, with everything it memoized."""

    def __init__(self, concrete_limit: int = 1 << 12, record: bool = False) -> None:
        self.concrete_limit = concrete_limit
        # implementations are the class's functions, called with the domain: a bound method here
        # would make every domain a reference cycle, and a simulation's planning domain (with all
        # its plans and memos) would wait for the cyclic collector instead of dying at once
        cls = type(self)
        self.dispatch: Dispatcher[Any] = Dispatcher()
        self.dispatch.register("*", Impl("reference", 2, cls._can_run, cls._run_reference))
        self.dispatch.register("*", Impl("partial", 1, _has_partial, cls._run_partial))
        self.dispatch.register("*", Impl("abstract", 0, always, cls._run_abstract))
        self._selected: dict[tuple[str, tuple[bool, ...]], Any] = {}
        self._defs: dict[str, OpDef] = {}
        self._call_cache: dict[tuple[str, tuple[Type, ...]], tuple[Mixed, ...]] = {}
        # (callee, ids of the argument types) -> (results, the argument types, pinned)
        self._call_ids: dict[tuple[Any, ...], tuple[tuple[Mixed, ...], tuple[Type, ...]]] = {}
        self.record = record
        # function name -> list of (argument types, final state) seen; only when record=True
        self.envs: dict[str, list[tuple[tuple[Type, ...], dict[Value, Mixed]]]] = {}

    # -- dispatch targets ------------------------------------------------------------------------
    @staticmethod
    def _can_run(d: OpDef, concrete: Sequence[bool]) -> bool:
        return d.kind is OpKind.LOCAL and d.reference is not None and all(concrete)

    def _run_reference(self, d: OpDef, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        types = [type_of(a) for a in args]
        known = _known(args)
        outs = d.infer_types(types, op.attrs, known)
        if sum(getattr(t, "numel", 1) for t in outs) > self.concrete_limit:
            return outs
        assert d.reference is not None
        datas = d.reference(known, op.attrs)
        result: list[Mixed] = []
        for t, x in zip(outs, datas, strict=True):
            arr = np.asarray(x)
            shape = getattr(t, "shape", ())
            if arr.shape != shape:  # pragma: no cover - an op whose rule and reference disagree
                raise RegistryError(f"{d.name}: reference gave shape {arr.shape}, rule {shape}")
            result.append(Concrete(t, arr))
        return result

    def _run_partial(self, d: OpDef, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        types = [type_of(a) for a in args]
        known = _known(args)
        outs = d.infer_types(types, op.attrs, known)
        assert d.partial is not None
        meshes = [t.mesh for t in types if isinstance(t, DTensorType)]
        if meshes:  # the partial evaluator sees the logical (global) tensors
            types = [global_view(t, meshes[0]) for t in types]
        dev = d.local_device(types, op.attrs) if d.kind is not OpKind.COMM else None
        vals = d.partial(TypeCtx(d, types, op.attrs, known, dev))
        return [
            t if x is None or getattr(t, "numel", 1) > self.concrete_limit else Concrete(t, np.asarray(x))
            for t, x in zip(outs, vals, strict=True)
        ]

    def _run_abstract(self, d: OpDef, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        if Concrete in map(type, args):
            return d.infer_types([type_of(a) for a in args], op.attrs, _known(args))
        return abstract_types(d, op.attrs, cast(Sequence[Type], args))

    # -- domain interface ------------------------------------------------------------------------
    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        d = self._defs.get(op.name)
        if d is None:
            d = self._defs[op.name] = REGISTRY[op.name]
        concrete = tuple(isinstance(a, Concrete) for a in args)
        key = (op.name, concrete)
        impl = self._selected.get(key)
        if impl is None:
            d.check_arity(len(args))
            impl = self._selected[key] = self.dispatch.select(d, concrete)
        outs: Sequence[Mixed] = impl.run(self, d, op, args)
        check_declared(op.outputs, outs, op.name)
        return outs

    def call(self, module: Module, call: Call, callee: Function, args: Sequence[Mixed]) -> Sequence[Mixed]:
        if not self.record:
            # the hot path (a call site seen before with the very same type objects): keyed by
            # identity, so no type is hashed; the entry pins the types, so their ids stay valid.
            # Only abstract arguments are ever entered, and a live object's id is its own, so
            # arguments with a Concrete value never match (no need to scan for one first).
            id_key = (callee.name, *map(id, args))
            pinned = self._call_ids.get(id_key)
            if pinned is not None:
                check_declared(call.outputs, pinned[0], "@" + callee.name)
                return pinned[0]
        abstract = Concrete not in map(type, args)
        # no Concrete among abstract arguments: they are their types
        types = cast(tuple[Type, ...], tuple(args)) if abstract else tuple(type_of(a) for a in args)
        check_arguments(callee, types)
        key = (callee.name, types)
        outs: Sequence[Mixed] | None = None
        if abstract and not self.record:
            outs = self._call_cache.get(key)
            if outs is not None:
                self._call_ids[id_key] = (tuple(outs), types)
        if outs is None:
            outs, env = interpret(module, callee, args, self)
            if self.record:
                self.envs.setdefault(callee.name, []).append((types, env))
            if abstract:
                # results may be known values (a callee returning Shape(%p)): keep them
                self._call_cache[key] = tuple(outs)
                if not self.record:
                    self._call_ids[id_key] = (tuple(outs), types)
        check_declared(call.outputs, outs, "@" + callee.name)
        return outs


def flat_types(fn: Function, arg_types: Sequence[Type]) -> dict[Value, Type] | None:
    """The type of every value of ``fn`` on ``arg_types`` as ``interpret`` in a ``TypeDomain``
    that keeps no known value (``concrete_limit=0``) gives it, for a body of primitive ops whose
    rules read no known value (no ``partial`` rule): each op's types from ``abstract_types``,
    its arity and declared results checked, without the interpreter's dispatch. None where the
    interpreter must walk: a call, a rule reading known values, or anything wrong (which it then
    reports precisely)."""
    if len(arg_types) != len(fn.params):
        return None
    env: dict[Value, Type] = dict(zip(fn.params, arg_types, strict=True))
    try:
        for instr in fn.body:
            if type(instr) is not Op:
                return None
            d = REGISTRY[instr.name]
            if d.partial is not None:
                return None
            d.check_arity(len(instr.inputs))
            outs = abstract_types(d, instr.attrs, [env[v] for v in instr.inputs])
            if len(outs) != len(instr.outputs):
                return None
            check_declared(instr.outputs, outs, instr.name)
            env.update(zip(instr.outputs, outs, strict=True))
    except (RegistryError, ValueError, TypeError, IndexError, ArithmeticError, KeyError):
        return None
    return env


def entry_args(fn: Function, concrete: Mapping[str, Any] | None = None) -> list[Mixed]:
    """Arguments for ``fn`` from its declared parameter types (and optional concrete values)."""
    args: list[Mixed] = []
    concrete = concrete or {}
    for p in fn.params:
        if p.type is None:
            raise InterpretError(
                f"parameter %{p.name} has no type; the entry function's parameters must all be typed",
                [(fn.name, f"func @{fn.name}")],
                p,
            )
        if p.name in concrete:
            args.append(Concrete(p.type, np.asarray(concrete[p.name])))
        else:
            args.append(p.type)
    return args


def infer_types(
    module: Module,
    fn: Function | None = None,
    concrete: Mapping[str, Any] | None = None,
    domain: TypeDomain | None = None,
) -> tuple[tuple[Mixed, ...], dict[Value, Mixed]]:
    """Propagate types through ``fn`` (the entry by default). Returns outputs and state."""
    fn = fn if fn is not None else module.entry
    domain = domain if domain is not None else TypeDomain()
    return interpret(module, fn, entry_args(fn, concrete), domain)
