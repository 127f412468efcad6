"""The plan of sharding propagation: what a flat function alone fixes, for any mesh and
annotations (``Plan``), and the module-level tables propagation and legalization share: op
signatures interned to small ints (``_sig_id``), each signature's options per axis size
(``_OPTIONS``, ``op_strategies``) and parsed annotation texts (``parsed_placements``).

``distir.parallel.sharding.propagate`` re-exports ``Plan``, ``op_strategies`` and ``parsed_placements``
and runs the propagation itself (``place``) on a plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final

from distir.interp.shapes import infer_types, type_of
from distir.ir.dtensor import Placement, parse_placements
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops.registry import REGISTRY, OpKind
from distir.ops.sharding import Strategy


def op_strategies(
    name: str, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> tuple[Strategy, ...]:
    """``REGISTRY[name].strategies(ins, outs, attrs, n)``, memoized by the op's definition
    (``OpDef.strategy_options``): propagation and legalization ask the same questions again and
    again."""
    return REGISTRY[name].strategy_options(ins, outs, attrs, n)


# annotation texts -> placements (a few distinct texts, met for every layer); bounded
_PARSED: dict[str, tuple[Placement, ...]] = {}


def parsed_placements(text: str) -> tuple[Placement, ...]:
    """``parse_placements(text)``, memoized (placements are immutable)."""
    got = _PARSED.get(text)
    if got is None:
        got = parse_placements(text)
        if len(_PARSED) >= 1 << 12:
            _PARSED.clear()
        _PARSED[text] = got
    return got


class Plan:
    """What propagation derives from a flat function alone, for any mesh and annotations: the
    global type of every value (type inference on the declared parameter types), the ops and
    their constants, and per op what fixes its options and move costs (name, sharding rule,
    global types, attributes; an interned ``sig`` for memo keys) and, per axis size, the options
    themselves. Immutable once built (the per-size tables fill lazily): ``shard_function`` keeps
    one per (function, argument types), and the meshes a layer is sharded on share it."""

    __slots__ = (
        "_by_name",
        "_fill",
        "_options",
        "_pin_flags",
        "_pins",
        "constants",
        "fn",
        "ins",
        "is_param",
        "movable",
        "ops",
        "outs",
        "params",
        "sharded",
        "sig",
        "tensors",
        "types",
        "vals",
    )

    def __init__(self, fn: Function) -> None:
        """``fn``: flat (no calls), every parameter typed."""
        self.fn = fn
        _, env = infer_types(Module((fn,)))
        self.types: dict[Value, Type] = {v: type_of(x) for v, x in env.items()}
        types = self.types
        self.ops: list[Op] = [i for i in fn.body if isinstance(i, Op)]
        # constants (ops without inputs) stay plain tensors of the logical program: replicated
        self.constants = {v for op in self.ops if not op.inputs for v in op.outputs}
        # the values propagation places, in the order inference met them
        self.tensors = [v for v, t in types.items() if isinstance(t, TensorType) and v not in self.constants]
        self.params = set(fn.params)
        self.ins: list[list[Type]] = []
        self.outs: list[list[Type]] = []
        self.sig: list[int] = []
        self.vals: list[tuple[Value, ...]] = []  # per op: its inputs, then its results
        self.is_param: list[tuple[bool, ...]] = []
        self.movable: list[tuple[tuple[int, TensorType], ...]] = []  # per op: its tensor inputs
        self.sharded: list[int] = []
        tensors = set(self.tensors)
        for op in self.ops:
            ins = [types[v] for v in op.inputs]
            outs = [types[v] for v in op.outputs]
            self.ins.append(ins)
            self.outs.append(outs)
            self.sig.append(_sig_id((op.name, REGISTRY[op.name].sharding, tuple(ins), tuple(outs), op.attrs)))
            vals = (*op.inputs, *op.outputs)
            self.vals.append(vals)
            self.is_param.append(tuple(v in self.params for v in vals))
            self.movable.append(tuple((i, t) for i, t in enumerate(ins) if isinstance(t, TensorType)))
            # legalization: 1 for a local op with a distributed input (its strategy may move
            # them), -1 when one of its results cannot be distributed (an error), else 0
            sharded = REGISTRY[op.name].kind is OpKind.LOCAL and any(v in tensors for v in op.inputs)
            self.sharded.append(0 if not sharded else 1 if all(v in tensors for v in op.outputs) else -1)
        self._options: dict[int, list[tuple[Strategy, ...]]] = {}
        self._fill: dict[int, list[tuple[tuple[Placement, ...], ...]]] = {}
        self._pins: dict[tuple[int, ...], set[Value]] = {}
        self._pin_flags: dict[tuple[int, ...], list[tuple[bool, ...]]] = {}
        self._by_name: dict[str, Value] | None = None

    def options(self, n: int) -> list[tuple[Strategy, ...]]:
        """Per op, its strategies along a mesh axis of ``n`` devices."""
        got = self._options.get(n)
        if got is None:
            got = self._options[n] = [self._tables(sig, k, n)[0] for k, sig in enumerate(self.sig)]
        return got

    def fill(self, n: int) -> list[tuple[tuple[Placement, ...], ...]]:
        """Per op, each strategy's placements of its inputs, then its results (``vals``)."""
        got = self._fill.get(n)
        if got is None:
            got = self._fill[n] = [self._tables(sig, k, n)[1] for k, sig in enumerate(self.sig)]
        return got

    def _tables(
        self, sig: int, k: int, n: int
    ) -> tuple[tuple[Strategy, ...], tuple[tuple[Placement, ...], ...]]:
        """Op ``k``'s options on an axis of ``n`` devices and their ``fill`` rows, by signature
        id first (``_OPTIONS``: an int key, where ``op_strategies`` hashes the types)."""
        got = _OPTIONS.get((sig, n))
        if got is None:
            op = self.ops[k]
            opts = op_strategies(op.name, self.ins[k], self.outs[k], op.attrs, n)
            if len(_OPTIONS) >= _OPTIONS_MAX:
                _OPTIONS.clear()
            got = _OPTIONS[(sig, n)] = (opts, tuple((*st.ins, *st.outs) for st in opts))
        return got

    def by_name(self) -> dict[str, Value]:
        """The first value of each name (annotations name values)."""
        if self._by_name is None:
            self._by_name = {}
            for v in self.types:
                self._by_name.setdefault(v.name, v)
        return self._by_name

    def pin_flags(self, pinned: tuple[int, ...]) -> list[tuple[bool, ...]]:
        """Per op, per input: pinned (``pins``)."""
        got = self._pin_flags.get(pinned)
        if got is None:
            pins = self.pins(pinned)
            got = self._pin_flags[pinned] = [tuple(v in pins for v in op.inputs) for op in self.ops]
        return got

    def pins(self, pinned: tuple[int, ...]) -> set[Value]:
        """The pinned parameters and the values computed from them (and constants) alone: a
        weight's transpose is a weight too. Callers must not mutate the set."""
        got = self._pins.get(pinned)
        if got is None:
            fn = self.fn
            got = {fn.params[i] for i in pinned}
            for op in self.ops:
                if got and op.inputs and all(v in got or v in self.constants for v in op.inputs):
                    got.update(op.outputs)
            self._pins[pinned] = got
        return got


# op signatures (name, sharding rule, global types, attributes) -> small ints, so that memo keys
# hash an int instead of types. Ids are never reused: clearing the table when full only makes
# later keys of a signature differ from earlier ones (a memo miss, never a wrong hit).
_SIGS: dict[tuple[object, ...], int] = {}
_SIGS_MAX: Final = 1 << 15
_next_sig = itertools.count()


def _sig_id(sig: tuple[object, ...]) -> int:
    got = _SIGS.get(sig)
    if got is None:
        if len(_SIGS) >= _SIGS_MAX:
            _SIGS.clear()
        got = _SIGS[sig] = next(_next_sig)
    return got


# (signature id, axis size) -> the op's options (``op_strategies``) and its ``Plan.fill`` rows;
# bounded: cleared when full
_OPTIONS: dict[tuple[int, int], tuple[tuple[Strategy, ...], tuple[tuple[Placement, ...], ...]]] = {}
_OPTIONS_MAX: Final = 1 << 15
