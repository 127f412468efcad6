"""Layer functions that take their weights in float8: Transformer Engine's FP8 weight cache, as
Megatron-Core runs it (``distribute(fp8_weight_cache=True)``), and FSDP's float8 all-gather, as
torchao runs it (``distribute(float8_gather=True)``).

Under delayed scaling (``fp8-delayed``) a linear layer's function casts its weight,
``Float8Cast(w, to=f8e4m3, scaling=delayed)``, in every call: once per microbatch, its float8
copy saved for that microbatch's backward. Megatron-Core runs TE otherwise: ``forward_step``
calls ``set_is_first_microbatch`` on the model chunk for microbatch 0 of the step
(megatron/core/pipeline_parallel/schedules.py; interleaved, per model chunk:
``is_first_microbatch_for_model_chunk``), and ``TELinear.forward`` (likewise
``TELayerNormColumnParallelLinear``) passes ``is_first_microbatch`` on to ``te.Linear`` and
clears it after the call, unless ``disable_parameter_transpose_cache``
(megatron/core/transformer/custom_layers/transformer_engine.py), both at Megatron-LM f2e5db4.
TE's ``_Linear.forward`` casts the weight with ``update_workspace = is_first_microbatch is None
or is_first_microbatch`` into the workspace ``cache_name="weight"`` that
``get_weight_workspace`` keeps in the module's ``_fp8_workspaces`` (None: cast every call,
nothing cached), and every later microbatch, the recomputation and the backward read that
workspace (transformer_engine/pytorch/module/linear.py and module/base.py at Transformer Engine
v2.1): each weight is cast once per step, and a stage holds one float8 copy of its weights, not
one per microbatch in flight. Callers that pass no ``is_first_microbatch`` (llm-foundry's
Composer calls ``te.Linear`` plainly; PyTorch FSDP) cast per call: the option is off.

This module finds the weights every layer function reads only through such a cast and rewrites
those functions to take the float8 copy as the parameter (``cached_layers``); ``distribute``
casts each once per step (in the entry, or, with ``overlap_param_gather``, right after its gather
in the chunk's first forward) and passes the copy to every call. The gradient is the same
(straight-through casts: the weight gradient comes from the float8 products).

FSDP's float8 all-gather (torchao's ``Float8LinearConfig(enable_fsdp_float8_all_gather=True)``,
torchtitan's ``--float8.enable_fsdp_float8_all_gather``) rewrites the same way the weights that
the layer functions read only through torchao's casts (E4M3, dynamic scaling, or the backward's
cast again: ``gathered_layers``): ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts
the local shard to float8 before FSDP gathers it, and ``Float8Linear`` takes the gathered
``Float8Tensor`` as it comes (torchao ``float8/fsdp_utils.py`` and ``float8_linear.py`` at
0afa4c1), so ``distribute`` casts each shard on the stream that gathers it and the layers read
the gathered float8 weight, forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from distir.ir.dtensor import DTensorType
from distir.ir.function import Function
from distir.ir.ops import Call, Instr, Op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import DType, Type
from distir.ir.values import Attrs, Value
from distir.ops.float8 import FLOAT8_CAST, SAVED_SCALING
from distir.ops.linalg import DYNAMIC_SCALING
from distir.ops.registry import REGISTRY
from distir.ops.shape.family import FAMILY as SHAPE_FAMILY
from distir.parallel.layer_sharder import ShardedLayer, split_backward

CACHE_DTYPE = DType.f8e4m3
CACHE_SCALING = "delayed"


def cast_attrs() -> Attrs:
    """The attributes of the once-per-step cast (TE's weight cast: E4M3, delayed scaling)."""
    return Attrs({"to": CACHE_DTYPE, "scaling": CACHE_SCALING})


def _weight_positions(L: ShardedLayer, call: Call, w: Value) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions of weight ``w`` among the parameters of ``L.fwd`` and of ``L.bwd``."""
    fpos = tuple(j for j, v in enumerate(call.inputs) if v is w)
    bpos: tuple[int, ...] = ()
    if L.vjp is not None:
        bpos = tuple(k for k, j in enumerate(L.vjp.bwd_params) if call.inputs[j] is w)
    return fpos, bpos


def _is_cache_cast(instr: Instr) -> bool:
    """TE's weight cast: E4M3 with delayed scaling."""
    return (
        isinstance(instr, Op)
        and instr.name == FLOAT8_CAST.name
        and instr.attrs.get("to") == CACHE_DTYPE
        and instr.attrs.get("scaling") == CACHE_SCALING
    )


def _is_torchao_cast(instr: Instr) -> bool:
    """torchao's weight cast: E4M3 with dynamic scaling, or the backward's cast again with the
    forward's amax (``saved``)."""
    return (
        isinstance(instr, Op)
        and instr.name == FLOAT8_CAST.name
        and instr.attrs.get("to") == CACHE_DTYPE
        and instr.attrs.get("scaling", DYNAMIC_SCALING) in (DYNAMIC_SCALING, SAVED_SCALING)
    )


IsCast = Callable[[Instr], bool]


def _is_view(instr: Instr) -> bool:
    """A shape op of one input (a view: context parallelism's broadcast of a weight)."""
    return isinstance(instr, Op) and len(instr.inputs) == 1 and REGISTRY[instr.name].family == SHAPE_FAMILY


def _only_cast(fn: Function, positions: Sequence[int], is_cast: IsCast = _is_cache_cast) -> tuple[bool, int]:
    """Whether ``fn`` reads its parameters at ``positions`` only through a weight cast (``is_cast``),
    directly or through views of them (a view commutes with a tensorwise cast: one scale for the
    whole tensor), and returns none of them; and how many such casts it has."""
    ps = {fn.params[k] for k in positions}
    if not ps:
        return True, 0
    n = 0
    for instr in fn.body:
        if not any(v in ps for v in instr.inputs):
            continue
        if _is_view(instr):
            ps.update(instr.outputs)
        elif is_cast(instr):
            n += 1
        else:
            return False, 0
    if any(v in ps for v in fn.outputs):
        return False, 0
    return True, n


def cached_weights(
    layers: Sequence[ShardedLayer], calls: Sequence[Call], is_cast: IsCast = _is_cache_cast
) -> frozenset[Value]:
    """The weights that every layer function taking them (forward, backward) reads only
    through a weight cast (``is_cast``; TE's by default: ``_only_cast``), at least one forward
    casting them."""
    good: dict[Value, bool] = {}
    cast_somewhere: set[Value] = set()
    for L in layers:
        call = calls[L.index]
        for w in L.weights:
            fpos, bpos = _weight_positions(L, call, w)
            ok_f, n_f = _only_cast(L.fwd, fpos, is_cast)
            ok_b, _ = _only_cast(L.bwd, bpos, is_cast) if L.bwd is not None else (True, 0)
            good[w] = good.get(w, True) and ok_f and ok_b
            if n_f:
                cast_somewhere.add(w)
    return frozenset(w for w, ok in good.items() if ok and w in cast_somewhere)


def without_casts(
    fn: Function, positions: Sequence[int], name: str, is_cast: IsCast = _is_cache_cast
) -> Function:
    """``fn`` (untyped, as sharded) taking float8 weights at ``positions``: each cast of one (or
    of a view of one) dropped, its result replaced by the parameter (or the view, now of the
    float8 parameter); ``_only_cast`` must hold."""
    vmap = ValueMap(lambda v: Value(v.name, None))
    params = tuple(vmap(p) for p in fn.params)
    weights = {fn.params[k] for k in positions}  # and their views, which now view the float8 copy
    body = []
    for instr in fn.body:
        if instr.inputs and instr.inputs[0] in weights:
            if is_cast(instr):
                vmap.bind(instr.outputs[0], vmap(instr.inputs[0]))
                continue
            weights.update(instr.outputs)  # a view (``_only_cast``)
        body.append(copy_instr(instr, vmap))
    return Function(name, params, tuple(body), tuple(vmap(v) for v in fn.outputs))


def _retyped(types: tuple[Type, ...], positions: Sequence[int]) -> tuple[Type, ...]:
    """``types`` with the weights at ``positions`` in the cache's float8 dtype."""
    out = list(types)
    for k in positions:
        t = out[k]
        if isinstance(t, DTensorType):
            out[k] = DTensorType(CACHE_DTYPE, t.shape, t.mesh, t.placements)
    return tuple(out)


class CachedLayers:
    """Rewrites layers for the weight cache (``cached_layers``), each distinct function once;
    new functions go into ``functions`` (the module's)."""

    def __init__(
        self, functions: dict[str, Function], cached: frozenset[Value], is_cast: IsCast = _is_cache_cast
    ) -> None:
        self.functions, self.cached, self.is_cast = functions, cached, is_cast
        self._made: dict[tuple[int, tuple[int, ...]], Function] = {}
        self._keep: list[Function] = []  # keeps the rewritten functions' ids theirs

    def _rewrite(self, fn: Function, positions: tuple[int, ...]) -> Function:
        if not positions:
            return fn
        key = (id(fn), positions)
        got = self._made.get(key)
        if got is None:
            name = f"{fn.name}_f8w"
            k = 1
            while name in self.functions:
                name, k = f"{fn.name}_f8w{k}", k + 1
            got = self._made[key] = without_casts(fn, positions, name, self.is_cast)
            self._keep.append(fn)
            self.functions[name] = got
        return got

    def layer(self, L: ShardedLayer, call: Call) -> ShardedLayer:
        """``L`` taking its cached weights in float8 (unchanged if it has none)."""
        fpos: list[int] = []
        bpos: list[int] = []
        for w in L.weights:
            if w in self.cached:
                f, b = _weight_positions(L, call, w)
                fpos += f
                bpos += b
        if not fpos and not bpos:
            return L
        fp, bp = tuple(sorted(set(fpos))), tuple(sorted(set(bpos)))
        fwd = self._rewrite(L.fwd, fp)
        out = replace(L, fwd=fwd, fwd_args=_retyped(L.fwd_args, fp))
        if L.bwd is None or L.vjp is None:
            return out
        bwd = self._rewrite(L.bwd, bp)
        bargs = _retyped(L.bwd_args, bp)
        out = replace(out, bwd=bwd, bwd_args=bargs)
        if L.bwd_i is not None:
            n_dx = 1 if 0 in L.vjp.wrt else 0
            bi, bw = split_backward(bwd, n_dx, bargs)
            self.functions.setdefault(bi.name, bi)
            self.functions.setdefault(bw.name, bw)
            out = replace(out, bwd_i=bi, bwd_w=bw, n_carried=len(bi.outputs) - n_dx)
        return out


def cached_layers(
    layers: Sequence[ShardedLayer], calls: Sequence[Call], functions: dict[str, Function]
) -> tuple[list[ShardedLayer], frozenset[Value]]:
    """``layers`` with each cached weight (``cached_weights``) taken in float8 by every layer
    function that takes it, and the set of those weights."""
    cached = cached_weights(layers, calls)
    if not cached:
        return list(layers), cached
    rw = CachedLayers(functions, cached)
    return [rw.layer(L, calls[L.index]) for L in layers], cached


def _saves_cast(fn: Function, positions: Sequence[int], is_cast: IsCast) -> bool:
    """Whether ``fn`` returns (for the backward) a weight cast of its parameters at ``positions``
    (or of views of them)."""
    ps = {fn.params[k] for k in positions}
    outs = set(fn.outputs)
    for instr in fn.body:
        if not any(v in ps for v in instr.inputs):
            continue
        if is_cast(instr) and instr.outputs[0] in outs:
            return True
        if _is_view(instr):
            ps.update(instr.outputs)
    return False


class SavedGatheredWeight(ValueError):
    """A forward saves a float8 weight for its backward (no recomputation), where FSDP's float8
    all-gather frees the gathered weight after the forward and gathers it again."""


def gathered_layers(
    layers: Sequence[ShardedLayer],
    calls: Sequence[Call],
    functions: dict[str, Function],
    sharded: Callable[[Value], bool],
) -> tuple[list[ShardedLayer], frozenset[Value]]:
    """``layers`` taking in float8 each weight that FSDP gathers (``sharded``) and that every
    layer function reads only through torchao's casts (``_is_torchao_cast``), and the set of those
    weights: FSDP's float8 all-gather (module docstring). A forward that saves such a weight's
    cast for its backward raises ``SavedGatheredWeight``: the program would keep the gathered
    weight from the forward to the backward, where FSDP frees it (its storage, which the saved
    ``Float8Tensor`` views) and gathers it again."""
    gathered = frozenset(w for w in cached_weights(layers, calls, _is_torchao_cast) if sharded(w))
    for L in layers:
        for w in L.weights:
            fpos = _weight_positions(L, calls[L.index], w)[0]
            if w in gathered and _saves_cast(L.fwd, fpos, _is_torchao_cast):
                raise SavedGatheredWeight(f"layer {L.index} saves {w.name}'s float8 cast for its backward")
    if not gathered:
        return list(layers), gathered
    rw = CachedLayers(functions, gathered, _is_torchao_cast)
    return [rw.layer(L, calls[L.index]) for L in layers], gathered


__all__ = [
    "CACHE_DTYPE",
    "SavedGatheredWeight",
    "cached_layers",
    "cached_weights",
    "cast_attrs",
    "gathered_layers",
    "without_casts",
]
