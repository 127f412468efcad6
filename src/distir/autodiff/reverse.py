"""Reverse-mode autodiff over the IR: a function becomes a forward and a backward function.

``vjp(module, fn, arg_types, wrt)`` differentiates a flat function (no calls; inline them first)
at concrete argument types and returns two new functions:

- ``@<fn>_fwd(params...) -> (outputs..., saved...)``: the original code, also returning the
  forward values the backward needs (the *residuals*);
- ``@<fn>_bwd(saved..., d_outputs...) -> (d_params for wrt...)``: the vector-Jacobian product.

Each op's gradient comes from its registry ``grad`` rule (``distir.ops.gradrules``). A rule
reads forward values through ``primal(v)``, and the *recompute policy* decides what that means:
save the value (it becomes a residual) or recompute it inside the backward function from what is
saved. The policies, as the trainers define them (``POLICIES``, the strategy's ``r`` suffix):

- ``none`` (``SAVE_ALL``): save everything the rules touch;
- ``full`` (``RECOMPUTE_ALL``, Megatron-LM's ``--recompute-granularity full``): save only the
  layer's inputs (the function's parameters: the incoming activation; weights are passed again)
  and recompute the whole layer forward inside the backward;
- ``selective`` (``SELECTIVE``, Megatron-LM's ``--recompute-granularity selective``, Korthikanti
  et al., "Reducing Activation Recomputation in Large Transformer Models", 2022, §4.2): recompute
  only the *attention core* and save everything else (projections, norms, activations, MLP).
  The core (``attention_core``) is defined by the registry, not by value names: every op whose
  ``OpDef.attention_core`` is set (the fused ``Attention``; ``Softmax``), and, around a flagged op
  with a single input (the softmax of the naive form), the chain of weight-free ops with
  one activation input on either side up to and including the first op with two activation
  inputs (QKᵀ before, ·V after): QKᵀ, scale, mask, softmax, dropout, ·V. So in the naive form
  the S×S scores and probabilities are recomputed from the saved q, k, v; in the fused form the
  ``Attention`` op is run again before its gradient (whose kernel recomputes the scores anyway),
  so its output and log-sum-exp are not kept. (A ``Softmax`` outside attention counts as core too;
  the zoo uses Softmax only in attention.)

- ``ops`` (``SAVE_PRODUCTS``, torchtitan's ``selective_ac_option = "op"``, PyTorch's selective
  activation checkpointing): save the results of the fused attention and of every other matrix
  product with a weight — the 1st, 3rd, 5th... in program order, as torchtitan's policy counts
  ``aten.mm`` calls per block and recomputes the even ones —, recompute everything else.
  PyTorch caches *every* result its policy saves, whether the backward reads it or not
  (``torch/utils/checkpoint.py``, ``_CachingTorchDispatchMode.__torch_dispatch__`` appends each
  MUST_SAVE op's detached outputs to the checkpoint's storage, which the block's recompute pops
  in the backward) when it runs eagerly; compiled, AOTAutograd's partitioner drops the saved
  values its backward graph does not use (``torch/_functorch/partitioners.py``,
  ``_extract_fwd_bwd_modules``). So ``ops-eager`` (``SAVE_PRODUCTS_EAGER``: torchtitan without
  ``torch.compile``) saves what ``ops`` saves, and under it — a caching policy
  (``CACHING_POLICIES``) — a saved result no gradient
  rule reads — the block's last product, FFN's down projection, whose only reader is the
  residual add — is a residual too, and the backward starts with a ``StopGradient`` of it (the
  cache's detached entry, taken by the recompute) that nothing reads: it lives from the forward
  to the start of the block's backward, as the cache entry does.

Whatever the policy, a ``Reshape`` of a parameter that only adds a leading dim of 1 (a weight
seen as a batch of one: context parallelism's products, ``distir.parallel.context_model``) is a
free view, taken again from the parameter in the backward rather than saved — a saved view would
keep a ZeRO-3 gather alive.

Recomputation is emitted lazily, right before its first use, so recomputed values die as early as
possible.

Cotangents of a value used several times are summed. A parameter in ``wrt`` that the outputs do
not depend on gets a zero gradient (``FillLike``). Integer values are never active.

``split_weight_grad`` splits a backward function into the input-gradient part and the
weight-gradient part (the zero-bubble pipeline schedules run them separately).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain, flat_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.printer import print_op
from distir.ir.rewrite import ValueMap, copy_instr, eliminate_dead_code
from distir.ir.types import TensorType, Type
from distir.ir.values import Value
from distir.ops import float8
from distir.ops.elementwise import STOP_GRADIENT
from distir.ops.float8 import FLOAT8_CAST
from distir.ops.gradrules import NotDifferentiableError
from distir.ops.registry import REGISTRY
from distir.ops.shape.family import FAMILY as SHAPE_FAMILY
from distir.ops.shape.views import RESHAPE

RecomputePolicy = Callable[[Op, Function], bool]
"""``policy(op, fn)``: True to save ``op``'s results for the backward, False to recompute them."""


def SAVE_ALL(op: Op, fn: Function) -> bool:
    return True


def RECOMPUTE_ALL(op: Op, fn: Function) -> bool:
    return False


def attention_core(fn: Function) -> frozenset[Op]:
    """The ops of ``fn`` in attention's core (module docstring): the registry's flagged ops and,
    around a flagged op with a single input, the weight-free chain up to the contraction on
    each side. An activation is any value but a weight (a parameter after the first)."""
    got = _CORE.get(id(fn))
    if got is not None and got[0] is fn:
        return got[1]
    weights = set(fn.params[1:])
    ops = [i for i in fn.body if isinstance(i, Op)]
    producer = {o: op for op in ops for o in op.outputs}
    consumers: dict[Value, list[Op]] = {}
    for op in ops:
        for v in op.inputs:
            consumers.setdefault(v, []).append(op)

    def acts(op: Op) -> list[Value]:
        return [v for v in op.inputs if v not in weights]

    def chainable(op: Op) -> bool:  # part of the chain: no weight input
        return not any(v in weights for v in op.inputs)

    core: set[Op] = set()
    for op in ops:
        if not REGISTRY[op.name].attention_core:
            continue
        core.add(op)
        if len(op.inputs) != 1 or op.inputs[0] in weights:  # the fused op is the core by itself
            continue
        back = producer.get(op.inputs[0])
        while back is not None and chainable(back) and back not in core:
            core.add(back)
            back = producer.get(acts(back)[0]) if len(acts(back)) == 1 else None
        todo = [c for o in op.outputs for c in consumers.get(o, [])]
        while todo:
            nxt = todo.pop()
            if nxt in core or not chainable(nxt):
                continue
            core.add(nxt)
            if len(acts(nxt)) == 1:
                todo.extend(c for o in nxt.outputs for c in consumers.get(o, []))
    found = frozenset(core)
    if len(_CORE) >= 256:
        _CORE.clear()
    _CORE[id(fn)] = (fn, found)
    return found


# ``attention_core``'s answers by function identity (the function kept alive); bounded
_CORE: dict[int, tuple[Function, frozenset[Op]]] = {}


def SELECTIVE(op: Op, fn: Function) -> bool:
    """Megatron-LM's selective recomputation: save everything but attention's core
    (``attention_core``), which is recomputed."""
    return op not in attention_core(fn)


def SAVE_PRODUCTS(op: Op, fn: Function) -> bool:
    """PyTorch's op-level selective activation checkpointing as torchtitan runs it
    (``selective_ac_option = "op"``): save the results of the fused attention and of the odd
    matrix products with a weight (ops whose registry entry describes a GEMM shape,
    ``OpDef.gemm``: the 1st, 3rd, ... of the layer, in program order — torchtitan's policy
    recomputes every second ``mm``); recompute the rest (norms, activations, elementwise
    chains, the even products). A product of float8 operands counts as one with a weight when
    an operand is the float8 cast of a weight (``saved_products``): torchao eab345c's Float8
    matmul calls ``torch.mm`` on two ``Float8Tensor`` operands, which the checkpointing policy
    sees as ``aten.mm`` before the subclass turns it into ``aten._scaled_mm``
    (``float8_linear.py``, ``float8_ops.py``), so torchtitan's ``_save_list`` (9dec370,
    ``parallelize_llama.py``: ``aten.mm``) saves every other Float8 product's bf16 result as it
    does a bf16 one's."""
    d = REGISTRY[op.name]
    if d.gemm is not None:
        return op in saved_products(fn)
    return d.attention_core and len(op.inputs) > 1  # the fused op, not a lone softmax


def saved_products(fn: Function) -> frozenset[Op]:
    """The matrix products with a weight that ``SAVE_PRODUCTS`` saves: every other one, from
    the first, in ``fn``'s program order (memoized per function)."""
    got = _PRODUCTS.get(id(fn))
    if got is not None and got[0] is fn:
        return got[1]
    weights = set(fn.params[1:])
    made = {v: op for op in fn.ops() for v in op.outputs}
    products = [
        op
        for op in fn.ops()
        if REGISTRY[op.name].gemm is not None and any(_weight_operand(v, weights, made) for v in op.inputs)
    ]
    found = frozenset(products[::2])
    if len(_PRODUCTS) >= 256:
        _PRODUCTS.clear()
    _PRODUCTS[id(fn)] = (fn, found)
    return found


_PRODUCTS: dict[int, tuple[Function, frozenset[Op]]] = {}


def _weight_operand(v: Value, weights: set[Value], made: dict[Value, Op]) -> bool:
    """Whether ``v`` is a weight, or a weight seen through single-input views (the shape
    family) and float8 casts (``FLOAT8_CAST``: Float8 training's cast of the weight)."""
    for _ in range(8):  # a weight is a few views and casts away, never more
        if v in weights:
            return True
        op = made.get(v)
        if op is None or len(op.inputs) != 1:
            return False
        if op.name != FLOAT8_CAST.name and REGISTRY[op.name].family != SHAPE_FAMILY:
            return False
        v = op.inputs[0]
    return False


def SAVE_PRODUCTS_EAGER(op: Op, fn: Function) -> bool:
    """``SAVE_PRODUCTS`` run eagerly: the same results saved, each cached until the block's
    backward whether the backward reads it or not (module docstring)."""
    return SAVE_PRODUCTS(op, fn)


# policies that cache every result they save, as eager PyTorch's selective checkpointing does
# (module docstring); the others save only what the backward reads, as autograd does
CACHING_POLICIES: frozenset[RecomputePolicy] = frozenset({SAVE_PRODUCTS_EAGER})

# policies that save each float8 cast's amax, so the backward casts again in one pass
# (``Float8Cast(scaling=saved)``): torchtitan's ``_save_list`` (9dec370,
# ``parallelize_llama.py``) holds ``aten.abs`` and ``aten.max`` ("for low precision training,
# it's useful to always save the result of max(abs(tensor))"), and torchao's dynamic scale is
# ``max(abs(x))`` (eab345c ``float8_utils.py`` ``tensor_to_amax``)
AMAX_SAVING_POLICIES: frozenset[RecomputePolicy] = frozenset({SAVE_PRODUCTS, SAVE_PRODUCTS_EAGER})


POLICIES: dict[str, RecomputePolicy] = {
    "none": SAVE_ALL,
    "full": RECOMPUTE_ALL,
    "selective": SELECTIVE,
    "ops": SAVE_PRODUCTS,
    "ops-eager": SAVE_PRODUCTS_EAGER,
}


class AutodiffError(ValueError):
    pass


@dataclass(frozen=True)
class VJP:
    """``fwd`` returns the original results then the residuals; ``bwd`` takes the parameters of
    the original function it reads (``bwd_params``: their indices), then the residuals, then one
    cotangent per active output. Parameters are passed by the caller rather than saved, so a
    caller may hand the backward a re-gathered weight (ZeRO-3) instead of keeping it alive."""

    fwd: Function
    bwd: Function
    n_outputs: int
    n_residuals: int
    bwd_params: tuple[int, ...]
    active_outputs: tuple[int, ...]  # outputs that get a cotangent parameter in bwd, in order
    wrt: tuple[int, ...]  # parameters whose gradients bwd returns, in order


class _Ctx:
    """The GradCtx handed to gradient rules (see distir.ops.gradrules)."""

    def __init__(
        self, fn: Function, types: dict[Value, Type], policy: RecomputePolicy, fb: FunctionBuilder
    ) -> None:
        self.fn = fn
        self.types = types
        self.policy = policy
        self.fb = fb
        self.producer: dict[Value, Op] = {}
        for instr in fn.body:
            assert isinstance(instr, Op)
            for o in instr.outputs:
                self.producer[o] = instr
        self.params = set(fn.params)
        self.saved: list[Value] = []  # forward values saved, in order of first use
        self.bwd_of: dict[Value, Value] = {}  # forward value -> its backward stand-in
        self.recast: set[Op] = set()  # the forward's float8 casts the backward runs again

    def op(self, name: str, *inputs: Value, n_out: int | None = None, **attrs: object) -> tuple[Value, ...]:
        extra: dict[str, Any] = attrs
        return self.fb.op(name, *inputs, n_out=n_out, **extra)

    def type(self, v: Value) -> TensorType:
        t = self.types[v]
        if not isinstance(t, TensorType):
            raise AutodiffError(f"%{v.name} is {t}, not a tensor")
        return t

    def primal(self, v: Value) -> Value:
        got = self.bwd_of.get(v)
        if got is not None:
            return got
        op = self.producer.get(v)
        view = op is not None and _leading_view(op, self.params)
        if v in self.params or (op is not None and op.inputs and not view and self.policy(op, self.fn)):
            got = Value(v.name, None)
            self.saved.append(v)
            self.bwd_of[v] = got
            return got
        assert op is not None
        ins = [self.primal(x) for x in op.inputs]
        attrs = op.attrs
        if op.name == FLOAT8_CAST.name:  # run again: one layout, the saved amax (float8 module)
            self.recast.add(op)
            attrs = float8.recomputed(attrs, self.policy in AMAX_SAVING_POLICIES)
        outs = self.fb.emit(op.name, ins, attrs, [o.name for o in op.outputs])
        for o, n in zip(op.outputs, outs, strict=True):
            self.bwd_of[o] = n
        return self.bwd_of[v]


def value_types(module: Module, fn: Function, arg_types: Sequence[Type]) -> dict[Value, Type]:
    """The type of every value of ``fn`` called with ``arg_types`` (abstract interpretation;
    a flat body without known-value rules by ``flat_types``, the same types without the
    interpreter's dispatch)."""
    flat = flat_types(fn, arg_types)
    if flat is not None:
        return flat
    _, env = interpret(module, fn, list(arg_types), TypeDomain(concrete_limit=0))
    return {v: type_of(x) for v, x in env.items()}


def _float(t: Type | None) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_float


def _leading_view(op: Op, params: set[Value]) -> bool:
    """``Reshape(p, shape=(1, …))`` of a parameter ``p`` with an explicit shape (module docstring)."""
    if op.name != RESHAPE.name or len(op.inputs) != 1 or op.inputs[0] not in params:
        return False
    shape = op.attrs.get("shape")
    return (
        isinstance(shape, tuple)
        and len(shape) > 1
        and shape[0] == 1
        and all(isinstance(x, int) and x > 0 for x in shape)
    )


def vjp(
    module: Module,
    fn: Function,
    arg_types: Sequence[Type],
    wrt: Sequence[int],
    policy: RecomputePolicy = SAVE_ALL,
    name: str | None = None,
) -> VJP:
    """Forward and backward functions of ``fn`` at ``arg_types`` (module docstring)."""
    base = name or fn.name
    if any(isinstance(i, Call) for i in fn.body):
        raise AutodiffError(f"@{fn.name} contains calls; inline them before differentiating")
    types = value_types(module, fn, arg_types)
    for i in wrt:
        if not 0 <= i < len(fn.params):
            raise AutodiffError(f"@{fn.name} has no parameter {i}")
        if not _float(types[fn.params[i]]):
            raise AutodiffError(
                f"cannot differentiate @{fn.name} with respect to %{fn.params[i].name}: "
                f"it is {types[fn.params[i]]}, not a floating-point tensor"
            )
    active: set[Value] = {fn.params[i] for i in wrt}
    for instr in fn.body:
        if any(v in active for v in instr.inputs):
            active.update(o for o in instr.outputs if _float(types.get(o)))
    fb = FunctionBuilder(f"{base}_bwd", REGISTRY.out_arity)
    ctx = _Ctx(fn, types, policy, fb)
    cot: dict[Value, Value] = {}
    cot_params: list[Value] = []
    active_outputs: list[int] = []
    for k, o in enumerate(fn.outputs):
        if o in active and o not in cot:
            p = Value(f"d{o.name}", None)
            cot[o] = p
            cot_params.append(p)
            active_outputs.append(k)
    for instr in reversed(fn.body):
        assert isinstance(instr, Op)
        douts = [cot.get(o) for o in instr.outputs]
        if all(d is None for d in douts) or not any(v in active for v in instr.inputs):
            continue
        rule = REGISTRY[instr.name].grad
        if rule is None:
            raise NotDifferentiableError(
                f"`{print_op(instr)}` in @{fn.name}: {instr.name} has no gradient rule, but the gradient "
                "flows through it"
            )
        dins = rule(ctx, instr, douts)
        if len(dins) != len(instr.inputs):  # pragma: no cover - a broken rule
            raise AutodiffError(f"{instr.name}'s gradient rule returned {len(dins)} values")
        for v, d in zip(instr.inputs, dins, strict=True):
            if d is None or v not in active:
                continue
            prev = cot.get(v)
            cot[v] = d if prev is None else fb.op("Add", prev, d, names=[f"d{v.name}"])[0]
    held = _hold_cached(ctx, fn, active) if policy in CACHING_POLICIES else frozenset()
    grads: list[Value] = []
    for i in wrt:
        p = fn.params[i]
        g = cot.get(p)
        if g is None:
            (g,) = fb.op("FillLike", ctx.primal(p), names=[f"d{p.name}"], value=0.0)
        grads.append(g)
    body_fn = fb.ret(*grads)
    index = {p: j for j, p in enumerate(fn.params)}
    used_params = sorted((v for v in ctx.saved if v in index), key=index.__getitem__)
    residuals = [v for v in ctx.saved if v not in index]
    kept = {i for i in body_fn.body if any(o in held for o in i.outputs)}
    bwd = eliminate_dead_code(
        Function(
            body_fn.name,
            (*(ctx.bwd_of[v] for v in (*used_params, *residuals)), *cot_params),
            (*(i for i in body_fn.body if i in kept), *(i for i in body_fn.body if i not in kept)),
            body_fn.outputs,
        ),
        keep=kept.__contains__,
    )
    # a fresh copy of the forward code: the module keeps the original function too
    vmap = ValueMap()
    fwd_params = tuple(Value(p.name, None) for p in fn.params)
    for p, q in zip(fn.params, fwd_params, strict=True):
        vmap.bind(p, q)
    fwd = Function(
        f"{base}_fwd",
        fwd_params,
        tuple(_forward_copy(i, vmap, ctx.recast) for i in fn.body),
        tuple(vmap(v) for v in (*fn.outputs, *residuals)),
    )
    return VJP(
        fwd,
        bwd,
        len(fn.outputs),
        len(residuals),
        tuple(index[v] for v in used_params),
        tuple(active_outputs),
        tuple(wrt),
    )


def _forward_copy(instr: Instr, vmap: ValueMap, recast: set[Op]) -> Instr:
    """``instr`` copied into the forward function; a float8 cast the backward runs again
    writes one layout there (``distir.ops.float8``)."""
    got = copy_instr(instr, vmap)
    if instr in recast and isinstance(got, Op):
        return Op(got.name, got.inputs, got.outputs, float8.one_layout(got.attrs))
    return got


def _hold_cached(ctx: _Ctx, fn: Function, active: set[Value]) -> frozenset[Value]:
    """Under a caching policy, the saved results on the gradient's path that no gradient rule
    read, made residuals, each with the backward's ``StopGradient`` of it that ends its life
    (module docstring): the ``StopGradient`` results, which the caller keeps at the backward's
    start."""
    out: list[Value] = []
    results = set(fn.outputs)
    for instr in fn.body:
        assert isinstance(instr, Op)
        if not instr.inputs or _leading_view(instr, ctx.params) or not ctx.policy(instr, ctx.fn):
            continue
        for o in instr.outputs:
            if o in ctx.bwd_of or o in results or o not in active:
                continue
            out.extend(ctx.fb.op(STOP_GRADIENT.name, ctx.primal(o), names=[f"{o.name}_cached"]))
    return frozenset(out)


def split_weight_grad(
    bwd: Function, n_input_grads: int, rerun: Callable[[Op], bool] | None = None
) -> tuple[Function, Function]:
    """Split ``bwd`` (results: ``n_input_grads`` input gradients, then weight gradients) into
    ``@<bwd>_i(params...) -> (input grads..., carried...)`` and ``@<bwd>_w(carried...) -> (weight
    grads...)``. The input part holds every op the input gradients need; the weight part holds
    the rest; *carried* are the values the weight part needs from the input part (or from the
    parameters — passed through). An op of the input part for which ``rerun`` holds, whose
    result the weight part reads, runs again in the weight part on its (carried) inputs instead
    of its result being carried: e.g. a gather of sequence-parallel slices, which Megatron-style
    weight-gradient stores hold as slices and gather again in the weight pass."""
    producer: dict[Value, Op] = {}
    for instr in bwd.body:
        assert isinstance(instr, Op)
        for o in instr.outputs:
            producer[o] = instr

    def slice_of(roots: Sequence[Value]) -> set[Op]:
        need: set[Op] = set()
        stack = list(roots)
        while stack:
            v = stack.pop()
            op = producer.get(v)
            if op is not None and op not in need:
                need.add(op)
                stack.extend(op.inputs)
        return need

    i_ops = slice_of(bwd.outputs[:n_input_grads])
    w_ops = slice_of(bwd.outputs[n_input_grads:]) - i_ops
    if rerun is not None:
        read = {v for op in w_ops for v in op.inputs} | set(bwd.outputs[n_input_grads:])
        w_ops |= {op for v in read if (op := producer.get(v)) is not None and op in i_ops and rerun(op)}
    w_defined = {o for op in w_ops for o in op.outputs}
    carried: list[Value] = []
    seen: set[Value] = set()
    for instr in bwd.body:
        if instr in w_ops:
            for v in instr.inputs:
                if v not in w_defined and v not in seen:
                    seen.add(v)
                    carried.append(v)
    for v in bwd.outputs[n_input_grads:]:
        if v not in w_defined and v not in seen:
            seen.add(v)
            carried.append(v)
    i_fn = Function(
        f"{bwd.name}_i",
        bwd.params,
        tuple(i for i in bwd.body if i in i_ops),
        (*bwd.outputs[:n_input_grads], *carried),
    )
    fresh = {v: Value(v.name, None) for v in carried}

    def m(v: Value) -> Value:
        return fresh.get(v, v)

    w_body = tuple(
        Op(op.name, tuple(m(v) for v in op.inputs), op.outputs, op.attrs)
        for op in bwd.body
        if isinstance(op, Op) and op in w_ops
    )
    w_fn = Function(
        f"{bwd.name}_w",
        tuple(fresh[v] for v in carried),
        w_body,
        tuple(m(v) for v in bwd.outputs[n_input_grads:]),
    )
    return i_fn, w_fn
