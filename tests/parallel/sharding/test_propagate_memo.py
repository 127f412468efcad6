"""``op_strategies`` (the memo propagation and legalization share) answers what the op's sharding
rule answers."""

from __future__ import annotations

from distir.autodiff.reverse import value_types
from distir.autodiff.train import layer_types, layer_vjps
from distir.frontends.zoo.registry import build_model
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ops.registry import REGISTRY
from distir.parallel.sharding.propagate import op_strategies


def test_memoized_strategies_equal_the_rules() -> None:
    model = build_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128", 4)
    types = layer_types(model)
    checked = 0
    for i, grad in enumerate(layer_vjps(model, types, "selective")[0]):
        fwd = grad.vjp.fwd
        env = value_types(Module((fwd,)), fwd, types[i])
        for op in fwd.body:
            if not isinstance(op, Op):
                continue
            ins = [env[v] for v in op.inputs]
            outs = [env[v] for v in op.outputs]
            for n in (1, 2, 4):
                want = tuple(REGISTRY[op.name].strategies(ins, outs, op.attrs, n))
                first = op_strategies(op.name, ins, outs, op.attrs, n)
                assert first == want
                assert op_strategies(op.name, ins, outs, op.attrs, n) is first  # a memo hit
                checked += 1
    assert checked > 50
