"""Every LOCAL op with a reference: on each example of ``EXAMPLES``, the reference's outputs have
exactly the types the op's rule infers, whether the rule sees only the fixed inputs or all of
them, the reference leaves its inputs alone, and the cost functions give finite, non-negative
numbers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_examples import EXAMPLES, Case, known_inputs, random_inputs

from distir.ir.types import ScalarType, TensorType, TupleType, Type
from distir.ops import REGISTRY, OpDef, OpKind


def _checked_ops() -> list[OpDef]:
    return [d for d in REGISTRY if d.kind is OpKind.LOCAL and d.reference is not None]


CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name, cases in sorted(EXAMPLES.items())
    for i in range(len(cases))
]


def test_every_local_op_with_a_reference_has_examples() -> None:
    missing = sorted(d.name for d in _checked_ops() if not EXAMPLES.get(d.name))
    assert not missing, f"add examples to tests/ops/ops_examples.py for: {missing}"


def test_examples_name_registered_local_ops() -> None:
    stale = sorted(n for n in EXAMPLES if n not in REGISTRY)
    assert not stale, f"EXAMPLES names unknown ops: {stale}"
    not_local = sorted(n for n in EXAMPLES if REGISTRY[n].kind is not OpKind.LOCAL)
    assert not not_local


def test_the_walk_covers_the_new_families() -> None:
    families = {d.family for d in _checked_ops()}
    assert {
        "reduce",
        "nn",
        "loss",
        "grad",
        "optim",
        "elementwise",
        "shape",
        "linalg",
        "conv",
        "compare",
    } <= families


def check_value(value: Any, t: Type, where: str) -> None:
    if isinstance(t, TupleType):
        assert isinstance(value, tuple), f"{where}: expected a tuple, got {type(value).__name__}"
        assert len(value) == len(t.elements), where
        for k, (v, e) in enumerate(zip(value, t.elements, strict=True)):
            check_value(v, e, f"{where}[{k}]")
        return
    arr = np.asarray(value)
    shape = t.shape if isinstance(t, TensorType) else ()
    assert isinstance(t, TensorType | ScalarType)
    assert arr.shape == shape, f"{where}: reference shape {arr.shape} != inferred {shape}"
    assert arr.dtype == t.dtype.to_numpy(), f"{where}: reference dtype {arr.dtype} != {t.dtype}"


def _snapshot(values: list[Any]) -> list[Any]:
    return [tuple(_snapshot(list(v))) if isinstance(v, tuple) else np.array(v, copy=True) for v in values]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def run_case(name: str, case: Case, seed: int) -> None:
    d = REGISTRY[name]
    rng = np.random.default_rng(seed)
    types, attrs = case.types(), case.attr_map()
    d.check_arity(len(types))
    d.check_attrs(attrs)
    values = random_inputs(case, rng)
    before = _snapshot(values)
    outs = d.infer_types(types, attrs, known_inputs(case, values))
    outs_all_known = d.infer_types(
        types, attrs, [None if isinstance(v, tuple) else np.asarray(v) for v in values]
    )
    assert outs == outs_all_known, f"{name}: the rule depends on which inputs are known"
    assert d.reference is not None
    with np.errstate(all="ignore"):
        results = tuple(d.reference(values, attrs))
    assert len(results) == len(outs), f"{name}: reference gave {len(results)} results"
    for k, (r, t) in enumerate(zip(results, outs, strict=True)):
        check_value(r, t, f"{name} output {k}")
    assert all(_same(x, y) for x, y in zip(values, before, strict=True)), f"{name} mutated inputs"
    for cost in (d.flops, d.bytes_read, d.bytes_written):
        c = cost(types, outs, attrs)
        assert isinstance(c, float | int) and math.isfinite(c) and c >= 0, (name, cost, c)


@pytest.mark.parametrize(("name", "index"), CASES)
def test_reference_matches_inferred_types(name: str, index: int) -> None:
    run_case(name, EXAMPLES[name][index], seed=index)


@settings(max_examples=25, deadline=None)
@given(
    case=st.sampled_from([(n, i) for n, cs in EXAMPLES.items() for i in range(len(cs))]),
    seed=st.integers(0, 2**32 - 1),
)
def test_reference_matches_inferred_types_random_seeds(case: tuple[str, int], seed: int) -> None:
    name, index = case
    run_case(name, EXAMPLES[name][index], seed)


def test_check_value_rejects_a_wrong_reference() -> None:
    t = EXAMPLES["Add"][0].types()[0]
    with pytest.raises(AssertionError, match="shape"):
        check_value(np.zeros((3, 2), np.float32), t, "x")
    with pytest.raises(AssertionError, match="dtype"):
        check_value(np.zeros((2, 3), np.float64), t, "x")


def test_compute_ops_count_flops() -> None:
    """Ops that do arithmetic report some FLOPs on at least one example."""
    free = {
        "Expand",
        "FillLike",
        "SliceGrad",
        "Shape",
        "Constant",
        "Range",
        "ConstantOfShape",
        "Trilu",
        "Gather",
        "Concat",
        "Reshape",
        "Unsqueeze",
        "Squeeze",
        "Transpose",
        "Split",
        "Slice",
        "Identity",
        "UnpadTokens",  # row copies
        "PadTokens",
        "StopGradient",  # a view (PyTorch's detach): no arithmetic
        "Cast",
        "MakeTuple",
        "UnpackTuple",
    }
    zero = []
    for d in _checked_ops():
        if d.name in free:
            continue
        counts = []
        for case in EXAMPLES[d.name]:
            types, attrs = case.types(), case.attr_map()
            outs = d.infer_types(
                types, attrs, known_inputs(case, random_inputs(case, np.random.default_rng(0)))
            )
            counts.append(d.flops(types, outs, attrs))
        if max(counts) <= 0:
            zero.append(d.name)
    assert not zero, f"ops with arithmetic but no FLOPs: {zero}"
