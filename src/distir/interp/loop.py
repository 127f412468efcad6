"""The abstract interpreter (the DistIR paper's Algorithm 1), generic over a domain.

``interpret(module, fn, args, domain)`` walks ``fn``'s body in program order with a state mapping
each value to the domain's abstract value: a primitive op is run by ``domain.op``; a call by
``domain.call`` (which by default interprets the callee recursively, and may cache); the
function's outputs are returned together with the final state.

Any failure inside an op becomes an ``InterpretError`` that says "while interpreting <printed op>
in @fn" (plus the chain of call sites), names the offending value and keeps expected vs actual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.printer import print_op
from distir.ir.values import Value
from distir.ops.registry import OpTypeError, RegistryError

V = TypeVar("V")


class InterpretError(ValueError):
    """An op failed during interpretation. ``frames`` lists (function, op text) innermost first."""

    def __init__(
        self,
        message: str,
        frames: list[tuple[str, str]],
        value: Value | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        self.message = message
        self.frames = frames
        self.instrs: list[Instr] = []  # the failing op, then its call sites (when known)
        self.value = value
        self.expected = expected
        self.actual = actual
        super().__init__(self._render())

    def _render(self) -> str:
        fn, op = self.frames[0]
        text = f"while interpreting `{op}` in @{fn}: {self.message}"
        if self.expected is not None or self.actual is not None:
            text += f" (expected {self.expected}, got {self.actual})"
        for fn2, op2 in self.frames[1:]:
            text += f"\n  called from `{op2}` in @{fn2}"
        return text

    def brief(self) -> str:
        """The error on one line: the failing op and its function, then only the names of the
        functions calling it (outermost last)."""
        first = self._render().split("\n", 1)[0]
        callers = " ← ".join(f"@{fn2}" for fn2, _ in self.frames[1:])
        return f"{first} (called from {callers})" if callers else first

    def at(self, instr: Instr) -> InterpretError:
        self.instrs.append(instr)
        return self

    def called_from(self, fn: str, instr: Instr) -> InterpretError:
        self.instrs.append(instr)
        self.frames.append((fn, print_op(instr)))
        self.args = (self._render(),)
        return self


# what ``interpret`` reports as an error of the program (an ``InterpretError`` naming the op):
# what a walk without its reporting (``walk_unchecked``) may raise on a wrong program
PROGRAM_FAULTS: tuple[type[Exception], ...] = (ValueError, TypeError, IndexError, ArithmeticError, KeyError)


class Domain(Protocol[V]):
    """An abstract domain: the meaning of primitive ops (and optionally of calls)."""

    def op(self, op: Op, args: Sequence[V]) -> Sequence[V]: ...

    def call(self, module: Module, call: Call, callee: Function, args: Sequence[V]) -> Sequence[V]: ...


class RecursiveCalls(Generic[V]):
    """Mixin giving a domain the default meaning of calls: interpret the callee."""

    def call(self, module: Module, call: Call, callee: Function, args: Sequence[V]) -> Sequence[V]:
        outs, _ = interpret(module, callee, args, self)  # type: ignore[arg-type]
        return outs


def interpret(
    module: Module, fn: Function, args: Sequence[V], domain: Domain[V]
) -> tuple[tuple[V, ...], dict[Value, V]]:
    """Run ``fn`` on ``args`` in ``domain``; return its outputs and the final state."""
    if len(args) != len(fn.params):
        raise InterpretError(
            f"@{fn.name} takes {len(fn.params)} arguments",
            [(fn.name, f"@{fn.name}(...)")],
            expected=len(fn.params),
            actual=len(args),
        )
    env: dict[Value, V] = dict(zip(fn.params, args, strict=True))
    op_fn = domain.op
    env_of = env.__getitem__
    for instr in fn.body:
        try:
            ins = list(map(env_of, instr.inputs))
            if type(instr) is Op:
                outs = op_fn(instr, ins)
            else:
                assert isinstance(instr, Call)
                outs = domain.call(module, instr, module[instr.callee], ins)
            if len(outs) != len(instr.outputs):
                raise OpTypeError(
                    f"produces {len(outs)} results but {len(instr.outputs)} are bound",
                    None,
                    len(instr.outputs),
                    len(outs),
                )
        except InterpretError as e:
            raise e.called_from(fn.name, instr) from None
        except OpTypeError as e:
            value = instr.inputs[e.index] if e.index is not None and e.index < len(instr.inputs) else None
            msg = e.message
            if value is not None:
                msg = f"{msg} [input %{value.name}]"
            raise InterpretError(msg, [(fn.name, print_op(instr))], value, e.expected, e.actual).at(
                instr
            ) from None
        except (RegistryError, ValueError, TypeError, IndexError, ArithmeticError) as e:
            msg = str(e) if isinstance(e, RegistryError) else f"{type(e).__name__}: {e}"
            raise InterpretError(msg, [(fn.name, print_op(instr))]).at(instr) from e
        except KeyError as e:
            raise InterpretError(f"value {e} is not defined", [(fn.name, print_op(instr))]).at(
                instr
            ) from None
        env.update(zip(instr.outputs, outs, strict=True))
    try:
        result = tuple(env[v] for v in fn.outputs)
    except KeyError:
        raise InterpretError("returns an undefined value", [(fn.name, "return")]) from None
    return result, env


def walk_unchecked(
    module: Module,
    fn: Function,
    args: Sequence[V],
    domain: Domain[V],
    trace: tuple[list[list[V]], list[Sequence[V]]] | None = None,
) -> dict[Value, V]:
    """``interpret``'s walk without its per-op error reporting, for hot paths whose callers
    re-run ``interpret`` on a failure to report it: the final state (outputs not looked up).
    With ``trace``, each instruction's arguments and results are appended to its two lists."""
    env: dict[Value, V] = dict(zip(fn.params, args, strict=True))
    env_of = env.__getitem__
    update = env.update
    op_fn, call_fn = domain.op, domain.call
    for instr in fn.body:
        ins = list(map(env_of, instr.inputs))
        if type(instr) is Op:
            outs = op_fn(instr, ins)
        else:
            assert isinstance(instr, Call)
            outs = call_fn(module, instr, module[instr.callee], ins)
        if len(outs) != len(instr.outputs):
            raise OpTypeError("result count mismatch")
        update(zip(instr.outputs, outs, strict=True))
        if trace is not None:
            trace[0].append(ins)
            trace[1].append(outs)
    return env
