"""No recursion that input depth controls (issue 22): call chains and tuple types nest at most
``MAX_CALL_DEPTH``/``MAX_TYPE_NESTING`` deep — one bound for the parser, the type constructor,
the verifier and the printer — so a deep program is a typed error (never RecursionError), and
every program distir accepts works in every walker and prints as text that parses back."""

from __future__ import annotations

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.interp.lockstep import check_deadlock_free
from distir.interp.loop import InterpretError
from distir.interp.project import project
from distir.interp.reference import random_inputs, run_reference
from distir.ir.parser import ParseError, parse_module
from distir.ir.printer import print_module
from distir.ir.types import Device, DType, IRTypeError, TensorType, TupleType
from distir.ir.verify import VerifyError
from distir.limits import MAX_CALL_DEPTH, MAX_TYPE_NESTING
from distir.sim.simulate import simulate

T = "Tensor[f32, (4,), d0]"


def call_chain(n: int) -> str:
    """@main calls @f0, which calls @f1, ...: ``n`` functions nested (the last calls none)."""
    fns = [f"func @f{n - 2}(%x: {T}) {{\n  %y = Relu(%x)\n  return %y\n}}"]
    fns += [f"func @f{i}(%x: {T}) {{\n  %y = @f{i + 1}(%x)\n  return %y\n}}" for i in range(n - 3, -1, -1)]
    fns.append(f"func @main(%x: {T}) {{\n  %y = @f0(%x)\n  return %y\n}}")
    return "\n".join(fns) + "\n"


def tuple_tower(n: int) -> str:
    """``n`` MakeTuples, each of the last: a result type nested ``n + 1`` deep (the tensor is 1)."""
    body = ["  %t0 = MakeTuple(%x)", *(f"  %t{i} = MakeTuple(%t{i - 1})" for i in range(1, n))]
    return f"func @main(%x: {T}) {{\n" + "\n".join(body) + f"\n  return %t{n - 1}\n}}\n"


def walk_everything(text: str) -> None:
    """What show, lower, exec and simulate do with a program file."""
    m = distir.verify(parse_module(text))
    typed = distir.check(m)
    assert parse_module(print_module(typed)) is not None  # the printed program parses back
    check_deadlock_free(project(typed))
    run_reference(m, random_inputs(typed.entry, 0))
    simulate(typed, parse_cluster("dgx-a100"))


def test_a_chain_at_the_bound_works_everywhere() -> None:
    walk_everything(call_chain(MAX_CALL_DEPTH.max))


@pytest.mark.parametrize("n", [MAX_CALL_DEPTH.max + 1, 3000])
def test_a_deeper_chain_is_a_verify_error(n: int) -> None:
    with pytest.raises(VerifyError, match=f"calls nest {MAX_CALL_DEPTH.max + 1} deep"):
        distir.verify(parse_module(call_chain(n)))


def test_recursion_is_still_named_as_a_cycle() -> None:
    a = f"func @a(%x: {T}) {{\n  %y = @b(%x)\n  return %y\n}}\n"
    text = a + a.replace("@a", "@c").replace("@b", "@a").replace("@c", "@b")
    with pytest.raises(VerifyError, match="recursive calls are not allowed: @a -> @b -> @a"):
        distir.verify(parse_module(text))


def test_a_tuple_tower_at_the_bound_works_everywhere() -> None:
    walk_everything(tuple_tower(MAX_TYPE_NESTING - 1))


@pytest.mark.parametrize("n", [MAX_TYPE_NESTING, 1200])
def test_a_deeper_tuple_tower_is_a_typed_error(n: int) -> None:
    m = distir.verify(parse_module(tuple_tower(n)))
    with pytest.raises(InterpretError, match=f"tuple types nested {MAX_TYPE_NESTING + 1} deep"):
        distir.check(m)


def test_tuple_type_depth_matches_the_parsers_nesting() -> None:
    t: TensorType | TupleType = TensorType(DType.f32, (2,), Device(0))
    for _ in range(MAX_TYPE_NESTING - 1):
        t = TupleType((t,))
    assert isinstance(t, TupleType) and t.depth == MAX_TYPE_NESTING
    text = f"func @f(%x: {t}) {{\n  return %x\n}}\n"
    assert str(parse_module(text).entry.params[0].type) == str(t)
    with pytest.raises(IRTypeError, match=f"nested {MAX_TYPE_NESTING + 1} deep"):
        TupleType((t,))
    with pytest.raises(ParseError, match=f"nesting deeper than {MAX_TYPE_NESTING} levels"):
        parse_module(f"func @f(%x: Tuple[{t}]) {{\n  return %x\n}}\n")
