"""Golden parse errors: exact ``FILE:LINE:COL: message`` first lines for malformed programs."""

from __future__ import annotations

import pytest

from distir.ir import ParseError, parse_module, parse_type

DTYPES = "f16, bf16, f8e4m3, f8e5m2, f32, f64, i8, i16, i32, i64, bool"

GOLDEN = [
    (
        "undefined-value",
        "func @main(%x) {\n  %y = Relu(%z)\n  return %y\n}\n",
        "prog.distir:2:13: use of undefined value %z",
    ),
    (
        "undefined-return",
        "func @main(%x) {\n  return %y\n}\n",
        "prog.distir:2:10: use of undefined value %y",
    ),
    (
        "use-before-definition",
        "func @main(%x) {\n  %y = Relu(%z)\n  %z = Relu(%x)\n  return %y\n}\n",
        "prog.distir:2:13: use of undefined value %z",
    ),
    (
        "self-use",
        "func @main(%x) {\n  %y = Relu(%y)\n  return %y\n}\n",
        "prog.distir:2:13: use of undefined value %y",
    ),
    (
        "duplicate-definition",
        "func @main(%x) {\n  %y = Relu(%x)\n  %y = Relu(%x)\n  return %y\n}\n",
        "prog.distir:3:3: value %y is already defined at 2:3",
    ),
    (
        "duplicate-result",
        "func @main(%x) {\n  %a, %a = Split(%x)\n  return %a\n}\n",
        "prog.distir:2:7: value %a is already defined at 2:3",
    ),
    (
        "duplicate-parameter",
        "func @main(%x, %x) {\n  return %x\n}\n",
        "prog.distir:1:16: value %x is already defined at 1:12",
    ),
    (
        "result-shadows-parameter",
        "func @main(%x) {\n  %x = Relu(%x)\n  return %x\n}\n",
        "prog.distir:2:3: value %x is already defined at 1:12",
    ),
    (
        "missing-close-paren",
        "func @main(%x) {\n  %y = Relu(%x\n  return %y\n}\n",
        "prog.distir:3:3: expected ')' to close the arguments of Relu, found 'return'",
    ),
    (
        "missing-close-paren-params",
        "func @main(%x {\n  return %x\n}\n",
        "prog.distir:1:15: expected ')' to close the parameter list, found '{'",
    ),
    (
        "unknown-dtype",
        "func @main(%x: Tensor[f31, (2,), d0]) {\n  return %x\n}\n",
        f"prog.distir:1:23: expected a dtype ({DTYPES}), found 'f31'",
    ),
    (
        "bad-device",
        "func @main(%x: Tensor[f32, (2,), gpu0]) {\n  return %x\n}\n",
        "prog.distir:1:34: expected a device like d0, found 'gpu0'",
    ),
    (
        "device-without-number",
        "func @main(%x: Scalar[f32, d]) {\n  return %x\n}\n",
        "prog.distir:1:28: expected a device like d0, found 'd'",
    ),
    (
        "unterminated-string",
        'func @main(%x) {\n  %y = Foo(%x, s="abc)\n  return %y\n}\n',
        "prog.distir:2:18: unterminated string",
    ),
    (
        "string-across-lines",
        'func @main(%x) {\n  %y = Foo(%x, s="abc\n")\n  return %y\n}\n',
        "prog.distir:2:18: unterminated string",
    ),
    (
        "value-after-attribute",
        "func @main(%x) {\n  %y = Concat(axis=0, %x)\n  return %y\n}\n",
        "prog.distir:2:23: value arguments must come before attributes",
    ),
    (
        "duplicate-attribute",
        "func @main(%x) {\n  %y = Split(%x, dim=0, dim=1)\n  return %y\n}\n",
        "prog.distir:2:25: attribute 'dim' is given twice",
    ),
    (
        "duplicate-function",
        "func @f() {\n  return\n}\n\nfunc @f() {\n  return\n}\n",
        "prog.distir:5:1: function @f is already defined at line 1",
    ),
    (
        "call-with-attributes",
        "func @g(%a) {\n  return %a\n}\nfunc @main(%x) {\n  %y = @g(%x, k=1)\n  return %y\n}\n",
        "prog.distir:5:8: a function call takes no attributes",
    ),
    (
        "unknown-escape",
        'func @main(%x) {\n  %y = Foo(%x, s="a\\qb")\n  return %y\n}\n',
        "prog.distir:2:18: unknown escape '\\q' in string",
    ),
    (
        "negative-dimension",
        "func @main(%x: Tensor[f32, (-2,), d0]) {\n  return %x\n}\n",
        "prog.distir:1:29: expected a non-negative dimension, found '-2'",
    ),
    (
        "unknown-type",
        "func @main(%x: Vector[f32]) {\n  return %x\n}\n",
        "prog.distir:1:16: unknown type 'Vector': "
        "expected Tensor[...], Scalar[...], Tuple[...] or DTensor[...]",
    ),
    (
        "missing-return",
        "func @main(%x) {\n  %y = Relu(%x)\n}\n",
        "prog.distir:3:1: expected an op or 'return' in @main, found '}'",
    ),
    (
        "end-of-input",
        "func @main(%x) {\n  %y = Relu(%x)\n",
        "prog.distir:3:1: expected an op or 'return' in @main, found end of input",
    ),
    (
        "bad-attribute-value",
        "func @main(%x) {\n  %y = Foo(%x, k=gpu)\n  return %y\n}\n",
        "prog.distir:2:18: unknown attribute value 'gpu': expected a number, a string, "
        "true/false, a device like d0, a dtype, or a [list]",
    ),
    (
        "unexpected-character",
        "func @main(%x) {\n  %y = Relu(%x) $ \n  return %y\n}\n",
        "prog.distir:2:17: unexpected character '$'",
    ),
    (
        "instruction-outside-function",
        "%x = Relu(%y)\n",
        "prog.distir:1:1: expected 'func' at the start of a function, found '%x'",
    ),
    (
        "missing-equals",
        "func @main(%x) {\n  %y Relu(%x)\n  return %y\n}\n",
        "prog.distir:2:6: expected '=' after the results of an op, found 'Relu'",
    ),
    (
        "nesting-too-deep",
        "func @main() {\n  %y = Foo(k=" + "[" * 65 + "]" * 65 + ")\n  return %y\n}\n",
        "prog.distir:2:78: nesting deeper than 64 levels",
    ),
    (
        "integer-too-long",
        "func @main() {\n  %y = Foo(k=" + "1" * 5000 + ")\n  return %y\n}\n",
        "prog.distir:2:14: integer with 5000 digits is too long",
    ),
    (
        "shape-above-the-element-bound",  # 2**64 elements: numpy's int64 shapes would overflow
        "func @main(%x: Tensor[f32, (4294967296, 4294967296), d0]) {\n  return %x\n}\n",
        "prog.distir:1:16: tensor shape (4294967296, 4294967296): its elements = 18,446,744,073,709,551,616 "
        "is above distir's bound of 9,007,199,254,740,992 elements in one tensor (docs/limitations.md)",
    ),
]


@pytest.mark.parametrize(("src", "expected"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_golden_parse_error(src: str, expected: str) -> None:
    with pytest.raises(ParseError) as ei:
        parse_module(src, "prog.distir")
    assert str(ei.value).split("\n")[0] == expected


def test_full_error_text_has_caret_excerpt() -> None:
    src = "func @main(%x) {\n  %y = Relu(%z)\n  return %y\n}\n"
    with pytest.raises(ParseError) as ei:
        parse_module(src, "prog.distir")
    e = ei.value
    assert str(e) == ("prog.distir:2:13: use of undefined value %z\n    %y = Relu(%z)\n              ^")
    assert (e.line, e.col, e.filename, e.message) == (2, 13, "prog.distir", "use of undefined value %z")


def test_default_filename() -> None:
    with pytest.raises(ParseError, match=r"^<text>:1:1: expected 'func'"):
        parse_module("return")


def test_error_at_end_of_input_after_trailing_newline() -> None:
    with pytest.raises(ParseError) as ei:
        parse_module("func @f(\n")
    assert (ei.value.line, ei.value.col) == (2, 1)
    assert str(ei.value).endswith("\n  \n  ^")


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("Tensor[f32, (2,), d0] x", "<type>:1:23: unexpected 'x' after the type"),
        ("Tensor[f32, (2,)]", "<type>:1:17: expected ',' after the tensor shape, found ']'"),
        ("Scalar[f32]", "<type>:1:11: expected ',' after the scalar dtype, found ']'"),
        (
            "Tuple[f32]",
            "<type>:1:7: unknown type 'f32': expected Tensor[...], Scalar[...], Tuple[...] or DTensor[...]",
        ),
        (
            "",
            "<type>:1:1: expected a name as a type (Tensor[...], Scalar[...] or Tuple[...]), "
            "found end of input",
        ),
    ],
)
def test_golden_type_errors(src: str, expected: str) -> None:
    with pytest.raises(ParseError) as ei:
        parse_type(src)
    assert str(ei.value).split("\n")[0] == expected
