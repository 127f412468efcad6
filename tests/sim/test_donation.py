"""Donated entry parameters (``Function.donated``): the simulator frees a donated parameter after
its last use; donated to a result that nothing reads it after, the result takes its place (an
in-place update: released right before the instruction making the result), else it lives until
both its last use and that instruction; the event loop (traced), the column path (untraced
flat entry) and the general path (an entry with calls) agree, and the text form round-trips."""

from __future__ import annotations

import pytest

from distir.hardware.cluster import parse_cluster
from distir.ir import parse_module
from distir.ir.function import Donation, Module
from distir.ir.printer import print_module
from distir.sim.simulate import simulate

MB = 64 * 64 * 4  # bytes of one tensor below
T = "Tensor[f32, (64, 64), d0]"


def _flat(donation: str) -> Module:
    """``w`` is last read by the first op; ``c``, ``d`` are made after it."""
    return parse_module(
        f"""
func @main(%x: {T}, %w: {T}{donation}) {{
  %a = Add(%x, %w)
  %c = Relu(%x)
  %d = Relu(%c)
  return %a, %d
}}"""
    )


def _with_call(donation: str) -> Module:
    """The same program with its first op in a callee."""
    return parse_module(
        f"""
func @first(%x, %w) {{
  %a = Add(%x, %w)
  return %a
}}

func @main(%x: {T}, %w: {T}{donation}) {{
  %a = @first(%x, %w)
  %c = Relu(%x)
  %d = Relu(%c)
  return %a, %d
}}"""
    )


def _peaks(m: Module) -> tuple[float, float]:
    cl = parse_cluster("dgx2-v100")
    fast, traced = simulate(m, cl), simulate(m, cl, trace=True)
    # the tensors' peak (without the runtime memory: CUDA context, workspaces, allocator reserve)
    return fast.peak_memory[0] - fast.runtime_memory[0], traced.peak_memory[0] - traced.runtime_memory[0]


# by hand: x, w live from the start; a (x+w); then c: with w kept, 4 tensors; then d while c
# dies after it: x, w, a, c, d = 5 tensors at the last op unless w was freed after its last use
@pytest.mark.parametrize(
    ("donation", "peak"),
    [
        ("", 5 * MB),  # the caller's: never freed
        (" donated", 4 * MB),  # freed after Add, its last use
        (" donated(0)", 4 * MB),  # written into by result 0 (a), made by Add
        (" donated(1)", 4 * MB),  # result 1 (d) takes its place: released before the last op
    ],
)
def test_donated_parameter_is_freed_after_its_last_use_or_its_successor(donation: str, peak: float) -> None:
    for m in (_flat(donation), _with_call(donation)):
        fast, traced = _peaks(m)
        assert fast == traced == peak, (print_module(m), fast, traced)


def test_donation_prints_and_parses() -> None:
    m = _flat(" donated(1)")
    assert m.entry.donated == (Donation(1, 1),)
    text = print_module(m)
    assert "%w: Tensor[f32, (64, 64), d0] donated(1)" in text
    assert parse_module(text).entry.donated == (Donation(1, 1),)
    assert parse_module(print_module(_flat(" donated"))).entry.donated == (Donation(1, -1),)


def test_donation_to_a_missing_result_is_a_parse_error() -> None:
    from distir.ir.parser import ParseError

    with pytest.raises(ParseError, match="donated to result 5"):
        _flat(" donated(5)")


def test_a_view_of_a_donated_parameter_keeps_it_live() -> None:
    """A Reshape of ``w`` read last: ``w`` lives until then (a view shares its storage)."""
    m = parse_module(
        f"""
func @main(%x: {T}, %w: {T} donated) {{
  %v = Reshape(%w, shape=[4096])
  %c = Relu(%x)
  %d = Relu(%c)
  %e = Relu(%v)
  return %d, %e
}}"""
    )
    fast, traced = _peaks(m)
    # at %d: x, w (through v), c, d = 4 tensors; at %e: x, w, d, e (c is dead) = 4
    assert fast == traced == 4 * MB


def _update(tail: str, donation: str) -> Module:
    return parse_module(
        f"""
func @main(%x: {T}, %w: {T}{donation}) {{
  %c = Relu(%x)
  %w2 = Relu(%w)
{tail}
}}"""
    )


@pytest.mark.parametrize(
    ("donation", "peak"),
    [("", 4 * MB), (" donated", 4 * MB), (" donated(0)", 3 * MB)],
)
def test_an_in_place_update_takes_the_donated_storage(donation: str, peak: float) -> None:
    """``w2`` made from ``w`` (its last read): donated to it, ``w2`` is ``w``'s storage — x, c
    and one of w, w2 at once; otherwise w and w2 are live together."""
    fast, traced = _peaks(_update("  return %w2, %c", donation))
    assert fast == traced == peak


def test_a_donated_parameter_read_after_its_successor_is_made_is_not_updated_in_place() -> None:
    """``w`` is read after ``w2`` is made: it lives until that read (x, w, c, w2, e)."""
    fast, traced = _peaks(_update("  %e = Add(%w, %c)\n  return %w2, %e", " donated(0)"))
    assert fast == traced == 5 * MB


def test_shared_plans_give_each_entry_its_own_donations() -> None:
    """Entries that differ only in what they donate call one callee object: planned on one domain
    (``SharedPlans``), each gets the figures of its own simulation, traced or not."""
    from distir.hardware.cluster import parse_cluster as _cluster
    from distir.sim.cost import RooflineCostModel
    from distir.sim.devices import DeviceMap
    from distir.sim.simulate import SharedPlans

    cl = _cluster("dgx2-v100")
    first = _with_call("")["first"]
    mods = [Module((first, _with_call(d).entry)) for d in ("", " donated", " donated(0)", " donated(1)")]
    args = mods[0].entry.params[0].type, mods[0].entry.params[1].type
    dmap = DeviceMap.default({d for t in args if t is not None for d in [t.device]}, cl.num_devices)
    cost = RooflineCostModel(cl)
    shared = SharedPlans()
    for trace in (False, True):
        for m in mods:
            got = simulate(m, cl, dmap, cost, trace=trace, shared=shared)
            want = simulate(m, cl, dmap, cost, trace=trace)
            assert (got.step_time_s, got.peak_memory, got.flops, got.memory_timeline) == (
                want.step_time_s,
                want.peak_memory,
                want.flops,
                want.memory_timeline,
            )
    assert shared.hits == len(mods)  # each entry (its own parameter types) shared by its traced run
