"""Each layer call of a model, differentiated and sharded once, as ``distribute`` uses it.

``LayerSharder.layers`` retypes the model's forward to one microbatch, differentiates each layer
function once (``distir.autodiff``) and shards its forward and backward on a representative
(dp, tp) mesh (``distir.parallel.sharding.shard_function``), with activations between layers at the strategy's
placements (``distir.parallel.seqpar``) and weights pinned where their tensor-parallel placement
puts them. A function met again with the same argument types and placements is sharded once;
with others it gets a numbered name; layer calls alike (a model's repeated blocks) are worked out
once. Sharding, splitting a backward for zero-bubble schedules and a forward's result types are
pure functions of the (differentiated) functions, types and mesh: memoized across sharders, so
the strategies of one microbatch size and (d, t) that a search simulates share them (the stage
partition is ``distir.parallel.pipeline.partition``). The search's profiler uses
``sharded_layers`` to cost the very layers the transform emits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from distir.autodiff.precision import Precision
from distir.autodiff.reverse import VJP, split_weight_grad, value_types
from distir.autodiff.train import layer_types, layer_vjps
from distir.frontends.zoo.model import Model
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    axis_size,
    format_placements,
    parse_placements,
)
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import copy_instr
from distir.ir.types import Device, TensorType, Type
from distir.ir.values import Value
from distir.ops.dist import REDISTRIBUTE
from distir.ops.registry import REGISTRY
from distir.parallel.seqpar import activation_placements
from distir.parallel.sharding.shard_function import rep_mesh, shard_function, strip_types
from distir.parallel.strategy import Strategy

ACT = "S(0), R"


@dataclass
class ShardedLayer:
    """One layer call of the model, once differentiated and sharded. ``fwd_args``/``bwd_args``
    are the argument types of ``fwd``/``bwd`` as DTensors on the representative (dp, tp) mesh
    (global shapes at the microbatch size; non-tensors as they are)."""

    index: int
    weights: list[Value]  # entry-level weight params of the model forward
    extras: list[Value]  # model inputs it takes besides the activation (labels)
    fwd: Function
    bwd: Function | None = None
    bwd_i: Function | None = None
    bwd_w: Function | None = None
    vjp: VJP | None = None
    n_carried: int = 0
    fwd_args: tuple[Type, ...] = ()
    bwd_args: tuple[Type, ...] = ()
    # per weight (``weights``' order): its gradient leaves the backward still pending over tp
    # (``LayerSharder`` with sequence parallelism: reduced once per step, not per layer)
    tp_pending: tuple[bool, ...] = ()


def at_batch(model: Model, batch: int) -> Module:
    """The model's module with the entry's inputs retyped to ``batch`` samples."""
    fwd = model.forward
    fb = FunctionBuilder(fwd.name, REGISTRY.out_arity)
    m: dict[Value, Value] = {}
    for k, p in enumerate(fwd.params):
        t = p.type
        if k < len(model.inputs) and isinstance(t, TensorType):
            t = TensorType(t.dtype, (batch, *t.shape[1:]), t.device)
        m[p] = fb.param(p.name, t)
    for instr in fwd.body:
        fb.append(copy_instr(instr, lambda v: m.setdefault(v, Value(v.name, None))))
    entry = fb.ret(*(m[v] for v in fwd.outputs))
    return Module((*(f for f in model.module.functions if f is not fwd), entry))


def _on_mesh(types: Sequence[Type], ann: dict[int, str], mesh: Mesh) -> tuple[Type, ...]:
    """Global ``types`` as DTensors on ``mesh`` with the annotated placements (unannotated and
    non-tensor types unchanged)."""
    out: list[Type] = []
    for j, t in enumerate(types):
        a = ann.get(j)
        if a is not None and isinstance(t, TensorType):
            out.append(DTensorType(t.dtype, t.shape, mesh, parse_placements(a)))
        else:
            out.append(t)
    return tuple(out)


def with_cp(text: str, c: int) -> str:
    """A placement on the (dp, tp) mesh as it reads on the (dp, cp, tp) mesh of context
    parallelism over c > 1: what is split by batch over dp (activations, inputs) is split along
    the sequence (dim 1) over cp; anything else (weights, their gradients, the loss) is placed
    over cp as over dp — cp acts like dp for weights. Unchanged for c = 1."""
    if c == 1:
        return text
    ps = parse_placements(text)
    cp = Shard(1) if ps[0] == Shard(0) else ps[0]
    return format_placements((ps[0], cp, *ps[1:]))


def placement_text(*ps: Placement) -> str:
    """Placements in their annotation form (``"R, S(1)"``)."""
    return format_placements(tuple(ps))


def sharded_layers(
    model: Model,
    d: int,
    t: int,
    recompute: str = "none",
    train: bool = True,
    split_w: bool = False,
    sp: bool = False,
    precision: Precision | str = "pure",
    policy: str | None = None,
) -> list[ShardedLayer]:
    """Every layer call of ``model`` (at its own batch size, i.e. one microbatch) differentiated
    (``train``) and sharded on the (d, t) mesh, as ``distribute`` uses them; ``split_w`` also
    splits each backward into input and weight parts (zero-bubble schedules); ``sp`` shards the
    activations between layers along the sequence (``distir.parallel.seqpar``); ``precision="mixed"``
    gives the layers of a mixed-precision step (the same, but for the loss layer in fp32);
    ``policy`` differentiates them under another recompute policy than ``recompute``'s own
    (``distribute(sac_eager=True)``'s ``ops-eager``)."""
    s = Strategy(d=d, t=t, recompute=recompute, schedule="zb1" if split_w else "1f1b", sp=sp)
    model = Precision.parse(precision).prepare(model)  # mixed: the loss layer in fp32
    n = len(model.layers) if train else len(model.layers) - 1
    return LayerSharder(model, s, train, model.batch, {}, policy).layers(n)


def defers_tp_sums(s: Strategy, train: bool) -> bool:
    """Whether the layers of ``s`` leave the gradients of their tensor-parallel-replicated
    weights pending over tp (``LayerSharder``): training with sequence parallelism."""
    return train and s.sp and s.t > 1


def bwd_arg_types(vj: VJP, arg_types: Sequence[Type], fwd_types: Sequence[Type]) -> list[Type]:
    """The argument types of ``vj.bwd`` when the forward ran on ``arg_types`` and gave
    ``fwd_types``: the forward arguments it takes again, the residuals, then the cotangents of the
    active outputs."""
    out: list[Type] = [arg_types[j] for j in vj.bwd_params]
    out += [fwd_types[vj.n_outputs + r] for r in range(vj.n_residuals)]
    out += [fwd_types[o] for o in vj.active_outputs]
    return out


def unsharded_layers(model: Model, recompute: str = "none", train: bool = True) -> list[ShardedLayer]:
    """Every layer call of ``model`` (at its own batch size) differentiated (``train``) but not
    sharded, on device ``d0``: what ``sharded_layers(model, 1, 1, ...)`` gives, without the
    Redistributes between placements of a one-device mesh (they move nothing: the simulator and
    the lowering treat them as views), so the two cost the same. The search profiles layers of no
    tensor parallelism with it: a third of the sharding's time at one device per group."""
    model = Precision.parse("pure").prepare(model)
    n = len(model.layers) if train else len(model.layers) - 1
    types, grads = _differentiated(model, model.batch, recompute, train)
    weight_params = set(model.forward.params[len(model.inputs) :])
    d0 = Device(0)

    def on_d0(ts: Sequence[Type]) -> tuple[Type, ...]:
        return tuple(t.with_device(d0) if isinstance(t, TensorType) else t for t in ts)

    out: list[ShardedLayer] = []
    calls = model.layers  # a property that collects them anew at each access
    for i in range(n):
        call = calls[i]
        weights = [v for v in call.inputs[1:] if v in weight_params]
        extras = [v for v in call.inputs[1:] if v not in weight_params]
        if not train:
            fn = model.module[call.callee]
            out.append(ShardedLayer(i, weights, extras, fn, fwd_args=on_d0(types[i])))
            continue
        vj = grads[i].vjp
        env = value_types(Module((vj.fwd,)), vj.fwd, types[i])
        btypes = bwd_arg_types(vj, types[i], [env[o] for o in vj.fwd.outputs])
        out.append(
            ShardedLayer(
                i, weights, extras, vj.fwd, vj.bwd, vjp=vj, fwd_args=on_d0(types[i]), bwd_args=on_d0(btypes)
            )
        )
    return out


class LayerSharder:
    """Shards the layers of ``model`` (already prepared for its precision) for strategy ``s``
    at microbatch size ``mb``; every function it makes goes into ``functions`` (shared with the
    caller, which emits them into the module)."""

    def __init__(
        self,
        model: Model,
        s: Strategy,
        train: bool,
        mb: int,
        functions: dict[str, Function],
        recompute: str | None = None,
    ) -> None:
        self.model, self.s, self.train, self.mb = model, s, train, mb
        # the recompute policy's name (``distir.autodiff.reverse.POLICIES``): the strategy's, or
        # a variant of it the caller names (``distribute(sac_eager=True)``: ``ops-eager``)
        self.recompute = recompute or s.recompute
        self.mesh_rep = _mesh(axis_size(s.d, s.shares), s.t, s.c)
        self.defer_tp = defers_tp_sums(s, train)
        self.weight_params = set(model.forward.params[len(model.inputs) :])
        self.functions = functions
        self._sharded: dict[tuple[object, ...], tuple[Function, list[tuple[Placement, ...] | None]]] = {}
        self._meshed: dict[tuple[object, ...], tuple[Type, ...]] = {}  # ``_on_mesh`` per layer kind
        self._weight_texts: dict[Placement, str] = {}  # a weight's placement text per TP placement
        # (layer function, id of its VJP, types, activation placements around it, its inputs'
        # roles) -> the layer sharded (``layers``), which keeps the VJP alive: its id stays its own
        self._alike: dict[tuple[object, ...], ShardedLayer] = {}
        self._names: dict[str, int] = {}

    def wp(self, w: Value) -> str:
        """A weight's placement on the (dp, tp) mesh: replicated over dp, its TP placement."""
        return with_cp(placement_text(Replicate(), self.model.weight(w.name).tp), self.s.c)

    def _on_mesh(self, types: Sequence[Type], ann: dict[int, str]) -> tuple[Type, ...]:
        """``_on_mesh`` on this sharder's mesh, once per (types, annotations): repeated blocks
        share the resulting types."""
        key = (*types, None, *sorted(ann.items()))
        hit = self._meshed.get(key)
        if hit is None:
            hit = self._meshed[key] = _on_mesh(types, ann, self.mesh_rep)
        return hit

    def _fwd_types(self, fwd: Function, arg_types: Sequence[Type]) -> list[Type]:
        """The result types of ``fwd`` on ``arg_types``, inferred once per (function, types): the
        repeated blocks of a model share one differentiated forward, and the differentiated
        functions are the same objects for every strategy of one microbatch size
        (``_differentiated``), so the memo is kept across sharders (``_OUT_TYPES``)."""
        key = (id(fwd), *arg_types)
        hit = _OUT_TYPES.get(key)
        if hit is None or hit[0] is not fwd:
            env = value_types(Module((fwd,)), fwd, arg_types)
            _bounded(_OUT_TYPES)
            hit = _OUT_TYPES[key] = (fwd, [env[o] for o in fwd.outputs])
        return list(hit[1])

    def layers(self, n: int) -> list[ShardedLayer]:
        """The first ``n`` layer calls, differentiated (when training) and sharded. Layer calls
        alike — the same layer function and VJP at the same types, with the same placements of
        the activations around them and of their weights (a model's repeated blocks) — are
        sharded alike: each is worked out once (``_layer``) and the others share its functions."""
        types, grads = _differentiated(self.model, self.mb, self.recompute, self.train)
        orig_calls = self.model.layers
        out: list[ShardedLayer] = []
        acts = [with_cp(a, self.s.c) for a in activation_placements(self.model, self.s, types[:n])]
        alike = self._alike
        for i in range(n):
            call = orig_calls[i]
            weights = [v for v in call.inputs[1:] if v in self.weight_params]
            extras = [v for v in call.inputs[1:] if v not in self.weight_params]
            # each input's role: a weight placed by its tensor-parallel placement, or not a weight
            roles = tuple(
                self.model.weight(v.name).tp if v in self.weight_params else None for v in call.inputs
            )
            last = self.train and i == len(orig_calls) - 1
            vj = grads[i].vjp if self.train else None
            key = (call.callee, id(vj), tuple(types[i]), acts[i], None if last else acts[i + 1], roles)
            got = alike.get(key)
            if got is None:
                act_out = None if last else acts[i + 1]
                got = alike[key] = self._layer(call, vj, types[i], acts[i], act_out, roles)
                out.append(replace(got, index=i, weights=weights, extras=extras))
                continue
            # the arguments on the mesh of a layer alike, by ``_on_mesh``'s memo (one dict lookup)
            fargs = self._on_mesh(types[i], self._annotations(acts[i], roles))
            out.append(replace(got, index=i, weights=weights, extras=extras, fwd_args=fargs))
        return out

    def _annotations(self, act_in: str, roles: tuple[Placement | None, ...]) -> dict[int, str]:
        """A layer's parameter annotations: the activation at ``act_in``, each weight replicated
        over dp and placed by its role over tp, other inputs as activations."""
        pann = {0: act_in}
        texts = self._weight_texts
        for j, r in enumerate(roles[1:], start=1):
            if r is None:
                pann[j] = with_cp(ACT, self.s.c)
                continue
            text = texts.get(r)
            if text is None:
                text = texts[r] = with_cp(placement_text(Replicate(), r), self.s.c)
            pann[j] = text
        return pann

    def _layer(
        self,
        call: Call,
        vj: VJP | None,
        types: Sequence[Type],
        act_in: str,
        act_out: str | None,
        roles: tuple[Placement | None, ...],
    ) -> ShardedLayer:
        """One layer call (``call``, differentiated as ``vj`` when training) sharded, with the
        activation entering at ``act_in`` and leaving at ``act_out`` (None: the last layer, whose
        result is the loss), weights placed by their ``roles``. Its index, weights and extras are
        the caller's to fill in."""
        pann = self._annotations(act_in, roles)
        # weights are used where their tensor-parallel placement puts them (seqpar docstring)
        pins = tuple(j for j, r in enumerate(roles) if r is not None)
        fargs = self._on_mesh(types, pann)
        if vj is None:
            assert act_out is not None
            f, _ = self.shard(self.model.module[call.callee], types, pann, {0: act_out}, pins)
            return ShardedLayer(-1, [], [], f, fwd_args=fargs)
        fwd, fplaces = self.shard(vj.fwd, types, pann, {} if act_out is None else {0: act_out}, pins)
        btypes = bwd_arg_types(vj, types, self._fwd_types(vj.fwd, types))
        bann: dict[int, str] = {k: pann[j] for k, j in enumerate(vj.bwd_params)}
        at = len(vj.bwd_params)
        for r in range(vj.n_residuals):
            pl = fplaces[vj.n_outputs + r]
            if pl is not None:
                bann[at + r] = placement_text(*pl)
        for k in range(len(vj.active_outputs)):
            # the loss's cotangent is the replicated seed; activations' are (S(0), R)
            bann[at + vj.n_residuals + k] = with_cp("R, R", self.s.c) if act_out is None else act_out
        # gradients: the input's as the activation, each weight's as its weight, pending the
        # data-parallel sum (left free, propagation may gather a TP-sharded weight's gradient)
        # (with cp, also over a dp of one: ``distribute`` sees the pending sum over dp·cp)
        dp_grad: Placement = Partial() if self.s.d * self.s.c > 1 else Replicate()
        cp_grad = (Partial(),) if self.s.c > 1 else ()  # the sequence's shards' sum, as over dp
        rann = {
            k: act_in if j == 0 else placement_text(dp_grad, *cp_grad, _role(roles, j))
            for k, j in enumerate(vj.wrt)
        }
        bpins = tuple(k for k, j in enumerate(vj.bwd_params) if j in pins)
        in_sp = isinstance(parse_placements(act_in)[-1], Shard)  # a layer of the sequence-parallel region
        bwd, pending = self._sharded_bwd(vj, btypes, bann, rann, bpins, roles, self.defer_tp and in_sp)
        bargs = self._on_mesh(btypes, bann)
        layer = ShardedLayer(-1, [], [], fwd, bwd, vjp=vj, fwd_args=fargs, bwd_args=bargs, tp_pending=pending)
        if self.s.schedule == "zb1":
            n_dx = 1 if 0 in vj.wrt else 0
            bi, bw = split_backward(bwd, n_dx, bargs)
            layer.bwd_i, layer.bwd_w = bi, bw
            layer.n_carried = len(bi.outputs) - n_dx
            self.functions.setdefault(bi.name, bi)
            self.functions.setdefault(bw.name, bw)
        return layer

    def _sharded_bwd(
        self,
        vj: VJP,
        btypes: Sequence[Type],
        bann: dict[int, str],
        rann: dict[int, str],
        bpins: tuple[int, ...],
        roles: tuple[Placement | None, ...],
        defer: bool,
    ) -> tuple[Function, tuple[bool, ...]]:
        """A layer's backward sharded with its weight gradients at ``rann``, and per weight
        whether its gradient stays pending over tp. With ``defer`` (sequence parallelism,
        ``defers_tp_sums``, in a layer whose input is split along the sequence: Megatron-LM's
        ``sequence_parallel`` parameters) the gradient of a weight replicated over tp (norms,
        the biases after row-parallel products) is a sum over the sequence's shards: the
        backward's last step, reducing it over tp, is left out (``tp_sums_deferred``), so it is
        accumulated pending over the microbatches and reduced once per step, in one call for all
        of them, as Megatron-LM does (``finalize_model_grads``' ``_allreduce_layernorm_grads``:
        one coalesced all-reduce over the tensor-parallel group of every ``sequence_parallel``
        parameter's gradient, after the data-parallel reduction). The rest of the backward is
        the one sharded without deferring, op for op."""
        bwd, _ = self.shard(vj.bwd, btypes, bann, rann, bpins)
        wrt = [(k, j) for k, j in enumerate(vj.wrt) if j != 0]
        if not defer:
            return bwd, (False,) * len(wrt)
        outs = tuple(k for k, j in wrt if isinstance(roles[j], Replicate))
        stripped, done = tp_sums_deferred(bwd, self._on_mesh(btypes, bann), outs)
        if stripped is not bwd:
            self.functions[stripped.name] = stripped
        return stripped, tuple(k in done for k, _ in wrt)

    def shard(
        self,
        fn: Function,
        types: Sequence[Type],
        pann: dict[int, str],
        rann: dict[int, str],
        pins: tuple[int, ...] = (),
    ) -> tuple[Function, list[tuple[Placement, ...] | None]]:
        """Shard ``fn`` once per argument types; a function met again with other types gets a
        numbered name. ``pins``: the parameters (weights) used where they lie."""
        key = (fn.name, tuple(types), tuple(sorted(pann.items())), tuple(sorted(rann.items())), pins)
        got = self._sharded.get(key)
        if got is None:
            f, places = _shard(self.model.module, fn, key, self.mesh_rep, pann, rann, pins)
            n = self._names.get(fn.name, 0)
            self._names[fn.name] = n + 1
            if n:
                f = strip_types(f, f"{fn.name}_{n}")
            got = self._sharded[key] = (f, places)
            self.functions[f.name] = f
        return got


# (dp, tp, cp) -> ``rep_mesh``: one object per shape, so the types of every sharder on it (each
# microbatch size, with and without sequence parallelism) share it and compare by identity
_MESHES: dict[tuple[int, int, int], Mesh] = {}


def _mesh(d: int, t: int, c: int) -> Mesh:
    """``rep_mesh(d, t, c)``, one object per (d, t, c) (``_MESHES``; a mesh is frozen)."""
    got = _MESHES.get((d, t, c))
    if got is None:
        got = _MESHES[(d, t, c)] = rep_mesh(d, t, c)
    return got


def _role(roles: tuple[Placement | None, ...], j: int) -> Placement:
    """Input ``j``'s role, a weight's (a gradient is taken with respect to weights only)."""
    r = roles[j]
    assert r is not None, "a gradient of an input that is not a weight"
    return r


# Pure functions of their arguments, memoized across sharders (every strategy a search simulates
# exactly builds its own): the same model, microbatch size and (d, t) give the same layers. Keyed
# by the identity of the functions and module (kept alive in the entry, so their ids stay theirs)
# and the value of everything else; bounded (cleared when full).
_MEMO_MAX = 256
# (id of the module, the sharder's key, mesh) -> (module, function, its sharding, result placements)
_SHARDS: dict[tuple[object, ...], tuple[Module, Function, Function, list[tuple[Placement, ...] | None]]] = {}
# (id of a backward, inputs with a gradient, argument types) -> (that backward, its input and
# weight parts)
_SPLITS: dict[tuple[object, ...], tuple[Function, tuple[Function, Function]]] = {}
# (id of a forward, argument types) -> (that forward, its result types): ``LayerSharder._fwd_types``
_OUT_TYPES: dict[tuple[object, ...], tuple[Function, list[Type]]] = {}


def _bounded(memo: dict[Any, Any]) -> None:
    if len(memo) >= _MEMO_MAX:
        memo.clear()


def _shard(
    module: Module,
    fn: Function,
    key: tuple[object, ...],
    mesh: Mesh,
    pann: dict[int, str],
    rann: dict[int, str],
    pins: tuple[int, ...],
) -> tuple[Function, list[tuple[Placement, ...] | None]]:
    """``shard_function`` memoized (``_SHARDS``); ``key`` is ``LayerSharder.shard``'s (the
    function's name, argument types, annotations and pins)."""
    full = (id(module), id(fn), key, mesh)
    hit = _SHARDS.get(full)
    if hit is None or hit[0] is not module or hit[1] is not fn:
        f, places = shard_function(module, fn, key[1], mesh, pann, rann, pins)  # type: ignore[arg-type]
        _bounded(_SHARDS)
        hit = _SHARDS[full] = (module, fn, f, places)
    return hit[2], hit[3]


# (id of a sharded backward, outputs asked for) -> (that backward, its deferred form, the outputs deferred)
_DEFERRED: dict[tuple[int, tuple[int, ...]], tuple[Function, Function, frozenset[int]]] = {}


def tp_sums_deferred(
    bwd: Function, arg_types: Sequence[Type], outs: tuple[int, ...]
) -> tuple[Function, frozenset[int]]:
    """``bwd`` without the final reductions over tp (the mesh's last axis) of its results at
    positions ``outs``: a result made by a ``Redistribute`` whose input differs from it only in
    being a pending sum over tp returns that input instead, and the Redistribute goes. Returns
    the function (``bwd`` itself when nothing changes) and the positions whose results are now
    pending over tp. Memoized (``_DEFERRED``)."""
    hit = _DEFERRED.get((id(bwd), outs))
    if hit is not None and hit[0] is bwd:
        return hit[1], hit[2]
    env = value_types(Module((bwd,)), bwd, arg_types)
    producer = {op.outputs[0]: op for op in bwd.ops() if op.outputs}
    drop: dict[int, Value] = {}
    for k in outs:
        op = producer.get(bwd.outputs[k])
        if op is None or op.name != REDISTRIBUTE.name:
            continue
        a, b = env.get(op.inputs[0]), env.get(op.outputs[0])
        if (
            isinstance(a, DTensorType)
            and isinstance(b, DTensorType)
            and isinstance(a.placements[-1], Partial)
            and isinstance(b.placements[-1], Replicate)
            and a.placements[:-1] == b.placements[:-1]
        ):
            drop[k] = op.inputs[0]
    got = bwd
    if drop:
        gone = {id(producer[bwd.outputs[k]]) for k in drop}
        used = {v for i in bwd.body if id(i) not in gone for v in i.inputs}
        if not any(producer[bwd.outputs[k]].outputs[0] in used for k in drop):
            got = replace(bwd, body=tuple(i for i in bwd.body if id(i) not in gone),
                          outputs=tuple(drop.get(k, v) for k, v in enumerate(bwd.outputs)))  # fmt: skip
        else:
            drop = {}
    _bounded(_DEFERRED)
    _DEFERRED[(id(bwd), outs)] = (bwd, got, frozenset(drop))
    return got, frozenset(drop)


def split_backward(bwd: Function, n_dx: int, arg_types: Sequence[Type]) -> tuple[Function, Function]:
    """A layer's backward (called on ``arg_types``) as its input-gradient part (returning the
    ``n_dx`` input gradients, then the values it carries to the weight-gradient part) and its
    weight-gradient part, as the zero-bubble schedules run them: ``split_weight_grad`` memoized
    (``_SPLITS``). A gather the weight part needs (a Redistribute that shards over fewer devices
    than its input: sequence parallelism's all-gather of a GEMM input or output gradient) is not
    carried gathered: the input part carries its slice and the weight part gathers it again, as
    Megatron-style weight-gradient stores do (MindSpeed's ``WeightGradStore`` keeps the
    sequence-parallel ``input_slice``/``grad_output_slice`` and all-gathers them in the
    weight-gradient pass) — so what a layer carries does not depend on whether its plan happened
    to share one gather between the two parts (it does at some microbatch sizes, not others)."""
    key = (id(bwd), n_dx, tuple(arg_types))
    hit = _SPLITS.get(key)
    if hit is None or hit[0] is not bwd:
        _bounded(_SPLITS)
        types = value_types(Module((bwd,)), bwd, arg_types)
        hit = _SPLITS[key] = (bwd, split_weight_grad(bwd, n_dx, lambda op: _gathers(op, types)))
    return hit[1]


def _gathers(op: Op, types: dict[Value, Type]) -> bool:
    """Whether ``op`` is a Redistribute whose result is sharded over fewer devices than its input
    (an all-gather: the result is larger on each device)."""
    if op.name != REDISTRIBUTE.name:
        return False
    src, dst = types.get(op.inputs[0]), types.get(op.outputs[0])
    return isinstance(src, DTensorType) and isinstance(dst, DTensorType) and _ways(dst) < _ways(src)


def _ways(t: DTensorType) -> int:
    """Over how many devices ``t`` is sharded (the product of its sharded mesh axes' sizes)."""
    return math.prod(n for (_, n), p in zip(t.mesh.axes, t.placements, strict=True) if isinstance(p, Shard))


# (model id, microbatch, recompute, train) -> (the model, kept alive so its id stays valid; layer
# argument types; layer VJPs): the same for every (d, t), which the search's profiler walks
_DIFFERENTIATED: dict[tuple[int, int, str, bool], tuple[Model, list[Any], list[Any]]] = {}


def _differentiated(model: Model, mb: int, recompute: str, train: bool) -> tuple[list[Any], list[Any]]:
    """The layers' argument types at microbatch ``mb`` and (training) their VJPs; memoized (a few
    models): they do not depend on the mesh."""
    key = (id(model), mb, recompute, train)
    hit = _DIFFERENTIATED.get(key)
    if hit is None or hit[0] is not model:
        model_mb = _model_with(model, at_batch(model, mb))
        types = layer_types(model_mb)
        grads = layer_vjps(model_mb, types, recompute)[0] if train else []
        if len(_DIFFERENTIATED) >= 16:
            _DIFFERENTIATED.clear()
        hit = _DIFFERENTIATED[key] = (model, list(types), list(grads))
    return hit[1], hit[2]


def _model_with(model: Model, module: Module) -> Model:
    """The same model with another module (its forward retyped for a microbatch)."""
    return replace(model, module=module)


__all__ = [
    "ACT",
    "LayerSharder",
    "ShardedLayer",
    "at_batch",
    "bwd_arg_types",
    "defers_tp_sums",
    "placement_text",
    "sharded_layers",
    "tp_sums_deferred",
    "unsharded_layers",
]
