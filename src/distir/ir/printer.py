"""The canonical text form of DistIR modules.

The printer and ``distir.ir.parser`` are exact inverses: ``print(parse(print(m))) == print(m)``.
Value names are hints: within a function the printer makes them unique and valid (``%x``,
``%x_1``, ...) in definition order, so printing is deterministic and a printed program re-parses
to the same names. Grammar: see ``distir.ir.parser``.
"""

from __future__ import annotations

import math
import re

from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.types import Device, DType
from distir.ir.values import AttrValue, Value

NAME_RE = re.compile(r"[A-Za-z0-9_.]+")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.]")


def format_attr(v: AttrValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, Device | DType):
        return str(v)
    return "[" + ", ".join(format_attr(x) for x in v) + "]"


def _quote(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF:  # surrogates: not UTF-8
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class Namer:
    """Assigns each value of a function a unique, valid printed name, first come first served."""

    __slots__ = ("_names", "_next", "_used")

    def __init__(self) -> None:
        self._names: dict[Value, str] = {}
        self._used: set[str] = set()
        self._next: dict[str, int] = {}  # per hint, the suffix to try next (keeps naming linear)

    def __call__(self, v: Value) -> str:
        name = self._names.get(v)
        if name is None:
            base = _BAD_CHARS.sub("_", v.name) or "v"
            name = base
            i = self._next.get(base, 1)
            while name in self._used:
                name = f"{base}_{i}"
                i += 1
            self._next[base] = i
            self._used.add(name)
            self._names[v] = name
        return name


def _result_list(outs: tuple[Value, ...], namer: Namer) -> str:
    parts = []
    for v in outs:
        n = "%" + namer(v)
        parts.append(f"{n}: {v.type}" if v.type is not None else n)
    return ", ".join(parts)


def format_instr(instr: Instr, namer: Namer | None = None) -> str:
    """One op or call as a line of text (without indentation)."""
    namer = namer if namer is not None else Namer()
    args = ["%" + namer(v) for v in instr.inputs]
    lhs = _result_list(instr.outputs, namer)
    if isinstance(instr, Op):
        args += [f"{k}={format_attr(v)}" for k, v in instr.attrs.items_in_order()]
        callee = instr.name
    else:
        callee = "@" + instr.callee
    rhs = f"{callee}({', '.join(args)})"
    return f"{lhs} = {rhs}" if lhs else rhs


def print_function(fn: Function) -> str:
    namer = Namer()
    donated = {d.param: " donated" if d.result < 0 else f" donated({d.result})" for d in fn.donated}
    params = ", ".join(
        (f"%{namer(p)}: {p.type}" if p.type is not None else f"%{namer(p)}") + donated.get(j, "")
        for j, p in enumerate(fn.params)
    )
    lines = [f"func @{fn.name}({params}) {{"]
    for instr in fn.body:
        lines.append("  " + format_instr(instr, namer))
    ret = ", ".join("%" + namer(v) for v in fn.outputs)
    lines.append(f"  return {ret}" if ret else "  return")
    lines.append("}")
    return "\n".join(lines)


def print_module(m: Module) -> str:
    return "\n\n".join(print_function(f) for f in m.functions) + "\n"


def print_op(instr: Op | Call) -> str:
    """A single op for error messages, with its values' hints as names."""
    return format_instr(instr)
