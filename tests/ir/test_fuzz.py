"""Parser robustness: any text either parses to a Module or raises ParseError -- nothing else --
and a ParseError points at a real place of the text (1-based line/col) with a caret excerpt."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distir.ir import Module, ParseError, parse_module, parse_type, print_module

from .strategies import modules

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_error(e: ParseError, src: str, filename: str = "<text>") -> None:
    lines = src.split("\n")
    assert 1 <= e.line <= len(lines), (e.line, len(lines))
    line = lines[e.line - 1]
    assert 1 <= e.col <= len(line) + 1, (e.col, line)
    text = str(e)
    head, *rest = text.split("\n")
    assert head == f"{filename}:{e.line}:{e.col}: {e.message}"
    assert f"{e.line}:{e.col}" in head
    assert e.message and "\n" not in e.message
    # the excerpt is the offending line (without a CRLF's \r) and a caret under the column
    assert rest == ["  " + line.rstrip("\r"), "  " + " " * (e.col - 1) + "^"], rest


def parses_or_fails_cleanly(src: str) -> Module | None:
    """Parse ``src``; only ParseError may escape, and a parsed module must print stably."""
    try:
        m = parse_module(src)
    except ParseError as e:
        check_error(e, src)
        return None
    assert isinstance(m, Module)
    text = print_module(m)
    text.encode("utf-8")  # printed programs can be written to a file
    assert print_module(parse_module(text)) == text
    return m


# -- random text ---------------------------------------------------------------------------------

GRAMMAR_CHARS = '%@()[]{},:="\\/ \n\r\t-+.0123456789abdefilnrtuxTSfcmpu_eEü\u2028\x0c\x00'
TOKENS = [
    "func",
    "@f",
    "@main",
    "%x",
    "%y",
    "%0",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "return",
    "Tensor",
    "Scalar",
    "Tuple",
    "f32",
    "bool",
    "i64",
    "d0",
    "d12",
    "dx",
    "(1,)",
    "()",
    "Add",
    "rank.Send",
    "axis",
    "a=",
    "1",
    "-1",
    "1.5",
    "-2e-3",
    "1e400",
    "inf",
    "-inf",
    "nan",
    "true",
    '"s"',
    '"a\\"b"',
    '"\\u00e9"',
    '"\\ud800"',
    '"\\q"',
    '"',
    "\\",
    "//",
    "// c\n",
    "\n",
    "\r\n",
    " ",
    "-",
    "9" * 5000,
    "ü",
    "\u2028",
]
token_soup = st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join) | st.lists(
    st.sampled_from(TOKENS), max_size=40
).map("".join)


@FUZZ
@given(st.text(max_size=200))
def test_random_text(src: str) -> None:
    parses_or_fails_cleanly(src)


@FUZZ
@given(st.text(alphabet=GRAMMAR_CHARS, max_size=200))
def test_random_grammar_characters(src: str) -> None:
    parses_or_fails_cleanly(src)


@FUZZ
@given(token_soup)
def test_token_soup(src: str) -> None:
    parses_or_fails_cleanly(src)


@FUZZ
@given(st.text(alphabet=GRAMMAR_CHARS, max_size=80) | token_soup)
def test_parse_type_raises_only_parse_error(src: str) -> None:
    try:
        t = parse_type(src)
    except ParseError as e:
        check_error(e, src, "<type>")
    else:
        assert parse_type(str(t)) == t


# -- mutated printed programs --------------------------------------------------------------------

_TOKEN_SPLIT = re.compile(r'\s+|"(?:[^"\\\n]|\\.)*"|[%@]?[A-Za-z0-9_.\-]+|.', re.S)

mutation = st.tuples(
    st.sampled_from(
        ["delete", "insert", "duplicate", "swap", "tdelete", "tinsert", "tduplicate", "tswap", "treplace"]
    ),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from(TOKENS) | st.text(alphabet=GRAMMAR_CHARS, min_size=1, max_size=3),
)


def mutate(text: str, muts: list[tuple[str, int, int, str]]) -> str:
    for kind, i, j, payload in muts:
        if kind.startswith("t"):
            toks = _TOKEN_SPLIT.findall(text) or [""]
            a, b = i % len(toks), j % len(toks)
            if kind == "tdelete":
                del toks[a]
            elif kind == "tinsert":
                toks.insert(a, payload)
            elif kind == "tduplicate":
                toks.insert(a, toks[a])
            elif kind == "tswap":
                toks[a], toks[b] = toks[b], toks[a]
            else:
                toks[a] = payload
            text = "".join(toks)
            continue
        n = len(text) or 1
        a, b = i % n, j % n
        if kind == "delete":
            text = text[:a] + text[a + 1 :]
        elif kind == "insert":
            text = text[:a] + payload + text[a:]
        elif kind == "duplicate":
            lo, hi = min(a, b), max(a, b)
            text = text[:hi] + text[lo:hi] + text[hi:]
        elif text:
            chars = list(text)
            chars[a], chars[b] = chars[b], chars[a]
            text = "".join(chars)
    return text


@FUZZ
@given(modules(max_functions=3, max_instrs=5), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_programs(m: Module, muts: list[tuple[str, int, int, str]]) -> None:
    parses_or_fails_cleanly(mutate(print_module(m), muts))


def test_mutation_is_not_a_no_op() -> None:
    # guard against a mutator that silently never changes anything
    src = "func @f(%x) {\n  return %x\n}\n"
    assert mutate(src, [("delete", 0, 0, "")]) == src[1:]
    assert mutate(src, [("tdelete", 2, 0, "")]) == src.replace("@f", "", 1)
    assert mutate(src, [("tswap", 0, 2, "")]).startswith("@f func")


# -- pathological inputs -------------------------------------------------------------------------

DEEP = [1, 63, 64, 65, 66, 1000, 100_000]


@pytest.mark.slow
@pytest.mark.parametrize("n", DEEP)
@pytest.mark.parametrize(
    "make",
    [
        lambda n: "[" * n,
        lambda n: "func @f() {\n  %x = Foo(a=" + "[" * n,
        lambda n: "func @f() {\n  %x = Foo(a=" + "[" * n + "]" * n + ")\n  return %x\n}\n",
        lambda n: "func @f(%x: " + "Tuple[" * n,
        lambda n: "func @f(%x: " + "Tuple[" * n + "]" * n + ") {\n  return %x\n}\n",
        lambda n: "(" * n + "{" * n,
        lambda n: "func @f() {\n  %x = Foo(" + "(" * n,
    ],
    ids=["brackets", "attr-open", "attr-closed", "type-open", "type-closed", "parens", "args"],
)
def test_deep_nesting(make, n: int) -> None:
    src = make(n)
    m = parses_or_fails_cleanly(src)
    if n <= 64 and src.endswith("}\n"):
        assert m is not None  # within the nesting limit, well-formed programs parse
    if n > 64:
        assert m is None


@pytest.mark.parametrize(
    "src",
    [
        "func @f() {\n  %x = Foo(a=" + "7" * 5000 + ")\n  return %x\n}\n",
        "func @f() {\n  %x = Foo(a=-" + "7" * 5000 + ")\n  return %x\n}\n",
        "func @f() {\n  %x = Foo(a=d" + "7" * 5000 + ")\n  return %x\n}\n",
        "func @f(%a: Tensor[f32, (" + "7" * 5000 + ",), d0]) {\n  return %a\n}\n",
        "func @f(%a: Scalar[f32, d" + "7" * 5000 + "]) {\n  return %a\n}\n",
        "func @f() {\n  %x = Foo(a=" + "7" * 5000 + ".5)\n  return %x\n}\n",
    ],
    ids=["int", "negative-int", "device-attr", "dim", "device", "float"],
)
def test_huge_numbers(src: str) -> None:
    parses_or_fails_cleanly(src)


def test_huge_integer_error_points_at_the_number() -> None:
    src = "func @f() {\n  %x = Foo(a=" + "7" * 5000 + ")\n  return %x\n}\n"
    with pytest.raises(ParseError) as ei:
        parse_module(src)
    assert (ei.value.line, ei.value.col) == (2, 14)
    assert "too long" in ei.value.message


@pytest.mark.parametrize("sep", ["\u2028", "\x0c", "\x85", "\r", "\x1e"])
def test_excerpt_uses_the_same_lines_as_the_position(sep: str) -> None:
    # str.splitlines() splits at these too; the error's line number only counts "\n"
    src = f'func @f() {{\n  %x = Foo(a="{sep}")\n  %y = Bar(%z)\n  return %x\n}}\n'
    if sep == "\r":
        src = src.replace('"\r"', '""') + "\r"  # a lone CR is whitespace, not a string character
        src = src.replace("  %y", "\r  %y")
    with pytest.raises(ParseError) as ei:
        parse_module(src)
    check_error(ei.value, src)
    assert "%y = Bar(%z)" in str(ei.value).split("\n")[1]


def test_crlf_source_positions() -> None:
    src = "func @f() {\r\n  return %x\r\n}\r\n"
    with pytest.raises(ParseError) as ei:
        parse_module(src)
    assert (ei.value.line, ei.value.col) == (2, 10)
    assert str(ei.value).split("\n")[1:] == ["    return %x", "           ^"]


def test_lone_surrogate_escape_prints_encodable_text() -> None:
    m = parses_or_fails_cleanly('func @f() {\n  %x = Foo(a="\\ud800\\udfff")\n  return %x\n}\n')
    assert m is not None
    op = next(m.entry.ops())
    assert op.attrs["a"] == "\ud800\udfff"
