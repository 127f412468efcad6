"""Structural verifier for DistIR modules.

Checks, in one pass per function, everything that does not need interpretation:
- names: function names are valid identifiers;
- SSA: every used value is defined before its use in the same function, every value is
  defined once (parameters included), returned values are defined;
- calls: the callee exists, argument and result counts match its signature, declared argument
  and result types match the callee's declared types, and the call graph has no cycle;
- primitive ops: whatever the injected ``check_op`` says (the op registry checks the op is
  known, input/output arity, attribute schema and device consistency of declared types).

Errors are ``VerifyError``s naming the function, the printed op, the value and expected vs
actual. Type *inference* (shapes through the program) is an interpretation, in ``distir.interp``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.printer import NAME_RE, print_op
from distir.ir.values import Value
from distir.limits import MAX_CALL_DEPTH


class OpSignatureError(ValueError):
    """Raised by an op checker: what is wrong with an op, optionally which value, expected/actual."""

    def __init__(
        self,
        message: str,
        value: Value | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.value = value
        self.expected = expected
        self.actual = actual


class VerifyError(ValueError):
    """A module is not well formed. ``str(e)`` names function, op, value, expected vs actual."""

    def __init__(
        self,
        message: str,
        function: str | None = None,
        op: Instr | None = None,
        value: Value | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        self.message = message
        self.function = function
        self.op = op
        self.op_text = print_op(op) if op is not None else None
        self.value = value
        self.expected = expected
        self.actual = actual
        parts = []
        if function is not None:
            parts.append(f"in @{function}")
        if self.op_text is not None:
            parts.append(f"at `{self.op_text}`")
        head = ", ".join(parts)
        text = f"{head}: {message}" if head else message
        if expected is not None or actual is not None:
            text += f" (expected {expected}, got {actual})"
        super().__init__(text)


OpChecker = Callable[[Op], None]


def verify(module: Module, check_op: OpChecker | None = None) -> Module:
    """Check ``module``; return it unchanged if well formed, else raise ``VerifyError``."""
    for fn in module.functions:
        _verify_function(module, fn, check_op)
    _check_acyclic(module)
    return module


def _verify_donations(fn: Function) -> None:
    """Each donated parameter (``Function.donated``) exists, is donated once, and is written
    into a result that exists, by at most one parameter."""
    seen: set[int] = set()
    into: set[int] = set()
    for d in fn.donated:
        if not 0 <= d.param < len(fn.params) or d.param in seen:
            raise VerifyError(
                f"donation of parameter #{d.param}: no such parameter, or donated twice", fn.name
            )
        seen.add(d.param)
        if d.result >= len(fn.outputs) or d.result in into:
            raise VerifyError(
                f"parameter %{fn.params[d.param].name} is donated to result #{d.result}: no such "
                "result, or one another parameter is donated to",
                fn.name,
                value=fn.params[d.param],
            )
        if d.result >= 0:
            into.add(d.result)


def _verify_function(module: Module, fn: Function, check_op: OpChecker | None) -> None:
    if not NAME_RE.fullmatch(fn.name):
        raise VerifyError(f"invalid function name {fn.name!r}", fn.name)
    defined: set[Value] = set()
    for p in fn.params:
        if p in defined:
            raise VerifyError(f"parameter %{p.name} appears twice", fn.name, value=p)
        defined.add(p)
    _verify_donations(fn)
    for instr in fn.body:
        for v in instr.inputs:
            if v not in defined:
                raise VerifyError(f"%{v.name} is used before it is defined", fn.name, instr, v)
        for v in instr.outputs:
            if v in defined:
                raise VerifyError(f"%{v.name} is assigned more than once", fn.name, instr, v)
            defined.add(v)
        if isinstance(instr, Call):
            _check_call(module, fn, instr)
        elif check_op is not None:
            try:
                check_op(instr)
            except OpSignatureError as e:
                raise VerifyError(e.message, fn.name, instr, e.value, e.expected, e.actual) from None
    for v in fn.outputs:
        if v not in defined:
            raise VerifyError(f"returned value %{v.name} is not defined", fn.name, value=v)


def _check_call(module: Module, fn: Function, call: Call) -> None:
    if call.callee not in module:
        known = ", ".join("@" + f.name for f in module.functions)
        raise VerifyError(f"call of unknown function @{call.callee}; functions: {known}", fn.name, call)
    callee = module[call.callee]
    if len(call.inputs) != len(callee.params):
        raise VerifyError(
            f"@{callee.name} takes {len(callee.params)} arguments",
            fn.name,
            call,
            expected=len(callee.params),
            actual=len(call.inputs),
        )
    if len(call.outputs) != len(callee.outputs):
        raise VerifyError(
            f"@{callee.name} returns {len(callee.outputs)} values",
            fn.name,
            call,
            expected=len(callee.outputs),
            actual=len(call.outputs),
        )
    for arg, p in zip(call.inputs, callee.params, strict=True):
        if arg.type is not None and p.type is not None and arg.type != p.type:
            raise VerifyError(
                f"argument %{arg.name} does not match parameter %{p.name} of @{callee.name}",
                fn.name,
                call,
                arg,
                expected=p.type,
                actual=arg.type,
            )
    for res, r in zip(call.outputs, callee.outputs, strict=True):
        if res.type is not None and r.type is not None and res.type != r.type:
            raise VerifyError(
                f"result %{res.name} does not match what @{callee.name} returns",
                fn.name,
                call,
                res,
                expected=r.type,
                actual=res.type,
            )


def _check_acyclic(module: Module) -> None:
    """Programs are straight-line: no function may (transitively) call itself, and calls nest at
    most ``MAX_CALL_DEPTH.max`` deep (the interpreters, the simulator and the printer walk calls
    recursively). An explicit stack, so a chain of any length gets this error, not Python's."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    depth: dict[str, int] = {}  # the longest chain of calls from a done function (1: no calls)
    for f in module.functions:
        if state.get(f.name, 0):
            continue
        path: list[str] = [f.name]
        todo: list[Iterator[Call]] = [f.calls()]
        state[f.name] = 1
        while path:
            c = next(todo[-1], None)
            if c is None:  # every callee of path[-1] is done
                name = path.pop()
                todo.pop()
                state[name] = 2
                depth[name] = 1 + max((depth.get(k.callee, 0) for k in module[name].calls()), default=0)
                if depth[name] > MAX_CALL_DEPTH.max:
                    raise VerifyError(
                        f"calls nest {depth[name]:,} deep from @{name}; distir's bound is "
                        f"{MAX_CALL_DEPTH.max} (docs/limitations.md)",
                        name,
                    )
                continue
            s = state.get(c.callee, 0)
            if s == 1:
                cycle = " -> ".join("@" + n for n in [*path[path.index(c.callee) :], c.callee])
                raise VerifyError(f"recursive calls are not allowed: {cycle}", path[-1], c)
            if s == 0 and c.callee in module:
                state[c.callee] = 1
                path.append(c.callee)
                todo.append(module[c.callee].calls())
