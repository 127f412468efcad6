"""Mixture of experts: MoE (a top-k routed block of SwiGLU experts) and its gradient MoEGrad.

``Y = MoE(X, Wg, W1, W3, W2; top_k, normalize)`` is the sparse MoE block as Mixtral computes it
(Hugging Face's ``MixtralSparseMoeBlock``), for ``X`` (..., H) — every leading position a token:

- the router: ``logits = X Wgᵀ`` with ``Wg`` (E, H), ``p = softmax(logits)`` over the E experts,
  the ``top_k`` largest probabilities per token (``torch.topk``'s choice) and, when ``normalize``
  (Mixtral; Qwen-MoE's ``norm_topk_prob``), those k weights divided by their sum;
- expert ``e``'s FFN: ``FFN_e(x) = W2_e (silu(W1_e x) ⊙ W3_e x)`` with ``W1``, ``W3`` (E, F, H)
  (the gate and up projections) and ``W2`` (E, H, F) (the down projection);
- ``Y[t] = Σ_j w[t, j] · FFN_{e[t, j]}(X[t])`` over the token's k chosen experts.

No capacity limit (no token is dropped: Mixtral's and HF's dropless routing), no router
jitter, no auxiliary load-balancing loss (the router logits are not a result). The references
compute in float64 and round once.

``dX, dWg, dW1, dW3, dW2 = MoEGrad(dY, X, Wg, W1, W3, W2; ...)`` is its backward, as autograd
differentiates the forward: the choice of experts is piecewise constant (no gradient through the
top-k selection); gradients reach the router through the chosen experts' weights (the
normalization, then the softmax over all E).

Costs: the router's matmul (2·T·H·E) and softmax, and T·k expert FFNs of three matmuls each
(6·T·k·H·F) with their SwiGLU; the backward twice the matmuls (and the router's again). Bytes
are the operands' and results' (the default): every expert's weights are read whatever the
routing. Its GEMM shape is a batch of 3·E products of (T·k/E × H) by (H × F): each expert
receives its share of the tokens on average (balanced routing).

Sharding: the tokens (any leading dim of X, Y and dX; weights replicated, their gradients
pending sums), and tensor parallelism inside the experts (W1, W3 on their F dim 1, W2 on its F
dim 2: each device computes a slice of every expert's hidden features, the result a pending
sum; the router is replicated). MoEGrad is linear in dY. No expert parallelism: the experts'
dim 0 stays whole (a device holding some experts would need the token dispatch, an all-to-all).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from distir.hardware.gemm import GemmShape
from distir.ir.dtensor import Placement, Shard
from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import float_input, int_attr, same_dtype
from distir.ops._special import F64, f64
from distir.ops.gradrules import GradCtx
from distir.ops.nn import softmax
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "moe"
COST_CLASS = CostClass.MOE  # how the family's ops are costed
ATTRS = {"top_k": AttrSpec("int"), "normalize": AttrSpec("bool", True)}


class Dims(NamedTuple):
    """The sizes of a MoE op: tokens T, model width H, experts E, expert hidden width F, k."""

    tokens: int
    hidden: int
    experts: int
    ffn: int
    k: int


def _dims(ins: Sequence[Type], attrs: Attrs, first: int) -> Dims:
    x, w1 = ins[first], ins[first + 2]
    assert isinstance(x, TensorType) and isinstance(w1, TensorType)
    return Dims(
        int(np.prod(x.shape[:-1])), x.shape[-1], w1.shape[0], w1.shape[1], int_attr(attrs, "top_k", 1)
    )


# -- type rules -------------------------------------------------------------------------------
def _check(ctx: TypeCtx, first: int) -> TensorType:
    """X, Wg, W1, W3, W2 from input ``first`` on: their shapes agree (module docstring)."""
    x = float_input(ctx, first, "X")
    same_dtype(ctx, list(range(first, first + 5)))
    if x.rank < 1:
        ctx.fail(f"{ctx.op.name}: X must have rank >= 1 (..., H)", first, "rank >= 1", x.rank)
    h = x.shape[-1]
    wg, w1, w3, w2 = (ctx.tensor(first + i) for i in range(1, 5))
    e, f = (w1.shape[0], w1.shape[1]) if w1.rank == 3 else (0, 0)
    want = {1: (e, h), 2: (e, f, h), 3: (e, f, h), 4: (e, h, f)}
    for i, t in ((1, wg), (2, w1), (3, w3), (4, w2)):
        if t.shape != want[i]:
            name = ctx.op.inputs[first + i]
            ctx.fail(
                f"{ctx.op.name}: {name} must be {want[i]} for X (..., {h}) and W1 (E, F, H), got {t.shape}",
                first + i,
                want[i],
                t.shape,
            )
    k = ctx.attr("top_k")
    if not 1 <= k <= e:
        ctx.fail(f"{ctx.op.name}: top_k={k} must be in [1, {e}] (the number of experts)", None, e, k)
    return x


def _moe_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = _check(ctx, 0)
    return (ctx.out(x.dtype, x.shape),)


def _moe_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = _check(ctx, 1)
    dy = ctx.tensor(0)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        ctx.fail("MoEGrad: dY must be like X", 0, (x.dtype, x.shape), (dy.dtype, dy.shape))
    return tuple(ctx.out(t.dtype, t.shape) for t in map(ctx.tensor, range(1, 6)))


# -- references -------------------------------------------------------------------------------
class Routing(NamedTuple):
    """A router's decision per token: the softmax ``probs`` (T, E), the chosen ``experts``
    (T, k) in decreasing probability and their ``weights`` (T, k)."""

    probs: F64
    experts: np.ndarray
    weights: F64


def route(x: F64, wg: F64, k: int, normalize: bool) -> Routing:
    """The router of the module docstring on tokens ``x`` (T, H)."""
    p = softmax(x @ wg.T, -1)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, axis=-1)
    if normalize:
        w = w / w.sum(-1, keepdims=True)
    return Routing(p, idx, w)


def _silu(z: F64) -> F64:
    return z / (1.0 + np.exp(-z))


def _ffn(x: F64, w1: F64, w3: F64, w2: F64) -> tuple[F64, F64, F64]:
    """One expert on tokens ``x``: (its result, the gate pre-activation, the up projection)."""
    g, u = x @ w1.T, x @ w3.T
    return (_silu(g) * u) @ w2.T, g, u


def _moe_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x0 = np.asarray(args[0])
    x = f64(x0).reshape(-1, x0.shape[-1])
    wg, w1, w3, w2 = (f64(a) for a in args[1:5])
    r = route(x, wg, int_attr(attrs, "top_k", 1), bool(attrs.get("normalize", True)))
    y = np.zeros_like(x)
    for e in range(w1.shape[0]):
        tok, j = np.nonzero(r.experts == e)
        if tok.size:
            y[tok] += r.weights[tok, j, None] * _ffn(x[tok], w1[e], w3[e], w2[e])[0]
    return (y.reshape(x0.shape).astype(x0.dtype),)


def _moe_grad_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x0 = np.asarray(args[1])
    h = x0.shape[-1]
    dy, x = f64(args[0]).reshape(-1, h), f64(x0).reshape(-1, h)
    wg, w1, w3, w2 = (f64(a) for a in args[2:6])
    normalize = bool(attrs.get("normalize", True))
    r = route(x, wg, int_attr(attrs, "top_k", 1), normalize)
    dx, dw1, dw3, dw2 = np.zeros_like(x), np.zeros_like(w1), np.zeros_like(w3), np.zeros_like(w2)
    dw = np.zeros_like(r.weights)  # ∂/∂ of each chosen expert's weight
    for e in range(w1.shape[0]):
        tok, j = np.nonzero(r.experts == e)
        if not tok.size:
            continue
        xe = x[tok]
        out, g, u = _ffn(xe, w1[e], w3[e], w2[e])
        dw[tok, j] = np.sum(dy[tok] * out, axis=-1)
        do = r.weights[tok, j, None] * dy[tok]
        sg = 1.0 / (1.0 + np.exp(-g))
        act = g * sg * u
        dw2[e] = do.T @ act
        da = do @ w2[e]
        du = da * g * sg
        dg = da * u * sg * (1.0 + g * (1.0 - sg))
        dw1[e], dw3[e] = dg.T @ xe, du.T @ xe
        dx[tok] += dg @ w1[e] + du @ w3[e]
    chosen = np.take_along_axis(r.probs, r.experts, axis=-1)
    if normalize:  # w = c / Σc: ∂c = (∂w − Σ ∂w·w) / Σc
        dw = (dw - np.sum(dw * r.weights, -1, keepdims=True)) / chosen.sum(-1, keepdims=True)
    dp = np.zeros_like(r.probs)
    np.put_along_axis(dp, r.experts, dw, axis=-1)
    dlogits = r.probs * (dp - np.sum(dp * r.probs, -1, keepdims=True))
    dx += dlogits @ wg
    dwg = dlogits.T @ x
    outs = (dx.reshape(x0.shape), dwg, dw1, dw3, dw2)
    return tuple(o.astype(np.asarray(a).dtype) for o, a in zip(outs, args[1:6], strict=True))


# -- costs ------------------------------------------------------------------------------------
def _router_flops(d: Dims) -> float:
    return 2.0 * d.tokens * d.hidden * d.experts + 5.0 * d.tokens * d.experts


def _experts_flops(d: Dims) -> float:
    """T·k expert FFNs: three matmuls and the SwiGLU, then the weighted sum."""
    return d.tokens * d.k * (6.0 * d.hidden * d.ffn + 5.0 * d.ffn + 2.0 * d.hidden)


def _moe_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    d = _dims(ins, attrs, 0)
    return _router_flops(d) + _experts_flops(d)


def _moe_grad_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    d = _dims(ins, attrs, 1)
    return 2.0 * (_router_flops(d) + _experts_flops(d))


def _gemm(first: int) -> Any:
    def shape(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> GemmShape:
        d = _dims(ins, attrs, first)
        return GemmShape(3 * d.experts, max(1, d.tokens * d.k // d.experts), d.ffn, d.hidden)

    return shape


# -- sharding ---------------------------------------------------------------------------------
R = sh.R
SUM = sh.SUM
EXPERT_TP: tuple[Placement, ...] = (R, Shard(1), Shard(1), Shard(2))  # Wg, W1, W3, W2


def _token_dims(x: Type) -> list[int]:
    return [d for d, s in enumerate(x.shape[:-1]) if s > 1] if isinstance(x, TensorType) else []


def _moe_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    found = [sh.replicated(ins, outs)]
    found += [sh.Strategy((Shard(d), R, R, R, R), (Shard(d),)) for d in _token_dims(ins[0])]
    found.append(sh.Strategy((R, *EXPERT_TP), (SUM,)))
    return found


def _moe_grad_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    found = [sh.replicated(ins, outs)]
    found += [
        sh.Strategy((Shard(d), Shard(d), R, R, R, R), (Shard(d), SUM, SUM, SUM, SUM))
        for d in _token_dims(ins[1])
    ]
    found.append(sh.Strategy((R, R, *EXPERT_TP), (SUM, SUM, Shard(1), Shard(1), Shard(2))))
    found.append(sh.linear_first(ins, outs))
    return found


MOE = register(
    OpDef(
        name="MoE",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("X", "Wg", "W1", "W3", "W2"),
        outputs=("Y",),
        infer=_moe_rule,
        attrs=dict(ATTRS),
        reference=_moe_ref,
        flops=_moe_flops,
        gemm=_gemm(0),
        doc="Mixtral's sparse MoE block: top_k softmax routing (normalized), SwiGLU experts "
        "W2_e(silu(W1_e x)·W3_e x), the chosen experts' weighted sum per token.",
        sharding=_moe_sharding,
    )
)
MOE_GRAD = register(
    OpDef(
        name="MoEGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY", "X", "Wg", "W1", "W3", "W2"),
        outputs=("dX", "dWg", "dW1", "dW3", "dW2"),
        infer=_moe_grad_rule,
        attrs=dict(ATTRS),
        reference=_moe_grad_ref,
        flops=_moe_grad_flops,
        gemm=_gemm(1),
        doc="The gradient of MoE with respect to X and its four weights (no gradient through "
        "the top-k choice).",
        sharding=_moe_grad_sharding,
    )
)


def _moe_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    dy = douts[0]
    if dy is None:
        return [None] * 5
    attrs = {"top_k": int_attr(op.attrs, "top_k", 1), "normalize": bool(op.attrs.get("normalize", True))}
    return ctx.op("MoEGrad", dy, *(ctx.primal(v) for v in op.inputs), **attrs)


MOE.fill("grad", _moe_grad)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def moe_torch(torch: Any, x: Any, wg: Any, w1: Any, w3: Any, w2: Any, k: int, normalize: bool) -> Any:
    """MoE in torch (``torch`` is the module), as HF's eager experts loop computes it: the
    router in f32 (in the dtype when wider), each expert on the tokens routed to it, results
    added back per token."""
    shape = x.shape
    xt = x.reshape(-1, shape[-1])
    logits = xt @ wg.t()
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    w, idx = torch.topk(p, k, dim=-1)
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    w = w.to(x.dtype)
    y = torch.zeros_like(xt)
    for e in range(w1.shape[0]):
        tok, j = torch.where(idx == e)
        if tok.numel():
            xe = xt[tok]
            out = (torch.nn.functional.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t()
            y = y.index_add(0, tok, out * w[tok, j, None])
    return y.reshape(shape)


def _attrs(attrs: Attrs) -> tuple[int, bool]:
    return int_attr(attrs, "top_k", 1), bool(attrs.get("normalize", True))


def _moe_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, wg, w1, w3, w2 = xs
    return (moe_torch(ctx.torch, x, wg, w1, w3, w2, *_attrs(attrs)),)


def _moe_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The backward by torch's autograd through ``moe_torch``."""
    torch = ctx.torch
    with torch.enable_grad():
        prim = [v.detach().requires_grad_(True) for v in xs[1:]]
        x, wg, w1, w3, w2 = prim
        y = moe_torch(torch, x, wg, w1, w3, w2, *_attrs(attrs))
        return tuple(torch.autograd.grad(y, prim, xs[0]))


MOE.fill("torch", _moe_torch)
MOE_GRAD.fill("torch", _moe_grad_torch)

__all__ = ["MOE", "MOE_GRAD", "Routing", "moe_torch", "route"]
