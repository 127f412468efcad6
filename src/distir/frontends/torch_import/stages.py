"""Pipeline stages (PiPPy's semantics): split points → stage functions that keep the chain contract.

Split points are ``distir.pipe_split()`` markers in ``forward`` (``markers``) and module names
(``StageSpec.split``: the boundary before the first op traced inside that module, e.g.
``model.layers.12``). With split points the importer does not group ops into layer functions by
module path: the program between two boundaries is one stage function ``@stage<k>``, and the
entry calls them in order, then the loss.

What crosses a boundary (``split_stages``):
- the stage's own result and every value a later stage still needs (a skip connection from
  stage 0 to stage 2) are forwarded stage to stage: each stage in between takes them and returns
  them. A call has one result (the model contract), so when more than the activation crosses,
  the values are *packed* into one (batch, n) tensor — each flattened to (batch, -1) and
  concatenated on dim 1 — and the next stage slices and reshapes them back (so they must be
  floating tensors whose dim 0 is the batch);
- a parameter used by several stages is, per parameter (``StageSpec.multi_use``), taken as a
  weight by every stage using it — a tied weight (``Model.tied``) — and either ``replicate``d
  (the default, as PiPPy: each stage keeps a copy with its own optimizer state, and the copies'
  gradients are summed: Megatron's embedding group) or ``transmit``ted (``Model.transmitted``:
  only its first user, the owner, keeps it; the transforms send its value to the other stage
  once per step and that stage's gradient back once, summed at the owner before its update);
- constants (ops without inputs) are recomputed in each stage that uses them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from distir.frontends.torch_import.errors import StructureError
from distir.frontends.torch_import.layers import module_paths
from distir.frontends.torch_import.markers import is_marker
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.rewrite import eliminate_dead_code
from distir.ir.values import Value
from distir.ops.registry import REGISTRY

MultiUse = Literal["transmit", "replicate"]
POLICIES = ("transmit", "replicate")


class SplitError(StructureError):
    """A split spec that does not apply: a module name no op was traced in, an empty stage, an
    unknown multi-use policy."""


@dataclass(frozen=True, slots=True)
class StageSpec:
    """Where the stages split and how parameters used by several stages cross them:
    ``split`` module names (the boundary before each); ``multi_use`` the default policy and
    ``per_param`` overrides by parameter name (torch's, ``lin.weight``)."""

    split: tuple[str, ...] = ()
    multi_use: MultiUse = "replicate"
    per_param: tuple[tuple[str, MultiUse], ...] = ()

    def __post_init__(self) -> None:
        for name, policy in [("multi_use", self.multi_use), *self.per_param]:
            if policy not in POLICIES:
                raise SplitError(
                    f"multi-use policy of {name}: {policy!r} is not one of {', '.join(POLICIES)}"
                )

    def policy(self, param: str) -> MultiUse:
        return dict(self.per_param).get(param, self.multi_use)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage function and the torch names of its weights, in parameter order after the
    activation."""

    fn: Function
    weights: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Body:
    """The whole program as one function and what splitting it needs: ``stage_of`` each op's
    stage, ``weights`` the torch name of each parameter after the first (the input),
    ``shapes`` the shape of every value that may cross a boundary (None: the batch)."""

    fn: Function
    stage_of: Mapping[Op, int]
    weights: tuple[str, ...]
    shapes: Mapping[Value, tuple[int | None, ...]]
    stages: int


def _carried(body: Body, spec: StageSpec) -> tuple[list[list[Value]], tuple[str, ...]]:
    """Per boundary k (after stage k), the values that cross it, in definition order; and the
    names of the weights used by several stages that are transmitted."""
    fn, n = body.fn, body.stages
    x, params = fn.params[0], fn.params[1:]
    weight_name = dict(zip(params, body.weights, strict=True))
    made: dict[Value, int] = {x: 0}
    order: list[Value] = [x]
    last_use: dict[Value, int] = {}
    first_use: dict[Value, int] = {}
    for op in fn.ops():
        s = body.stage_of[op]
        for v in op.inputs:
            last_use[v] = max(last_use.get(v, s), s)
            first_use[v] = min(first_use.get(v, s), s)
        for v in op.outputs:
            made[v] = s
            order.append(v)
    for v in fn.outputs:
        last_use[v] = n - 1
    owner = {p: first_use[p] for p in params if p in first_use}
    sent = tuple(
        weight_name[p]
        for p in params
        if p in owner and last_use[p] > owner[p] and spec.policy(weight_name[p]) == "transmit"
    )
    cross = [[v for v in order if made[v] <= k < last_use.get(v, -1)] for k in range(n - 1)]
    return cross, sent


def stage_numbers(nodes: Sequence[Any], tensors: Sequence[Any], split: Sequence[str]) -> dict[str, int]:
    """The stage of each tensor node (by name), from the markers among ``nodes`` (the whole
    graph, in order) and the ``split`` module names; raises ``SplitError`` for a name no op was
    traced in or an empty stage."""
    index = {n.name: i for i, n in enumerate(tensors)}
    starts: set[int] = set()
    pending = 0
    for n in nodes:
        if is_marker(n):
            pending += 1
        elif n.name in index and pending:
            starts.add(index[n.name])
            pending = 0
    if pending:
        raise SplitError("a pipe_split() marker comes after the last op: its stage would be empty")
    for name in split:
        first = next(
            (
                i
                for i, n in enumerate(tensors)
                if any(
                    p == name or p.startswith(name + ".") for p in module_paths(n.meta.get("nn_module_stack"))
                )
            ),
            None,
        )
        if first is None:
            raise SplitError(f"split point {name!r}: no op of the model runs in a module of that name")
        starts.add(first)
    if 0 in starts:
        raise SplitError("a split point before the model's first op: stage 0 would be empty")
    bounds = sorted(starts)
    return {n.name: sum(1 for b in bounds if b <= i) for i, n in enumerate(tensors)}


def _no_inputs(op: Op) -> bool:
    return not op.inputs


class Split(NamedTuple):
    """The stage functions, whether any boundary packs several values into one, and the
    transmitted weights (``Model.transmitted``)."""

    stages: list[Stage]
    packed: bool
    transmitted: tuple[str, ...]


def split_stages(body: Body, spec: StageSpec) -> Split:
    """The stage functions of ``body`` (module docstring)."""
    cross, sent = _carried(body, spec)
    fn = body.fn
    params = fn.params[1:]
    weight_name = dict(zip(params, body.weights, strict=True))
    consts = [op for op in fn.ops() if _no_inputs(op)]
    out: list[Stage] = []
    for k in range(body.stages):
        fb = FunctionBuilder(f"stage{k}", REGISTRY.out_arity)
        env: dict[Value, Value] = {}
        flat: dict[Value, Value] = {}  # a forwarded activation's (batch, n) piece, as received
        carrier = fb.param("x")
        if k == 0:
            env[fn.params[0]] = carrier
        else:
            env.update(_unpack(fb, carrier, cross[k - 1], body.shapes, flat))
        weights: list[str] = []
        ops = [op for op in fn.ops() if body.stage_of[op] == k and not _no_inputs(op)]
        used = {v for op in ops for v in op.inputs}
        for p in params:
            if p in used and p not in env:
                env[p] = fb.param(weight_name[p])
                weights.append(weight_name[p])
        for c in consts:
            if any(v in used for v in c.outputs):
                env.update(
                    zip(c.outputs, fb.emit(c.name, (), c.attrs, [v.name for v in c.outputs]), strict=True)
                )
        for op in ops:
            ins = [env[v] for v in op.inputs]
            outs = fb.emit(op.name, ins, op.attrs, [v.name for v in op.outputs])
            env.update(zip(op.outputs, outs, strict=True))
        if k == body.stages - 1:
            result = env[fn.outputs[0]]
        else:
            vals = [flat.get(v, env[v]) if len(cross[k]) > 1 else env[v] for v in cross[k]]
            result = _pack(fb, vals, cross[k], body.shapes, set(flat.values()))
        out.append(Stage(eliminate_dead_code(fb.ret(result)), tuple(weights)))
    return Split(out, any(len(c) > 1 for c in cross), sent)


def _flat(shape: tuple[int | None, ...]) -> int:
    return math.prod(d for d in shape[1:] if d is not None)


def _check_packable(vals: Sequence[Value], shapes: Mapping[Value, tuple[int | None, ...]]) -> None:
    for v in vals:
        shape = shapes.get(v)
        if shape is None:
            raise StructureError(f"value %{v.name} crosses a stage boundary but its shape is unknown")
        if not shape or shape[0] is not None or None in shape[1:]:
            raise StructureError(
                f"value %{v.name} {shape} crosses a stage boundary with other values: only values whose "
                "dim 0 (and only dim 0) is the batch can be forwarded"
            )


def _pack(
    fb: FunctionBuilder,
    vals: Sequence[Value],
    origs: Sequence[Value],
    shapes: Mapping[Value, tuple[int | None, ...]],
    passed: AbstractSet[Value],
) -> Value:
    """One activation carrying ``vals`` (module docstring); a lone activation passes as it is,
    and so do the pieces of ``passed`` (already (batch, n), received packed)."""
    if len(vals) == 1:
        return vals[0]
    _check_packable(origs, shapes)
    pieces: list[Value] = []
    for v, o in zip(vals, origs, strict=True):
        if len(shapes[o]) == 2 or v in passed:  # already (batch, n)
            pieces.append(v)
        else:
            (f,) = fb.op("Reshape", v, shape=(0, -1))
            pieces.append(f)
    (packed,) = fb.op("Concat", *pieces, axis=1)
    return packed


def _unpack(
    fb: FunctionBuilder,
    carrier: Value,
    origs: Sequence[Value],
    shapes: Mapping[Value, tuple[int | None, ...]],
    flat: dict[Value, Value],
) -> dict[Value, Value]:
    """The values ``carrier`` packs (``_pack``); ``flat`` gets each activation's (batch, n)
    piece, so a stage passing it on sends the piece as it came."""
    if len(origs) == 1:
        return {origs[0]: carrier}
    env: dict[Value, Value] = {}
    at = 0
    for o in origs:
        shape = shapes[o]
        n = _flat(shape)
        (piece,) = fb.op("Slice", carrier, starts=(at,), ends=(at + n,), axes=(1,))
        flat[o] = env[o] = piece
        if len(shape) != 2:
            (env[o],) = fb.op("Reshape", piece, shape=(0, *(int(d) for d in shape[1:] if d is not None)))
        at += n
    return env
