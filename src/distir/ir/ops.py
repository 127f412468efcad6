"""Operations: a primitive invocation (``Op``) or a call of a module function (``Call``).

A function's body is a sequence of these; its ``return`` is the function's ``outputs``. Both
are immutable once built. An op refers to its op definition by name only: the IR does not
depend on the op registry (the registry lives in a lower layer and checks ops on verification).
"""

from __future__ import annotations

from dataclasses import dataclass

from distir.ir.values import EMPTY_ATTRS, Attrs, Value


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """``%y1, %y2 = Name(%x1, %x2, attr=value)``."""

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Attrs = EMPTY_ATTRS


@dataclass(frozen=True, slots=True, eq=False)
class Call:
    """``%y1, %y2 = @callee(%x1, %x2)``: run another function of the same module."""

    callee: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


Instr = Op | Call
