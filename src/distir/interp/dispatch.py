"""Dynamic dispatch of op implementations on which arguments are abstract or concrete.

A domain keeps a ``Dispatcher``: a list of implementations, each with a precision and a
predicate over the op definition and the arguments' concreteness. ``select`` returns the most
precise applicable one (concrete beats mixed beats abstract), so an op with concrete inputs
computes concrete results while the same op on abstract inputs only propagates types.
Implementations can be registered for every op ("*") or for one op name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from distir.ops.registry import OpDef

R = TypeVar("R")
Applies = Callable[[OpDef, Sequence[bool]], bool]


@dataclass(frozen=True, slots=True)
class Impl(Generic[R]):
    name: str
    precision: int
    applies: Applies
    run: R


class Dispatcher(Generic[R]):
    def __init__(self) -> None:
        self._generic: list[Impl[R]] = []
        self._by_op: dict[str, list[Impl[R]]] = {}

    def register(self, op: str, impl: Impl[R]) -> None:
        target = self._generic if op == "*" else self._by_op.setdefault(op, [])
        target.append(impl)
        target.sort(key=lambda i: -i.precision)

    def candidates(self, op: str) -> list[Impl[R]]:
        return sorted([*self._by_op.get(op, []), *self._generic], key=lambda i: -i.precision)

    def select(self, opdef: OpDef, concrete: Sequence[bool]) -> Impl[R]:
        for impl in self.candidates(opdef.name):
            if impl.applies(opdef, concrete):
                return impl
        raise LookupError(f"no implementation of {opdef.name} for concreteness {list(concrete)}")


def always(opdef: OpDef, concrete: Sequence[bool]) -> bool:
    return True
