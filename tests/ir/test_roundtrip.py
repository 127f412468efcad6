"""Printer/parser round trips on random valid modules and types."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distir.ir import Function, Module, Op, Value, parse_module, parse_type, print_module
from distir.ir.verify import verify
from distir.ops.registry import REGISTRY

from .strategies import modules, types
from .structural import structural_diff, structurally_equal

ROUNDTRIP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ROUNDTRIP
@given(modules())
def test_print_parse_print_is_identity(m: Module) -> None:
    assert verify(m, REGISTRY.check_op) is m  # the strategy only draws valid modules
    text = print_module(m)
    m2 = parse_module(text)
    assert print_module(m2) == text
    d = structural_diff(m, m2)
    assert d is None, f"{d}\n{text}"
    # the parsed module is as valid as the original
    verify(m2, REGISTRY.check_op)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules(registered=False))
def test_roundtrip_with_arbitrary_ops_and_attributes(m: Module) -> None:
    verify(m)  # no op checker: names and attributes are arbitrary
    text = print_module(m)
    m2 = parse_module(text)
    assert print_module(m2) == text
    d = structural_diff(m, m2)
    assert d is None, f"{d}\n{text}"


@settings(max_examples=300, deadline=None)
@given(types())
def test_parse_type_inverts_str(t: object) -> None:
    s = str(t)
    assert parse_type(s) == t
    assert str(parse_type(s)) == s


# -- the structural-equality helper itself must be able to fail ----------------------------------

BASE = """\
func @g(%a: Tensor[f32, (2,), d0], %b) {
  %c_d = Add(%a, %b)
  return %c_d
}

func @main(%x: Tensor[f32, (2,), d0], %y) {
  %s, %t = Split(%x, num_splits=2, dim=0)
  %z = @g(%s, %y)
  %k = Constant(value=[1, 2.5, true], device=d0)
  return %z, %t
}
"""


def test_structural_equality_holds_for_reparse() -> None:
    m = parse_module(BASE)
    assert structurally_equal(m, parse_module(print_module(m)))
    assert structurally_equal(m, m)


def test_structural_equality_ignores_value_identity_and_unsanitized_hints() -> None:
    a = parse_module(BASE)
    g, main = a.functions
    op = g.body[0]
    assert isinstance(op, Op)
    # fresh Value objects; "c d" prints as %c_d, like the parsed value
    pa, pb = (Value(p.name, p.type) for p in g.params)
    c = Value("c d")
    g2 = Function(g.name, (pa, pb), (Op(op.name, (pa, pb), (c,), op.attrs),), (c,))
    assert structurally_equal(a, Module((g2, main)))
    c_bad = Value("c.d")  # a different printed name
    g3 = Function(g.name, (pa, pb), (Op(op.name, (pa, pb), (c_bad,), op.attrs),), (c_bad,))
    assert not structurally_equal(a, Module((g3, main)))


@given(
    st.sampled_from(
        [
            [("%c_d = Add(%a, %b)", "%c_d = Add(%b, %a)")],  # data flow
            [("Split(%x, num_splits=2, dim=0)", "Split(%x, dim=0, num_splits=2)")],  # attribute order
            [("num_splits=2", "num_splits=3")],  # attribute value
            [("[1, 2.5, true]", "[1, 2.5, 1]")],  # nested attribute kind
            [("[1, 2.5, true]", "[1.0, 2.5, true]")],  # nested int vs float
            [("value=[1, 2.5, true]", "value=[1, -0.0, true]")],  # float sign
            [("%c_d = Add", "%c_d = Sub")],  # op name
            [("%z = @g(%s, %y)", "%z = Add(%s, %y)")],  # call vs op
            [("%b) {", "%b: Scalar[f32, d0]) {")],  # declared type
            [("(2,), d0], %y", "(2,), d1], %y")],  # device
            [("return %z, %t", "return %t, %z")],  # returns
            [("return %z, %t", "return %z")],  # number of returns
            [("%s, %t = Split", "%s, %tt = Split"), ("return %z, %t", "return %z, %tt")],  # name hint
            [("@g", "@h"), ("@g", "@h")],  # function name
            [
                ("func @main(%x: Tensor[f32, (2,), d0], %y)", "func @main(%x: Tensor[f32, (2,), d0])"),
                ("@g(%s, %y)", "@g(%s, %x)"),
            ],  # parameter count
        ]
    )
)
def test_structural_equality_detects_differences(changes: list[tuple[str, str]]) -> None:
    src = BASE
    for old, new in changes:
        assert old in src
        src = src.replace(old, new, 1)
    a, b = parse_module(BASE), parse_module(src)
    assert not structurally_equal(a, b)
    assert not structurally_equal(b, a)
