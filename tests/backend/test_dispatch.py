"""The rank loop's overheads (``distir.backend.dispatch``): the synthetic programs are valid
DistIR with the op and message counts the derivation divides by, the derivation from measured
times (closed-form samples). The measurement through the real worker loop (torch) is checked
where ``distir calibrate --quick`` runs it (``tests/backend/test_calibrate.py``)."""

from __future__ import annotations

import pytest

import distir
from distir.backend.dispatch import (
    CHAIN,
    Runs,
    allreduce_text,
    arrival_text,
    chain_ops,
    chain_text,
    derive,
    p2p_text,
)
from distir.interp.project import project


def _ops(text: str) -> list[str]:
    return [op.name for op in distir.check(distir.parse_module(text)).entry.ops()]


def test_the_chain_runs_the_ops_it_counts_on_one_device() -> None:
    n = 2 * len(CHAIN) + 3
    assert _ops(chain_text(n)) == chain_ops(n)
    assert set(chain_ops(n)) == set(CHAIN)
    assert list(project(distir.check(distir.parse_module(chain_text(n))))) == [distir.ir.Device(0)]


def test_the_message_programs_have_one_collective_per_iteration_and_two_sends() -> None:
    n = 5
    ar = _ops(allreduce_text(n))
    assert ar.count("AllReduce") == n and ar.count("Gelu") == 2 * n
    pp = _ops(p2p_text(n))
    assert pp.count("Send") == 2 * n and pp.count("Gelu") == 2 * n
    for text in (allreduce_text(n), p2p_text(n)):
        assert len(project(distir.check(distir.parse_module(text)))) == 2


def test_the_arrival_check_computes_on_one_rank_at_a_time_or_both() -> None:
    n, m = 6, 4
    for apart in (False, True):
        module = distir.check(distir.parse_module(arrival_text(n, m, apart)))
        ops = list(module.entry.ops())
        assert sum(op.name == "AllReduce" for op in ops) == n
        gelus = [op.outputs[0].type.device.id for op in ops if op.name == "Gelu"]  # type: ignore[union-attr]
        if apart:  # the late rank alternates: d0 at even iterations, d1 at odd ones
            assert gelus == [i % 2 for i in range(n) for _ in range(m)]
        else:
            assert sorted(gelus) == [0] * (n * m) + [1] * (n * m)
        assert len(project(module)) == 2


def test_the_arrival_cost_is_the_apart_iteration_less_the_together_one() -> None:
    base = (3e-3, 1e-3, 0.5e-3, 1e-3, 100, 5e-6, 300e-6, 100e-6)
    assert derive(Runs(*base, 400e-6, 520e-6)).arrival_s == pytest.approx(120e-6)
    assert derive(Runs(*base, 400e-6, 390e-6)).arrival_s == 0.0  # noise below: nothing
    assert derive(Runs(*base)).arrival_s == 0.0  # not measured


def test_overheads_are_what_the_loop_adds_beyond_the_tight_loop_and_the_link() -> None:
    # 100 ops of 10 µs tight that take 3 ms in the loop: 20 µs per op; a Gelu (5 µs tight) then
    # costs 25 µs there, so a 1 ms all-reduce iteration on a 300 µs link leaves 675 µs per call
    runs = Runs(3e-3, 1e-3, 0.5e-3, 1e-3, 100, 5e-6, 300e-6, 100e-6)
    d = derive(runs)
    assert d.op_s == pytest.approx(20e-6)
    assert d.collective_s == pytest.approx(1e-3 - 25e-6 - 300e-6)
    assert d.p2p_s == pytest.approx(0.5e-3 - 25e-6 - 100e-6)
    # a loop faster than the tight loop or the link adds nothing
    fast = derive(Runs(0.5e-3, 10e-6, 10e-6, 1e-3, 100, 5e-6, 300e-6, 100e-6))
    assert (fast.op_s, fast.collective_s, fast.p2p_s) == (0.0, 0.0, 0.0)
