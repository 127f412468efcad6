"""Pipeline schedules as per-rank action lists (``distir.parallel.pipeline.schedules`` and
``distir.parallel.pipeline.analysis``).

1. Exact per-rank lists, written by hand from the papers' figures (GPipe, 1F1B as in Figure 2 of
   the zero-bubble paper, Megatron's interleaved schedule, ZB-H1 as in Figure 3 top).
2. Properties over (p, k, v): every schedule validates; unit-time bubble fractions are GPipe's and
   1F1B's (p-1)/(k+p-1), interleaving divides the bubble by v (Megatron paper), ZB-H1 beats 1F1B
   whenever W is split off B and matches the paper's (p-1)(T_F+T_I-T_W) bubble; peak in-flight.
3. Text: parse/format round trips and positioned errors.
4. ``merge``: keeps every rank's order and every dependency, succeeds exactly when some order
   exists (checked against an independent topological sort), and gives the DistIR paper's
   Figure 2 order for 1F1B with 2 stages and 2 microbatches.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.ir import parse_module
from distir.ir.ops import Call
from distir.parallel.pipeline.analysis import (
    ScheduleDeadlock,
    bubble_fraction,
    compiled_schedule,
    compiled_schedule_reference,
    dependencies,
    makespan,
    merge,
    peak_in_flight,
    schedule_times,
    simulate_schedule,
    time_order,
    validate,
)
from distir.parallel.pipeline.schedules import (
    KINDS,
    SCHEDULE_NAMES,
    Action,
    ScheduleError,
    build_schedule,
    format_schedule,
    gpipe,
    interleaved_1f1b,
    num_stages,
    one_f_one_b,
    parse_action,
    parse_schedule,
    stage_of,
    zero_bubble_h1,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def sched(text: str) -> list[list[Action]]:
    """Hand-written schedule: one rank per line, actions separated by spaces."""
    return [[parse_action(t) for t in line.split()] for line in text.strip().splitlines()]


# --- 1. exact schedules, by hand ---------------------------------------------------------------

GPIPE_2_2 = sched("""
0F0 0F1 0B0 0B1
1F0 1F1 1B0 1B1
""")

GPIPE_3_4 = sched("""
0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3
1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3
2F0 2F1 2F2 2F3 2B0 2B1 2B2 2B3
""")

# Rank r: p-1-r warm-up forwards, then F/B pairs, then the remaining backwards.
ONE_F_ONE_B_2_2 = sched("""
0F0 0F1 0B0 0B1
1F0 1B0 1F1 1B1
""")

# The zero-bubble paper's Figure 2 (1F1B, 4 devices, 8 microbatches), 0-indexed.
ONE_F_ONE_B_4_8 = sched("""
0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7
1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7
2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7
3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7
""")

# Megatron interleaved, p=2, v=2 (rank 0 holds stages 0, 2; rank 1 holds 1, 3), k=4 in groups
# of p=2: forwards chunk 0 of mb 0,1, chunk 1 of mb 0,1, chunk 0 of mb 2,3, ...; backwards
# the same with chunks reversed. Warm-up: rank 0 runs 2*(p-1) + (v-1)*p = 4 forwards, rank 1
# runs 2; then forward/backward pairs; then the remaining backwards.
INTERLEAVED_2_4_2 = sched("""
0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
""")

# ZB-H1: 1F1B order with B -> I; worker i (1-indexed) defers i-1 W passes.
ZB1_2_4 = sched("""
0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3
1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3
""")

# The zero-bubble paper's Figure 3 top (ZB-H1, 4 devices, 8 microbatches), 0-indexed.
ZB1_4_8 = sched("""
0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7
1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 1I6 1W5 1I7 1W6 1W7
2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 2I7 2W5 2W6 2W7
3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7
""")


@pytest.mark.parametrize(
    ("name", "p", "k", "v", "expected"),
    [
        ("gpipe", 2, 2, 1, GPIPE_2_2),
        ("gpipe", 3, 4, 1, GPIPE_3_4),
        ("1f1b", 2, 2, 1, ONE_F_ONE_B_2_2),
        ("1f1b", 4, 8, 1, ONE_F_ONE_B_4_8),
        ("interleaved", 2, 4, 2, INTERLEAVED_2_4_2),
        ("i1f1b", 2, 4, 2, INTERLEAVED_2_4_2),
        ("zb1", 2, 4, 1, ZB1_2_4),
        ("zbh1", 4, 8, 1, ZB1_4_8),
    ],
)
def test_exact_schedules(name: str, p: int, k: int, v: int, expected: list[list[Action]]) -> None:
    got = build_schedule(name, p, k, v)
    assert format_schedule(got) == format_schedule(expected)
    validate(expected, p, k, v, split_backward=name.startswith("zb"))


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    assert interleaved_1f1b(4, 6, 1) == one_f_one_b(4, 6)


def test_builder_errors() -> None:
    with pytest.raises(ScheduleError, match=r"k=6, p=4") as e:
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ScheduleError, match="unknown schedule 'pipedream'") as e:
        build_schedule("pipedream", 2, 2)
    for known in ("gpipe", "1f1b", "interleaved", "i1f1b", "zb1", "zbh1"):
        assert known in str(e.value)
    with pytest.raises(ScheduleError, match="v must be 1, got 2"):
        build_schedule("1f1b", 2, 2, 2)
    with pytest.raises(ScheduleError, match="k must be an int >= 1, got 0"):
        gpipe(2, 0)
    with pytest.raises(ScheduleError, match="p must be an int >= 1, got -1"):
        stage_of(3, -1)
    assert stage_of(5, 2) == 1 and num_stages(3, 2) == 6


# --- 2. properties over (p, k, v) ----------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, int, int, int]:
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb1"]))
    p = draw(st.integers(1, 6))
    if name == "interleaved":
        return name, p, p * draw(st.integers(1, 3)), draw(st.integers(1, 4))
    return name, p, draw(st.integers(1, 12)), 1


@settings(max_examples=150, deadline=None)
@given(configs())
def test_every_schedule_validates_and_merges(cfg: tuple[str, int, int, int]) -> None:
    name, p, k, v = cfg
    s = build_schedule(name, p, k, v)
    validate(s, p, k, v, split_backward=name == "zb1")
    check_merge(s, p, v)


@settings(max_examples=150, deadline=None)
@given(configs())
def test_compiled_schedule_equals_its_reference(cfg: tuple[str, int, int, int]) -> None:
    """The numbering on action codes gives the reference's arrays (same order, dependencies and
    hops)."""
    assert compiled_schedule(*cfg) == compiled_schedule_reference(*cfg)


def test_compiled_schedule_equals_its_reference_on_search_shapes() -> None:
    """Deep pipelines and many microbatches, as the searches number them."""
    shapes = [(n, p, k, 1) for n in ("gpipe", "1f1b", "zb1") for p in (2, 8, 16) for k in (1, 3, 16, 64)]
    shapes += [("interleaved", p, k, v) for p in (2, 4, 8) for k in (8, 32) for v in (2, 3)]
    for shape in shapes:
        assert compiled_schedule(*shape) == compiled_schedule_reference(*shape), shape


@settings(max_examples=100, deadline=None)
@given(configs(), st.floats(0.1, 3.0), st.floats(0.1, 3.0), st.floats(0.0, 1.0), st.sampled_from([0.0, 0.25]))
def test_compiled_makespan_equals_the_list_scheduled_one(
    cfg: tuple[str, int, int, int], f: float, b: float, wf: float, comm: float
) -> None:
    """The compiled schedule's makespan (the screen's pipeline time) is ``simulate_schedule``'s
    with the same times: one duration per pass, one transfer per hop either way."""
    name, p, k, v = cfg
    w = wf * b if name == "zb1" else None
    want, _, _ = simulate_schedule(build_schedule(name, p, k, v), p, k, v, f, b, w, comm)
    per_pass = {"F": f, "B": b, "I": b - (w or 0.0), "W": w or 0.0}
    durations = [[per_pass[kd] for kd in KINDS]] * (p * v)
    got = makespan(compiled_schedule(name, p, k, v), durations, [(comm, comm)] * (p * v - 1))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(configs(), st.randoms(use_true_random=False))
def test_schedule_times_end_each_rank_and_slot_where_list_scheduling_does(
    cfg: tuple[str, int, int, int], rng: random.Random
) -> None:
    """``schedule_times`` gives each rank's last end and each (virtual stage, pass) slot's last
    end as ``time_order``'s list scheduling does (no transfers), 0 for a slot without actions."""
    name, p, k, v = cfg
    durations = [[rng.uniform(0.1, 2.0) for _ in KINDS] for _ in range(p * v)]
    timed = time_order(
        build_schedule(name, p, k, v), p, v, lambda r, a: durations[a.stage][KINDS.index(a.kind)]
    )
    got = schedule_times(compiled_schedule(name, p, k, v), durations, [(0.0, 0.0)] * (p * v - 1))
    want_rank = [max([t.end for t in timed if t.rank == r], default=0.0) for r in range(p)]
    want_slot = [0.0] * (4 * p * v)
    for t in timed:
        sl = 4 * t.action.stage + KINDS.index(t.action.kind)
        want_slot[sl] = max(want_slot[sl], t.end)
    assert got.rank_end == pytest.approx(want_rank, rel=1e-12)
    assert got.slot_end == pytest.approx(want_slot, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(configs(), st.randoms(use_true_random=False))
def test_compiled_makespan_takes_each_stage_and_pass_its_own_time(
    cfg: tuple[str, int, int, int], rng: random.Random
) -> None:
    """With a duration per virtual stage and pass and no transfers, the compiled makespan is the
    latest end of ``time_order``'s list scheduling; transfers on one cut delay it by at most
    their sum over the microbatches crossing it."""
    name, p, k, v = cfg
    durations = [[rng.uniform(0.1, 2.0) for _ in KINDS] for _ in range(p * v)]
    per_rank = build_schedule(name, p, k, v)
    timed = time_order(per_rank, p, v, lambda r, a: durations[a.stage][KINDS.index(a.kind)])
    order = compiled_schedule(name, p, k, v)
    none = [(0.0, 0.0)] * (p * v - 1)
    assert makespan(order, durations, none) == pytest.approx(max(t.end for t in timed), rel=1e-12)
    if p * v > 1:
        cut = rng.randrange(p * v - 1)
        slow = list(none)
        slow[cut] = (0.5, 0.25)
        grown = makespan(order, durations, slow) - makespan(order, durations, none)
        assert -1e-12 <= grown <= 0.75 * k + 1e-9  # each microbatch crosses it once each way


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 7), st.integers(1, 16))
def test_unit_time_bubble_of_gpipe_and_1f1b(name: str, p: int, k: int) -> None:
    makespan, busy, _ = simulate_schedule(build_schedule(name, p, k), p, k, 1, 1.0, 1.0)
    assert busy == [2.0 * k] * p
    assert bubble_fraction(makespan, busy) == pytest.approx((p - 1) / (k + p - 1), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.integers(2, 4))
def test_interleaving_divides_the_bubble_by_v(p: int, groups: int, v: int) -> None:
    # Each chunk does 1/v of a stage's work; Megatron's bubble is (p-1)(t_f + t_b)/v.
    k = p * groups
    makespan, busy, _ = simulate_schedule(interleaved_1f1b(p, k, v), p, k, v, 1.0 / v, 1.0 / v)
    assert makespan == pytest.approx(2 * k + 2 * (p - 1) / v, abs=1e-9)
    ms1, busy1, _ = simulate_schedule(one_f_one_b(p, k), p, k, 1, 1.0, 1.0)
    assert bubble_fraction(makespan, busy) < bubble_fraction(ms1, busy1)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 6),
    st.integers(1, 12),
    st.floats(0.1, 3.0),
    st.floats(0.1, 3.0),
    st.floats(0.01, 1.0),
    st.sampled_from([0.0, 0.3]),
)
def test_zb1_beats_1f1b_when_w_is_split_off(
    p: int, k: int, f: float, b: float, wf: float, comm: float
) -> None:
    zb_ms, zb_busy, _ = simulate_schedule(zero_bubble_h1(p, k), p, k, 1, f, b, wf * b, comm)
    ms, busy, _ = simulate_schedule(one_f_one_b(p, k), p, k, 1, f, b, comm=comm)
    assert zb_busy == pytest.approx(busy)
    assert bubble_fraction(zb_ms, zb_busy) < bubble_fraction(ms, busy)
    # With W of zero length the split changes nothing: F and I keep 1F1B's order.
    zero_w, _, _ = simulate_schedule(zero_bubble_h1(p, k), p, k, 1, f, b, 0.0, comm)
    assert zero_w == pytest.approx(ms)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 8))
def test_zb1_bubble_matches_the_paper(p: int, extra: int) -> None:
    # Table 2 of the zero-bubble paper: with T_F = T_I = T_W = 1 and k >= p, ZB-H1's bubble per
    # rank is (p-1)(T_F + T_I - T_W) = p-1, against 1F1B's (p-1)(T_F + T_I + T_W) = 3(p-1).
    k = p + extra
    makespan, busy, _ = simulate_schedule(zero_bubble_h1(p, k), p, k, 1, 1.0, 2.0, 1.0)
    assert makespan == pytest.approx(3 * k + (p - 1))
    assert busy == pytest.approx([3.0 * k] * p)
    ms1, _, _ = simulate_schedule(one_f_one_b(p, k), p, k, 1, 1.0, 2.0)
    assert ms1 == pytest.approx(3 * k + 3 * (p - 1))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 12))
def test_peak_in_flight(p: int, k: int) -> None:
    assert peak_in_flight(one_f_one_b(p, k)) == [min(k, p - r) for r in range(p)]
    assert peak_in_flight(zero_bubble_h1(p, k)) == [min(k, p - r) for r in range(p)]
    assert peak_in_flight(gpipe(p, k)) == [k] * p


def test_peak_in_flight_counts_chunks_separately() -> None:
    # Rank 0 of INTERLEAVED_2_4_2 holds 0F0 0F1 2F0 2F1 0F2 before its first backward.
    assert peak_in_flight(INTERLEAVED_2_4_2) == [5, 3]


def test_simulation_by_hand_with_comm() -> None:
    # 1F1B, p=2, k=1, f=1, b=2, comm=0.5: 0F0 [0,1]; 1F0 [1.5,2.5]; 1B0 [2.5,4.5]; 0B0 [5,7].
    makespan, busy, timeline = simulate_schedule(one_f_one_b(2, 1), 2, 1, 1, 1.0, 2.0, comm=0.5)
    assert makespan == 7.0 and busy == [3.0, 3.0]
    got = [(t.rank, str(t.action), t.start, t.end) for t in timeline]
    assert got == [(0, "0F0", 0.0, 1.0), (1, "1F0", 1.5, 2.5), (1, "1B0", 2.5, 4.5), (0, "0B0", 5.0, 7.0)]
    with pytest.raises(ScheduleError, match="w_time is required"):
        simulate_schedule(zero_bubble_h1(2, 1), 2, 1, 1, 1.0, 2.0)
    with pytest.raises(ScheduleError, match=r"w_time must be in \[0, b_time=2.0\], got 3.0"):
        simulate_schedule(zero_bubble_h1(2, 1), 2, 1, 1, 1.0, 2.0, 3.0)


# --- validate: errors name the action -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "split", "message", "rank", "token"),
    [
        ("0F0 0F1 0B0\n1F0 1B0 1F1 1B1", False, "missing action 0B1", None, None),
        ("0F0 0F1 0B0 0B1 0B1\n1F0 1B0 1F1 1B1", False, "duplicate action", 0, "0B1"),
        ("0F0 0F1 0B0 0B1 1F0\n1B0 1F1 1B1", False, "stage 1 runs on rank 1, not rank 0", 0, "1F0"),
        ("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1", True, "kind B not allowed", 0, "0B0"),
        ("0F0 0F1 0B0 0B1 2F0\n1F0 1B0 1F1 1B1", False, "stage 2 out of range", 0, "2F0"),
        ("0F0 0F2 0B0 0B2\n1F0 1B0 1F2 1B2", False, "microbatch 2 out of range 0..1", 0, "0F2"),
        # rank 0 wants 1B0 before it runs 0F1; rank 1 wants 0F1 (for 1F1) before it runs 1F0.
        ("0F0 0B0 0F1 0B1\n1F1 1F0 1B0 1B1", False, "deadlock", 0, "0B0"),
        ("0B0 0F0 0F1 0B1\n1F0 1B0 1F1 1B1", False, "rank 0 index 0 0B0 waits for 0F0, 1B0", 0, "0B0"),
    ],
)
def test_validate_errors(text: str, split: bool, message: str, rank: int | None, token: str | None) -> None:
    with pytest.raises(ScheduleError, match=message) as e:
        validate(sched(text), 2, 2, 1, split_backward=split)
    assert (e.value.rank, e.value.token) == (rank, token)


def test_deadlock_lists_stuck_actions() -> None:
    with pytest.raises(ScheduleDeadlock) as e:
        merge(sched("0F0 0B0 0F1 0B1\n1F1 1F0 1B0 1B1"), 2, 1)
    stuck = [(r, i, str(a), [str(w) for w in waits]) for r, i, a, waits in e.value.stuck]
    assert stuck == [(0, 1, "0B0", ["1B0"]), (1, 0, "1F1", ["0F1"])]


# --- 3. text ----------------------------------------------------------------------------------------

actions = st.builds(Action, st.integers(0, 120), st.integers(0, 1200), st.sampled_from(["F", "B", "I", "W"]))
schedules = st.lists(st.lists(actions, max_size=12), min_size=1, max_size=6)


@given(schedules)
def test_format_parse_round_trip(per_rank: list[list[Action]]) -> None:
    text = format_schedule(per_rank)
    assert parse_schedule(text) == per_rank
    assert format_schedule(parse_schedule(text + "\n")) == text
    for acts, line in zip(per_rank, text.split("\n"), strict=True):
        assert [str(a) for a in acts] == line.split()[2:]
        assert all(parse_action(str(a)) == a for a in acts)


@given(schedules, st.data())
def test_malformed_token_is_located(per_rank: list[list[Action]], data: st.DataObject) -> None:
    ranks = [r for r, acts in enumerate(per_rank) if acts]
    if not ranks:
        per_rank[0].append(Action(0, 0, "F"))
        ranks = [0]
    r = data.draw(st.sampled_from(ranks))
    i = data.draw(st.integers(0, len(per_rank[r]) - 1))
    bad = data.draw(st.sampled_from(["0X1", "F1", "0F", "01F1", "0F01", "-1F0", "0f0", "0F1x"]))
    tokens = [[str(a) for a in acts] for acts in per_rank]
    tokens[r][i] = bad
    text = "\n".join(f"rank {q}:" + "".join(f" {t}" for t in ts) for q, ts in enumerate(tokens))
    with pytest.raises(ScheduleError) as e:
        parse_schedule(text)
    assert (e.value.rank, e.value.index, e.value.token) == (r, i, bad)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rank 1: 0F0", "ranks must be listed in order: expected rank 0"),
        ("rank 0:0F0", "expected a space after"),
        ("rank 0: 0F0  0B0", "malformed action"),
        ("stage 0: 0F0", "expected a line starting 'rank 0:'"),
    ],
)
def test_malformed_lines(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_schedule(text)


def test_action_checks_its_fields() -> None:
    with pytest.raises(ScheduleError, match="kind must be one of F, B, I, W, got 'X'"):
        Action(0, 0, "X")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="microbatch must be an int >= 0, got -1"):
        Action(0, -1, "F")
    assert str(Action(2, 13, "F")) == "2F13" and parse_action("2F13") == Action(2, 13, "F")


# --- 4. merge -----------------------------------------------------------------------------------------


def check_merge(per_rank: list[list[Action]], p: int, v: int) -> None:
    order = merge(per_rank, p, v)
    assert [[a for r, a in order if r == q] for q in range(p)] == per_rank
    seen: set[Action] = set()
    for _, a in order:
        assert all(d in seen for d in dependencies(a, p, v)), a
        seen.add(a)


def has_order(per_rank: list[list[Action]], p: int, v: int) -> bool:
    """Kahn's algorithm on rank-order edges plus dependency edges (independent of merge)."""
    nodes = [a for acts in per_rank for a in acts]
    preds: dict[Action, set[Action]] = {a: set(dependencies(a, p, v)) for a in nodes}
    for acts in per_rank:
        for before, after in itertools.pairwise(acts):
            preds[after].add(before)
    done: set[Action] = set()
    progress = True
    while progress:
        progress = False
        for a in nodes:
            if a not in done and preds[a] <= done:
                done.add(a)
                progress = True
    return len(done) == len(nodes)


@st.composite
def random_orders(draw: st.DrawFn) -> tuple[list[list[Action]], int, int]:
    """Per-rank lists of a complete action set, each rank in a random order."""
    p, k, v = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    split = draw(st.booleans())
    kinds = ("F", "I", "W") if split else ("F", "B")
    per_rank: list[list[Action]] = [[] for _ in range(p)]
    for s in range(p * v):
        for m in range(k):
            per_rank[s % p] += [Action(s, m, kind) for kind in kinds]  # type: ignore[arg-type]
    return [draw(st.permutations(acts)) for acts in per_rank], p, v


@settings(max_examples=200, deadline=None)
@given(random_orders())
def test_merge_succeeds_exactly_when_an_order_exists(case: tuple[list[list[Action]], int, int]) -> None:
    per_rank, p, v = case
    if has_order(per_rank, p, v):
        check_merge(per_rank, p, v)
    else:
        with pytest.raises(ScheduleDeadlock):
            merge(per_rank, p, v)


def test_merge_gives_figure_2_order() -> None:
    expected = ["0F0", "0F1", "1F0", "1B0", "0B0", "1F1", "1B1", "0B1"]
    order = merge(one_f_one_b(2, 2), 2, 1)
    assert [str(a) for _, a in order] == expected
    assert [r for r, _ in order] == [0, 0, 1, 1, 0, 1, 1, 0]
    # The same order read off the example program: @dense is a forward, @denseGrad a backward;
    # weight w<i> is stage i-1 and the suffix _<j> is microbatch j-1.
    module = parse_module((EXAMPLES / "fig2_mlp_pipeline.distir").read_text(encoding="utf-8"))
    from_file = [
        f"{int(c.inputs[0].name[1:]) - 1}{'F' if c.callee == 'dense' else 'B'}"
        f"{int(c.outputs[0].name.rsplit('_', 1)[1]) - 1}"
        for c in module.entry.body
        if isinstance(c, Call) and c.callee in ("dense", "denseGrad")
    ]
    assert from_file == expected


def test_schedule_names() -> None:
    assert set(SCHEDULE_NAMES) == {"gpipe", "1f1b", "interleaved", "i1f1b", "zb1", "zbh1"}
    assert build_schedule("zbh1", 3, 5) == build_schedule("zb1", 3, 5) == zero_bubble_h1(3, 5)
