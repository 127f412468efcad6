"""The MoE op (``distir.ops.moe``): its reference equals a per-token oracle written from the
definition (every token's top-k experts by a sort, their FFNs, the weighted sum), its FLOPs are
the closed form (router + T·k expert FFNs), and it offers the tensor-parallel split of the experts'
hidden dim (every strategy is checked sound in ``parallel/test_moe_sharding``). The gradient is checked by
finite differences in ``test_grad_rules``; the torch implementation in ``test_torch_ops``; the
whole block against Hugging Face's Mixtral in ``frontends/test_torch_import_numeric``."""

from __future__ import annotations

import numpy as np
import pytest
from ops_examples import T, f64

from distir.ir.dtensor import Shard
from distir.ir.values import Attrs
from distir.ops import REGISTRY
from distir.ops.sharding import SUM, R


def _oracle(
    x: np.ndarray, wg: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray, k: int, norm: bool
) -> np.ndarray:
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        logits = wg @ x[t]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = sorted(range(len(p)), key=lambda e: -p[e])[:k]
        total = sum(p[e] for e in chosen) if norm else 1.0
        for e in chosen:
            g, u = w1[e] @ x[t], w3[e] @ x[t]
            y[t] += p[e] / total * (w2[e] @ (g / (1 + np.exp(-g)) * u))
    return y


@pytest.mark.parametrize(("k", "norm"), [(1, False), (2, True), (3, True), (4, False)])
def test_reference_equals_the_per_token_oracle(k: int, norm: bool) -> None:
    rng = np.random.default_rng(k)
    e, h, f = 4, 5, 3
    x = rng.standard_normal((2, 3, h))
    ws = [rng.standard_normal(s) for s in ((e, h), (e, f, h), (e, f, h), (e, h, f))]
    (y,) = REGISTRY["MoE"].reference([x, *ws], Attrs({"top_k": k, "normalize": norm}))
    np.testing.assert_allclose(y.reshape(-1, h), _oracle(x.reshape(-1, h), *ws, k, norm), rtol=1e-12)


def test_flops_are_the_router_and_k_expert_ffns_per_token() -> None:
    tokens, h, e, f, k = 6, 4, 4, 5, 2
    ins = [T(f64, 2, 3, h), T(f64, e, h), T(f64, e, f, h), T(f64, e, f, h), T(f64, e, h, f)]
    outs = [T(f64, 2, 3, h)]
    fwd = REGISTRY["MoE"].flops(ins, outs, Attrs({"top_k": k}))
    router = 2 * tokens * h * e + 5 * tokens * e
    experts = tokens * k * (3 * 2 * h * f + 5 * f + 2 * h)
    assert fwd == router + experts
    grad = REGISTRY["MoEGrad"].flops([outs[0], *ins], ins, Attrs({"top_k": k}))
    assert grad == 2 * fwd


def test_tensor_parallel_strategy_splits_the_experts_hidden_dim() -> None:
    ins = [T(f64, 6, 4), T(f64, 4, 4), T(f64, 4, 6, 4), T(f64, 4, 6, 4), T(f64, 4, 4, 6)]
    found = REGISTRY["MoE"].strategies(ins, [T(f64, 6, 4)], Attrs({"top_k": 2}), 2)
    tp = [s for s in found if s.ins[2] == Shard(1)]
    assert [(s.ins, s.outs) for s in tp] == [((R, R, Shard(1), Shard(1), Shard(2)), (SUM,))]
