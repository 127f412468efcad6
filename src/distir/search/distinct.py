"""The distinct layers of a model: the chain with repeated layer calls dropped, for profiling.

A transformer repeats one block dozens of times (96 in GPT-3), and ``sharded_layers`` walks
every call — type inference, the backward's argument types, DTensor argument types — although
every repeat shards to the very same functions. The profiler therefore shards a *reduced* model
in which each run of repeats is represented by one call, and maps every layer of the full model
to the call that stands for it.

A call i is dropped (stood for by an earlier call r) only when all of this holds, which makes
everything ``sharded_layers`` derives for it equal to what it derives for r:

- it is a middle layer (0 < i < last − 1): the first and the loss layer are differentiated
  with respect to other arguments (no input gradient / no weights), so they always stay; the
  layer before the loss stays too, as the last layer of the inference program (nothing is
  transferred after it, so it must not stand for a repeat that hands its result on);
- it calls the same function as r with equal argument types, and each of its other arguments
  plays the same role as r's (a weight with the same tensor-parallel placement, or the same
  model input): the differentiation and the sharding of a call depend on nothing else
  (without sequence parallelism, every activation between layers has the same placement);
- its result has the type of its activation argument, so the call after it still receives the
  type it had in the full model: dropping it changes no other call's types.

The reduced model keeps ``check_model``'s contract (a chain of calls, each kept weight used
once), with only the kept calls' weights; its ``flops_per_sample`` is 0 (unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distir.autodiff.train import layer_types
from distir.frontends.zoo.model import Model
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Module
from distir.ir.rewrite import copy_instr
from distir.ir.values import Value
from distir.ops.registry import REGISTRY


@dataclass(frozen=True, slots=True)
class Reduced:
    """A model's distinct layers (module docstring).

    Invariants: ``rep[i]`` is the layer of ``model`` standing for layer i of the full model, a
    call of the same function on equal argument types; every layer of ``model`` stands for at
    least itself, in order (the kept layers' ``rep`` values are 0, 1, 2, …); the first, the
    last two (the inference program's last layer and the loss) are always kept.
    """

    model: Model
    rep: tuple[int, ...]

    @property
    def dropped(self) -> int:
        return len(self.rep) - len(self.model.layers)


def distinct_layers(model: Model) -> Reduced:
    """``model`` with its repeated middle layer calls dropped (module docstring)."""
    calls = model.layers
    fwd = model.forward
    n_in = len(model.inputs)
    weights = {p: model.weight(p.name).tp for p in fwd.params[n_in:]}
    types = layer_types(model)
    last = len(calls) - 1
    seen: dict[tuple[object, ...], int] = {}
    rep: list[int] = []
    kept: list[int] = []
    for i, call in enumerate(calls):
        roles = tuple(("w", weights[v]) if v in weights else ("in", v.name) for v in call.inputs[1:])
        key = (call.callee, tuple(types[i]), roles)
        r = seen.get(key)
        if 0 < i < last - 1 and r is not None and types[i + 1][0] == types[i][0]:
            rep.append(r)
            continue
        if 0 < i < last:
            seen.setdefault(key, len(kept))
        rep.append(len(kept))
        kept.append(i)
    if len(kept) == len(calls):
        return Reduced(model, tuple(rep))
    used = {v for i in kept for v in calls[i].inputs[1:] if v in weights}
    fb = FunctionBuilder(fwd.name, REGISTRY.out_arity)
    vm: dict[Value, Value] = {}
    for k, p in enumerate(fwd.params):
        if k < n_in or p in used:
            vm[p] = fb.param(p.name, p.type)
    keep = set(kept)
    for i, call in enumerate(calls):
        if i in keep:
            fb.append(copy_instr(call, lambda v: vm.setdefault(v, Value(v.name, None))))
        else:  # the next call takes this one's activation argument (same type, see above)
            vm[call.outputs[0]] = vm[call.inputs[0]]
    entry = fb.ret(*(vm[v] for v in fwd.outputs))
    module = Module((*(f for f in model.module.functions if f is not fwd), entry))
    names = {p.name for p in used}
    kept_w = tuple(w for w in model.weights if w.name in names)
    return Reduced(replace(model, module=module, weights=kept_w, flops_per_sample=0.0), tuple(rep))


__all__ = ["Reduced", "distinct_layers"]
