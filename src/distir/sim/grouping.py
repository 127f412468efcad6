"""How a DTensor program's slots group into units: the groups, their common refinement, and the
meshes a program names in attributes (``distir.sim.units``).

A unit is a set of slots every op touches together, whose devices hold equally shaped pieces of
every value, on GPUs of one class. ``device_groups`` lists the groups that must stay whole —
each plain value's device, for each DTensor type the devices holding equally shaped pieces (the
whole mesh for even shards), each GPU class — and ``split_units`` refines the slots by all of
them. The result depends only on the set of groups, not on their order (units are numbered in
order of their first slot).

``Units.prepare`` finds the types by a full type propagation before planning; ``Units.assume``
instead takes the groups of the entry's parameter types and of the meshes named by attributes
(``attribute_meshes``: where a ``MeshSend`` sends) — and, on each such mesh over another stream of
an unevenly sharded parameter's GPUs, that parameter's groups (``sent_groups``) — plans, and checks
afterwards that the types the planner met give the very same units (``Units.confirm``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import partial
from itertools import compress
from operator import attrgetter, is_

from distir.ir.dtensor import DTensorType, Mesh
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import Device, IRTypeError
from distir.ops.dist import parse_mesh_attr
from distir.sim.layout import shape_groups, uniform_shape

Groups = dict[tuple[int, ...], None]
_attrs = attrgetter("attrs")
_callee = attrgetter("callee")
_is_op = partial(is_, Op)
_is_call = partial(is_, Call)


def device_groups(
    dtensors: Iterable[DTensorType],
    devices: Iterable[Device],
    slot: Callable[[Device], int],
    slot_class: Sequence[Hashable],
    meshes: Iterable[Mesh] = (),
) -> Groups:
    """The groups of slots that must stay within one unit (module docstring); ``meshes`` adds
    each mesh whole (as an evenly sharded type on it would)."""
    groups: Groups = {}
    whole: dict[int, tuple[Mesh, tuple[int, ...]]] = {}  # mesh id -> (mesh, the slots of its devices)
    for m in meshes:
        whole[id(m)] = (m, tuple(map(slot, m.devices)))
        groups[whole[id(m)][1]] = None
    add_groups(groups, whole, dtensors, devices, slot)
    by_class: dict[Hashable, list[int]] = {}
    for s, c in enumerate(slot_class):
        by_class.setdefault(c, []).append(s)
    for members in by_class.values():
        groups[tuple(members)] = None
    return groups


def add_groups(
    groups: Groups,
    whole: dict[int, tuple[Mesh, tuple[int, ...]]],
    dtensors: Iterable[DTensorType],
    devices: Iterable[Device],
    slot: Callable[[Device], int],
) -> None:
    """Add to ``groups`` the groups of ``dtensors`` and ``devices`` (``device_groups``'); ``whole``
    (mesh id -> the mesh, kept alive, and its slots) is a memo the caller may keep across calls.
    The groups are a set: adding more later gives what ``device_groups`` of all gives."""
    for d in devices:
        groups[(slot(d),)] = None
    for t in dtensors:
        devs = t.mesh.devices
        if uniform_shape(t) is not None:  # one group: the whole mesh (most types of a program)
            got = whole.get(id(t.mesh))
            if got is None or got[0] is not t.mesh:
                got = whole[id(t.mesh)] = (t.mesh, tuple(map(slot, devs)))
            groups[got[1]] = None
            continue
        for positions in shape_groups(t):
            groups[tuple(slot(devs[i]) for i in positions)] = None


def sent_groups(
    dtensors: Iterable[DTensorType],
    meshes: Iterable[Mesh],
    slot: Callable[[Device], int],
    gpu: Callable[[Device], int],
) -> Groups:
    """The groups each unevenly sharded type of ``dtensors`` would make on every other mesh of
    ``meshes`` with its axes (sizes and shares) over the same GPUs in the same order (another
    stream of them): those of a ``MeshSend`` of it there, whose result is the same tensor on the
    destination mesh — e.g. an uneven vocabulary's gradient sent to its GPUs' reduction stream. A
    guess for ``Units.assume`` (``Units.confirm`` checks it)."""
    # per (mesh axes, GPUs), the distinct ways the uneven types split positions, and their meshes
    splits: dict[tuple[object, ...], dict[tuple[tuple[int, ...], ...], set[Mesh]]] = {}
    for t in dtensors:
        if uniform_shape(t) is None:
            split = tuple(map(tuple, shape_groups(t)))
            where = (t.mesh.axes, tuple(map(gpu, t.mesh.devices)))
            splits.setdefault(where, {}).setdefault(split, set()).add(t.mesh)
    out: Groups = {}
    for m in meshes if splits else ():
        for split, own in splits.get((m.axes, tuple(map(gpu, m.devices))), {}).items():
            if m not in own:
                for group in split:
                    out[tuple(slot(m.devices[i]) for i in group)] = None
    return out


def split_units(groups: Iterable[tuple[int, ...]], n_slots: int) -> list[int]:
    """The unit of every slot: all slots start as one unit, each group splits every unit into
    its part inside the group and its part outside; units numbered in order of their first slot."""
    unit = [0] * n_slots
    n_units = 1
    for g in groups:
        renamed: dict[int, int] = {}
        for s in g:
            old = unit[s]
            new = renamed.get(old)
            if new is None:
                new = renamed[old] = n_units
                n_units += 1
            unit[s] = new
    order: dict[int, int] = {}
    return [order.setdefault(u, len(order)) for u in unit]


def attribute_meshes(module: Module, fn: Function) -> list[Mesh]:
    """The meshes named by a ``mesh`` attribute (``MeshSend``'s destination) in ``fn`` and the
    functions it calls; an attribute that does not parse is left to the op's type rule."""
    meshes: dict[str, Mesh] = {}
    seen: set[int] = set()  # attribute objects already scanned (builders intern them)
    for f in _reachable(module, fn):
        ops = list(compress(f.body, map(_is_op, map(type, f.body))))  # at C speed: long entries
        for key, a in dict(zip(map(id, map(_attrs, ops)), map(_attrs, ops), strict=True)).items():
            if key in seen:
                continue
            seen.add(key)
            text = a.get("mesh")
            if isinstance(text, str) and text not in meshes:
                with contextlib.suppress(IRTypeError):
                    meshes[text] = parse_mesh_attr(text)
    return list(meshes.values())


def _reachable(module: Module, fn: Function) -> list[Function]:
    """``fn`` and the functions it reaches through calls."""
    seen: dict[str, Function] = {}
    stack = [fn]
    while stack:
        f = stack.pop()
        if f.name in seen:
            continue
        seen[f.name] = f
        callees = set(map(_callee, compress(f.body, map(_is_call, map(type, f.body)))))
        stack.extend(module[c] for c in callees if c in module)
    return list(seen.values())
