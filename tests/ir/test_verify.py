"""One test per verifier check: a bad module, and the VerifyError it must raise (naming the
function, showing the printed op, with expected/actual where they apply)."""

from __future__ import annotations

import pytest

from distir.ir import (
    Call,
    Device,
    DType,
    Function,
    FunctionBuilder,
    Module,
    Op,
    ScalarType,
    TensorType,
    TupleType,
    Value,
    VerifyError,
    parse_module,
)
from distir.ir.printer import format_attr
from distir.ir.values import freeze_attr
from distir.ir.verify import OpSignatureError, verify
from distir.ops.registry import REGISTRY

D0, D1 = Device(0), Device(1)
T0 = TensorType(DType.f32, (4,), D0)
T1 = TensorType(DType.f32, (4,), D1)


def fb(name: str = "f") -> FunctionBuilder:
    return FunctionBuilder(name, out_arity=REGISTRY.out_arity)


def verify_error(m: Module) -> VerifyError:
    with pytest.raises(VerifyError) as ei:
        verify(m, REGISTRY.check_op)
    return ei.value


def check(e: VerifyError, fn: str, op_text: str | None, *fragments: str) -> None:
    s = str(e)
    assert e.function == fn
    assert s.startswith(f"in @{fn}")
    if op_text is not None:
        assert e.op_text == op_text
        assert f"at `{op_text}`" in s
    for frag in fragments:
        assert frag in s, f"{frag!r} not in {s!r}"


def single(f: Function) -> Module:
    return Module((f,))


# -- a valid module passes (control) -------------------------------------------------------------


def test_valid_module_passes_and_is_returned_unchanged() -> None:
    g = fb("g")
    a = g.param("a", T0)
    (r,) = g.op("Relu", a)
    gf = g.ret(r)
    b = fb("main")
    x = b.param("x", T0)
    (s0, s1) = b.op("Split", x)
    (y,) = b.call(gf, s0, types=[None])
    (z,) = b.op("Send", s1, dst=D1, types=[T1])
    m = Module((gf, b.ret(y, z)))
    assert verify(m, REGISTRY.check_op) is m


# -- names and SSA -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bad name", "", "f@g", "ü"])
def test_invalid_function_name(name: str) -> None:
    e = verify_error(single(Function(name, (), (), ())))
    assert e.function == name
    assert f"invalid function name {name!r}" in str(e)


def test_parameter_twice() -> None:
    p = Value("p")
    e = verify_error(single(Function("f", (p, p), (), ())))
    check(e, "f", None, "parameter %p appears twice")
    assert e.value is p


def test_use_before_def() -> None:
    b = fb()
    x = b.param("x")
    later = Value("later")
    b.append(Op("Relu", (later,), (Value("y"),)))
    b.append(Op("Relu", (x,), (later,)))
    e = verify_error(single(b.ret(later)))
    check(e, "f", "%y = Relu(%later)", "%later is used before it is defined")
    assert e.value is later


def test_use_of_value_of_another_function() -> None:
    g = fb("g")
    a = g.param("a")
    gf = g.ret(a)
    b = fb("main")
    (y,) = b.op("Relu", a)  # %a belongs to @g
    e = verify_error(Module((gf, b.ret(y))))
    check(e, "main", "%relu = Relu(%a)", "%a is used before it is defined")


def test_same_named_values_are_distinct() -> None:
    b = fb()
    b.param("x")
    (y,) = b.op("Relu", Value("x"))  # a different %x, never defined
    e = verify_error(single(b.ret(y)))
    check(e, "f", "%relu = Relu(%x)", "%x is used before it is defined")


def test_double_assignment() -> None:
    b = fb()
    x = b.param("x")
    y = Value("y")
    b.append(Op("Relu", (x,), (y,)))
    b.append(Op("Identity", (x,), (y,)))
    e = verify_error(single(b.ret(y)))
    check(e, "f", "%y = Identity(%x)", "%y is assigned more than once")
    assert e.value is y


def test_assignment_to_parameter() -> None:
    b = fb()
    x = b.param("x")
    b.append(Op("Relu", (x,), (x,)))
    e = verify_error(single(b.ret(x)))
    check(e, "f", "%x = Relu(%x)", "%x is assigned more than once")


def test_returned_value_not_defined() -> None:
    b = fb()
    b.param("x")
    e = verify_error(single(b.ret(Value("ghost"))))
    check(e, "f", None, "returned value %ghost is not defined")


# -- primitive ops (the registry's check_op) -----------------------------------------------------


def test_unknown_op_lists_known_ops() -> None:
    b = fb()
    x = b.param("x")
    (y,) = b.op("Relux", x, n_out=1)
    e = verify_error(single(b.ret(y)))
    check(
        e,
        "f",
        "%relux = Relux(%x)",
        "unknown op 'Relux'",
        "did you mean Relu",
        "known ops: ",
        "AllReduce",
        "MatMul",
        "Send",
    )
    known = str(e).split("known ops: ")[1].split(", ")
    assert known == sorted(op.name for op in REGISTRY)


def test_without_op_checker_any_op_name_passes() -> None:
    b = fb()
    x = b.param("x")
    (y,) = b.op("Relux", x, n_out=1, anything=[1, "two"])
    m = single(b.ret(y))
    assert verify(m) is m


@pytest.mark.parametrize(
    ("name", "n_in", "attrs", "expected"),
    [
        ("Add", 1, {}, "Add takes 2 inputs (expected 2, got 1)"),
        ("Add", 3, {}, "Add takes 2 inputs (expected 2, got 3)"),
        ("Relu", 0, {}, "Relu takes 1 inputs (expected 1, got 0)"),
        ("Gemm", 4, {}, "Gemm takes 2..3 inputs (expected 2..3, got 4)"),
        ("Concat", 0, {"axis": 0}, "Concat takes at least 1 inputs (expected at least 1, got 0)"),
        ("AllReduce", 0, {}, "AllReduce takes at least 1 inputs (expected at least 1, got 0)"),
    ],
)
def test_wrong_input_arity(name: str, n_in: int, attrs: dict[str, object], expected: str) -> None:
    b = fb()
    xs = [b.param(f"x{i}", T0) for i in range(n_in)]
    outs = b.op(name, *xs, n_out=1, **attrs)
    e = verify_error(single(b.ret(*outs)))
    args = ", ".join([f"%x{i}" for i in range(n_in)] + [f"{k}={v}" for k, v in attrs.items()])
    check(e, "f", f"%{name.lower()} = {name}({args})", expected)
    assert e.expected is not None and e.actual == n_in


@pytest.mark.parametrize(
    ("name", "n_out", "attrs", "expected"),
    [
        ("Relu", 2, {}, "Relu returns 1 results (expected 1, got 2)"),
        ("Relu", 0, {}, "Relu returns 1 results (expected 1, got 0)"),
        ("Split", 2, {"num_splits": 3}, "Split returns 3 results (expected 3, got 2)"),
        ("Split", 3, {"sizes": [1, 3]}, "Split returns 2 results (expected 2, got 3)"),
    ],
)
def test_wrong_result_count(name: str, n_out: int, attrs: dict[str, object], expected: str) -> None:
    b = fb()
    x = b.param("x", T0)
    b.op(name, x, n_out=n_out, **attrs)
    e = verify_error(single(b.ret()))
    args = ", ".join(["%x"] + [f"{k}={format_attr(freeze_attr(v))}" for k, v in attrs.items()])
    check(e, "f", None, expected)
    assert e.op_text is not None and e.op_text.endswith(f"{name}({args})")


def test_unknown_attribute() -> None:
    b = fb()
    x = b.param("x")
    (y,) = b.op("Relu", x, alpha=0.5)
    e = verify_error(single(b.ret(y)))
    check(e, "f", "%relu = Relu(%x, alpha=0.5)", "Relu has no attribute 'alpha'; its attributes: none")


def test_unknown_attribute_lists_the_known_ones() -> None:
    b = fb()
    x = b.param("x")
    (y, z) = b.op("Split", x, axis=0)
    e = verify_error(single(b.ret(y, z)))
    check(
        e,
        "f",
        "%split, %split_1 = Split(%x, axis=0)",
        "Split has no attribute 'axis'; its attributes: dim, num_splits, sizes",
    )


@pytest.mark.parametrize(
    ("name", "n_in", "attrs", "expected"),
    [
        ("Concat", 1, {}, "Concat requires attribute 'axis' (int)"),
        ("Send", 1, {}, "Send requires attribute 'dst' (device)"),
        ("Constant", 0, {"device": D0}, "Constant requires attribute 'value' (tensor)"),
        ("Constant", 0, {"value": 1.0}, "Constant requires attribute 'device' (device)"),
        ("Cast", 1, {}, "Cast requires attribute 'to' (dtype)"),
    ],
)
def test_missing_required_attribute(name: str, n_in: int, attrs: dict[str, object], expected: str) -> None:
    b = fb()
    xs = [b.param("x") for _ in range(n_in)]
    (y,) = b.op(name, *xs, **attrs)
    e = verify_error(single(b.ret(y)))
    check(e, "f", None, expected)
    assert f"= {name}(" in (e.op_text or "")


@pytest.mark.parametrize(
    ("name", "attr", "value", "kind"),
    [
        ("Concat", "axis", "0", "int"),
        ("Concat", "axis", True, "int"),
        ("Concat", "axis", 1.0, "int"),
        ("Send", "dst", 1, "device"),
        ("Cast", "to", "f32", "dtype"),
        ("Split", "sizes", [1, 2.5], "ints"),
        ("Split", "sizes", 3, "ints"),
        ("Gemm", "alpha", "big", "float"),
        ("Gemm", "alpha", True, "float"),
        ("Broadcast", "devices", [D0, 1], "devices"),
    ],
)
def test_attribute_of_wrong_kind(name: str, attr: str, value: object, kind: str) -> None:
    b = fb()
    n_in = REGISTRY[name].min_inputs
    xs = [b.param(f"x{i}") for i in range(n_in)]
    outs = b.op(name, *xs, n_out=1, **{attr: value})
    e = verify_error(single(b.ret(*outs)))
    frozen = freeze_attr(value)
    check(
        e,
        "f",
        None,
        f"attribute '{attr}' of {name} must be {kind}",
        f"(expected {kind}, got {frozen!r})",
        f"{attr}={format_attr(frozen)}",
    )


def test_attribute_not_among_choices() -> None:
    b = fb()
    x = b.param("x")
    (y,) = b.op("AllReduce", x, op="avg")
    e = verify_error(single(b.ret(y)))
    check(
        e,
        "f",
        '%allreduce = AllReduce(%x, op="avg")',
        "attribute 'op' of AllReduce must be one of ['sum', 'max', 'min', 'mean', 'prod']",
        "got 'avg'",
    )


def test_local_op_with_declared_types_on_two_devices() -> None:
    b = fb()
    a = b.param("a", T0)
    c = b.param("c", T1)
    (y,) = b.op("Add", a, c)
    e = verify_error(single(b.ret(y)))
    check(
        e,
        "f",
        "%add = Add(%a, %c)",
        "Add runs on one device, but %a is on d0 and %c is on d1",
        "(expected d0, got d1)",
    )
    assert e.value is c


def test_local_op_result_declared_on_another_device() -> None:
    b = fb()
    a = b.param("a", T0)
    (y,) = b.op("Relu", a, types=[ScalarType(DType.f32, D1)])
    e = verify_error(single(b.ret(y)))
    check(
        e,
        "f",
        "%relu: Scalar[f32, d1] = Relu(%a)",
        "Relu runs on one device, but %a is on d0 and %relu is on d1",
    )


def test_local_op_with_tuple_spanning_two_devices() -> None:
    b = fb()
    t = b.param("t", TupleType((T0, T1)))
    (y,) = b.op("Identity", t)
    e = verify_error(single(b.ret(y)))
    check(e, "f", "%identity = Identity(%t)", "Identity runs on one device", "%t is on d0 and %t is on d1")


def test_rank_op_is_checked_for_one_device() -> None:
    b = fb()
    a = b.param("a", T0)
    b.op("rank.Send", a, dst=D1)  # fine: the value is on d0, dst is an attribute
    verify(single(b.ret()), REGISTRY.check_op)
    b = fb()
    a = b.param("a", T0)
    c = b.param("c", T1)
    b.op("rank.AllReduce", a, group=[D0, D1], shapes=[[4]], dtype=DType.f32, device=D0, types=[T1])
    e = verify_error(single(b.ret(c)))
    check(e, "f", None, "rank.AllReduce runs on one device")


def test_comm_op_may_span_devices() -> None:
    b = fb()
    a = b.param("a", T0)
    (y,) = b.op("Send", a, dst=D1, types=[T1])
    m = single(b.ret(y))
    assert verify(m, REGISTRY.check_op) is m


def test_untyped_values_are_not_device_checked() -> None:
    b = fb()
    a = b.param("a", T0)
    c = b.param("c")
    (y,) = b.op("Add", a, c)
    m = single(b.ret(y))
    assert verify(m, REGISTRY.check_op) is m


def test_op_checker_errors_other_than_signature_errors_propagate() -> None:
    def checker(op: Op) -> None:
        raise OpSignatureError("custom", op.inputs[0], "x", "y")

    b = fb()
    x = b.param("x")
    (y,) = b.op("Relu", x)
    with pytest.raises(VerifyError) as ei:
        verify(single(b.ret(y)), checker)
    check(ei.value, "f", "%relu = Relu(%x)", "custom (expected x, got y)")
    assert ei.value.value is x


# -- calls ---------------------------------------------------------------------------------------


def _callee(
    param_types: tuple[object, ...] = (T0, None), n_out: int = 1, out_type: object = None
) -> Function:
    g = fb("g")
    ps = [g.param(f"p{i}", t) for i, t in enumerate(param_types)]  # type: ignore[arg-type]
    (r,) = g.op("Relu", ps[0], types=[out_type])  # type: ignore[list-item]
    return g.ret(*[r] * n_out)


def test_call_of_unknown_function() -> None:
    gf = _callee()
    b = fb("main")
    x = b.param("x")
    (y,) = b.call("h", x)
    e = verify_error(Module((gf, b.ret(y))))
    check(e, "main", "%h = @h(%x)", "call of unknown function @h; functions: @g, @main")


def test_call_with_wrong_argument_count() -> None:
    gf = _callee()
    b = fb("main")
    x = b.param("x")
    (y,) = b.call(gf, x)
    e = verify_error(Module((gf, b.ret(y))))
    check(e, "main", "%g = @g(%x)", "@g takes 2 arguments (expected 2, got 1)")


def test_call_with_wrong_result_count() -> None:
    gf = _callee(n_out=2)
    b = fb("main")
    x = b.param("x")
    (y,) = b.call(gf, x, x, n_out=1)
    e = verify_error(Module((gf, b.ret(y))))
    check(e, "main", "%g = @g(%x, %x)", "@g returns 2 values (expected 2, got 1)")


def test_call_argument_type_mismatch() -> None:
    gf = _callee()
    b = fb("main")
    x = b.param("x", T1)
    w = b.param("w", T0)
    (y,) = b.call(gf, x, w)  # p1 is untyped: any argument fits; p0 wants T0
    e = verify_error(Module((gf, b.ret(y))))
    check(
        e,
        "main",
        "%g = @g(%x, %w)",
        "argument %x does not match parameter %p0 of @g",
        f"(expected {T0}, got {T1})",
    )
    assert e.value is x and e.expected == T0 and e.actual == T1


def test_call_result_type_mismatch() -> None:
    gf = _callee(out_type=T0)
    b = fb("main")
    x = b.param("x", T0)
    (y,) = b.call(gf, x, x, types=[T1])
    e = verify_error(Module((gf, b.ret(y))))
    check(
        e,
        "main",
        f"%g: {T1} = @g(%x, %x)",
        "result %g does not match what @g returns",
        f"(expected {T0}, got {T1})",
    )


def test_call_type_check_skips_untyped() -> None:
    gf = _callee(out_type=None)
    b = fb("main")
    x = b.param("x")  # untyped argument for a typed parameter
    (y,) = b.call(gf, x, x, types=[T1])  # typed result of an untyped return
    m = Module((gf, b.ret(y)))
    assert verify(m, REGISTRY.check_op) is m


def test_direct_recursion() -> None:
    b = fb("f")
    x = b.param("x")
    (y,) = b.call("f", x)
    e = verify_error(single(b.ret(y)))
    check(e, "f", "%f = @f(%x)", "recursive calls are not allowed: @f -> @f")


def test_mutual_recursion() -> None:
    m = parse_module(
        "func @a(%x) {\n  %y = @b(%x)\n  return %y\n}\n"
        "func @b(%x) {\n  %y = @c(%x)\n  return %y\n}\n"
        "func @c(%x) {\n  %y = @a(%x)\n  return %y\n}\n"
        "func @main(%x) {\n  %y = @a(%x)\n  return %y\n}\n"
    )
    e = verify_error(m)
    check(e, "c", "%y = @a(%x)", "recursive calls are not allowed: @a -> @b -> @c -> @a")


def test_recursion_reached_from_entry() -> None:
    m = parse_module(
        "func @main(%x) {\n  %y = @a(%x)\n  return %y\n}\n"
        "func @a(%x) {\n  %y = @b(%x)\n  return %y\n}\n"
        "func @b(%x) {\n  %y = @a(%x)\n  return %y\n}\n"
    )
    e = verify_error(m)
    check(e, "b", "%y = @a(%x)", "@a -> @b -> @a")


def test_calling_a_later_function_is_fine_without_a_cycle() -> None:
    m = parse_module(
        "func @main(%x) {\n  %y = @a(%x)\n  @b(%x)\n  return %y\n}\n"
        "func @a(%x) {\n  return %x\n}\n"
        "func @b(%x) {\n  return\n}\n"
    )
    assert verify(m, REGISTRY.check_op) is m


def test_verify_error_without_context() -> None:
    e = VerifyError("plain")
    assert str(e) == "plain"
    e = VerifyError("m", "f", Call("g", (Value("a"),), ()), expected=1, actual=2)
    assert str(e) == "in @f, at `@g(%a)`: m (expected 1, got 2)"


def test_verify_checks_donations() -> None:
    """A donated parameter exists and is donated once, into a result that exists and that no
    other parameter is donated to (``Function.donated``)."""
    import dataclasses

    from distir.ir.function import Donation

    m = parse_module(
        """
func @f(%x: Tensor[f32, (4,), d0], %w: Tensor[f32, (4,), d0] donated(0)) {
  %y = Add(%x, %w)
  return %y
}"""
    )
    verify(m)
    for bad, message in (
        ((Donation(1, 0), Donation(0, 0)), "donated to result #0"),
        ((Donation(7, -1),), "no such parameter"),
        ((Donation(1, 3),), "donated to result #3"),
    ):
        with pytest.raises(VerifyError, match=message):
            verify(Module((dataclasses.replace(m.entry, donated=bad),)))
