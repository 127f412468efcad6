"""The strategy value and its compact string form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distir.parallel.strategy import SCHEDULES, Strategy, StrategyError, parse_strategy


@st.composite
def strategies(draw: st.DrawFn) -> Strategy:
    d, t, p, k, c = (draw(st.integers(1, 16)) for _ in range(5))
    schedule = draw(st.sampled_from(SCHEDULES))
    v = draw(st.integers(1, 4)) if schedule == "interleaved" else 1
    part: tuple[int, ...] | str = draw(
        st.one_of(
            st.sampled_from(["uniform", "params"]),
            st.lists(st.integers(1, 9), min_size=p * v, max_size=p * v).map(tuple),
        )
    )
    placement = (
        draw(st.none() | st.permutations(list(range(d * c * t * p))).map(tuple))
        if d * c * t * p <= 8
        else None
    )
    return Strategy(
        d,
        t,
        p,
        k,
        schedule,
        v,
        draw(st.integers(0, 3)),
        draw(st.sampled_from(["none", "full", "selective"])),
        part,
        placement,
        sp=t > 1 and draw(st.booleans()),
        c=c,
    )


@given(strategies())
def test_string_form_round_trips(s: Strategy) -> None:
    assert parse_strategy(str(s)) == s
    assert str(parse_strategy(str(s))) == str(s)


def test_the_issue_example() -> None:
    s = parse_strategy("d2.t4.p2.k8.1f1b")
    assert (s.d, s.t, s.p, s.k, s.schedule, s.zero, s.recompute) == (2, 4, 2, 8, "1f1b", 0, "none")
    assert s.devices == 16
    assert str(s) == "d2.t4.p2.k8.1f1b"
    assert (
        str(parse_strategy("k4.p2.i1f1b.v2.z3.rsel.L2-1-1-2"))
        == "d1.t1.p2.k4.interleaved.v2.z3.rsel.L2-1-1-2"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty strategy"),
        ("d2..t4", "empty part"),
        ("d2.t4.p2.k8.1fib", "did you mean 1f1b"),
        ("d2.d4", "d is given twice"),
        ("dx", "unknown part 'dx'"),
        ("d0", "d must be a positive integer"),
        ("z5", "ZeRO stage must be 0, 1, 2 or 3"),
        ("p2.v2.1f1b", "need the interleaved schedule"),
        ("p2.L1-2-3", "must give p·v = 2 block counts"),
        ("d2.@0-0", "permutation of 0..1"),
        ("Lfoo", "should list integers"),
        ("d2.t1.sp", r"sp \(sequence parallelism\) .* needs t > 1"),
        ("sp", "needs t > 1"),
        ("t2.sp.sp", "sp is given twice"),
        ("t2.seqp", "did you mean sp"),
        ("c0", "c must be a positive integer"),
        ("c2.cx", "unknown part 'cx'"),
        ("d2.@0-1.c2", "permutation of 0..3"),
    ],
)
def test_bad_strings_are_named(text: str, message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        parse_strategy(text)


def test_sequence_parallel_string_form() -> None:
    """``sp`` prints right after ``t<n>`` (the issue's ``d2.t4.sp.p2.k8.1f1b``) and parses anywhere."""
    s = parse_strategy("d2.t4.sp.p2.k8.1f1b")
    assert s == Strategy(d=2, t=4, p=2, k=8, sp=True)
    assert str(s) == "d2.t4.sp.p2.k8.1f1b"
    assert parse_strategy("d2.t4.p2.k8.1f1b.sp") == s
    assert not parse_strategy("d2.t4.p2.k8.1f1b").sp
    with pytest.raises(StrategyError, match="sp must be True or False"):
        Strategy(t=2, sp=1)  # type: ignore[arg-type]


def test_context_parallel_string_form() -> None:
    """``c<n>`` prints after ``t<n>``/``sp`` (``d2.t1.c2.p1.k1``), only when c > 1, and counts in
    the devices (a stage's mesh is d·c·t)."""
    s = parse_strategy("d2.t1.c2.p1.k1")
    assert s == Strategy(d=2, k=1, c=2)
    assert str(s) == "d2.t1.c2.p1.k1.1f1b"
    assert s.devices == 4
    assert str(parse_strategy("p2.c4.d2.t2.sp")) == "d2.t2.sp.c4.p2.k1.1f1b"
    assert parse_strategy("d2.t4").c == 1 and "c" not in str(parse_strategy("d2.t4"))
