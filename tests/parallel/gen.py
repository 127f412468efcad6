"""Hypothesis strategies for the sharding property tests: meshes, placements, redistribution
programs written in the DTensor text format, and small MLP-like sequential programs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import distir
from distir.interp.lockstep import check_deadlock_free, run_ranks
from distir.interp.project import project
from distir.interp.reference import random_inputs, run_reference
from distir.ir import Device, Mesh, Module
from distir.ir.dtensor import DTensorType, Partial, Placement, Replicate, Shard, split_sizes
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import (
    local_offsets,
    local_shape,
    materialize,
    shard_value,
    unshard_value,
)
from distir.parallel.sharding.propagate import propagate
from distir.parallel.sharding.sink_reductions import sink_reductions

R = Replicate()


def mesh_of(shape: tuple[int, ...]) -> Mesh:
    names = ("x",) if len(shape) == 1 else ("a", "b")
    return Mesh(tuple(zip(names, shape, strict=True)), tuple(Device(i) for i in range(math.prod(shape))))


# 1-D meshes of 2-4 devices and the 2-D meshes 2x2, 2x3
MESH_SHAPES: tuple[tuple[int, ...], ...] = ((2,), (3,), (4,), (2, 2), (2, 3))
meshes = st.sampled_from(MESH_SHAPES).map(mesh_of)
# redistributions also meet axes of one device (a (dp, tp) mesh with d = 1 or t = 1): every
# placement along them is the same piece, so nothing moves there
redist_meshes = st.sampled_from((*MESH_SHAPES, (1, 3), (2, 1))).map(mesh_of)


def shape_text(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(map(str, shape)) + ")"


def places_text(places: tuple[Placement, ...]) -> str:
    return ", ".join(map(str, places))


def valid_layout(places: tuple[Placement, ...]) -> bool:
    """Materialization supports each tensor dim sharded along at most one mesh axis."""
    dims = [p.dim for p in places if isinstance(p, Shard)]
    return len(dims) == len(set(dims))


# -- redistribution programs ---------------------------------------------------------------------
@dataclass(frozen=True)
class RedistCase:
    shape: tuple[int, ...]
    mesh: Mesh
    src: tuple[Placement, ...]
    dst: tuple[Placement, ...]

    @property
    def text(self) -> str:
        sh = shape_text(self.shape)
        a = f"DTensor[f32, {sh}, {self.mesh}, [{places_text(self.src)}]]"
        b = f"DTensor[f32, {sh}, {self.mesh}, [{places_text(self.dst)}]]"
        return (
            f"func @f(%x: {a}) {{\n"
            f'  %y: {b} = Redistribute(%x, to="{places_text(self.dst)}")\n'
            "  return %y\n"
            "}\n"
        )


@st.composite
def redist_cases(draw: st.DrawFn, nested: bool = False) -> RedistCase:
    """A global shape of rank 1-3 with dims 1-9, a mesh, and (source, target) placements: sources
    among R, S(d), P(sum) (P(max|min|mean) on at most one axis), targets R or S(d); each layout
    shards a dim along at most one mesh axis, or with ``nested`` (on a mesh of two axes or more),
    one of them shards a dim along two (nested: ``local_shape_at``)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    mesh = draw(redist_meshes.filter(lambda m: len(m.axes) > 1) if nested else redist_meshes)
    k = len(mesh.axes)
    data = st.sampled_from([R, *(Shard(d) for d in range(rank))])
    src_one = st.sampled_from([R, *(Shard(d) for d in range(rank)), Partial("sum")])
    src = list(draw(st.lists(src_one, min_size=k, max_size=k)))
    if draw(st.booleans()):  # another reduction, on one axis (the only partial axis then: with
        # two different reductions pending, the value would depend on their order)
        ax = draw(st.integers(0, k - 1))
        src = [R if isinstance(p, Partial) else p for p in src]
        src[ax] = Partial(draw(st.sampled_from(["max", "min", "mean"])))
    dst = list(draw(st.lists(data, min_size=k, max_size=k)))
    if nested:  # one dim on two axes at one end or both
        dim = draw(st.integers(0, rank - 1))
        axes = draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=2, unique=True))
        for end in draw(st.sampled_from([(src,), (dst,), (src, dst)])):
            for ax in axes:
                end[ax] = Shard(dim)
    src_t, dst_t = tuple(src), tuple(dst)
    assume(nested or (valid_layout(src_t) and valid_layout(dst_t)))
    return RedistCase(shape, mesh, src_t, dst_t)


def partial_pieces(x: np.ndarray, t: DTensorType, rng: np.random.Generator) -> dict[Device, np.ndarray]:
    """Each device's piece of the global array ``x`` laid out as ``t``, with partial axes holding
    genuinely different pieces whose reduction is ``x``: for sum, random pieces summing to x; for
    mean, x plus zero-mean noise; for max (min), x on one random coordinate and smaller (larger)
    values elsewhere. Replicas along R axes are equal. Several partial axes are nested (the first
    partial axis outermost), which is unambiguous when they reduce the same way."""
    coords = {d: t.mesh.coords(d) for d in t.mesh.devices}
    # the value each partial-axis coordinate tuple holds, built axis by axis
    values: dict[tuple[int, ...], np.ndarray] = {(): x}
    pax = [ax for ax, p in enumerate(t.placements) if isinstance(p, Partial)]
    for ax in pax:
        p = t.placements[ax]
        assert isinstance(p, Partial)
        n = t.mesh.shape[ax]
        nxt: dict[tuple[int, ...], np.ndarray] = {}
        for key, v in values.items():
            noise = rng.standard_normal((n, *v.shape)).astype(x.dtype)
            if p.op == "sum":
                parts = [*noise[:-1], v - noise[:-1].sum(axis=0)]
            elif p.op == "mean":
                parts = list(v + (noise - noise.mean(axis=0)))
            else:
                sign = -1.0 if p.op == "max" else 1.0
                top = int(rng.integers(0, n))
                parts = [v if i == top else v + sign * (np.abs(noise[i]) + 0.5) for i in range(n)]
            for i, part in enumerate(parts):
                nxt[(*key, i)] = np.asarray(part, dtype=x.dtype)
        values = nxt
    out: dict[Device, np.ndarray] = {}
    for d in t.mesh.devices:
        whole = values[tuple(coords[d][ax] for ax in pax)]
        off, shape = local_offsets(t, d), local_shape(t, d)
        sl = tuple(slice(o, o + s) for o, s in zip(off, shape, strict=True))
        out[d] = np.array(whole[sl], copy=True)
    return out


def gather_pieces(pieces: dict[Device, np.ndarray], t: DTensorType) -> np.ndarray:
    """The global array of a layout without partial axes, checking that replicas agree."""
    assert not any(isinstance(p, Partial) for p in t.placements)
    out = np.full(t.shape, np.nan, dtype=np.asarray(next(iter(pieces.values()))).dtype)
    for d in t.mesh.devices:
        off, shape = local_offsets(t, d), local_shape(t, d)
        piece = np.asarray(pieces[d])
        assert piece.shape == shape, (d, piece.shape, shape)
        sl = tuple(slice(o, o + s) for o, s in zip(off, shape, strict=True))
        seen = out[sl]
        have = ~np.isnan(seen)
        assert np.array_equal(seen[have], piece[have]), f"replicas on {d} disagree"
        out[sl] = piece
    assert not np.isnan(out).any(), "some elements are on no device"
    return out


def expected_collectives(src: tuple[Placement, ...], dst: tuple[Placement, ...], mesh: Mesh) -> list[str]:
    """The ops the lowering emits, axis by axis and group by group (R->S slices per device);
    none along an axis of one device (every placement there is the same piece)."""
    names: list[str] = []
    for ax, (a, b) in enumerate(zip(src, dst, strict=True)):
        if a == b or mesh.shape[ax] == 1:
            continue
        groups = mesh.groups(ax)
        if isinstance(b, Replicate):
            one = "AllReduce" if isinstance(a, Partial) else "AllGather"
            names += [one] * len(groups)
        elif isinstance(a, Partial):
            names += ["ReduceScatter"] * len(groups)
        elif isinstance(a, Shard):
            names += ["AllToAll"] * len(groups)
        else:
            names += ["Slice"] * len(mesh.devices)
    return names


def uneven(n: int, parts: int) -> bool:
    return len(set(split_sizes(n, parts))) > 1


# -- MLP-like sequential programs -----------------------------------------------------------------
@dataclass
class Program:
    dtype: str
    lines: list[str] = field(default_factory=list)
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)
    n: int = 0

    def fresh(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def param(self, prefix: str, shape: tuple[int, ...]) -> str:
        name = f"{prefix}{len(self.params)}"
        self.params[name] = shape
        return name

    def text(self, out: str) -> str:
        ps = ", ".join(f"%{k}: Tensor[{self.dtype}, {shape_text(s)}, d0]" for k, s in self.params.items())
        body = "".join(f"  {line}\n" for line in self.lines)
        return f"func @mlp({ps}) {{\n{body}  return %{out}\n}}\n"


OPS = ("matmul", "matmul_left", "add", "act", "mul", "square", "residual", "transpose", "reduce", "softmax")


@st.composite
def mlp_programs(draw: st.DrawFn, dtype: str = "f64") -> tuple[str, dict[str, tuple[int, ...]]]:
    """2-7 ops on a 2-d or 3-d (batched) value, from %x0: MatMul by a 2-d weight (on the right,
    or on the left, broadcast over the batch), Add of a bias (broadcast along some dims, or full,
    on either side), Gelu/Relu, Mul by a constant, a 0-d tensor or a broadcast tensor, Mul of the
    value by itself, Add of an earlier value of the same shape (a residual), Transpose (any
    permutation), ReduceSum over one axis (keepdims) and Softmax over the last axis; sometimes a
    final ReduceSum without keepdims. Every size is 1-9, so shards are often uneven or empty.
    Returns the program text and its parameters."""
    dim = st.integers(1, 9)
    p = Program(dtype)
    shape: tuple[int, ...] = tuple(draw(st.lists(dim, min_size=2, max_size=3)))
    cur = p.param("x", shape)
    seen: list[tuple[str, tuple[int, ...]]] = [(cur, shape)]
    first = draw(st.sampled_from(["matmul", "matmul_left"]))
    ops = [first, *draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=6))]
    for kind in ops:
        *batch, r, c = shape
        if kind == "matmul":
            k = draw(dim)
            w = p.param("w", (c, k))
            line, shape = f"MatMul(%{cur}, %{w})", (*batch, r, k)
        elif kind == "matmul_left":
            k = draw(dim)
            w = p.param("w", (k, r))
            line, shape = f"MatMul(%{w}, %{cur})", (*batch, k, c)
        elif kind == "add":
            bshape = draw(
                st.sampled_from(
                    [(c,), (1, c), (r, 1), shape, tuple(1 if i == 0 else s for i, s in enumerate(shape))]
                )
            )
            b = p.param("b", bshape)
            line = f"Add(%{cur}, %{b})" if draw(st.booleans()) else f"Add(%{b}, %{cur})"
        elif kind == "act":
            line = f"{draw(st.sampled_from(['Gelu', 'Relu']))}(%{cur})"
        elif kind == "mul":
            how = draw(st.sampled_from(["const", "0d", "row", "col", "full"]))
            if how == "const":
                s = p.fresh()
                p.lines.append(f"%{s} = Constant(value=0.5, dtype={dtype}, device=d0)")
            else:
                s = p.param("s", {"0d": (), "row": (c,), "col": (r, 1), "full": shape}[how])
            line = f"Mul(%{cur}, %{s})"
        elif kind == "square":
            line = f"Mul(%{cur}, %{cur})"
        elif kind == "residual":
            same = [v for v, sh in seen[:-1] if sh == shape]
            if not same:
                continue
            line = f"Add(%{cur}, %{draw(st.sampled_from(same))})"
        elif kind == "transpose":
            perm = draw(st.permutations(range(len(shape))))
            line = f"Transpose(%{cur}, perm=[{', '.join(map(str, perm))}])"
            shape = tuple(shape[i] for i in perm)
        elif kind == "reduce":
            ax = draw(st.integers(0, len(shape) - 1))
            line = f"ReduceSum(%{cur}, axes=[{ax}], keepdims=1)"
            shape = tuple(1 if i == ax else s for i, s in enumerate(shape))
        else:
            line = f"Softmax(%{cur}, axis=-1)"
        cur = p.fresh()
        p.lines.append(f"%{cur} = {line}")
        seen.append((cur, shape))
    if draw(st.booleans()):
        v = p.fresh()
        p.lines.append(f"%{v} = ReduceSum(%{cur}, axes=[{draw(st.integers(0, len(shape) - 1))}], keepdims=0)")
        cur = v
    return p.text(cur), dict(p.params)


@st.composite
def annotations(
    draw: st.DrawFn, params: dict[str, tuple[int, ...]], mesh: Mesh, nested: bool = False
) -> dict[str, tuple[Placement, ...]]:
    """Placements (R or S(d) for a dim of the parameter, per mesh axis; no dim sharded along two
    axes) for 1-3 of the parameters; with ``nested`` (a mesh of two axes or more), also one
    parameter's first dim over every axis (nested: ``local_shape_at``)."""
    names = draw(st.lists(st.sampled_from(sorted(params)), min_size=1, max_size=3, unique=True))
    out: dict[str, tuple[Placement, ...]] = {}
    for name in names:
        places: list[Placement] = []
        for _ in mesh.axes:
            free = [Shard(d) for d in range(len(params[name])) if Shard(d) not in places]
            places.append(draw(st.sampled_from([R, *free])))
        out[name] = tuple(places)
    if nested:  # a parameter of rank 1 or more: every program has one (%x0)
        name = draw(st.sampled_from([n for n in sorted(params) if params[n]]))
        out[name] = tuple(Shard(0) for _ in mesh.axes)
    return out


# -- running a sharded program against the sequential one -----------------------------------------
def compare_optimized(m: Module, mesh: Mesh, annotations: Mapping[str, str], seed: int) -> tuple[float, int]:
    """Like ``helpers.compare`` with ``sink_reductions`` between legalization and
    materialization: the max relative difference to the sequential outputs (materialized global
    program and per-rank programs), and how many ops the pass moved."""
    m = distir.check(m)
    legal = distir.check(legalize(propagate(m, mesh, annotations).module))
    opt = distir.check(sink_reductions(legal))
    moved = sum(a.name != b.name for a, b in zip(legal.entry.ops(), opt.entry.ops(), strict=True))
    mat = distir.check(materialize(opt))
    args = random_inputs(m.entry, seed)
    want = run_reference(m, args)
    devs = mesh.devices
    per_rank: dict[Device, list[np.ndarray]] = {d: [] for d in devs}
    for a, p in zip(args, opt.entry.params, strict=True):
        assert isinstance(p.type, DTensorType)
        sv = shard_value(a, p.type)
        for d in devs:
            per_rank[d].append(sv[d])
    got = run_reference(mat, [x for i in range(len(args)) for x in (per_rank[d][i] for d in devs)])
    ranks = project(mat)
    check_deadlock_free(ranks)
    by_rank = run_ranks(ranks, per_rank)
    worst = 0.0
    for k, (w, v) in enumerate(zip(want, opt.entry.outputs, strict=True)):
        assert isinstance(v.type, DTensorType)
        scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-6)
        for ps in ({d: got[k * len(devs) + i] for i, d in enumerate(devs)}, {d: by_rank[d][k] for d in devs}):
            back = unshard_value(ps, v.type)
            worst = max(worst, float(np.max(np.abs(back - w), initial=0.0)) / scale)
    return worst, moved


# -- single ops under every strategy of their sharding rule --------------------------------------
@dataclass(frozen=True)
class OpCase:
    """One op on f64 tensors: its data inputs' shapes, constant extra inputs (Reshape's target)
    and attributes, as text."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: str = ""
    consts: tuple[str, ...] = ()
    n_out: int = 1

    def text(self, types: list[str] | None = None, outs: list[str] | None = None) -> str:
        """The function, with ``types`` for the parameters (default: plain tensors on d0) and
        declared result types ``outs``."""
        names = [f"%a{i}" for i in range(len(self.shapes))]
        types = types or [f"Tensor[f64, {shape_text(s)}, d0]" for s in self.shapes]
        ps = ", ".join(f"{n}: {t}" for n, t in zip(names, types, strict=True))
        lines = [f"  %c{i} = Constant(value={v}, device=d0)\n" for i, v in enumerate(self.consts)]
        args = ", ".join(
            [*names, *(f"%c{i}" for i in range(len(self.consts)))] + ([self.attrs] if self.attrs else [])
        )
        res = [f"%y{i}" + (f": {outs[i]}" if outs else "") for i in range(self.n_out)]
        lines.append(f"  {', '.join(res)} = {self.op}({args})\n")
        return f"func @f({ps}) {{\n{''.join(lines)}  return {', '.join(f'%y{i}' for i in range(self.n_out))}\n}}\n"


def _broadcast_like(draw: st.DrawFn, out: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``out``: some leading dims dropped, some dims 1."""
    keep = draw(st.integers(0, len(out)))
    return tuple(1 if draw(st.integers(0, 3)) == 0 else s for s in out[len(out) - keep :])


@st.composite
def op_cases(draw: st.DrawFn, only: str | None = None) -> OpCase:
    """An op used by the sharding rules' families, with random sizes 1-9 and attributes."""
    dim = st.integers(1, 9)
    shape: tuple[int, ...] = tuple(draw(st.lists(dim, min_size=1, max_size=3)))
    rank = len(shape)
    kinds = ["binary", "unary", "matmul", "gemm", "transpose", "reduce", "softmax", "layernorm"]
    kind = only or draw(st.sampled_from([*kinds, "reshape", "unsqueeze", "concat", "split", "slice"]))
    if kind == "binary":
        op = draw(st.sampled_from(["Add", "Sub", "Mul", "Div"]))
        a, b = tuple(1 if draw(st.integers(0, 4)) == 0 else s for s in shape), _broadcast_like(draw, shape)
        return OpCase(op, (a, b) if draw(st.booleans()) else (b, a))
    if kind == "unary":
        return OpCase(draw(st.sampled_from(["Relu", "Gelu", "Neg", "Tanh", "Exp"])), (shape,))
    if kind == "matmul":
        m, k, n = draw(dim), draw(dim), draw(dim)
        batch = tuple(draw(st.lists(dim, max_size=1)))
        lead = st.sampled_from([(), batch, tuple(1 for _ in batch)])
        ta, tb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        a, b = (*draw(lead), *((k, m) if ta else (m, k))), (*draw(lead), *((n, k) if tb else (k, n)))
        return OpCase("MatMul", (a, b), ", ".join(f"trans{x}=1" for x, t in (("A", ta), ("B", tb)) if t))
    if kind == "gemm":
        m, k, n = draw(dim), draw(dim), draw(dim)
        ta, tb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        shapes: tuple[tuple[int, ...], ...] = ((k, m) if ta else (m, k), (n, k) if tb else (k, n))
        c = draw(st.sampled_from([None, (n,), (m, n), (m, 1), (1, n)]))
        if c is not None:
            shapes = (*shapes, c)
        return OpCase("Gemm", shapes, f"alpha=0.5, beta=2.0, transA={ta}, transB={tb}")
    if kind == "transpose":
        perm = draw(st.permutations(range(rank)))
        return OpCase("Transpose", (shape,), f"perm=[{', '.join(map(str, perm))}]")
    if kind == "reduce":
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        op = draw(st.sampled_from(["ReduceSum", "ReduceMean"]))
        return OpCase(op, (shape,), f"axes=[{', '.join(map(str, axes))}], keepdims={draw(st.integers(0, 1))}")
    if kind == "softmax":
        return OpCase("Softmax", (shape,), f"axis={draw(st.integers(-rank, rank - 1))}")
    if kind == "layernorm":
        axis = draw(st.integers(0, rank - 1))
        tail = shape[axis:]
        shapes = (shape, tail, tail) if draw(st.booleans()) else (shape, tail)
        return OpCase("LayerNormalization", shapes, f"axis={axis}")
    if kind == "reshape":  # merge two adjacent dims, or split one into two factors
        if rank >= 2 and draw(st.booleans()):
            i = draw(st.integers(0, rank - 2))
            target = (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :])
        else:
            i = draw(st.integers(0, rank - 1))
            f = draw(st.sampled_from([d for d in range(1, shape[i] + 1) if shape[i] % d == 0]))
            target = (*shape[:i], f, shape[i] // f, *shape[i + 1 :])
        return OpCase("Reshape", (shape,), consts=(f"[{', '.join(map(str, target))}]",))
    if kind == "unsqueeze":
        if draw(st.booleans()) and 1 in shape:
            return OpCase("Squeeze", (shape,), f"axes=[{shape.index(1)}]")
        return OpCase("Unsqueeze", (shape,), f"axes=[{draw(st.integers(0, rank))}]")
    if kind == "concat":
        axis = draw(st.integers(0, rank - 1))
        other = (*shape[:axis], draw(dim), *shape[axis + 1 :])
        return OpCase("Concat", (shape, other), f"axis={axis}")
    if kind == "split":
        d = draw(st.integers(0, rank - 1))
        k = draw(st.integers(1, 3))
        return OpCase("Split", (shape,), f"dim={d}, num_splits={k}", n_out=k)
    d = draw(st.integers(0, rank - 1))
    lo = draw(st.integers(0, shape[d] - 1))
    hi = draw(st.integers(lo + 1, shape[d]))
    return OpCase("Slice", (shape,), f"starts=[{lo}], ends=[{hi}], axes=[{d}]")


def reduce_pieces(pieces: dict[Device, np.ndarray], t: DTensorType) -> np.ndarray:
    """The global value of a 1-D-mesh layout: partial pieces reduced with their op, shards
    gathered (replicas checked to agree)."""
    (p,) = t.placements
    if isinstance(p, Partial):
        fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[p.op]
        return np.asarray(fn(np.stack([pieces[d] for d in t.mesh.devices]), axis=0))
    return gather_pieces(pieces, t)
