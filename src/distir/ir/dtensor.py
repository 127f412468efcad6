"""Device meshes, placements and distributed tensor types (DTensor), for the sharding layer.

A ``Mesh`` arranges devices in a grid with named axes (``mesh(dp=2, tp=4; d0, ..., d7)``, devices
in row-major order). A placement says how a tensor relates to one mesh axis:

- ``Replicate()`` — ``R``: every device along the axis holds the whole tensor;
- ``Shard(dim)`` — ``S(1)``: the tensor is split along ``dim`` into near-equal pieces, larger
  first (127 rows over 2 devices: 64 and 63), one per device along the axis;
- ``Partial(op)`` — ``P(sum)``: every device holds a partial value; the tensor is the reduction
  (sum, max, min, mean) of them — an explicit state "waiting to be reduced", never implicit.

``DTensorType(dtype, shape, mesh, placements)`` is a tensor of *global* ``shape`` laid out on
``mesh`` with one placement per mesh axis; its text form is
``DTensor[f32, (128, 127), mesh(x=2; d0, d1), [S(1)]]``. All are frozen, slotted, validated.

A mesh axis may give its devices uneven *shares* (``AxisSize``; ``mesh(dp=4[2:2:2:1], tp=2; …)``):
every dim sharded along it is then split in proportion to them (largest remainders first), not
near-equally — uneven data parallelism, where a faster device takes more of the batch. The
shares live in the axis size itself, so everything that reads an axis' size (sharding rules,
memo keys, ``split_sizes``) sees them, and equal sizes with different shares compare unequal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from distir.ir.local_types import _ITEMSIZE, Device, DType, IRTypeError, TensorType
from distir.limits import MAX_DEGREE, MAX_DEVICES, MAX_ELEMENTS, exceeds, over, read_int


class AxisSize(int):
    """The size of a mesh axis whose devices take uneven ``shares`` (positive ints in lowest
    terms, one per device along the axis, not all equal) of every dim sharded along it. An int
    for arithmetic; compares and hashes with its shares. Build with ``axis_size``."""

    shares: tuple[int, ...]

    def __new__(cls, n: int, shares: tuple[int, ...]) -> AxisSize:
        obj = super().__new__(cls, n)
        obj.shares = shares
        return obj

    def __eq__(self, other: object) -> bool:
        return type(other) is AxisSize and int(self) == int(other) and self.shares == other.shares

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((int(self), self.shares))

    def __repr__(self) -> str:
        return f"AxisSize({int(self)}, {self.shares})"

    def __str__(self) -> str:
        return f"{int(self)}[{':'.join(map(str, self.shares))}]"

    def __reduce__(self) -> tuple[type[AxisSize], tuple[int, tuple[int, ...]]]:
        return (AxisSize, (int(self), self.shares))


def axis_size(n: int, shares: tuple[int, ...] | None = None) -> int:
    """The size of an axis of ``n`` devices with ``shares`` (None or all equal: a plain int, the
    even split); raises IRTypeError unless ``shares`` gives ``n`` positive ints."""
    if shares is None:
        return n
    if (
        not isinstance(shares, tuple)
        or len(shares) != n
        or not all(type(x) is int and x >= 1 for x in shares)
    ):
        raise IRTypeError(f"an axis of {n} devices needs {n} positive integer shares, got {shares!r}")
    if len(set(shares)) == 1:
        return n
    g = math.gcd(*shares)
    return AxisSize(n, tuple(x // g for x in shares))


def shares_of(n: int) -> tuple[int, ...] | None:
    """The shares of an axis size (None: even)."""
    return n.shares if type(n) is AxisSize else None


def format_axis_size(n: int) -> str:
    return str(n) if type(n) is AxisSize else str(int(n))


@dataclass(frozen=True, slots=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Shard:
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 0:
            raise IRTypeError(f"Shard dim must be a non-negative int, got {self.dim!r}")

    def __str__(self) -> str:
        return f"S({self.dim})"


PARTIAL_OPS = ("sum", "max", "min", "mean")


@dataclass(frozen=True, slots=True)
class Partial:
    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in PARTIAL_OPS:
            raise IRTypeError(f"Partial op must be one of {', '.join(PARTIAL_OPS)}, got {self.op!r}")

    def __str__(self) -> str:
        return f"P({self.op})"


Placement = Replicate | Shard | Partial
R = Replicate()


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` near-equal pieces of ``n``, larger pieces first (like np.array_split):
    how a sharded dim is divided (127 over 2: 64, 63). Along an axis with shares (``AxisSize``),
    pieces in proportion to them: each its floor, the rest one each to the largest remainders,
    earlier pieces first on ties (equal shares would give the near-equal split)."""
    if type(parts) is AxisSize:
        w = parts.shares
        total = sum(w)
        sizes = [n * x // total for x in w]
        order = sorted(range(len(w)), key=lambda i: (-(n * w[i] % total), i))
        for i in order[: n - sum(sizes)]:
            sizes[i] += 1
        return sizes
    q, r = divmod(n, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def parse_placements(text: str) -> tuple[Placement, ...]:
    """``"S(0), R"`` -> ``(Shard(0), Replicate())``; raises IRTypeError naming the bad part."""
    out: list[Placement] = []
    for part in text.replace(" ", "").split(","):
        if part == "R":
            out.append(Replicate())
        elif part.startswith("S(") and part.endswith(")") and (dim := read_int(part[2:-1])) is not None:
            out.append(Shard(dim))
        elif part.startswith("P(") and part.endswith(")"):
            out.append(Partial(part[2:-1]))
        else:
            raise IRTypeError(
                f"bad placement {part!r} in {text!r}: expected R, S(dim) or P(sum|max|min|mean)"
            )
    return tuple(out)


def format_placements(places: tuple[Placement, ...]) -> str:
    return ", ".join(map(str, places))


def id_ranges(ids: Sequence[int], prefix: str = "") -> str:
    """``ids`` for display, each with ``prefix``: each run of three or more consecutive ids as
    ``A-B`` (``d0-d7, d16-d23``); never parsed back."""
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{prefix}{ids[i]}-{prefix}{ids[j]}")
        else:
            parts.extend(f"{prefix}{x}" for x in ids[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def device_ranges(devices: Sequence[Device]) -> str:
    """``devices`` for display, runs as ranges (``id_ranges``: ``d0-d3, d8``)."""
    return id_ranges([d.id for d in devices], "d")


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named axes with sizes, over ``devices`` in row-major order."""

    axes: tuple[tuple[str, int], ...]
    devices: tuple[Device, ...]
    _hash: int = field(init=False, repr=False, compare=False)
    _shape: tuple[int, ...] = field(init=False, repr=False, compare=False)  # ``shape``, computed once

    def __post_init__(self) -> None:
        if not isinstance(self.axes, tuple) or not self.axes:
            raise IRTypeError(f"a mesh needs at least one axis, got {self.axes!r}")
        names = [a for a, _ in self.axes]
        if len(set(names)) != len(names):
            raise IRTypeError(f"mesh axis names repeat: {names}")
        for a, n in self.axes:
            if not isinstance(a, str) or not a.isidentifier():
                raise IRTypeError(f"mesh axis name must be an identifier, got {a!r}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise IRTypeError(f"mesh axis {a} must have a positive size, got {n!r}")
            if type(n) is AxisSize and (
                len(n.shares) != int(n) or n.shares != shares_of(axis_size(int(n), n.shares))
            ):
                raise IRTypeError(
                    f"mesh axis {a}: shares {n.shares} must give {int(n)} positive ints in lowest terms, "
                    "not all equal (build the size with axis_size)"
                )
        # the sharding and the simulator ask for it per placement of every type on the mesh
        object.__setattr__(self, "_shape", tuple(n for _, n in self.axes))
        if not isinstance(self.devices, tuple) or not all(isinstance(d, Device) for d in self.devices):
            raise IRTypeError(f"mesh devices must be a tuple of devices, got {self.devices!r}")
        if len(set(self.devices)) != len(self.devices):
            raise IRTypeError("mesh devices repeat")
        if len(self.devices) != math.prod(n for _, n in self.axes):
            raise IRTypeError(
                f"mesh of shape {self.shape} needs {math.prod(self.shape)} devices, got {len(self.devices)}"
            )
        # meshes key every DTensor type; a 1024-device mesh would rehash 1024 devices each time
        object.__setattr__(self, "_hash", hash((self.axes, tuple(d.id for d in self.devices))))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Mesh], tuple[object, ...]]:
        return (Mesh, (self.axes, self.devices))

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    def axis_index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise IRTypeError(f"mesh has no axis {name!r}; axes: {', '.join(self.names)}") from None

    def coords(self, device: Device) -> tuple[int, ...]:
        """The device's coordinate along each axis."""
        i = self.devices.index(device)
        out = []
        for n in reversed(self.shape):
            out.append(i % n)
            i //= n
        return tuple(reversed(out))

    def groups(self, axis: int) -> list[tuple[Device, ...]]:
        """The device groups along ``axis``: devices that differ only in that coordinate, in
        coordinate order. A collective over a mesh axis runs once per group."""
        groups: dict[tuple[int, ...], list[Device]] = {}
        for d in self.devices:
            c = self.coords(d)
            groups.setdefault(c[:axis] + c[axis + 1 :], []).append(d)
        return [tuple(g) for g in groups.values()]

    @staticmethod
    def parse(axes: str, devices: str | None = None) -> Mesh:
        """``Mesh.parse("dp=2, tp=4")`` over d0..d7, or over ``devices`` like ``"d4,d5,d6,d7"``."""
        parsed: list[tuple[str, int]] = []
        for part in axes.split(","):
            name, eq, size = part.strip().partition("=")
            size, bracket, rest = size.strip().partition("[")
            n_axis = read_int(size.strip())
            if not eq or n_axis is None:
                raise IRTypeError(f"mesh axis {part.strip()!r} is not like tp=4 or dp=2[2:1]")
            if exceeds(n_axis, MAX_DEGREE):
                raise IRTypeError(f"mesh axis {part.strip()[:40]!r}: {over('its size', n_axis, MAX_DEGREE)}")
            shares = None
            if bracket:
                items = [read_int(x.strip()) for x in rest.rstrip().removesuffix("]").split(":")]
                if not rest.rstrip().endswith("]") or any(x is None for x in items):
                    raise IRTypeError(f"mesh axis {part.strip()!r}: shares are not like [2:1]")
                shares = tuple(x for x in items if x is not None)
            parsed.append((name.strip(), axis_size(n_axis, shares)))
        n = math.prod(s for _, s in parsed)
        if exceeds(n, MAX_DEVICES):
            raise IRTypeError(f"mesh {axes[:60]!r}: {over('its device count', n, MAX_DEVICES)}")
        if devices is None:
            return Mesh(tuple(parsed), tuple(Device(i) for i in range(n)))
        listed: list[Device] = []
        for d in devices.split(","):
            d = d.strip()
            dev = read_int(d[1:]) if d.startswith("d") else None
            if dev is None:
                raise IRTypeError(f"mesh device {d!r} is not like d3")
            listed.append(Device(dev))
        return Mesh(tuple(parsed), tuple(listed))

    def __str__(self) -> str:
        return self.text()

    def text(self, short: bool = False) -> str:
        """The mesh as the IR writes it; ``short``: its devices as ``device_ranges`` (for display
        only, e.g. a trace's arguments: the parser reads the full form)."""
        axes = ", ".join(f"{a}={format_axis_size(n)}" for a, n in self.axes)
        devices = device_ranges(self.devices) if short else ", ".join(map(str, self.devices))
        return f"mesh({axes}; {devices})"


@dataclass(frozen=True, slots=True)
class DTensorType:
    """A tensor of global ``shape`` distributed over ``mesh``, one placement per mesh axis."""

    dtype: DType
    shape: tuple[int, ...]
    mesh: Mesh
    placements: tuple[Placement, ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.dtype) is not DType:
            raise IRTypeError(f"DTensor dtype must be a DType, got {self.dtype!r}")
        if type(self.shape) is not tuple or not all(type(s) is int and s >= 0 for s in self.shape):
            raise IRTypeError(f"DTensor shape must be a tuple of non-negative ints, got {self.shape!r}")
        if (n := math.prod(self.shape)) > MAX_ELEMENTS.max:
            raise IRTypeError(over(f"DTensor shape {self.shape}: its elements", n, MAX_ELEMENTS))
        if not isinstance(self.mesh, Mesh):
            raise IRTypeError(f"DTensor mesh must be a Mesh, got {self.mesh!r}")
        if not isinstance(self.placements, tuple) or len(self.placements) != len(self.mesh.axes):
            raise IRTypeError(
                f"DTensor needs one placement per mesh axis ({len(self.mesh.axes)}), got {self.placements!r}"
            )
        for p in self.placements:
            if not isinstance(p, Replicate | Shard | Partial):
                raise IRTypeError(f"not a placement: {p!r}")
            if isinstance(p, Shard) and p.dim >= len(self.shape):
                raise IRTypeError(f"{p} is out of range for a tensor of rank {len(self.shape)}")
        object.__setattr__(self, "_hash", hash((self.dtype.value, self.shape, self.mesh, self.placements)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[DTensorType], tuple[object, ...]]:
        return (DTensorType, (self.dtype, self.shape, self.mesh, self.placements))

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_placements(self, placements: tuple[Placement, ...]) -> DTensorType:
        return DTensorType(self.dtype, self.shape, self.mesh, placements)

    def global_type(self) -> TensorType:
        """The logical tensor, on the mesh's first device (for shape rules)."""
        return TensorType(self.dtype, self.shape, self.mesh.devices[0])

    def __str__(self) -> str:
        return self.text()

    def text(self, short: bool = False) -> str:
        """The type as the IR writes it; ``short``: its mesh's devices as ranges (``Mesh.text``)."""
        shape = f"({self.shape[0]},)" if len(self.shape) == 1 else "(" + ", ".join(map(str, self.shape)) + ")"
        mesh = self.mesh.text(short)
        return f"DTensor[{self.dtype}, {shape}, {mesh}, [{', '.join(map(str, self.placements))}]]"
