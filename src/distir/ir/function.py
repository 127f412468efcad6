"""Functions and modules: immutable containers of SSA code.

A ``Function`` has parameters, a straight-line body of ops and calls, and the values it returns.
A ``Module`` is an ordered collection of functions with distinct names; by convention its entry
point is the last function (the paper's listings put the distributed program last). Both are
immutable: transforms build new ones (with ``FunctionBuilder``) instead of editing.

Nothing here checks well-formedness beyond what construction needs; ``verify`` does that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from distir.ir.ops import Call, Instr, Op
from distir.ir.values import Value


class Donation(NamedTuple):
    """Parameter ``param``'s storage belongs to the function: it is freed after the parameter's
    last use — or, when ``result`` ≥ 0, not before the instruction that makes result ``result``,
    which is written into it (an in-place update: a step's new weights and optimizer state take
    the old ones' place, as every trainer updates them)."""

    param: int
    result: int = -1


@dataclass(frozen=True, slots=True, eq=False)
class Function:
    name: str
    params: tuple[Value, ...]
    body: tuple[Instr, ...]
    outputs: tuple[Value, ...]
    # parameters whose storage the caller gives up (JAX's ``donate_argnums`` with XLA's
    # input-output aliasing): ``Donation``; printed ``donated`` / ``donated(result)``
    donated: tuple[Donation, ...] = ()

    def ops(self) -> Iterator[Op]:
        """The primitive ops of the body (calls excluded), in program order."""
        return (i for i in self.body if isinstance(i, Op))

    def calls(self) -> Iterator[Call]:
        return (i for i in self.body if isinstance(i, Call))

    def __str__(self) -> str:
        from distir.ir.printer import print_function

        return print_function(self)


class ModuleError(ValueError):
    """A module was assembled from functions with clashing names, or an entry is missing."""


@dataclass(frozen=True, slots=True, eq=False)
class Module:
    functions: tuple[Function, ...]
    _by_name: dict[str, Function] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Function] = {}
        for f in self.functions:
            if f.name in by_name:
                raise ModuleError(f"function @{f.name} is defined twice")
            by_name[f.name] = f
        object.__setattr__(self, "_by_name", by_name)

    def __getitem__(self, name: str) -> Function:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join("@" + n for n in self._by_name) or "none"
            raise ModuleError(f"no function @{name} in module; functions: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def entry(self) -> Function:
        if not self.functions:
            raise ModuleError("the module has no functions, so no entry point")
        return self.functions[-1]

    def replace(self, fn: Function) -> Module:
        """A module with ``fn`` replacing the function of the same name (or appended)."""
        if fn.name in self._by_name:
            return Module(tuple(fn if f.name == fn.name else f for f in self.functions))
        return Module((*self.functions, fn))

    def with_entry(self, name: str) -> Module:
        """The same functions, reordered so that ``name`` is the entry (last)."""
        f = self[name]
        return Module((*(g for g in self.functions if g.name != name), f))

    def __str__(self) -> str:
        from distir.ir.printer import print_module

        return print_module(self)
