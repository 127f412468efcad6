"""The lock-step check rejects per-rank programs whose communication cannot match up."""

from __future__ import annotations

import pytest

import distir
from distir.interp.lockstep import DeadlockError, check_deadlock_free
from distir.ir import Device, parse_module

T = "Tensor[f32, (4,), d{d}]"


def _ranks(*texts: str) -> dict[Device, object]:
    mods = {}
    for i, t in enumerate(texts):
        m = parse_module(t)
        distir.verify(m)
        mods[Device(i)] = m
    return mods  # type: ignore[return-value]


def test_matching_sends_pass() -> None:
    r0 = f"""func @r(%x: {T.format(d=0)}) {{
  rank.Send(%x, dst=d1)
  %y = rank.Recv(src=d1, dtype=f32, shape=[4], device=d0)
  return %y
}}"""
    r1 = f"""func @r(%x: {T.format(d=1)}) {{
  %y = rank.Recv(src=d0, dtype=f32, shape=[4], device=d1)
  rank.Send(%x, dst=d0)
  return %y
}}"""
    check_deadlock_free(_ranks(r0, r1))  # type: ignore[arg-type]


def test_both_receive_first_deadlocks_and_names_ops_and_ranks() -> None:
    r0 = f"""func @r(%x: {T.format(d=0)}) {{
  %y = rank.Recv(src=d1, dtype=f32, shape=[4], device=d0)
  rank.Send(%x, dst=d1)
  return %y
}}"""
    r1 = f"""func @r(%x: {T.format(d=1)}) {{
  %y = rank.Recv(src=d0, dtype=f32, shape=[4], device=d1)
  rank.Send(%x, dst=d0)
  return %y
}}"""
    with pytest.raises(DeadlockError) as e:
        check_deadlock_free(_ranks(r0, r1))  # type: ignore[arg-type]
    assert set(e.value.blocked) == {Device(0), Device(1)}
    assert "rank.Recv(src=d1" in str(e.value) and "d0 (op 1)" in str(e.value)


def test_three_rank_cycle_of_sends_deadlocks() -> None:
    texts = []
    for i in range(3):
        nxt, prv = (i + 1) % 3, (i - 1) % 3
        texts.append(f"""func @r(%x: {T.format(d=i)}) {{
  rank.Send(%x, dst=d{nxt})
  %y = rank.Recv(src=d{prv}, dtype=f32, shape=[4], device=d{i})
  return %y
}}""")
    with pytest.raises(DeadlockError):
        check_deadlock_free(_ranks(*texts))  # type: ignore[arg-type]


def test_collectives_in_different_orders_deadlock() -> None:
    def ar(d: int, n: int) -> str:
        return f"%a{n} = rank.AllReduce(%x, group=[d0, d1], shapes=[[4], [4]], dtype=f32, device=d{d})"

    def ag(d: int, n: int) -> str:
        return f"%b{n} = rank.AllGather(%x, dim=0, group=[d0, d1], shapes=[[4], [4]], dtype=f32, device=d{d})"

    r0 = f"func @r(%x: {T.format(d=0)}) {{\n  {ar(0, 1)}\n  {ag(0, 2)}\n  return %a1\n}}"
    r1 = f"func @r(%x: {T.format(d=1)}) {{\n  {ag(1, 2)}\n  {ar(1, 1)}\n  return %a1\n}}"
    with pytest.raises(DeadlockError, match=r"rank\.AllReduce"):
        check_deadlock_free(_ranks(r0, r1))  # type: ignore[arg-type]


def test_send_to_missing_rank() -> None:
    r0 = f"func @r(%x: {T.format(d=0)}) {{\n  rank.Send(%x, dst=d5)\n  return %x\n}}"
    with pytest.raises(DeadlockError, match="d5, which has no program"):
        check_deadlock_free(_ranks(r0))  # type: ignore[arg-type]
