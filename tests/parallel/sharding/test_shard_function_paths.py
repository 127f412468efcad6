"""``shard_function``'s one-pass path gives what the passes it stands for give.

``shard_function`` builds the sharded layer straight from ``place``'s placements
(``legalize_placed``) with a ``Plan`` kept per (function, argument types), and the final choice
takes a free strategy without counting bytes (``choices._free``); the search shards thousands
of layers that way. Here each of those is checked against the plain composition it replaces:
``strip_types`` of ``legalize(propagate(...))`` plus the boundary ``Redistribute`` ops (the
former implementation, kept below as the reference), ``_choose`` itself, and legalization's
cheapest strategy by ``min``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.frontends.zoo.registry import build_from, parse_model_string
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    format_placements,
    parse_placements,
)
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.printer import print_function
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import Device, DType, TensorType, Type
from distir.ir.values import Value
from distir.ops.dtensor_inference import global_view
from distir.ops.registry import REGISTRY, OpKind
from distir.ops.sharding import Strategy
from distir.parallel import layer_sharder
from distir.parallel.sharding import choices, legalize, propagate
from distir.parallel.sharding.shard_function import shard_function, strip_types

MODELS = (
    "gpt:layers=3,hidden=64,heads=4,seq=16,vocab=128",
    "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=128,seq=16",
    "mlp:layers=3,hidden=64",
    "transgan-hetero",
)
# (d, t, microbatch, recompute, train, sequence parallel)
CONFIGS = (
    (1, 2, 2, "none", True, False),
    (1, 4, 2, "selective", True, False),
    (2, 2, 1, "full", True, False),
    (1, 2, 4, "none", False, False),
    (1, 4, 2, "none", True, True),
)


def reference_shard_function(
    fn: Function,
    arg_types: Sequence[Type],
    mesh: Mesh,
    params: Mapping[int, str],
    results: Mapping[int, str],
    pinned: Collection[int] = (),
) -> tuple[Function, list[tuple[Placement, ...] | None], Module]:
    """``shard_function`` as the composition of the public passes (its former implementation),
    and the DTensor program propagation gave."""
    dev0 = mesh.devices[0]
    fb = FunctionBuilder(fn.name, REGISTRY.out_arity)
    vmap = ValueMap(lambda v: Value(v.name, None))
    for p, at in zip(fn.params, arg_types, strict=True):
        vmap.bind(p, fb.param(p.name, at.with_device(dev0) if isinstance(at, TensorType) else at))
    for instr in fn.body:
        fb.append(copy_instr(instr, vmap))
    typed = fb.ret(*(vmap(v) for v in fn.outputs))
    prop = propagate.propagate(
        Module((typed,)), mesh, {}, params=params, results=results, replicate_results=False, pinned=pinned
    )
    pending = [i for i, w in results.items() if any(isinstance(x, Partial) for x in parse_placements(w))]
    legal = legalize.legalize(prop.module, pending).entry
    fix = FunctionBuilder(fn.name, REGISTRY.out_arity)
    vm = ValueMap()
    for p in legal.params:
        vm.bind(p, fix.param(p.name, p.type))
    for instr in legal.body:
        fix.append(copy_instr(instr, vm))
    outs: list[Value] = []
    places: list[tuple[Placement, ...] | None] = []
    for i, v in enumerate(legal.outputs):
        nv = vm(v)
        t = v.type
        want = results.get(i)
        target = None
        if isinstance(t, DTensorType) and want is not None:
            target = tuple(
                g if isinstance(w, Partial) and not isinstance(g, Partial) else w
                for w, g in zip(parse_placements(want), t.placements, strict=True)
            )
        if isinstance(t, DTensorType) and target is not None and target != t.placements:
            (nv,) = fix.op("Redistribute", nv, names=[v.name], to=format_placements(target))
            places.append(target)
        else:
            places.append(t.placements if isinstance(t, DTensorType) else None)
        outs.append(nv)
    return strip_types(fix.ret(*outs)), places, prop.module


def _layers(model_string: str) -> Iterator[None]:
    spec = parse_model_string(model_string)
    for d, t, b, recompute, train, sp in CONFIGS:
        model = build_from(spec, b, DType.f32)
        if sp and model.seq_dim is None:
            continue
        layer_sharder.sharded_layers(model, d, t, recompute, train, sp=sp)
        yield


@pytest.mark.parametrize("model", MODELS)
def test_shard_function_is_the_composition_of_the_passes(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer function the sharder shards (plans and memos warm from earlier meshes and
    microbatch sizes) prints exactly as the reference gives it, with equal result placements;
    on the way, legalization's required placements of every op of the propagated program are
    those of ``min`` over all strategies (``_required_of`` stops at the first costing nothing)."""
    checked = required = 0

    def both(
        module: Module,
        fn: Function,
        arg_types: Sequence[Type],
        mesh: Mesh,
        params: Mapping[int, str],
        results: Mapping[int, str],
        pinned: Collection[int] = (),
    ) -> tuple[Function, list[tuple[Placement, ...] | None]]:
        nonlocal checked, required
        got = shard_function(module, fn, arg_types, mesh, params, results, pinned)
        want, places, prop = reference_shard_function(fn, arg_types, mesh, params, results, pinned)
        assert print_function(got[0]) == print_function(want)
        assert got[1] == places
        checked += 1
        for op in prop.entry.ops():
            if REGISTRY[op.name].kind is OpKind.LOCAL:
                assert legalize._required_of(op) == _old_required(op), str(op)
                required += 1
        return got

    monkeypatch.setattr(layer_sharder, "shard_function", both)
    for _ in _layers(model):
        pass
    assert checked >= 2 * len(CONFIGS) and required > 50


def _old_required(op: Op) -> list[tuple[Placement, ...] | None]:
    """Legalization's required input placements as first written: per axis, ``min`` over the
    strategies giving the results their placements of (clashes, bytes)."""
    types = [v.type for v in op.inputs]
    dts = [t for t in types if isinstance(t, DTensorType)]
    if not dts:
        return [None] * len(types)
    mesh = dts[0].mesh
    glob = [global_view(t, mesh) for t in types if t is not None]
    outs = [v.type for v in op.outputs]
    gouts = [t.global_type() for t in outs if isinstance(t, DTensorType)]
    per_axis: list[tuple[Placement, ...]] = []
    for ax, (_, n) in enumerate(mesh.axes):
        want = tuple(t.placements[ax] for t in outs if isinstance(t, DTensorType))
        have = tuple(t.placements[ax] if isinstance(t, DTensorType) else Replicate() for t in types)
        options = [s for s in propagate.op_strategies(op.name, glob, gouts, op.attrs, n) if s.outs == want]

        def cost(
            s: Strategy, have: tuple[Placement, ...] = have, n: int = n, ax: int = ax
        ) -> tuple[int, float]:
            clash = sum(
                isinstance(w, Shard)
                and isinstance(t, DTensorType)
                and any(
                    (per_axis[b][i] if b < ax else t.placements[b]) == w
                    for b in range(len(mesh.axes))
                    if b != ax
                )
                for i, (t, w) in enumerate(zip(types, s.ins, strict=True))
            )
            return clash, float(
                sum(
                    propagate.redistribution_bytes(g, h, w, n)
                    for g, h, w in zip(glob, have, s.ins, strict=True)
                    if isinstance(g, TensorType)
                )
            )

        per_axis.append(options[0].ins if len(options) == 1 else min(options, key=cost).ins)
    return [
        tuple(pa[i] for pa in per_axis) if isinstance(types[i], DTensorType) else None
        for i in range(len(types))
    ]


PLACES = st.sampled_from([Replicate(), Shard(0), Shard(1), Partial()])


@st.composite
def _choices(draw: st.DrawFn) -> tuple[object, ...]:
    """A random final choice on one axis: 2 inputs, 1 result, options among few placements."""
    t = TensorType(DType.f32, draw(st.sampled_from([(4, 4), (8, 2), (2, 6)])), Device(0))
    opts = draw(
        st.lists(
            st.builds(lambda a, b, c: Strategy((a, b), (c,)), PLACES, PLACES, PLACES),
            min_size=1,
            max_size=6,
        )
    )
    have = (draw(PLACES), draw(PLACES))
    hint = (draw(PLACES),)
    in_other = ((draw(PLACES),), (draw(PLACES),))
    out_other = ((draw(PLACES),),)
    movable = [(i, t, draw(st.booleans())) for i in range(2) if draw(st.booleans())]
    tgt = ((0, draw(PLACES)),) if draw(st.booleans()) else ()
    return opts, draw(st.sampled_from([1, 2, 4])), have, hint, in_other, out_other, movable, tgt, t


_ANSWERED = [0, 0]  # examples, answered by ``_free``


@settings(max_examples=400, deadline=None)
@given(_choices())
def test_a_free_strategy_is_chooses_pick(case: tuple[object, ...]) -> None:
    """Whenever ``_free`` finds a strategy, ``_choose`` picks that very one."""
    opts, n, have, hint, in_other, out_other, movable, tgt, t = case
    targets = [(i, t, [p]) for i, p in tgt]  # type: ignore[attr-defined]
    free = choices._free(opts, have, hint, in_other, out_other, [(i, tv) for i, tv, _ in movable], tgt)  # type: ignore[arg-type, attr-defined]
    _ANSWERED[0] += 1
    if free is not None:
        _ANSWERED[1] += 1
        picked = choices._choose(opts, n, have, hint, in_other, out_other, movable, targets, tgt)  # type: ignore[arg-type]
        assert free is picked


@pytest.mark.slow
def test_free_strategies_are_found() -> None:
    """The property above is not vacuous: many random choices have a free strategy."""
    _ANSWERED[:] = [0, 0]
    test_a_free_strategy_is_chooses_pick()
    assert _ANSWERED[0] >= 100 and _ANSWERED[1] >= 20, _ANSWERED
