"""Sharding one layer function on a (dp, tp) mesh: the D and T of D/T/P/K.

A layer function (a zoo layer, or its ``_fwd``/``_bwd`` from autodiff) is sharded by the
sharding layer: its parameters and boundary results are annotated, ``propagate`` places every
other value, ``legalize`` makes each change of placement an explicit ``Redistribute``. The result
keeps the function's name and loses its value types, so the same function runs on the mesh of any
pipeline stage with the same (dp, tp) shape: the placements live in the ``Redistribute`` ops and
in the arguments, not in the devices.

Boundary placements (the contract that lets layers chain and microbatches accumulate):
activations and their gradients are ``(S(0), R)`` — batch split over ``dp``, whole over ``tp``;
weights are ``(R, <declared tp placement>)``; residuals and weight gradients keep the placement
their producer gives them (a weight gradient is typically ``P(sum)`` over ``dp``: the pending
data-parallel reduction, summed over microbatches before one collective).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Mesh, Partial, Placement, format_placements
from distir.ir.function import Function, Module
from distir.ir.ops import Call
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import Device, TensorType, Type
from distir.ir.values import Value
from distir.ops.registry import REGISTRY
from distir.parallel.sharding.legalize import legalize_placed
from distir.parallel.sharding.propagate import Plan, ShardingError, parsed_placements, place


def rep_mesh(d: int, t: int, c: int = 1) -> Mesh:
    """The representative (dp, tp) mesh layer functions are sharded on; (dp, cp, tp) with
    context parallelism over c > 1 (``distir.parallel.context_model``)."""
    if c > 1:
        return Mesh((("dp", d), ("cp", c), ("tp", t)), tuple(Device(i) for i in range(d * c * t)))
    return Mesh((("dp", d), ("tp", t)), tuple(Device(i) for i in range(d * t)))


def strip_types(fn: Function, name: str | None = None) -> Function:
    """A copy of ``fn`` whose values carry no declared types (types come from the arguments)."""
    vmap = ValueMap(lambda v: Value(v.name, None))
    params = tuple(vmap(p) for p in fn.params)
    body = tuple(copy_instr(i, vmap) for i in fn.body)
    return Function(name or fn.name, params, body, tuple(vmap(v) for v in fn.outputs))


def shard_function(
    module: Module,
    fn: Function,
    arg_types: Sequence[Type],
    mesh: Mesh,
    params: Mapping[int, str],
    results: Mapping[int, str],
    pinned: Collection[int] = (),
) -> tuple[Function, list[tuple[Placement, ...] | None]]:
    """Shard flat ``fn`` called with (global) ``arg_types`` on ``mesh``. ``params``/``results``
    give placements by position (unlisted results are free); ``pinned`` parameters (the weights)
    are used where they lie (``propagate``). Returns the untyped sharded function and the
    placements of its results (None for non-tensors).

    The function is what ``strip_types`` gives for ``legalize(propagate(...))`` of ``fn`` with
    its parameters typed, plus a ``Redistribute`` per result whose producer chose other
    placements than ``results`` ask for; it is built in one pass from the placements
    (``place``, ``legalize_placed``), and what propagation derives from the function and its
    types alone (type inference, the ops' options) is kept per (function, argument types)
    (``_plan``): the meshes of the search's tensor-parallel degrees share it."""
    if any(isinstance(i, Call) for i in fn.body):
        raise ShardingError(f"@{fn.name} must be flat (inline its calls) to be sharded")
    dev0 = mesh.devices[0]
    plan = _plan(
        fn,
        tuple(
            at.with_device(dev0) if isinstance(at, TensorType) and at.device != dev0 else at
            for at in arg_types
        ),
    )
    got = place(plan, mesh, {}, params=params, results=results, replicate_results=False, pinned=pinned)
    # results annotated as pending sums stay pending (the caller reduces them once, later)
    pending = [i for i, w in results.items() if any(isinstance(x, Partial) for x in parsed_placements(w))]
    fb = FunctionBuilder(fn.name, REGISTRY.out_arity)
    legal = legalize_placed(got, mesh, pending, fb)
    # a result whose producer chose another placement than the boundary asks for: redistribute
    outs: list[Value] = []
    places: list[tuple[Placement, ...] | None] = []
    for i, (nv, have) in enumerate(legal):
        want = results.get(i)
        if have is not None and want is not None:
            # a producer that cannot leave a sum pending has already reduced it: keep that
            target = tuple(
                g if isinstance(w, Partial) and not isinstance(g, Partial) else w
                for w, g in zip(parsed_placements(want), have, strict=True)
            )
            if target != have:
                (nv,) = fb.op("Redistribute", nv, names=[nv.name], to=format_placements(target))
                have = target
        places.append(have)
        outs.append(nv)
    return fb.ret(*outs), places


# (id of a layer function, its argument types on the mesh's first device) -> (the function, kept
# so its id stays valid; the plan of its typed copy). A layer at one microbatch size is sharded
# for several TP degrees (and data-parallel degrees): type inference and the options are the
# same. Bounded: cleared when full.
_PLANS: dict[tuple[object, ...], tuple[Function, Plan]] = {}
_PLANS_MAX: Final = 256


def _plan(fn: Function, arg_types: tuple[Type, ...]) -> Plan:
    """The ``Plan`` of ``fn`` with its parameters typed ``arg_types`` and no other declared
    types (memoized: ``_PLANS``)."""
    key = (id(fn), arg_types)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is fn:
        return hit[1]
    fb = FunctionBuilder(fn.name, REGISTRY.out_arity)
    vmap = ValueMap(lambda v: Value(v.name, None))
    for p, at in zip(fn.params, arg_types, strict=True):
        vmap.bind(p, fb.param(p.name, at))
    for instr in fn.body:
        fb.append(copy_instr(instr, vmap))
    plan = Plan(fb.ret(*(vmap(v) for v in fn.outputs)))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = (fn, plan)
    return plan
