"""Random small distributed DistIR programs for the simulator's property tests.

``programs(feats)`` draws a typed, valid module: an entry over ``n_devices`` devices with local
ops (Relu, Add), Sends, every global collective (including ones whose source or root is not the
first listed device, and unsorted device lists), views (Reshape, Unsqueeze, MakeTuple +
UnpackTuple), and calls — nested, spanning several devices, reused at several call sites, with
callees that return their parameters, untyped parameters, and so on.

The generator tracks the storage *roots* of every value exactly as ``distir.sim.plan`` defines
them (a fresh result owns its storage; a view op's results share all of its inputs' roots; a
call result either aliases the roots of the arguments the callee returns or is fresh). The
``Feats`` flags switch patterns off one by one: each once made the simulator's call summaries
disagree with the inlined program (all fixed: ``test_minimal_programs.py``), and projection still
needs some of them off (``interp/test_call_and_projection_cases.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

import distir.ops  # noqa: F401  (registers the ops)
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType, Value
from distir.ir.function import Function
from distir.ops.registry import REGISTRY

Draw = Callable[[st.SearchStrategy[Any]], Any]

BASE_SHAPES: tuple[tuple[int, ...], ...] = ((4, 2), (2, 3))
MAX_NUMEL = 48
MAX_DEPTH = 3
ITEMSIZE = 4  # everything is f32


@dataclass(frozen=True)
class Feats:
    n_devices: int = 3
    max_ops: int = 8
    collectives: bool = True
    views: bool = True
    tuples: bool = True
    calls: bool = True
    # patterns that once broke call summaries (all fixed; see test_minimal_programs)
    dup_outputs: bool = True  # a callee returns one fresh storage root twice
    mixed_alias: bool = True  # a callee returns a view of several roots (params and/or fresh)
    unused_params: bool = True  # a callee parameter no op of the callee reads
    deep_dying: bool = True  # a callee passes its parameters on to a nested call
    unused_results: bool = True  # call results the caller never uses
    empty_callees: bool = True  # callees that touch no device (return a parameter, nothing else)
    single_collectives: bool = True  # one-member collectives (in the entry)
    single_in_callees: bool = True  # one-member collectives inside callees (project bug)


@dataclass(frozen=True, eq=False)
class V:
    val: Value
    dev: int
    shape: tuple[int, ...]
    roots: frozenset[Value]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * ITEMSIZE


_POLY_OPS = {"Relu", "Add", "Split", "Unsqueeze", "Squeeze", "MakeTuple", "UnpackTuple"}


@dataclass
class CalleeSpec:
    fn: Function
    params: list[tuple[int, tuple[int, ...]]]
    # per result: device, shape, and the parameter indices it aliases (None: fresh storage)
    outs: list[tuple[int, tuple[int, ...], frozenset[int] | None]]
    depth: int  # how deep its own calls nest (0: no calls)
    touches_devices: bool
    poly: bool = False  # untyped, all on one device, device-agnostic ops: callable on any device


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _chunks(n: int, k: int) -> list[int]:
    q, r = divmod(n, k)
    return [q + 1 if i < r else q for i in range(k)]


@dataclass
class _Frame:
    """The function being generated."""

    fb: FunctionBuilder
    pool: list[V]
    params: list[V]
    depth: int  # 0 = the entry
    used_by_op: set[Value] = field(default_factory=set)  # values read by a (non-call) op
    used: set[Value] = field(default_factory=set)  # values read by anything
    call_results: list[V] = field(default_factory=list)
    max_call_depth: int = 0
    touches: bool = False
    local_only: bool = True  # only device-agnostic local ops (the callee can be reused anywhere)

    def param_roots(self, v: V) -> frozenset[Value]:
        ps = {p.val for p in self.params}
        return frozenset(r for r in v.roots if r in ps)


class Gen:
    def __init__(self, draw: Draw, feats: Feats) -> None:
        self.draw = draw
        self.f = feats
        self.callees: list[CalleeSpec] = []
        self.n = 0

    # -- helpers ---------------------------------------------------------------------------------
    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def pick(self, xs: list[Any]) -> Any:
        return self.draw(st.sampled_from(xs)) if xs else None

    def op(
        self, fr: _Frame, name: str, ins: list[V], n_out: int | None = None, **attrs: object
    ) -> tuple[Value, ...]:
        for v in ins:
            fr.used.add(v.val)
            fr.used_by_op.add(v.val)
        fr.touches = True
        if name not in _POLY_OPS:
            fr.local_only = False
        return fr.fb.op(name, *(v.val for v in ins), n_out=n_out, **attrs)

    def fresh(self, fr: _Frame, val: Value, dev: int, shape: tuple[int, ...]) -> V:
        v = V(val, dev, shape, frozenset({val}))
        fr.pool.append(v)
        return v

    # -- ops ---------------------------------------------------------------------------------------
    def e_relu(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        (y,) = self.op(fr, "Relu", [a])
        self.fresh(fr, y, a.dev, a.shape)
        return True

    def e_add(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        b = self.pick([v for v in fr.pool if v.dev == a.dev and v.shape == a.shape])
        (y,) = self.op(fr, "Add", [a, b])
        self.fresh(fr, y, a.dev, a.shape)
        return True

    def e_send(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        dst = self.pick([d for d in range(self.f.n_devices) if d != a.dev])
        (y,) = self.op(fr, "Send", [a], dst=Device(dst))
        self.fresh(fr, y, dst, a.shape)
        return True

    def e_split(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        if not a.shape:
            return False
        k = self.draw(st.integers(1, 3))
        outs = self.op(fr, "Split", [a], dim=0, num_splits=k)
        for y, c in zip(outs, _chunks(a.shape[0], k), strict=True):
            self.fresh(fr, y, a.dev, (c, *a.shape[1:]))
        return True

    def _single_ok(self, fr: _Frame) -> bool:
        return self.f.single_collectives and (fr.depth == 0 or self.f.single_in_callees)

    def _group(self, fr: _Frame) -> list[V] | None:
        """One value per device, all of one shape, in a random order."""
        shape = self.pick(sorted({v.shape for v in fr.pool}))
        by_dev: dict[int, list[V]] = {}
        for v in fr.pool:
            if v.shape == shape:
                by_dev.setdefault(v.dev, []).append(v)
        lo = 1 if self._single_ok(fr) else 2
        if len(by_dev) < lo:
            return None
        devs = self.draw(st.permutations(sorted(by_dev)))
        k = self.draw(st.integers(lo, len(devs)))
        return [self.pick(by_dev[d]) for d in devs[:k]]

    def e_collective(self, fr: _Frame) -> bool:
        kind = self.draw(
            st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "MPIGather", "Reduce", "AllToAll"])
        )
        g = self._group(fr)
        if g is None:
            return False
        shape = g[0].shape
        n = len(g)
        dim = self.draw(st.integers(0, len(shape) - 1))
        red = self.draw(st.sampled_from(["sum", "max"]))
        if kind == "AllReduce":
            outs = self.op(fr, kind, g, op=red)
            shapes = [shape] * n
        elif kind == "AllGather":
            big = tuple(s * n if i == dim else s for i, s in enumerate(shape))
            if _numel(big) > MAX_NUMEL:
                return False
            outs = self.op(fr, kind, g, dim=dim)
            shapes = [big] * n
        elif kind == "ReduceScatter":
            outs = self.op(fr, kind, g, dim=dim, op=red)
            shapes = [
                tuple(c if i == dim else s for i, s in enumerate(shape)) for c in _chunks(shape[dim], n)
            ]
        elif kind == "AllToAll":
            cd = self.draw(st.integers(0, len(shape) - 1))
            shapes = []
            for c in _chunks(shape[dim], n):
                piece = [c if i == dim else s for i, s in enumerate(shape)]
                piece[cd] *= n
                shapes.append(tuple(piece))
            if any(_numel(s) > MAX_NUMEL for s in shapes):
                return False
            outs = self.op(fr, kind, g, split_dim=dim, concat_dim=cd)
        else:
            root = self.pick([v.dev for v in g])
            if kind == "MPIGather":
                big = tuple(s * n if i == dim else s for i, s in enumerate(shape))
                if _numel(big) > MAX_NUMEL:
                    return False
                outs = self.op(fr, kind, g, dim=dim, root=Device(root))
                shapes = [big]
            else:
                outs = self.op(fr, kind, g, root=Device(root), op=red)
                shapes = [shape]
            for y, s in zip(outs, shapes, strict=True):
                self.fresh(fr, y, root, s)
            return True
        for y, v, s in zip(outs, g, shapes, strict=True):
            self.fresh(fr, y, v.dev, s)
        return True

    def e_bcast(self, fr: _Frame) -> bool:
        kind = self.draw(st.sampled_from(["Broadcast", "Scatter"]))
        a = self.pick(fr.pool)
        others = [d for d in range(self.f.n_devices) if d != a.dev]
        lo = 0 if self._single_ok(fr) else 1
        k = self.draw(st.integers(lo, len(others)))
        devs = self.draw(st.permutations([a.dev, *self.draw(st.permutations(others))[:k]]))
        if kind == "Broadcast":
            outs = self.op(fr, kind, [a], devices=[Device(d) for d in devs])
            shapes = [a.shape] * len(devs)
        else:
            dim = self.draw(st.integers(0, len(a.shape) - 1))
            outs = self.op(fr, kind, [a], dim=dim, devices=[Device(d) for d in devs])
            shapes = [
                tuple(c if i == dim else s for i, s in enumerate(a.shape))
                for c in _chunks(a.shape[dim], len(devs))
            ]
        for y, d, s in zip(outs, devs, shapes, strict=True):
            self.fresh(fr, y, d, s)
        return True

    def e_view(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        how = self.draw(st.sampled_from(["reshape", "unsqueeze", "squeeze"]))
        if how == "reshape":
            if 0 in a.shape:  # ONNX Reshape reads 0 as "copy this dim"
                return False
            new = tuple(reversed(a.shape)) if self.draw(st.booleans()) else (_numel(a.shape),)
            (s,) = self.op(fr, "Constant", [], value=list(new), device=Device(a.dev))
            (y,) = self.op(fr, "Reshape", [a, V(s, a.dev, (len(new),), frozenset({s}))])
            fr.pool.append(V(y, a.dev, new, a.roots | {s}))
        elif how == "unsqueeze":
            if len(a.shape) >= 3:
                return False
            (y,) = self.op(fr, "Unsqueeze", [a], axes=[0])
            fr.pool.append(V(y, a.dev, (1, *a.shape), a.roots))
        else:
            if not a.shape or a.shape[0] != 1:
                return False
            (y,) = self.op(fr, "Squeeze", [a], axes=[0])
            fr.pool.append(V(y, a.dev, a.shape[1:], a.roots))
        return True

    def e_tuple(self, fr: _Frame) -> bool:
        a = self.pick(fr.pool)
        b = self.pick([v for v in fr.pool if v.dev == a.dev])
        (t,) = self.op(fr, "MakeTuple", [a, b])
        roots = a.roots | b.roots
        if self.draw(st.booleans()):
            x, y = self.op(fr, "UnpackTuple", [V(t, a.dev, (), roots)], n_out=2)
            fr.pool.append(V(x, a.dev, a.shape, roots))
            fr.pool.append(V(y, a.dev, b.shape, roots))
        return True

    def e_call(self, fr: _Frame) -> bool:
        if fr.depth >= MAX_DEPTH:
            return False
        eligible = fr.pool
        if fr.depth > 0 and not self.f.deep_dying:
            eligible = [v for v in fr.pool if not fr.param_roots(v)]
        if not eligible:
            return False
        spec: CalleeSpec | None = None
        args: list[V] = []
        reuse = [c for c in self.callees if c.depth + fr.depth < MAX_DEPTH]
        shift: dict[int, int] = {}
        if reuse and self.draw(st.integers(0, 3)) > 0:
            poly = [c for c in reuse if c.poly and c.params]
            if poly and self.draw(st.booleans()):  # a device-agnostic callee, on another device
                c = self.pick(poly)
                shift = {c.params[0][0]: self.draw(st.integers(0, self.f.n_devices - 1))}
            else:
                c = self.pick(reuse)
            for dev, shape in c.params:
                dev = shift.get(dev, dev)
                v = self.pick([v for v in eligible if v.dev == dev and v.shape == shape])
                if v is None:
                    break
                args.append(v)
            else:
                spec = c
        if spec is None:
            shift = {}
            args = self.draw(st.lists(st.sampled_from(eligible), min_size=0, max_size=3))
            if not args and not self.f.empty_callees:
                args = [self.pick(eligible)]
            spec = self.callee(args, fr.depth + 1)
            if spec is None:
                return False
        for v in args:
            fr.used.add(v.val)
        outs = fr.fb.call(spec.fn, *(v.val for v in args))
        fr.touches = fr.touches or spec.touches_devices
        fr.local_only = False
        fr.max_call_depth = max(fr.max_call_depth, spec.depth + 1)
        for y, (dev, shape, alias) in zip(outs, spec.outs, strict=True):
            dev = shift.get(dev, dev)
            if alias is None:
                v = V(y, dev, shape, frozenset({y}))
            else:
                v = V(y, dev, shape, frozenset(r for j in alias for r in args[j].roots))
            fr.pool.append(v)
            fr.call_results.append(v)
        return True

    # -- functions -----------------------------------------------------------------------------------
    def body(self, fr: _Frame, n_ops: int) -> None:
        kinds: list[Callable[[_Frame], bool]] = [self.e_relu, self.e_add, self.e_send, self.e_split]
        if self.f.collectives:
            kinds += [self.e_collective, self.e_bcast]
        if self.f.views:
            kinds.append(self.e_view)
        if self.f.tuples:
            kinds.append(self.e_tuple)
        if self.f.calls:
            kinds += [self.e_call] * 3
        for _ in range(n_ops):
            if not fr.pool:
                return
            self.draw(st.sampled_from(kinds))(fr)

    def finish(self, fr: _Frame) -> None:
        """Consume what the known-bug flags say must be consumed."""
        if not self.f.unused_results:
            for v in fr.call_results:
                if v.val not in fr.used:
                    self.op(fr, "Relu", [v])
        if not self.f.unused_params and fr.depth > 0:
            for p in fr.params:
                if p.val not in fr.used_by_op:
                    self.op(fr, "Relu", [p])

    def callee(self, args: list[V], depth: int) -> CalleeSpec | None:
        name = self.name("f")
        fb = FunctionBuilder(name, REGISTRY.out_arity)
        typed = self.draw(st.booleans())
        params = []
        for i, a in enumerate(args):
            t = TensorType(DType.f32, a.shape, Device(a.dev)) if typed else None
            p = fb.param(f"p{i}", t)
            params.append(V(p, a.dev, a.shape, frozenset({p})))
        fr = _Frame(fb, list(params), params, depth)
        self.body(fr, self.draw(st.integers(0, 4)))
        self.finish(fr)
        pset = {p.val: j for j, p in enumerate(params)}
        chosen: list[V] = []
        fresh_roots: set[Value] = set()
        for v in self.draw(st.lists(st.sampled_from(fr.pool), max_size=3)) if fr.pool else []:
            proots = {r for r in v.roots if r in pset}
            others = v.roots - proots
            if not self.f.mixed_alias:
                if proots and others:
                    continue
                if others and (len(others) != 1 or (v.val not in others and not _same_size(v, fr))):
                    continue
            if not self.f.dup_outputs and others:
                if others & fresh_roots:
                    continue
                fresh_roots |= others
            chosen.append(v)
        if not fr.touches and not self.f.empty_callees:
            return None
        fn = fb.ret(*(v.val for v in chosen))
        outs: list[tuple[int, tuple[int, ...], frozenset[int] | None]] = []
        for v in chosen:
            alias = frozenset(pset[r] for r in v.roots) if all(r in pset for r in v.roots) else None
            outs.append((v.dev, v.shape, alias))
        poly = not typed and fr.local_only and len({a.dev for a in args}) == 1
        spec = CalleeSpec(fn, [(a.dev, a.shape) for a in args], outs, fr.max_call_depth, fr.touches, poly)
        self.callees.append(spec)
        return spec

    def entry(self) -> Module:
        fb = FunctionBuilder("main", REGISTRY.out_arity)
        pool: list[V] = []
        for d in range(self.f.n_devices):
            for i in range(self.draw(st.integers(1, 2))):
                shape = self.pick(list(BASE_SHAPES))
                p = fb.param(f"x{d}_{i}", TensorType(DType.f32, shape, Device(d)))
                pool.append(V(p, d, shape, frozenset({p})))
        fr = _Frame(fb, list(pool), list(pool), 0)
        self.body(fr, self.draw(st.integers(1, self.f.max_ops)))
        self.finish(fr)
        outs = self.draw(st.lists(st.sampled_from(fr.pool), min_size=1, max_size=4))
        fn = fb.ret(*(v.val for v in outs))
        return Module((*(c.fn for c in self.callees), fn))


def _same_size(v: V, fr: _Frame) -> bool:
    """A single-root view whose root has the same size (so the caller's fresh copy is exact)."""
    (r,) = v.roots
    src = next((x for x in fr.pool if x.val is r), None)
    return src is not None and src.nbytes == v.nbytes


@st.composite
def programs(draw: Draw, feats: Feats = Feats()) -> Module:
    return Gen(draw, feats).entry()


def with_feats(**kw: Any) -> Feats:
    return replace(Feats(), **kw)
