"""Builder, module, value and attribute semantics: immutability, naming, identity."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.ir import (
    Attrs,
    Call,
    Device,
    DType,
    Function,
    FunctionBuilder,
    IRTypeError,
    Module,
    ModuleError,
    Op,
    ScalarType,
    TensorType,
    TupleType,
    Value,
    parse_module,
    print_function,
    print_module,
)
from distir.ir.builder import BuilderError, module
from distir.ops.registry import REGISTRY

from .strategies import attr_values

D0 = Device(0)
T = TensorType(DType.f32, (2, 3), D0)


def simple(name: str, ret_param: bool = True) -> Function:
    b = FunctionBuilder(name)
    x = b.param("x")
    return b.ret(x) if ret_param else b.ret()


# -- immutability --------------------------------------------------------------------------------


def test_function_is_frozen() -> None:
    f = simple("f")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.name = "g"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.body = ()  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        f.extra = 1  # type: ignore[attr-defined]
    assert isinstance(f.params, tuple) and isinstance(f.body, tuple)
    assert isinstance(f.outputs, tuple)


def test_module_and_ops_are_frozen() -> None:
    m = Module((simple("f"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.functions = ()  # type: ignore[misc]
    op = Op("Relu", (Value("x"),), (Value("y"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.name = "Neg"  # type: ignore[misc]
    call = Call("f", (), ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.callee = "g"  # type: ignore[misc]
    with pytest.raises(TypeError):
        op.attrs["k"] = 1  # type: ignore[index]


def test_types_are_frozen_and_hashable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        T.shape = (1,)  # type: ignore[misc]
    assert len({T, TensorType(DType.f32, (2, 3), Device(0)), T.with_device(Device(1))}) == 2


def test_builder_is_unusable_after_ret() -> None:
    b = FunctionBuilder("f", out_arity=REGISTRY.out_arity)
    x = b.param("x")
    (y,) = b.op("Relu", x)
    f = b.ret(y)
    for attempt in (
        lambda: b.param("z"),
        lambda: b.op("Relu", x),
        lambda: b.call(f, x),
        lambda: b.append(Op("Relu", (x,), (Value("w"),))),
        lambda: b.ret(x),
    ):
        with pytest.raises(BuilderError, match="function @f is already finished"):
            attempt()
    assert len(f.body) == 1 and f.params == (x,) and f.outputs == (y,)


def test_function_does_not_share_builder_state() -> None:
    b = FunctionBuilder("f")
    x = b.param("x")
    b.op("Relu", x)
    f = b.ret(x)
    b._body.append(Op("Neg", (x,), ()))  # even poking the builder's list leaves f alone
    b._params.append(Value("late"))
    assert len(f.body) == 1 and len(f.params) == 1


# -- builder -------------------------------------------------------------------------------------


def test_builder_out_arity_from_registry() -> None:
    b = FunctionBuilder("f", out_arity=REGISTRY.out_arity)
    x = b.param("x", T)
    assert len(b.op("Split", x, num_splits=3)) == 3
    assert len(b.op("Split", x, sizes=[1, 1, 1, 1])) == 4
    assert len(b.op("Split", x)) == 2
    assert len(b.op("AllReduce", x, x, x)) == 3
    assert len(b.op("rank.Send", x, dst=D0)) == 0
    assert len(b.op("Relu", x, n_out=2)) == 2  # n_out wins over the registry


def test_builder_without_out_arity_defaults_to_one_result() -> None:
    b = FunctionBuilder("f")
    x = b.param("x")
    assert len(b.op("Split", x, num_splits=3)) == 1
    assert len(b.op("Split", x, names=["a", "b"])) == 2
    assert len(b.op("Split", x, types=[None, T, None])) == 3


def test_builder_result_names_and_types() -> None:
    b = FunctionBuilder("f")
    x = b.param("x", T)
    assert x.type == T and x.name == "x"
    (y,) = b.op("MatMul", x, x)
    assert y.name == "matmul" and y.type is None  # default hint: lower-cased op name
    (a, c) = b.op("Split", x, names=["lo", "hi"], types=[T, None])
    assert (a.name, a.type, c.name, c.type) == ("lo", T, "hi", None)
    op = b._body[-1]
    assert isinstance(op, Op) and op.outputs == (a, c) and op.inputs == (x,)


def test_builder_name_and_type_count_mismatch() -> None:
    b = FunctionBuilder("f")
    x = b.param("x")
    with pytest.raises(BuilderError, match="2 names given for 3 results"):
        b.op("Split", x, n_out=3, names=["a", "b"])
    with pytest.raises(BuilderError, match="1 types given for 2 results"):
        b.op("Split", x, names=["a", "b"], types=[T])
    with pytest.raises(BuilderError, match="1 names given for 2 results"):
        b.call("g", x, n_out=2, names=["a"])
    assert b._body == []  # nothing half-appended


def test_builder_call_takes_arity_from_callee() -> None:
    g = FunctionBuilder("g")
    p = g.param("p")
    gf = g.ret(p, p, p)
    b = FunctionBuilder("main")
    x = b.param("x")
    outs = b.call(gf, x)
    assert len(outs) == 3 and all(o.name == "g" for o in outs)
    assert len(b.call("g", x)) == 1  # by name: one result unless told
    assert len(b.call("g", x, types=[None, None])) == 2
    call = b._body[0]
    assert isinstance(call, Call) and call.callee == "g" and call.inputs == (x,)


def test_builder_attrs_are_frozen() -> None:
    b = FunctionBuilder("f")
    x = b.param("x")
    sizes = [1, [2, 3]]
    b.op("Split", x, sizes=sizes)
    sizes.append(4)
    op = b._body[0]
    assert isinstance(op, Op) and op.attrs["sizes"] == (1, (2, 3))
    with pytest.raises(TypeError, match="unsupported attribute value"):
        b.op("Split", x, sizes={1, 2})


# -- modules -------------------------------------------------------------------------------------


def test_module_duplicate_names() -> None:
    with pytest.raises(ModuleError, match="function @f is defined twice"):
        Module((simple("f"), simple("g"), simple("f")))
    with pytest.raises(ModuleError):
        module([simple("f"), simple("f")])


def test_module_lookup_and_entry() -> None:
    f, g = simple("f"), simple("g")
    m = Module((f, g))
    assert m["f"] is f and m.entry is g and "f" in m and "h" not in m
    with pytest.raises(ModuleError, match="no function @h in module; functions: @f, @g"):
        m["h"]
    with pytest.raises(ModuleError, match="no entry point"):
        _ = Module(()).entry
    with pytest.raises(ModuleError, match="functions: none"):
        Module(())["f"]


def test_module_with_entry() -> None:
    f, g, h = simple("f"), simple("g"), simple("h")
    m = Module((f, g, h))
    m2 = m.with_entry("f")
    assert m2.functions == (g, h, f) and m2.entry is f
    assert m.functions == (f, g, h)  # the original is unchanged
    assert m.with_entry("h").functions == (f, g, h)
    with pytest.raises(ModuleError, match="no function @x"):
        m.with_entry("x")
    assert print_module(m2).index("func @f") > print_module(m2).index("func @h")


def test_module_replace() -> None:
    f, g = simple("f"), simple("g")
    m = Module((f, g))
    f2 = simple("f", ret_param=False)
    assert m.replace(f2).functions == (f2, g)
    h = simple("h")
    assert m.replace(h).functions == (f, g, h)
    assert m.functions == (f, g)


# -- value identity and naming -------------------------------------------------------------------


def test_values_compare_by_identity() -> None:
    a, b = Value("x", T), Value("x", T)
    assert a != b and a == a
    assert len({a, b}) == 2
    assert repr(a) == f"%x: {T}" and repr(Value("y")) == "%y"


def test_same_hint_values_print_uniquely() -> None:
    b = FunctionBuilder("f")
    x1 = b.param("x")
    x2 = b.param("x")
    (x3,) = b.op("Add", x1, x2, names=["x"])
    (y,) = b.op("Add", x3, x1, names=["x_1"])  # hint that collides with a generated name
    text = print_function(b.ret(y, x2))
    assert text == (
        "func @f(%x, %x_1) {\n  %x_2 = Add(%x, %x_1)\n  %x_1_1 = Add(%x_2, %x)\n  return %x_1_1, %x_1\n}"
    )
    m = parse_module(text + "\n")
    f = m.entry
    assert [p.name for p in f.params] == ["x", "x_1"]
    assert f.body[1].inputs == (f.body[0].outputs[0], f.params[0])


def test_names_are_sanitized() -> None:
    b = FunctionBuilder("f")
    ps = [b.param(n) for n in ["a b", "", "ü", "%x", "0", "a.b", "a_b", ""]]
    text = print_function(b.ret(*ps))
    assert text.split("\n")[0] == "func @f(%a_b, %v, %_, %_x, %0, %a.b, %a_b_1, %v_1) {"
    parse_module(text)


def test_function_str_is_printed_form() -> None:
    f = simple("f")
    assert str(f) == print_function(f) == "func @f(%x) {\n  return %x\n}"
    assert str(Module((f,))) == str(f) + "\n"


# -- attributes ----------------------------------------------------------------------------------


def test_attrs_mapping_behaviour() -> None:
    a = Attrs({"b": 1, "a": [1, 2]})
    assert list(a) == ["b", "a"] and len(a) == 2 and a["a"] == (1, 2)
    assert a.items_in_order() == (("b", 1), ("a", (1, 2)))
    assert a.get("zz") is None and a.get("zz", 7) == 7 and a.get("b", 7) == 1
    assert "a" in a and "zz" not in a and 1 not in a
    with pytest.raises(ValueError, match="duplicate attribute names"):
        Attrs([("a", 1), ("a", 2)])
    with pytest.raises(TypeError, match="unsupported attribute value"):
        Attrs({"a": None})
    assert Attrs(a) == a


@pytest.mark.parametrize(
    ("x", "y"),
    [
        (1, True),
        (1, 1.0),
        (0, False),
        ((1,), (True,)),
        ((1, 2), (1.0, 2)),
        (((0,),), ((False,),)),
        ((1,), 1),
        ("d0", Device(0)),
        ("f32", DType.f32),
    ],
)
def test_attrs_equality_is_type_exact(x: object, y: object) -> None:
    # Constant(value=[1]) and Constant(value=[True]) are different ops
    assert Attrs({"k": x}) != Attrs({"k": y})
    assert Attrs({"k": y}) != Attrs({"k": x})


def test_attrs_equality_ignores_order_and_hash_agrees() -> None:
    a = Attrs({"a": 1, "b": (2.5, "s")})
    b = Attrs({"b": (2.5, "s"), "a": 1})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_attrs_with_nan_equal_a_reparsed_copy() -> None:
    a = Attrs({"k": math.nan, "l": (1.0, math.nan)})
    b = Attrs({"k": float("nan"), "l": (1.0, float("nan"))})
    assert a == b and hash(a) == hash(b)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), attr_values, max_size=4), st.randoms())
def test_attrs_equality_is_reflexive_and_consistent_with_hash(d: dict, rnd) -> None:
    items = list(d.items())
    rnd.shuffle(items)
    a, b = Attrs(d), Attrs(items)
    assert a == b and hash(a) == hash(b)


# -- type construction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Device(-1),
        lambda: Device(True),
        lambda: Device(1.0),
        lambda: TensorType(DType.f32, (-1,), D0),
        lambda: TensorType(DType.f32, [2], D0),
        lambda: TensorType(DType.f32, (True,), D0),
        lambda: TensorType("f32", (2,), D0),
        lambda: TensorType(DType.f32, (2,), 0),
        lambda: ScalarType(DType.f32, "d0"),
        lambda: TupleType([T]),
        lambda: TupleType((T, 1)),
        lambda: DType.parse("f31"),
    ],
)
def test_ill_formed_types_cannot_exist(make) -> None:
    with pytest.raises(IRTypeError):
        make()


def test_type_spelling() -> None:
    assert str(TensorType(DType.bf16, (), Device(3))) == "Tensor[bf16, (), d3]"
    assert str(TensorType(DType.i8, (5,), D0)) == "Tensor[i8, (5,), d0]"
    assert str(TensorType(DType.f64, (1, 0, 7), D0)) == "Tensor[f64, (1, 0, 7), d0]"
    assert str(ScalarType(DType.bool, Device(12))) == "Scalar[bool, d12]"
    assert str(TupleType(())) == "Tuple[]"
    assert str(TupleType((T, TupleType(())))) == f"Tuple[{T}, Tuple[]]"
