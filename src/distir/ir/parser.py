"""Parser for the DistIR text format (files ``*.distir``).

Grammar (``//`` starts a comment that runs to the end of the line)::

    module   := function*
    function := "func" "@"NAME "(" [param ("," param)*] ")" "{" instr* "return" [vals] "}"
    param    := "%"NAME [":" type] ["donated" ["(" INT ")"]]     (``Function.donated``)
    instr    := [result ("," result)* "="] (OPNAME | "@"NAME) "(" [args] ")"
    result   := "%"NAME [":" type]
    args     := value ("," value)* ["," attr ("," attr)*]  |  attr ("," attr)*
    attr     := IDENT "=" attrval
    attrval  := INT | FLOAT | STRING | "true" | "false" | "inf" | "-inf" | "nan"
              | DEVICE | DTYPE | "[" [attrval ("," attrval)*] "]"
    type     := "Tensor" "[" DTYPE "," shape "," DEVICE "]"
              | "Scalar" "[" DTYPE "," DEVICE "]"
              | "Tuple" "[" [type ("," type)*] "]"
    shape    := "(" [INT ("," INT)* [","]] ")"
    DEVICE   := "d" DIGITS          NAME := [A-Za-z0-9_.]+

Every error is a ``ParseError`` carrying line, column and a caret excerpt; the parser never
lets another exception escape for any input text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, replace

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard, axis_size
from distir.ir.function import Donation, Function, Module, ModuleError
from distir.ir.ops import Call, Op
from distir.ir.types import Device, DType, IRTypeError, ScalarType, TensorType, TupleType, Type
from distir.ir.values import EMPTY_ATTRS, Attrs, AttrValue, Value
from distir.limits import MAX_TYPE_NESTING

MAX_NESTING = MAX_TYPE_NESTING  # as TupleType allows: a printed program parses back


class ParseError(ValueError):
    """Malformed program text. ``str(e)`` is ``FILE:LINE:COL: message`` plus a caret excerpt."""

    def __init__(self, message: str, line: int, col: int, source: str, filename: str = "<text>"):
        self.message = message
        self.line = line
        self.col = col
        self.filename = filename
        lines = source.split("\n")  # the lines _line_col counts (splitlines also splits at \r, \f, ...)
        text = lines[line - 1].rstrip("\r") if 0 < line <= len(lines) else ""
        self.excerpt = f"  {text}\n  {' ' * (col - 1)}^"
        super().__init__(f"{filename}:{line}:{col}: {message}\n{self.excerpt}")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # VALUE FUNC IDENT INT FLOAT STRING PUNCT EOF
    text: str
    pos: int


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+|//[^\n]*)
  | (?P<VALUE>%[A-Za-z0-9_.]+)
  | (?P<FUNC>@[A-Za-z0-9_.]+)
  | (?P<FLOAT>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+))
  | (?P<INT>-?\d+)
  | (?P<IDENT>-?[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<STRING>"(?:[^"\\\n]|\\.)*")
  | (?P<PUNCT>[()\[\]{},:=;])
    """,
    re.VERBOSE | re.ASCII,  # digits are ASCII only (distir.limits): never ``٢`` or ``²``
)
_DEVICE_RE = re.compile(r"d([0-9]+)")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def _tokenize(src: str, filename: str) -> list[Token]:
    toks: list[Token] = []
    pos = 0
    n = len(src)
    while pos < n:
        m = _TOKEN_RE.match(src, pos)
        if m is None:
            line, col = _line_col(src, pos)
            ch = src[pos]
            msg = "unterminated string" if ch == '"' else f"unexpected character {ch!r}"
            raise ParseError(msg, line, col, src, filename)
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            toks.append(Token(kind, m.group(), pos))
        pos = m.end()
    toks.append(Token("EOF", "", n))
    return toks


def _line_col(src: str, pos: int) -> tuple[int, int]:
    line = src.count("\n", 0, pos) + 1
    col = pos - (src.rfind("\n", 0, pos) + 1) + 1
    return line, col


class _Parser:
    def __init__(self, src: str, filename: str) -> None:
        self.src = src
        self.filename = filename
        self.toks = _tokenize(src, filename)
        self.i = 0
        self.depth = 0
        self.line_starts = [0, *(m.end() for m in re.finditer("\n", src))]
        # where each op, call, function and value was written: object -> (line, col)
        self.positions: dict[object, tuple[int, int]] = {}

    # -- token helpers -------------------------------------------------------------------------
    def line_col(self, pos: int) -> tuple[int, int]:
        """1-based line and column of an offset, by binary search over line starts (positions are
        recorded for every op and value, so this must not scan the text)."""
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def peek(self) -> Token:
        return self.toks[self.i]

    def next(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "EOF":
            self.i += 1
        return t

    def error(self, msg: str, tok: Token | None = None) -> ParseError:
        tok = tok if tok is not None else self.peek()
        line, col = _line_col(self.src, tok.pos)
        return ParseError(msg, line, col, self.src, self.filename)

    def describe(self, tok: Token) -> str:
        return "end of input" if tok.kind == "EOF" else repr(tok.text)

    def is_punct(self, ch: str) -> bool:
        t = self.peek()
        return t.kind == "PUNCT" and t.text == ch

    def expect_punct(self, ch: str, context: str) -> Token:
        t = self.next()
        if t.kind != "PUNCT" or t.text != ch:
            raise self.error(f"expected '{ch}' {context}, found {self.describe(t)}", t)
        return t

    def expect_ident(self, word: str | None, context: str) -> Token:
        t = self.next()
        if t.kind != "IDENT" or (word is not None and t.text != word):
            what = f"'{word}'" if word is not None else "a name"
            raise self.error(f"expected {what} {context}, found {self.describe(t)}", t)
        return t

    def nest(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"nesting deeper than {MAX_NESTING} levels", tok)

    # -- grammar -------------------------------------------------------------------------------
    def module(self) -> Module:
        fns: list[Function] = []
        seen: dict[str, Token] = {}
        while self.peek().kind != "EOF":
            start = self.peek()
            fn = self.function()
            if fn.name in seen:
                line, _ = _line_col(self.src, seen[fn.name].pos)
                raise self.error(f"function @{fn.name} is already defined at line {line}", start)
            seen[fn.name] = start
            fns.append(fn)
        try:
            return Module(tuple(fns))
        except ModuleError as e:  # pragma: no cover - duplicates are caught above
            raise self.error(str(e)) from None

    def function(self) -> Function:
        self.expect_ident("func", "at the start of a function")
        t = self.next()
        if t.kind != "FUNC":
            raise self.error(f"expected a function name like @main, found {self.describe(t)}", t)
        fb = FunctionBuilder(t.text[1:])
        fn_pos = self.line_col(t.pos)
        scope: dict[str, tuple[Value, Token]] = {}
        self.expect_punct("(", "after the function name")
        gifts: list[Donation] = []  # donated parameters (``Function.donated``)
        gifts_at: list[Token] = []  # each parameter's token
        if not self.is_punct(")"):
            while True:
                tok = self.next()
                if tok.kind != "VALUE":
                    raise self.error(f"expected a parameter like %x, found {self.describe(tok)}", tok)
                typ = self.type() if self._maybe(":") else None
                nxt = self.peek()
                donated = nxt.kind == "IDENT" and nxt.text == "donated"
                if donated:
                    self.next()
                    into = -1
                    if self._maybe("("):
                        r = self.next()
                        if r.kind != "INT" or r.text.startswith("-"):
                            raise self.error(f"expected a result index, found {self.describe(r)}", r)
                        into = int(r.text)
                        self.expect_punct(")", "after the donated result's index")
                    gifts.append(Donation(len(gifts_at), into))
                gifts_at.append(tok)
                self.define(scope, tok, fb.param(tok.text[1:], typ))
                if not self._maybe(","):
                    break
        self.expect_punct(")", "to close the parameter list")
        self.expect_punct("{", "to open the function body")
        while True:
            t = self.peek()
            if t.kind == "IDENT" and t.text == "return":
                self.next()
                outs: list[Value] = []
                if not self.is_punct("}"):
                    outs.append(self.use(scope))
                    while self._maybe(","):
                        outs.append(self.use(scope))
                self.expect_punct("}", "after the return statement")
                fn = fb.ret(*outs)
                for g in gifts:
                    if g.result >= len(outs):
                        raise self.error(
                            f"parameter {gifts_at[g.param].text} is donated to result {g.result}, "
                            f"but @{fn.name} returns {len(outs)}",
                            gifts_at[g.param],
                        )
                if gifts:
                    fn = replace(fn, donated=tuple(gifts))
                self.positions[fn] = fn_pos
                return fn
            if t.kind == "EOF" or self.is_punct("}"):
                raise self.error(f"expected an op or 'return' in @{fb.name}, found {self.describe(t)}")
            self.instr(fb, scope)

    def _maybe(self, ch: str) -> bool:
        if self.is_punct(ch):
            self.next()
            return True
        return False

    def define(self, scope: dict[str, tuple[Value, Token]], tok: Token, v: Value) -> None:
        prev = scope.get(v.name)
        if prev is not None:
            line, col = _line_col(self.src, prev[1].pos)
            raise self.error(f"value %{v.name} is already defined at {line}:{col}", tok)
        scope[v.name] = (v, tok)
        self.positions[v] = self.line_col(tok.pos)

    def use(self, scope: dict[str, tuple[Value, Token]]) -> Value:
        t = self.next()
        if t.kind != "VALUE":
            raise self.error(f"expected a value like %x, found {self.describe(t)}", t)
        entry = scope.get(t.text[1:])
        if entry is None:
            raise self.error(f"use of undefined value {t.text}", t)
        return entry[0]

    def instr(self, fb: FunctionBuilder, scope: dict[str, tuple[Value, Token]]) -> None:
        results: list[tuple[Token, Type | None]] = []
        start = self.peek()
        if self.peek().kind == "VALUE":
            while True:
                tok = self.next()
                if tok.kind != "VALUE":
                    raise self.error(f"expected a result like %y, found {self.describe(tok)}", tok)
                results.append((tok, self.type() if self._maybe(":") else None))
                if not self._maybe(","):
                    break
            self.expect_punct("=", "after the results of an op")
        head = self.next()
        if head.kind not in ("IDENT", "FUNC") or head.text.startswith("-"):
            raise self.error(f"expected an op name or @function, found {self.describe(head)}", head)
        self.expect_punct("(", f"after {head.text}")
        inputs: list[Value] = []
        attrs: list[tuple[str, AttrValue]] = []
        seen_attr: set[str] = set()
        if not self.is_punct(")"):
            while True:
                t = self.peek()
                if t.kind == "VALUE":
                    if attrs:
                        raise self.error("value arguments must come before attributes", t)
                    inputs.append(self.use(scope))
                elif t.kind == "IDENT" and not t.text.startswith("-"):
                    self.next()
                    if t.text in seen_attr:
                        raise self.error(f"attribute {t.text!r} is given twice", t)
                    seen_attr.add(t.text)
                    self.expect_punct("=", f"after attribute name {t.text!r}")
                    attrs.append((t.text, self.attr_value()))
                else:
                    raise self.error(
                        f"expected an argument (%value or name=value), found {self.describe(t)}", t
                    )
                if not self._maybe(","):
                    break
        self.expect_punct(")", f"to close the arguments of {head.text}")
        outs = tuple(Value(tok.text[1:], typ) for tok, typ in results)
        if head.kind == "FUNC":
            if attrs:
                raise self.error("a function call takes no attributes", head)
            instr: Op | Call = Call(head.text[1:], tuple(inputs), outs)
        else:
            instr = Op(head.text, tuple(inputs), outs, Attrs(attrs) if attrs else EMPTY_ATTRS)
        fb.append(instr)
        self.positions[instr] = self.line_col(start.pos)
        for (tok, _), v in zip(results, outs, strict=True):
            self.define(scope, tok, v)

    def attr_value(self) -> AttrValue:
        t = self.next()
        if t.kind == "INT":
            return self.integer(t, t.text)
        if t.kind == "FLOAT":
            return float(t.text)
        if t.kind == "STRING":
            return self.unquote(t)
        if t.kind == "IDENT":
            word = t.text
            if word in ("true", "false"):
                return word == "true"
            if word in ("inf", "-inf", "nan"):
                return float(word)
            m = _DEVICE_RE.fullmatch(word)
            if m:
                return Device(self.integer(t, m.group(1)))
            try:
                return DType(word)
            except ValueError:
                raise self.error(
                    f"unknown attribute value {word!r}: expected a number, a string, true/false, "
                    "a device like d0, a dtype, or a [list]",
                    t,
                ) from None
        if t.kind == "PUNCT" and t.text == "[":
            self.nest(t)
            items: list[AttrValue] = []
            if not self.is_punct("]"):
                items.append(self.attr_value())
                while self._maybe(","):
                    items.append(self.attr_value())
            self.expect_punct("]", "to close the list")
            self.depth -= 1
            return tuple(items)
        raise self.error(f"expected an attribute value, found {self.describe(t)}", t)

    def unquote(self, t: Token) -> str:
        body = t.text[1:-1]
        out: list[str] = []
        i = 0
        while i < len(body):
            ch = body[i]
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            esc = body[i + 1]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                i += 2
            elif esc == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
            else:
                raise self.error(f"unknown escape '\\{esc}' in string", t)
        return "".join(out)

    def type(self) -> Type:
        t = self.expect_ident(None, "as a type (Tensor[...], Scalar[...] or Tuple[...])")
        self.nest(t)
        try:
            if t.text == "Tensor":
                self.expect_punct("[", "after Tensor")
                dt = self.dtype()
                self.expect_punct(",", "after the tensor dtype")
                shape = self.shape()
                self.expect_punct(",", "after the tensor shape")
                dev = self.device()
                self.expect_punct("]", "to close the tensor type")
                return TensorType(dt, shape, dev)
            if t.text == "Scalar":
                self.expect_punct("[", "after Scalar")
                dt = self.dtype()
                self.expect_punct(",", "after the scalar dtype")
                dev = self.device()
                self.expect_punct("]", "to close the scalar type")
                return ScalarType(dt, dev)
            if t.text == "Tuple":
                self.expect_punct("[", "after Tuple")
                elems: list[Type] = []
                if not self.is_punct("]"):
                    elems.append(self.type())
                    while self._maybe(","):
                        elems.append(self.type())
                self.expect_punct("]", "to close the tuple type")
                return TupleType(tuple(elems))
            if t.text == "DTensor":
                self.expect_punct("[", "after DTensor")
                dt = self.dtype()
                self.expect_punct(",", "after the DTensor dtype")
                shape = self.shape()
                self.expect_punct(",", "after the DTensor shape")
                mesh = self.mesh()
                self.expect_punct(",", "after the DTensor mesh")
                self.expect_punct("[", "to open the placements")
                places = [self.placement()]
                while self._maybe(","):
                    places.append(self.placement())
                self.expect_punct("]", "to close the placements")
                self.expect_punct("]", "to close the DTensor type")
                return DTensorType(dt, shape, mesh, tuple(places))
        except IRTypeError as e:  # a DTensor whose parts do not fit together (mesh size, shard dim)
            raise self.error(str(e), t) from None
        finally:
            self.depth -= 1
        raise self.error(
            f"unknown type {t.text!r}: expected Tensor[...], Scalar[...], Tuple[...] or DTensor[...]", t
        )

    def mesh(self) -> Mesh:
        """``mesh(x=2, y=4; d0, d1, ...)``; an axis with uneven shares as ``dp=2[2:1]``."""
        start = self.expect_ident("mesh", "(a DTensor's mesh, like mesh(x=2; d0, d1))")
        self.expect_punct("(", "after mesh")
        axes: list[tuple[str, int]] = []
        while True:
            name = self.expect_ident(None, "as a mesh axis name")
            self.expect_punct("=", f"after mesh axis {name.text}")
            size = self.next()
            if size.kind != "INT" or size.text.startswith("-"):
                raise self.error(
                    f"expected the size of mesh axis {name.text}, found {self.describe(size)}", size
                )
            n = self.integer(size, size.text)
            if self._maybe("["):  # uneven shares of the axis' devices: dp=4[2:2:2:1]
                shares = [self._share(name.text)]
                while self._maybe(":"):
                    shares.append(self._share(name.text))
                self.expect_punct("]", f"to close the shares of mesh axis {name.text}")
                try:
                    n = axis_size(n, tuple(shares))
                except IRTypeError as e:
                    raise self.error(str(e), size) from None
            axes.append((name.text, n))
            if not self._maybe(","):
                break
        self.expect_punct(";", "between the mesh axes and its devices")
        devices = [self.device()]
        while self._maybe(","):
            devices.append(self.device())
        self.expect_punct(")", "to close the mesh")
        try:
            return Mesh(tuple(axes), tuple(devices))
        except IRTypeError as e:
            raise self.error(str(e), start) from None

    def _share(self, axis: str) -> int:
        t = self.next()
        if t.kind != "INT" or t.text.startswith("-"):
            raise self.error(f"expected a share of mesh axis {axis} (like 2), found {self.describe(t)}", t)
        return self.integer(t, t.text)

    def placement(self) -> Placement:
        """``R``, ``S(dim)`` or ``P(op)``."""
        t = self.expect_ident(None, "as a placement (R, S(dim) or P(sum))")
        if t.text == "R":
            return Replicate()
        if t.text in ("S", "P"):
            self.expect_punct("(", f"after {t.text}")
            arg = self.next()
            self.expect_punct(")", f"to close {t.text}(...)")
            try:
                if t.text == "S":
                    if arg.kind != "INT":
                        raise IRTypeError(f"S(...) takes a dimension, found {self.describe(arg)}")
                    return Shard(self.integer(arg, arg.text))
                return Partial(arg.text)
            except IRTypeError as e:
                raise self.error(str(e), arg) from None
        raise self.error(f"unknown placement {t.text!r}: expected R, S(dim) or P(sum|max|min|mean)", t)

    def dtype(self) -> DType:
        t = self.next()
        try:
            if t.kind != "IDENT":
                raise IRTypeError("")
            return DType(t.text)
        except ValueError:
            known = ", ".join(d.value for d in DType)
            raise self.error(f"expected a dtype ({known}), found {self.describe(t)}", t) from None

    def device(self) -> Device:
        t = self.next()
        m = _DEVICE_RE.fullmatch(t.text) if t.kind == "IDENT" else None
        if m is None:
            raise self.error(f"expected a device like d0, found {self.describe(t)}", t)
        return Device(self.integer(t, m.group(1)))

    def integer(self, t: Token, digits: str) -> int:
        try:
            return int(digits)
        except ValueError:  # beyond Python's int-from-string digit limit
            raise self.error(f"integer with {len(digits)} digits is too long", t) from None

    def shape(self) -> tuple[int, ...]:
        self.expect_punct("(", "to open the shape")
        dims: list[int] = []
        while not self.is_punct(")"):
            t = self.next()
            if t.kind != "INT" or t.text.startswith("-"):
                raise self.error(f"expected a non-negative dimension, found {self.describe(t)}", t)
            dims.append(self.integer(t, t.text))
            if not self._maybe(","):
                break
        self.expect_punct(")", "to close the shape")
        return tuple(dims)


def parse_module(src: str, filename: str = "<text>") -> Module:
    """Parse a whole module. Raises ``ParseError`` (and only that) on malformed text."""
    return parse_with_positions(src, filename)[0]


def parse_with_positions(src: str, filename: str = "<text>") -> tuple[Module, dict[object, tuple[int, int]]]:
    """Parse a module and say where each op, call, function and value was written (line, col).
    A leading UTF-8 byte order mark is no content (editors do not count it as a column)."""
    src = src.removeprefix("\ufeff")
    try:
        p = _Parser(src, filename)
        return p.module(), p.positions
    except RecursionError:  # pragma: no cover - nesting is bounded by MAX_NESTING
        raise ParseError("program nested too deeply", 1, 1, src, filename) from None


def parse_type(src: str) -> Type:
    p = _Parser(src, "<type>")
    t = p.type()
    if p.peek().kind != "EOF":
        raise p.error(f"unexpected {p.describe(p.peek())} after the type")
    return t
