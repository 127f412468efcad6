"""Hypothesis strategies for the sharding property tests: meshes, placements, redistribution
programs written in the DTensor text format, and small MLP-like sequential programs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from distir.ir import Device, Mesh
from distir.ir.dtensor import DTensorType, Partial, Placement, Replicate, Shard, split_sizes

R = Replicate()


def mesh_of(shape: tuple[int, ...]) -> Mesh:
    names = ("x",) if len(shape) == 1 else ("a", "b")
    return Mesh(tuple(zip(names, shape, strict=True)), tuple(Device(i) for i in range(math.prod(shape))))


# 1-D meshes of 2-4 devices and the 2-D meshes 2x2, 2x3
MESH_SHAPES: tuple[tuple[int, ...], ...] = ((2,), (3,), (4,), (2, 2), (2, 3))
meshes = st.sampled_from(MESH_SHAPES).map(mesh_of)


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
def redist_cases(draw: st.DrawFn) -> RedistCase:
    """A global shape of rank 1-3 with dims 1-9, a mesh, and (source, target) placements: sources
    among R, S(d), P(sum) (P(max|min|mean) on at most one axis), targets R or S(d); each layout
    shards a dim along at most one mesh axis."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    mesh = draw(meshes)
    k = len(mesh.axes)
    data = st.sampled_from([R, *(Shard(d) for d in range(rank))])
    src_one = st.sampled_from([R, *(Shard(d) for d in range(rank)), Partial("sum")])
    src = list(draw(st.lists(src_one, min_size=k, max_size=k)))
    if draw(st.booleans()):  # another reduction on one axis
        src[draw(st.integers(0, k - 1))] = Partial(draw(st.sampled_from(["max", "min", "mean"])))
    dst = tuple(draw(st.lists(data, min_size=k, max_size=k)))
    src_t = tuple(src)
    for places in (src_t, dst):
        if not valid_layout(places):
            from hypothesis import assume

            assume(False)
    return RedistCase(shape, mesh, src_t, dst)


def partial_pieces(x: np.ndarray, t: DTensorType, rng: np.random.Generator) -> dict[Device, np.ndarray]:
    """Each device's piece of the global array ``x`` laid out as ``t``, with partial axes holding
    genuinely different pieces whose reduction is ``x``: for sum, random pieces summing to x; for
    mean, x plus zero-mean noise; for max (min), x on one random coordinate and smaller (larger)
    values elsewhere. Replicas along R axes are equal. Several partial axes are nested (the first
    partial axis outermost), which is unambiguous when they reduce the same way."""
    coords = {d: t.mesh.coords(d) for d in t.mesh.devices}
    # the value each partial-axis coordinate tuple holds, built axis by axis
    values: dict[tuple[int, ...], np.ndarray] = {(): x.astype(np.float32)}
    pax = [ax for ax, p in enumerate(t.placements) if isinstance(p, Partial)]
    for ax in pax:
        p = t.placements[ax]
        assert isinstance(p, Partial)
        n = t.mesh.shape[ax]
        nxt: dict[tuple[int, ...], np.ndarray] = {}
        for key, v in values.items():
            noise = rng.standard_normal((n, *v.shape)).astype(np.float32)
            if p.op == "sum":
                parts = [*noise[:-1], v - noise[:-1].sum(axis=0)]
            elif p.op == "mean":
                parts = list(v + (noise - noise.mean(axis=0)))
            else:
                sign = -1.0 if p.op == "max" else 1.0
                top = int(rng.integers(0, n))
                parts = [v if i == top else v + sign * (np.abs(noise[i]) + 0.5) for i in range(n)]
            for i, part in enumerate(parts):
                nxt[(*key, i)] = np.asarray(part, dtype=np.float32)
        values = nxt
    from distir.parallel.materialize import local_offsets, local_shape

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
    from distir.parallel.materialize import local_offsets, local_shape

    out = np.full(t.shape, np.nan, dtype=np.float32)
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
    """The ops the lowering emits, axis by axis and group by group (R->S slices per device)."""
    names: list[str] = []
    for ax, (a, b) in enumerate(zip(src, dst, strict=True)):
        if a == b:
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
        ps = ", ".join(f"%{k}: Tensor[f32, {shape_text(s)}, d0]" for k, s in self.params.items())
        body = "".join(f"  {line}\n" for line in self.lines)
        return f"func @mlp({ps}) {{\n{body}  return %{out}\n}}\n"


OPS = ("matmul", "matmul_left", "add", "act", "mul", "transpose", "reduce", "softmax")


@st.composite
def mlp_programs(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, ...]]]:
    """A chain of 2-6 ops on a 2-d value, starting from %x0 (and ending, sometimes, in a
    ReduceSum without keepdims): MatMul by a weight (right or left), Add of a broadcast bias,
    Gelu/Relu, Mul by a scalar or broadcast tensor, Transpose, ReduceSum over one axis
    (keepdims) and Softmax over the last axis. Sizes 1-9, so shards are often uneven."""
    dim = st.integers(1, 9)
    p = Program()
    shape = (draw(dim), draw(dim))
    cur = p.param("x", shape)
    first = draw(st.sampled_from(["matmul", "matmul_left"]))
    ops = [first, *draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=5))]
    for kind in ops:
        r, c = shape
        v = p.fresh()
        if kind == "matmul":
            k = draw(dim)
            w = p.param("w", (c, k))
            p.lines.append(f"%{v} = MatMul(%{cur}, %{w})")
            shape = (r, k)
        elif kind == "matmul_left":
            k = draw(dim)
            w = p.param("w", (k, r))
            p.lines.append(f"%{v} = MatMul(%{w}, %{cur})")
            shape = (k, c)
        elif kind == "add":
            bshape = draw(st.sampled_from([(c,), (1, c), (r, 1), (r, c)]))
            b = p.param("b", bshape)
            a, bb = (cur, b) if draw(st.booleans()) else (b, cur)
            p.lines.append(f"%{v} = Add(%{a}, %{bb})")
        elif kind == "act":
            p.lines.append(f"%{v} = {draw(st.sampled_from(['Gelu', 'Relu']))}(%{cur})")
        elif kind == "mul":
            how = draw(st.sampled_from(["const", "0d", "row", "col", "full"]))
            if how == "const":
                c_ = p.fresh()
                p.lines.append(f"%{c_} = Constant(value=0.5, device=d0)")
                s = c_
            else:
                s = p.param("s", {"0d": (), "row": (c,), "col": (r, 1), "full": (r, c)}[how])
            p.lines.append(f"%{v} = Mul(%{cur}, %{s})")
        elif kind == "transpose":
            p.lines.append(f"%{v} = Transpose(%{cur}, perm=[1, 0])")
            shape = (c, r)
        elif kind == "reduce":
            ax = draw(st.integers(0, 1))
            p.lines.append(f"%{v} = ReduceSum(%{cur}, axes=[{ax}], keepdims=1)")
            shape = (1, c) if ax == 0 else (r, 1)
        elif kind == "softmax":
            p.lines.append(f"%{v} = Softmax(%{cur}, axis=-1)")
        cur = v
    if draw(st.booleans()):
        v = p.fresh()
        p.lines.append(f"%{v} = ReduceSum(%{cur}, axes=[{draw(st.integers(0, 1))}], keepdims=0)")
        cur = v
    return p.text(cur), dict(p.params)


@st.composite
def annotations(
    draw: st.DrawFn, params: dict[str, tuple[int, ...]], mesh: Mesh
) -> dict[str, tuple[Placement, ...]]:
    """Placements (R or a valid S(d), per mesh axis) for 1-3 of the parameters."""
    names = draw(st.lists(st.sampled_from(sorted(params)), min_size=1, max_size=3, unique=True))
    out: dict[str, tuple[Placement, ...]] = {}
    for name in names:
        rank = len(params[name])
        one = st.sampled_from([R, *(Shard(d) for d in range(rank))])
        out[name] = tuple(draw(st.lists(one, min_size=len(mesh.axes), max_size=len(mesh.axes))))
    return out
