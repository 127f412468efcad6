"""Numerical check of a distributed program against the sequential training step.

``check_against_sequential(model, strategy)`` builds both programs, runs the sequential step on
random full-batch inputs with the reference executor, materializes the distributed program into
explicit per-device code (``materialize``), runs that on the same data (inputs split into
microbatches and sharded per device), and reassembles the results. It returns the largest
relative difference over the loss and every updated weight and optimizer state (and the copies of
tied weights another pipeline stage keeps: equal to their weight's), and the materialized program
(callers project it and check it for deadlocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo.model import Model
from distir.interp.annotate import annotate_types
from distir.interp.reference import run_reference
from distir.interp.shapes import TypeDomain, infer_types, type_of
from distir.ir.dtensor import DTensorType
from distir.ir.function import Module
from distir.ir.rewrite import inline_calls
from distir.ir.types import DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.parallel.context_model import POS, context_inputs
from distir.parallel.distribute import DDP_BUCKET_MB, distribute
from distir.parallel.sharding.materialize import materialize, shard_value, unshard_value
from distir.parallel.strategy import Strategy
from distir.parallel.zero3_fetch import Zero3Fetch


@dataclass
class Comparison:
    max_rel_diff: float
    worst: str
    sequential: Module
    distributed: Module
    materialized: Module
    # name -> (kind, initial value or None for the loss, sequential result, distributed result);
    # kind: "loss", "weight" or the optimizer state's name ("m", "v")
    results: dict[str, tuple[str, Any, Any, Any]] = field(default_factory=dict)

    def update_error(self, floor: float = 0.05) -> tuple[float, str]:
        """For low precision: the largest difference between the sequential and distributed
        *updates* (result minus initial value; the loss itself), relative to the sequential
        update's largest magnitude, or ``floor`` times the largest update of the same kind if that
        is larger — a gradient that is zero in exact arithmetic (a key bias, which softmax ignores)
        comes out as rounding noise of either sign, and noise has no relative accuracy. Returns
        (error, name)."""
        delta: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
        for name, (kind, x0, a, b) in self.results.items():
            a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            base = 0.0 if x0 is None else np.asarray(x0, dtype=np.float64)
            delta[name] = (kind, a64 - base, b64 - base)
        top: dict[str, float] = {}
        for kind, da, _ in delta.values():
            top[kind] = max(top.get(kind, 0.0), float(np.max(np.abs(da), initial=0.0)))
        worst, where = 0.0, ""
        for name, (kind, da, db) in delta.items():
            scale = max(float(np.max(np.abs(da), initial=0.0)), floor * top[kind], 1e-30)
            e = float(np.max(np.abs(da - db), initial=0.0)) / scale
            if e > worst or not where:
                worst, where = e, name
        return worst, where


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-12)
    return float(np.max(np.abs(a - b))) / scale if a.size else 0.0


def initial_values(
    model: Model, optimizer: Optimizer, seed: int, precision: Precision | str = "pure"
) -> dict[str, np.ndarray]:
    """Random inputs, weights and optimizer state (weights and state in the masters' dtype, a
    half-precision master rounded to it as the reference executor holds it)."""
    prec = Precision.parse(precision)
    vals = model.random_inputs(seed)

    def held(x: np.ndarray, t: TensorType) -> Any:
        dt = prec.master_type(t).dtype
        x = x.astype(dt.to_numpy())
        return _cast(x, dt) if prec.mixed and dt is not DType.f32 else x

    for w in model.weights:
        vals[w.name] = held(vals[w.name], w.type)
    rng = np.random.default_rng(seed + 1)
    for s in optimizer.state:
        for w in model.weights:
            x = rng.standard_normal(w.type.shape) * 0.01
            vals[f"{s}_{w.name}"] = held(np.abs(x) if s == "v" else x, w.type)
    if optimizer.kind == "adam":
        vals["step"] = np.array(3, dtype=np.int64)
    return vals


def materialized_inputs(
    dist: Module, model: Model, strategy: Strategy, vals: Mapping[str, np.ndarray]
) -> tuple[Module, list[Any]]:
    """``dist`` materialized into explicit per-device code, and its arguments: full-batch
    ``vals`` split into microbatches and sharded per device (in the materialized entry's order).
    Under context parallelism the inputs are reordered along the sequence and the positions
    added first (``distir.parallel.context_model.context_inputs``)."""
    entry = dist.entry
    args: dict[str, np.ndarray] = {}
    names = [i.name for i in model.inputs]
    if strategy.c > 1:
        vals = context_inputs(model, strategy.c, dict(vals))
        names.append(POS)
    for name in names:
        pieces = np.split(vals[name], strategy.k, axis=0)
        for m, x in enumerate(pieces):
            args[f"{name}_{m}" if strategy.k > 1 else name] = x
    copies = {f"{w.name}_{w.type.dtype}": w for w in model.weights}  # mixed: persistent compute copies
    for p in entry.params:
        if p.name in vals:
            args[p.name] = vals[p.name]
        elif p.name.startswith("step_s"):
            args[p.name] = vals["step"]
        elif p.name in copies:
            w = copies[p.name]
            args[p.name] = _cast(vals[w.name], w.type.dtype)
        elif p.name.endswith("_buffer"):  # ``pipelining_kept``'s receive buffers (donated, overwritten)
            t = p.type
            assert isinstance(t, DTensorType)
            args[p.name] = np.zeros(t.shape, np.float32)
    mat = materialize(annotate_types(Module((inline_calls(dist),))))
    flat: list[Any] = []
    for p in entry.params:
        t = p.type
        assert isinstance(t, DTensorType), f"%{p.name} is not a DTensor"
        by_dev = shard_value(np.asarray(args[p.name]), t)
        flat.extend(by_dev[d] for d in t.mesh.devices)
    return mat, flat


def run_distributed(
    dist: Module, model: Model, strategy: Strategy, vals: Mapping[str, np.ndarray]
) -> tuple[Module, list[Any]]:
    """Run the materialized ``dist`` on full-batch ``vals``; returns (materialized, logical results)."""
    mat, flat = materialized_inputs(dist, model, strategy, vals)
    outs = run_reference(mat, flat)
    out_types = [type_of(x) for x in infer_types(dist, domain=TypeDomain(concrete_limit=0))[0]]
    results: list[Any] = []
    k = 0
    for t in out_types:
        assert isinstance(t, DTensorType)
        n = len(t.mesh.devices)
        results.append(unshard_value(dict(zip(t.mesh.devices, outs[k : k + n], strict=True)), t))
        k += n
    return mat, results


def _cast(x: Any, dtype: DType) -> Any:
    """``x`` cast to ``dtype`` as the reference executor casts (bf16 rounded, held in float32)."""
    ref = REGISTRY["Cast"].reference
    assert ref is not None
    return ref([x], Attrs({"to": dtype}))[0]


def check_against_sequential(
    model: Model,
    strategy: Strategy,
    optimizer: Optimizer | None = None,
    seed: int = 0,
    precision: Precision | str = "pure",
    bucket_mb: float = DDP_BUCKET_MB,
    comm_streams: bool = False,
    overlap_param_gather: bool = False,
    deepspeed_pipe: bool = False,
    fp32_grad_accum: bool = False,
    cp_ring: bool = True,
    gather_copy_out: bool = False,
    reduce_fp32: bool = False,
    sac_eager: bool = False,
    fsdp2_root: bool = False,
    one_dp_stream: bool = False,
    grad_copy_in: str = "",
    gather_cast: bool = False,
    fsdp1_root: bool = False,
    megatron_ddp: bool = False,
    fsdp2_grad_accum: bool = False,
    grad_accum_fusion: bool = False,
    pipelining_kept: str = "",
    fp8_weight_cache: bool = False,
    zero3_fetch: Zero3Fetch | None = None,
    p2p_blocking: bool = False,
    float8_gather: bool = False,
) -> Comparison:
    opt = optimizer or Optimizer("sgd", lr=0.1)
    seq = training_step(model, opt, strategy.recompute, precision)
    dist = distribute(
        model,
        strategy,
        opt,
        comm_streams=comm_streams,
        precision=precision,
        bucket_mb=bucket_mb,
        overlap_param_gather=overlap_param_gather,
        deepspeed_pipe=deepspeed_pipe,
        fp32_grad_accum=fp32_grad_accum,
        cp_ring=cp_ring,
        gather_copy_out=gather_copy_out,
        reduce_fp32=reduce_fp32,
        sac_eager=sac_eager,
        fsdp2_root=fsdp2_root,
        one_dp_stream=one_dp_stream,
        grad_copy_in=grad_copy_in,
        gather_cast=gather_cast,
        fsdp1_root=fsdp1_root,
        megatron_ddp=megatron_ddp,
        fsdp2_grad_accum=fsdp2_grad_accum,
        grad_accum_fusion=grad_accum_fusion,
        pipelining_kept=pipelining_kept,
        fp8_weight_cache=fp8_weight_cache,
        zero3_fetch=zero3_fetch,
        p2p_blocking=p2p_blocking,
        float8_gather=float8_gather,
    )
    vals = initial_values(model, opt, seed, precision)
    want = run_reference(seq, [vals[p.name] for p in seq.entry.params])
    mat, got = run_distributed(dist, model, strategy, vals)
    names = ["loss", *(p.name for p in seq.entry.params[len(model.inputs) :] if p.name != "step")]
    # tied weights' copies on another pipeline stage (parameters named like their weight, after
    # the weights; results after the others): each must equal its weight's result
    wnames = {w.name for w in model.weights}
    names_seen = [p.name for p in dist.entry.params if p.name in wnames]
    copies = [n for k, n in enumerate(names_seen) if n in names_seen[:k]]
    extra = [*copies, *(f"{st}_{c}" for st in opt.state for c in copies)]
    got_copies = got[len(names) : len(names) + len(extra)]
    # mixed precision: the new compute copies (last: the weights', then the tied copies') are the
    # new masters, cast
    halves = got[len(names) + len(extra) :]
    if pipelining_kept:  # what the stages keep: the step's last results, compared with nothing
        halves = halves[: len(model.weights) + len(copies)]
    if halves:
        assert len(halves) == len(model.weights) + len(copies), "one compute copy per weight"
        for k, (w, copy) in enumerate(zip(model.weights, halves, strict=False)):
            assert np.array_equal(_cast(got[1 + k], w.type.dtype), copy), (
                f"the new compute copy of {w.name} is not its new master, cast"
            )
    got = got[: len(names)]
    n_w = len(model.weights)
    worst, where = 0.0, ""
    for name, b in zip(extra, got_copies, strict=True):
        r = _rel(want[names.index(name)], b)
        if r > worst:
            worst, where = r, f"{name} (tied copy)"
    results: dict[str, tuple[str, Any, Any, Any]] = {}
    for k, (name, a, b) in enumerate(zip(names, want, got, strict=True)):
        r = _rel(a, b)
        if r > worst or not where:
            worst, where = r, name
        kind = "loss" if k == 0 else "weight" if k <= n_w else opt.state[(k - 1 - n_w) // n_w]
        results[name] = (kind, vals.get(name) if k else None, a, b)
    return Comparison(worst, where, seq, dist, mat, results)
