"""The DistIR paper's MLP: ``layers`` dense layers ``Relu(MatMul(x, w))`` of width ``hidden``.

    func @forward(%x: (B, hidden), %y: (B, hidden), %w_0, ..., %w_{L-1}) {
      %h0 = @dense(%x, %w_0) ... %h{L-1} = @dense(%h{L-2}, %w_{L-1})
      %loss = @loss(%h{L-1}, %y)       // MSELoss(sum) · 1/(B·hidden): the mean over the batch
    }

Weights are (hidden, hidden) and alternate column- and row-parallel (``S(1)`` for even
layers, ``S(0)`` for odd ones), so consecutive layers form Megatron pairs: the column-parallel
layer's sharded output feeds the row-parallel layer directly. The loss divides by the number of
elements of the *global* target, so microbatch losses add up to the full-batch mean.

Zoo sizes (the MLPs of Santhanam et al., "DistIR: An Intermediate Representation for
Optimizing Distributed Neural Networks", EuroMLSys 2021): ``mlp-1b`` 16×8192 (1.07B
parameters), ``mlp-17b`` 64×16384 (17.2B), ``mlp-103b`` 96×32768 (103B).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from distir.frontends.zoo._build import LayerCall, LayerFn, assemble, check_config, tensor, weight
from distir.frontends.zoo.model import InputSpec, Model
from distir.ir.dtensor import Shard
from distir.ir.function import Function
from distir.ir.types import DType

FAMILY = "mlp"


@dataclass(frozen=True)
class MLPConfig:
    layers: int
    hidden: int

    def __post_init__(self) -> None:
        check_config(FAMILY, self)


ZOO: dict[str, tuple[MLPConfig, str]] = {
    "mlp-1b": (MLPConfig(16, 8192), "DistIR paper (EuroMLSys 2021): 16 layers of 8192"),
    "mlp-17b": (MLPConfig(64, 16384), "DistIR paper (EuroMLSys 2021): 64 layers of 16384"),
    "mlp-103b": (MLPConfig(96, 32768), "DistIR paper (EuroMLSys 2021): 96 layers of 32768"),
}


def dense_fn() -> Function:
    f = LayerFn("dense")
    x, w = f.param("x"), f.param("w")
    return f.ret(f("Relu", f("MatMul", x, w, name="xw"), name="h"))


def mse_loss_fn(normalizer: int) -> Function:
    """``@loss(pred, target) = MSELoss(sum) · 1/normalizer`` (shared with other MSE models)."""
    f = LayerFn("loss")
    pred, target = f.param("pred"), f.param("target")
    total = f("MSELoss", pred, target, reduction="sum", name="sse")
    return f.ret(f("Scale", total, alpha=1.0 / normalizer, name="loss"))


def build(cfg: MLPConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    h = cfg.hidden
    inputs = (InputSpec("x", tensor(dtype, batch, h)), InputSpec("y", tensor(dtype, batch, h)))
    dense = dense_fn()
    std = math.sqrt(2.0 / h)  # He initialization keeps the Relu activations' scale
    calls = [
        LayerCall(dense, (weight(f"w_{i}", dtype, (h, h), Shard(1 if i % 2 == 0 else 0), std=std),), f"h{i}")
        for i in range(cfg.layers)
    ]
    calls.append(LayerCall(mse_loss_fn(batch * h), ("y",), "loss"))
    return assemble(name, {"family": FAMILY, **asdict(cfg)}, inputs, calls, ends=(0, 1))
