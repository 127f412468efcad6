"""The registry's contract: unique names, helpful unknown-name errors, slots filled once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from ops_examples import T, f32

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops import REGISTRY, OpDef, TypeCtx, register
from distir.ops.registry import CostClass, OpRegistry, RegistryError, UnknownOpError


def _identity_rule(ctx: TypeCtx) -> Sequence[Type]:
    return (ctx.tensor(0),)


def make_op(name: str = "TestOnlyOp") -> OpDef:
    return OpDef(
        name=name,
        family="test",
        cost_class=CostClass.ELEMENTWISE,
        inputs=("X",),
        outputs=("Y",),
        infer=_identity_rule,
    )


def test_registering_a_name_twice_raises() -> None:
    reg = OpRegistry()
    first = reg.register(make_op("Twice"))
    with pytest.raises(RegistryError, match="Twice is already registered"):
        reg.register(make_op("Twice"))
    assert reg["Twice"] is first and len(reg) == 1


def test_registering_an_existing_global_op_raises_and_keeps_the_original() -> None:
    original = REGISTRY["MatMul"]
    n = len(REGISTRY)
    with pytest.raises(RegistryError, match=r"MatMul is already registered \(family linalg\)"):
        register(make_op("MatMul"))
    assert REGISTRY["MatMul"] is original and len(REGISTRY) == n


def test_unknown_op_suggests_the_close_name_and_lists_known_ops() -> None:
    with pytest.raises(UnknownOpError) as info:
        REGISTRY["Matmul"]
    msg = str(info.value)
    assert "unknown op 'Matmul'" in msg
    assert "did you mean MatMul" in msg
    known = msg.split("known ops: ", 1)[1].split(", ")
    assert known == sorted(d.name for d in REGISTRY)
    assert {"MatMul", "Softmax", "Adam", "ReduceSum"} <= set(known)
    assert isinstance(info.value, KeyError) and isinstance(info.value, RegistryError)


def test_unknown_op_without_a_close_name_has_no_suggestion() -> None:
    with pytest.raises(UnknownOpError) as info:
        REGISTRY["Zzzqqq"]
    assert "did you mean" not in str(info.value)
    assert "Zzzqqq" not in REGISTRY and "MatMul" in REGISTRY


def test_fill_a_slot_once() -> None:
    op = make_op()
    op.fill("grad", "first rule")
    assert op.grad == "first rule"
    with pytest.raises(RegistryError, match=r"TestOnlyOp\.grad is already filled"):
        op.fill("grad", "second rule")
    assert op.grad == "first rule"
    op.fill("torch", "t")  # other slots are independent
    with pytest.raises(RegistryError, match="unknown slot 'gard'"):
        op.fill("gard", "x")


def test_signature_shows_inputs_outputs_and_attribute_defaults() -> None:
    sig = REGISTRY["LayerNormalization"].signature()
    assert sig == (
        "Y = LayerNormalization(X, Scale, B?; axis: int = -1, epsilon: float = 1e-05, "
        "zero_centered_gamma: bool = False)"
    )
    adam = REGISTRY["Adam"].signature()
    assert adam.startswith("new_weight, new_m, new_v = Adam(weight, grad, m, v, step; lr: float")


def test_new_ops_are_registered_in_their_families() -> None:
    families = {
        "reduce": {"ReduceSum", "ReduceMean", "ReduceMax", "CumSum"},
        "nn": {"Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization", "CausalMask", "Dropout"}
        | {"DropoutGrad", "UnpadTokens", "PadTokens"},
        "loss": {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "MSELoss"}
        | {"SoftmaxCrossEntropyParts", "NllLossParts"},
        "grad": {
            "ReluGrad",
            "GeluGrad",
            "GeluTanhGrad",
            "TanhGrad",
            "SigmoidGrad",
            "SiluGrad",
            "SquaredReluGrad",
            "SoftmaxGrad",
            "LogSoftmaxGrad",
            "LayerNormalizationGrad",
            "RMSNormalizationGrad",
            "SoftmaxCrossEntropyLossGrad",
            "NegativeLogLikelihoodLossGrad",
            "SoftmaxCrossEntropyPartsGrad",
            "NllLossPartsGrad",
            "MSELossGrad",
            "ConvGrad",
            "MaxPoolGrad",
            "AveragePoolGrad",
            "GatherGrad",
            "SliceGrad",
        },
        "conv": {"Conv", "MaxPool", "AveragePool"},
        "optim": {"SGD", "Adam", "AdamRemainder", "GradNormSq", "ClipByNorm"},
        "attention": {"Attention", "AttentionGrad", "AttentionMerge", "Rope"},
    }
    for fam, names in families.items():
        assert {d.name for d in REGISTRY if d.family == fam} == names, fam


def test_optional_inputs_and_output_counts() -> None:
    ln = REGISTRY["LayerNormalization"]
    assert (ln.min_inputs, ln.max_inputs) == (2, 3)
    assert REGISTRY["LayerNormalizationGrad"].num_outputs(3, Attrs()) == 3
    assert REGISTRY["Adam"].num_outputs(5, Attrs()) == 3
    (y,) = ln.infer_types([T(f32, 2, 4), T(f32, 4)], Attrs(), [None, None])
    assert y == T(f32, 2, 4)
