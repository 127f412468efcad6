"""Training steps of a 2-layer MLP (forward, loss, backward by hand, optimizer; optionally a
LayerNormalization first), sharded through propagate -> legalize -> materialize with the rules of
the training ops (``test_training_rules``): data parallel needs exactly one AllReduce per weight
gradient; Megatron tensor parallel one reduction of the row-parallel output in the forward (a
ReduceScatter to the batch rows the loss accepts, plus an AllGather of the loss gradient) and one
AllReduce of the input gradient in the backward; ZeRO (Adam moments sharded) one ReduceScatter
per gradient. The sharded programs' results (on the global program and on the per-rank programs)
are the unsharded program's, whose updates are checked against finite differences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

import distir
from distir.interp.lockstep import check_deadlock_free, run_ranks
from distir.interp.project import project
from distir.interp.reference import run_reference
from distir.ir import DTensorType, Mesh, Module
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Shard, split_sizes
from distir.ir.types import Device, DType, TensorType
from distir.ops.registry import REGISTRY, OpKind
from distir.parallel.sharding.materialize import shard_value, unshard_value
from parallel.helpers import sharded

D0 = Device(0)
f64, i64 = DType.f64, DType.i64


def _t(*shape: int, dtype: DType = f64) -> TensorType:
    return TensorType(dtype, shape, D0)


def mlp_step(
    batch: int,
    sizes: tuple[int, int, int],
    *,
    loss: str = "mse",
    optimizer: str = "sgd",
    norm: bool = False,
    outputs: Sequence[str] = ("w1_new", "w2_new"),
) -> Module:
    """One training step of y = Relu(LN?(x) @ w1) @ w2 with a summed loss (MSE against targets
    or cross entropy against labels), backward by hand, and SGD or Adam (moments m*, v*, step).
    Returns the values named in ``outputs``."""
    d_in, hidden, d_out = sizes
    fb = FunctionBuilder("step", REGISTRY.out_arity)
    x = fb.param("x", _t(batch, d_in))
    t = fb.param("t", _t(batch, d_out) if loss == "mse" else _t(batch, dtype=i64))
    w1, w2 = fb.param("w1", _t(d_in, hidden)), fb.param("w2", _t(hidden, d_out))
    weights = {"w1": w1, "w2": w2}
    if norm:
        weights["g"], weights["b"] = fb.param("g", _t(d_in)), fb.param("b", _t(d_in))
        (xn,) = fb.op("LayerNormalization", x, weights["g"], weights["b"], names=["xn"])
    else:
        xn = x
    adam = optimizer == "adam"
    if adam:
        moments = {k: (fb.param(f"m{k}", v.type), fb.param(f"v{k}", v.type)) for k, v in weights.items()}
        step = fb.param("step", _t(dtype=i64))
    (h,) = fb.op("MatMul", xn, w1, names=["h"])
    (a,) = fb.op("Relu", h, names=["a"])
    (y,) = fb.op("MatMul", a, w2, names=["y"])
    loss_op = "MSELoss" if loss == "mse" else "SoftmaxCrossEntropyLoss"
    (lv,) = fb.op(loss_op, y, t, names=["loss"], reduction="sum")
    (one,) = fb.op("Constant", names=["one"], value=1.0, dtype=f64, device=D0)
    (dy,) = fb.op(loss_op + "Grad", one, y, t, names=["dy"], reduction="sum")
    (at,) = fb.op("Transpose", a, names=["at"], perm=[1, 0])
    (w2t,) = fb.op("Transpose", w2, names=["w2t"], perm=[1, 0])
    (dw2,) = fb.op("MatMul", at, dy, names=["dw2"])
    (da,) = fb.op("MatMul", dy, w2t, names=["da"])
    (dh,) = fb.op("ReluGrad", da, h, names=["dh"])
    (xt,) = fb.op("Transpose", xn, names=["xt"], perm=[1, 0])
    (w1t,) = fb.op("Transpose", w1, names=["w1t"], perm=[1, 0])
    (dw1,) = fb.op("MatMul", xt, dh, names=["dw1"])
    (dxn,) = fb.op("MatMul", dh, w1t, names=["dxn" if norm else "dx"])
    grads = {"w1": dw1, "w2": dw2}
    values = {"loss": lv, "dx": dxn}
    if norm:
        dx, grads["g"], grads["b"] = fb.op(
            "LayerNormalizationGrad", dxn, x, weights["g"], names=["dx", "dg", "db"]
        )
        values["dx"] = dx
    for k, w in weights.items():
        if adam:
            m, v = moments[k]
            names = [f"{k}_new", f"m{k}_new", f"v{k}_new"]
            outs = fb.op("Adam", w, grads[k], m, v, step, names=names, lr=0.01)
            values.update(zip(names, outs, strict=True))
        else:
            (values[f"{k}_new"],) = fb.op("SGD", w, grads[k], names=[f"{k}_new"], lr=0.1)
    return Module((fb.ret(*(values[o] for o in outputs)),))


def _inputs(m: Module, seed: int, classes: int) -> list[np.ndarray]:
    """Random inputs: floats ~ N(0, 1) (second moments in [0, 1)), labels in range, step 3."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for p in m.entry.params:
        t = p.type
        assert isinstance(t, TensorType)
        if p.name == "step":
            out.append(np.asarray(3, dtype=np.int64))
        elif p.name == "t" and t.dtype.is_int:
            out.append(rng.integers(0, classes, size=t.shape).astype(np.int64))
        elif p.name.startswith("v"):
            out.append(rng.uniform(0, 1, size=t.shape))
        else:
            out.append(rng.standard_normal(t.shape))
    return out


def run_sharded(m: Module, mesh: Mesh, ann: Mapping[str, str], seed: int = 0) -> tuple[Module, float]:
    """(materialized program, max relative difference of its outputs — on the global program and
    on the per-rank programs run in lock-step — to the unsharded program's)."""
    m = distir.check(m)
    legal, mat = sharded(m, mesh, ann)
    w2 = m.entry.params[3].type
    assert isinstance(w2, TensorType)
    args = _inputs(m, seed, classes=w2.shape[1])
    want = run_reference(m, args)
    devs = mesh.devices
    per_rank: dict[Device, list[np.ndarray]] = {d: [] for d in devs}
    for a, p in zip(args, legal.entry.params, strict=True):
        assert isinstance(p.type, DTensorType)
        sv = shard_value(a, p.type)
        for d in devs:
            per_rank[d].append(sv[d])
    got = run_reference(mat, [per_rank[d][i] for i in range(len(args)) for d in devs])
    ranks = project(mat)
    check_deadlock_free(ranks)
    by_rank = run_ranks(ranks, per_rank)  # type: ignore[arg-type]
    worst = 0.0
    for k, (w, v) in enumerate(zip(want, legal.entry.outputs, strict=True)):
        assert isinstance(v.type, DTensorType)
        scale = max(float(np.max(np.abs(w))), 1e-6)
        for ps in ({d: got[k * len(devs) + i] for i, d in enumerate(devs)}, {d: by_rank[d][k] for d in devs}):
            worst = max(worst, float(np.max(np.abs(unshard_value(ps, v.type) - w))) / scale)
    return mat, worst


def collectives(mat: Module) -> Counter[tuple[str, str, tuple[int, ...]]]:
    """(collective, the value it makes without the device suffix, its first piece's shape)."""
    got: Counter[tuple[str, str, tuple[int, ...]]] = Counter()
    for op in mat.entry.ops():
        if REGISTRY[op.name].kind is OpKind.COMM:
            t = op.outputs[0].type
            assert isinstance(t, TensorType)
            got[(op.name, op.outputs[0].name.rsplit(".", 1)[0], t.shape)] += 1
    return got


def _mesh(axis: str, n: int) -> Mesh:
    return Mesh(((axis, n),), tuple(Device(i) for i in range(n)))


SIZES = (6, 10, 3)  # d_in, hidden, d_out: every weight has its own shape


@pytest.mark.parametrize("n", [2, 3])  # 3: a batch of 8 splits 3, 3, 2
@pytest.mark.parametrize("norm", [False, True])
def test_data_parallel_step_allreduces_each_weight_gradient_once(n: int, norm: bool) -> None:
    m = mlp_step(8, SIZES, norm=norm, outputs=("w1_new", "w2_new", *(("g_new", "b_new") if norm else ())))
    ann = {"x": "S(0)", "t": "S(0)", "w1": "R", "w2": "R"}
    mat, err = run_sharded(m, _mesh("dp", n), ann)
    assert err < 1e-12
    want = Counter({("AllReduce", "dw1_R", (6, 10)): 1, ("AllReduce", "dw2_R", (10, 3)): 1})
    if norm:  # LayerNormalizationGrad on the batch shard: dScale and dB are pending sums
        want.update({("AllReduce", "dg_R", (6,)): 1, ("AllReduce", "db_R", (6,)): 1})
    assert collectives(mat) == want


def test_data_parallel_step_returning_the_loss_also_reduces_the_loss() -> None:
    """The summed loss of a batch shard is a pending sum: returning it costs one AllReduce of a
    0-d tensor, and the updated weights are as before."""
    m = mlp_step(8, SIZES, outputs=("loss", "w1_new", "w2_new"))
    mat, err = run_sharded(m, _mesh("dp", 2), {"x": "S(0)", "t": "S(0)"})
    assert err < 1e-12
    assert collectives(mat) == Counter(
        {
            ("AllReduce", "dw1_R", (6, 10)): 1,
            ("AllReduce", "dw2_R", (10, 3)): 1,
            ("AllReduce", "loss_R", ()): 1,
        }
    )


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("with_loss", [False, True])
def test_megatron_step_one_reduction_forward_one_backward(n: int, with_loss: bool) -> None:
    """W1 column-, W2 row-sharded (8 rows, hidden 12). The row-parallel output y is a pending
    sum; the loss accepts it sharded by rows, so the forward's reduction is a ReduceScatter of y
    to rows (half an AllReduce: propagation picks the cheaper move at each op), the loss of a row
    shard is a pending sum (one AllReduce of a 0-d tensor when the loss is returned), and its
    gradient dy comes out sharded by rows; dW2 = a^T dy (a^T sharded over hidden) needs all of
    dy: one AllGather, the other half of Megatron's AllReduce of y. The backward's reduction is
    the input gradient dx, a sum over the hidden shards (Megatron's f). The weight gradients come
    out sharded like the weights, so the updates are local."""
    outputs = ("loss", "dx", "w1_new", "w2_new") if with_loss else ("dx", "w1_new", "w2_new")
    m = mlp_step(8, (6, 12, 3), outputs=outputs)
    ann = {"x": "R", "t": "R", "w1": "S(1)", "w2": "S(0)", "w1_new": "S(1)", "w2_new": "S(0)"}
    mat, err = run_sharded(m, _mesh("tp", n), ann)
    assert err < 1e-12
    want = Counter(
        {
            ("ReduceScatter", "y_S0", (8 // n, 3)): 1,
            ("AllGather", "dy_R", (8, 3)): 1,
            ("AllReduce", "dx_R", (8, 6)): 1,
        }
    )
    if with_loss:
        want[("AllReduce", "loss_R", ())] = 1
    assert collectives(mat) == want


def test_megatron_step_with_layer_norm_reduces_its_parameter_gradients_instead() -> None:
    """With a LayerNormalization before the MLP, the backward's pending sum dL/d(LN output)
    passes through LayerNormalizationGrad (linear in dY): what is reduced is dScale and dB
    (d_in values each) for their updates, not the batch x d_in activation gradient (which is
    not a result here). The forward and the loss are as without it."""
    m = mlp_step(8, (6, 12, 3), norm=True, outputs=("w1_new", "w2_new", "g_new", "b_new"))
    ann = {"x": "R", "t": "R", "w1": "S(1)", "w2": "S(0)", "w1_new": "S(1)", "w2_new": "S(0)"}
    mat, err = run_sharded(m, _mesh("tp", 2), ann)
    assert err < 1e-12
    assert collectives(mat) == Counter(
        {
            ("ReduceScatter", "y_S0", (4, 3)): 1,
            ("AllGather", "dy_R", (8, 3)): 1,
            ("AllReduce", "dg_R", (6,)): 1,
            ("AllReduce", "db_R", (6,)): 1,
        }
    )


@pytest.mark.parametrize("n", [2, 3])
def test_zero_adam_step_reduce_scatters_each_gradient_once(n: int) -> None:
    """Data parallel with the Adam moments sharded (ZeRO): each weight gradient, a pending sum,
    is reduce-scattered to the moments' layout (half the traffic of an AllReduce) and Adam
    updates that shard of the weight; the new weights come out sharded too (the next step's
    forward would gather them). Cross-entropy loss on integer labels, sharded with the batch."""
    outputs = ("w1_new", "w2_new", "mw1_new", "vw1_new", "mw2_new", "vw2_new")
    m = mlp_step(8, (6, 10, 4), loss="ce", optimizer="adam", outputs=outputs)
    ann = {"x": "S(0)", "t": "S(0)", "w1": "R", "w2": "R"}
    ann.update({k: "S(0)" for k in ("mw1", "vw1", "mw2", "vw2", "mw1_new", "vw1_new", "mw2_new", "vw2_new")})
    mesh = _mesh("dp", n)
    mat, err = run_sharded(m, mesh, ann)
    assert err < 1e-12
    assert collectives(mat) == Counter(
        {  # (the first, largest, piece)
            ("ReduceScatter", "dw1_S0", (split_sizes(6, n)[0], 10)): 1,
            ("ReduceScatter", "dw2_S0", (split_sizes(10, n)[0], 4)): 1,
        }
    )
    legal, _ = sharded(distir.check(m), mesh, ann)
    for v in legal.entry.outputs:
        assert isinstance(v.type, DTensorType) and v.type.placements == (Shard(0),), v


@pytest.mark.parametrize(("loss", "norm"), [("mse", False), ("ce", True)])
def test_the_unsharded_step_descends_the_true_gradient(loss: str, norm: bool) -> None:
    """The reference the sharded steps are held to is right: (w - w_new) / lr is the central
    finite difference of the loss, for every weight (so the backward by hand is the gradient)."""
    weights = ("w1", "w2", *(("g", "b") if norm else ()))
    step = distir.check(mlp_step(5, SIZES, loss=loss, norm=norm, outputs=tuple(f"{w}_new" for w in weights)))
    value = distir.check(mlp_step(5, SIZES, loss=loss, norm=norm, outputs=("loss",)))
    args = _inputs(step, 0, classes=SIZES[2])
    index = {p.name: i for i, p in enumerate(step.entry.params)}
    new = run_reference(step, args)
    eps = 1e-6
    for w, w_new in zip(weights, new, strict=True):
        a = args[index[w]]
        fd = np.zeros_like(a)
        for pos in np.ndindex(a.shape):
            hi, lo = [x.copy() for x in args], [x.copy() for x in args]
            hi[index[w]][pos] += eps
            lo[index[w]][pos] -= eps
            fd[pos] = (run_reference(value, hi)[0] - run_reference(value, lo)[0]) / (2 * eps)
        np.testing.assert_allclose((a - w_new) / 0.1, fd, rtol=1e-5, atol=1e-6, err_msg=w)
