"""The transformers' fused QKV projection (``qkv=fused``: one GEMM of one weight laid out per
query group, as Megatron-Core's ``linear_qkv``) computes what the three projections compute: the
same loss and gradients on the reference executor, for multi-head and grouped-query attention,
and tensor parallelism over whole heads gives the sequential step; in the simulator its split
into q, k and v is views (no kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.reverse import value_types
from distir.autodiff.train import Optimizer, layer_types, training_step
from distir.frontends.zoo import Model, build_model
from distir.interp.reference import run_reference
from distir.ir.types import DType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import sharded_layers
from distir.parallel.strategy import parse_strategy

from .test_zoo_numeric import values

LR = 0.5
MHA = "gpt:layers=2,hidden=16,heads=2,seq=6,vocab=24"
GQA = "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=20,vocab=24,seq=6"
MQA = "llama:layers=1,hidden=12,heads=3,kv_heads=1,ffn=10,vocab=16,seq=5"
LLAMA_MHA = "llama:layers=1,hidden=12,heads=3,kv_heads=3,ffn=10,vocab=16,seq=5"


def _heads(model: Model) -> tuple[int, int, int]:
    c = model.config
    heads = int(c["heads"])  # type: ignore[call-overload]
    kv = int(c.get("kv_heads", heads))  # type: ignore[call-overload]
    return heads, kv, int(c["hidden"]) // heads  # type: ignore[call-overload]


def fuse(parts: tuple[np.ndarray, np.ndarray, np.ndarray], heads: int, kv: int, d: int) -> np.ndarray:
    """Q, K, V weights (or biases: the last axis is the columns) laid out per query group:
    ``[q_{jg} … q_{jg+g-1}, k_j, v_j]`` for each kv head ``j``."""
    q, k, v = parts
    g = heads // kv
    cols = []
    for j in range(kv):
        cols += [q[..., j * g * d : (j + 1) * g * d], k[..., j * d : (j + 1) * d]]
        cols.append(v[..., j * d : (j + 1) * d])
    return np.concatenate(cols, axis=-1)


def _step(model: Model, vals: dict[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and every weight's gradient (from one SGD step's update) on the reference executor."""
    step = training_step(model, Optimizer("sgd", lr=LR))
    out = run_reference(step, [vals[p.name] for p in step.entry.params])
    grads = {w.name: (vals[w.name] - new) / LR for w, new in zip(model.weights, out[1:], strict=True)}
    return float(out[0]), grads


def _fused_values(
    split: dict[str, np.ndarray], layers: int, hkd: tuple[int, int, int]
) -> dict[str, np.ndarray]:
    """``split``'s values (or gradients) by the fused model's weight names."""
    out = {n: a for n, a in split.items() if not n.startswith(("wq_", "wk_", "wv_", "bq_", "bk_", "bv_"))}
    for i in range(layers):
        out[f"wqkv_{i}"] = fuse((split[f"wq_{i}"], split[f"wk_{i}"], split[f"wv_{i}"]), *hkd)
        if f"bq_{i}" in split:
            out[f"bqkv_{i}"] = fuse((split[f"bq_{i}"], split[f"bk_{i}"], split[f"bv_{i}"]), *hkd)
    return out


@pytest.mark.parametrize("spec", [MHA, GQA, MQA, LLAMA_MHA, f"{GQA},attention=naive", f"{MHA},unpad=1"])
def test_the_fused_projection_gives_the_split_loss_and_gradients(spec: str) -> None:
    split = build_model(spec, batch=3, dtype=DType.f64)
    fused = build_model(f"{spec},qkv=fused", batch=3, dtype=DType.f64)
    assert fused.num_params == split.num_params
    layers, hkd = int(split.config["layers"]), _heads(split)  # type: ignore[call-overload]
    vals = values(split, seed=1)  # every weight at a scale where it matters
    loss_s, grad_s = _step(split, vals)
    loss_f, grad_f = _step(fused, _fused_values(vals, layers, hkd))
    assert loss_f == pytest.approx(loss_s, rel=1e-12)
    for name, g in _fused_values(grad_s, layers, hkd).items():
        np.testing.assert_allclose(grad_f[name], g, rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        (MHA, "d1.t2.p1.k1"),
        (GQA, "d1.t2.p1.k1"),
        (GQA, "d1.t2.sp.p1.k2.1f1b"),
        (MHA, "d1.t2.sp.p2.k2.1f1b"),
    ],
)
def test_tensor_parallel_fused_step_matches_sequential(spec: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(f"{spec},qkv=fused", batch=s.k * s.d, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{spec} {s}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"


BLOCKS = [
    "gpt:layers=1,hidden=8,heads=2,seq=16,vocab=16",
    "llama:layers=1,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=16",
]


@pytest.mark.parametrize("spec", BLOCKS)
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_fused_block_moves_what_the_split_one_moves(spec: str, sp: bool) -> None:
    """Column-parallel over whole query groups: the fused weight never moves, and the block's
    collectives are the split block's (Megatron-LM's g and ḡ), layout for layout."""

    def moves(qkv: str) -> list[list[str]]:
        layers = sharded_layers(build_model(f"{spec},qkv={qkv}", batch=4), 2, 2, sp=sp)
        fns = [f for L in layers for f in (L.fwd, L.bwd) if f is not None and f.name.startswith("block")]
        redis = [[op for op in fn.ops() if op.name == "Redistribute"] for fn in fns]
        assert not [op for ops in redis for op in ops if op.inputs[0].name.startswith(("wqkv", "bqkv"))]
        return [[str(op.attrs["to"]) for op in ops] for ops in redis]

    assert moves("fused") == moves("split")


@pytest.mark.parametrize("spec", [MHA, GQA])
def test_the_fused_output_is_split_into_views(spec: str) -> None:
    """The simulator charges the split nothing (``torch.split``'s views): no bytes, aliasing the
    product's storage; the same Split without ``view`` copies its parts."""
    model = build_model(f"{spec},qkv=fused", batch=3)
    fn = model.module[model.layers[1].callee]
    types = value_types(model.module, fn, layer_types(model)[1])
    (split,) = [op for op in fn.ops() if op.name == "Split"]
    ins, outs = [types[v] for v in split.inputs], [types[v] for v in split.outputs]
    d = REGISTRY["Split"]
    assert split.attrs["view"] == 1
    assert d.bytes_written(ins, outs, split.attrs) == d.bytes_read(ins, outs, split.attrs) == 0
    copy = Attrs({k: v for k, v in split.attrs.items() if k != "view"})
    assert d.bytes_written(ins, outs, copy) == sum(t.nbytes for t in outs) > 0
