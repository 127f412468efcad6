"""Checking, ordering and timing pipeline schedules (per-rank action lists of
``distir.parallel.pipeline.schedules``).

Dependencies (``dependencies``), over ``S = p*v`` virtual stages:
``F(s,m)`` needs ``F(s-1,m)``; ``B(s,m)`` / ``I(s,m)`` need ``F(s,m)`` and, below the last
stage, ``B(s+1,m)`` / ``I(s+1,m)``; ``W(s,m)`` needs ``I(s,m)``.

- ``validate`` checks that a schedule has exactly the right actions on the right ranks and that
  some execution finishes (no cyclic waits between the ranks' orders and the dependencies).
- ``merge`` produces the one global order the DistIR program is written in.
- ``simulate_schedule`` times a schedule by list scheduling; ``bubble_fraction`` and
  ``peak_in_flight`` summarize it.
- ``compiled_schedule`` and ``makespan``: the same list scheduling with a duration per virtual
  stage and pass and a transfer per cut and direction, on a schedule numbered once (the
  screen's pipeline time, ``distir.search.stage_costs``); tested equal to ``simulate_schedule``
  and ``time_order``, and the numbering to its plain form (``compiled_schedule_reference``).
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from distir.parallel.pipeline.schedules import (
    KINDS,
    Action,
    Kind,
    ScheduleError,
    _check_counts,
    build_schedule,
    num_stages,
    stage_of,
)


class ScheduleDeadlock(ScheduleError):
    """No rank can run its next action. ``stuck`` lists ``(rank, index, action, waits_for)``."""

    def __init__(self, message: str, stuck: Sequence[tuple[int, int, Action, tuple[Action, ...]]]) -> None:
        r, i, a, _ = stuck[0]
        super().__init__(message, rank=r, index=i, token=str(a))
        self.stuck = list(stuck)


@dataclass(frozen=True, slots=True)
class TimedAction:
    """One action of a simulated schedule: it runs on ``rank`` from ``start`` to ``end``."""

    rank: int
    action: Action
    start: float
    end: float


def dependencies(action: Action, p: int, v: int) -> tuple[Action, ...]:
    """The actions ``action`` must wait for (see the module docstring)."""
    last = num_stages(p, v) - 1
    return tuple(Action(*k) for k in _dependency_keys(action.stage, action.microbatch, action.kind, last))


_Key = tuple[int, int, Kind]  # (virtual stage, microbatch, kind): an action, hashed at C speed


def _dependency_keys(s: int, m: int, kind: Kind, last: int) -> tuple[_Key, ...]:
    """``dependencies`` as keys, for a schedule of virtual stages 0..``last``."""
    if kind == "F":
        return ((s - 1, m, "F"),) if s > 0 else ()
    if kind == "W":
        return ((s, m, "I"),)
    return ((s, m, "F"),) if s == last else ((s, m, "F"), (s + 1, m, kind))


class _Indexed:
    """A schedule's actions numbered in rank order (rank 0's list first), with each action's
    dependencies as numbers, computed once: ``merge`` asks about a rank's next action in every
    round until it runs."""

    __slots__ = ("actions", "deps", "first")

    def __init__(self, per_rank: Sequence[Sequence[Action]], p: int, v: int) -> None:
        """Checks the schedule as ``_locate`` does (the same errors)."""
        pos, deps = _locate(per_rank, p, v)
        self.actions = [a for acts in per_rank for a in acts]
        self.first = [0] * (p + 1)  # rank r's actions are numbers first[r] .. first[r + 1] - 1
        for r, acts in enumerate(per_rank):
            self.first[r + 1] = self.first[r] + len(acts)
        first = self.first
        number = {k: first[r] + i for k, (r, i) in pos.items()}
        self.deps = [tuple(map(number.__getitem__, ds)) for ds in deps]


def _locate(
    per_rank: Sequence[Sequence[Action]], p: int, v: int
) -> tuple[dict[_Key, tuple[int, int]], list[tuple[_Key, ...]]]:
    """Map each action (by key) to its (rank, index), and list the dependencies of each action
    in rank order; check the rank count, stages, duplicates and that every dependency is run by
    some rank."""
    _check_counts(p=p, v=v)
    if len(per_rank) != p:
        raise ScheduleError(f"schedule has {len(per_rank)} ranks, expected p={p}")
    n_stages = num_stages(p, v)
    pos: dict[_Key, tuple[int, int]] = {}
    for r, acts in enumerate(per_rank):
        for i, a in enumerate(acts):
            if a.stage >= n_stages:
                raise ScheduleError(
                    f"stage {a.stage} out of range: p={p}, v={v} give stages 0..{n_stages - 1}",
                    rank=r,
                    index=i,
                    token=str(a),
                )
            if a.stage % p != r:  # ``stage_of`` (p is checked above, stages are >= 0)
                raise ScheduleError(
                    f"stage {a.stage} runs on rank {stage_of(a.stage, p)}, not rank {r}",
                    rank=r,
                    index=i,
                    token=str(a),
                )
            k = (a.stage, a.microbatch, a.kind)
            if k in pos:
                raise ScheduleError(
                    f"duplicate action, first at index {pos[k][1]}", rank=r, index=i, token=str(a)
                )
            pos[k] = (r, i)
    deps = [_dependency_keys(s, m, kind, n_stages - 1) for s, m, kind in pos]
    for (k, (r, i)), ds in zip(pos.items(), deps, strict=True):
        for d in ds:
            if d not in pos:
                raise ScheduleError(
                    f"depends on {Action(*d)}, which no rank runs", rank=r, index=i, token=str(Action(*k))
                )
    return pos, deps


def validate(per_rank: Sequence[Sequence[Action]], p: int, k: int, v: int, split_backward: bool) -> None:
    """Check a schedule; ``ScheduleError`` names the offending action.

    Every (virtual stage, microbatch) of ``p*v`` stages and ``k`` microbatches has exactly one
    ``F`` and one ``B`` — or, with ``split_backward``, one ``I`` and one ``W`` — on rank
    ``stage % p``, and the ranks' orders together with the dependencies admit an execution
    (``merge`` finds one; a ``ScheduleDeadlock`` otherwise).
    """
    _check_counts(p=p, k=k, v=v)
    allowed: tuple[Kind, ...] = ("F", "I", "W") if split_backward else ("F", "B")
    for r, acts in enumerate(per_rank):
        for i, a in enumerate(acts):
            if a.kind not in allowed:
                raise ScheduleError(
                    f"kind {a.kind} not allowed with split_backward={split_backward} "
                    f"(allowed: {', '.join(allowed)})",
                    rank=r,
                    index=i,
                    token=str(a),
                )
            if a.microbatch >= k:
                raise ScheduleError(
                    f"microbatch {a.microbatch} out of range 0..{k - 1}", rank=r, index=i, token=str(a)
                )
    pos, _ = _locate(per_rank, p, v)
    for s in range(num_stages(p, v)):
        for m in range(k):
            for kind in allowed:
                if (s, m, kind) not in pos:
                    a = Action(s, m, kind)
                    raise ScheduleError(f"missing action {a} (stage {s} runs on rank {stage_of(s, p)})")
    merge(per_rank, p, v)


def merge(per_rank: Sequence[Sequence[Action]], p: int, v: int) -> list[tuple[int, Action]]:
    """One global order of all ``(rank, action)`` that keeps every rank's order and every
    dependency: the order of a lock-step execution in rounds.

    Rule: in each round, every rank, in rank order, runs its next action if all of that action's
    dependencies ran in an *earlier* round. What runs in a round becomes visible only in the next
    one, as if each round ended with delivering the messages sent in it. So a forward whose input
    was just produced on another rank waits one round, and a rank whose input is ready keeps
    going. For 1F1B with p=2, k=2 this gives the DistIR paper's Figure 2 order
    ``0F0 | 0F1 1F0 | 1B0 | 0B0 1F1 | 1B1 | 0B1`` (rounds separated by ``|``).

    If no rank can run in some round, nothing changes any more: each rank's next action waits for
    one that has not run, which is at or after some rank's next action; following the waits gives a
    cycle through the ranks' orders and the dependencies, so *no* order exists. Hence ``merge``
    fails (``ScheduleDeadlock`` naming the stuck actions and what they wait for) exactly for
    schedules that cannot run, and succeeds for every other one.
    """
    ix = _Indexed(per_rank, p, v)
    return [(r, ix.actions[j]) for r, j in _merge(per_rank, p, v, ix)]


def _merge(per_rank: Sequence[Sequence[Action]], p: int, v: int, ix: _Indexed) -> list[tuple[int, int]]:
    """``merge`` on the numbered schedule: the same rounds, giving (rank, action number)."""
    deps, first = ix.deps, ix.first
    done = [False] * len(ix.actions)
    pcs = [0] * p
    order: list[tuple[int, int]] = []
    remaining = len(ix.actions)
    while remaining:
        ran: list[tuple[int, int]] = []
        for r in range(p):
            if pcs[r] < len(per_rank[r]):
                j = first[r] + pcs[r]
                if all(done[d] for d in deps[j]):
                    ran.append((r, j))
                    pcs[r] += 1
        if not ran:
            ran_before = {ix.actions[j] for j, x in enumerate(done) if x}
            stuck = [
                (r, pcs[r], per_rank[r][pcs[r]], _unmet(per_rank[r][pcs[r]], ran_before, p, v))
                for r in range(p)
                if pcs[r] < len(per_rank[r])
            ]
            detail = "; ".join(
                f"rank {r} index {i} {a} waits for {', '.join(map(str, w))}" for r, i, a, w in stuck
            )
            raise ScheduleDeadlock(f"deadlock: no rank can run its next action: {detail}", stuck)
        for _, j in ran:  # visible from the next round on
            done[j] = True
        order.extend(ran)
        remaining -= len(ran)
    return order


def _unmet(a: Action, done: set[Action], p: int, v: int) -> tuple[Action, ...]:
    return tuple(d for d in dependencies(a, p, v) if d not in done)


def simulate_schedule(
    per_rank: Sequence[Sequence[Action]],
    p: int,
    k: int,
    v: int,
    f_time: float,
    b_time: float,
    w_time: float | None = None,
    comm: float = 0.0,
) -> tuple[float, list[float], list[TimedAction]]:
    """Time a schedule by list scheduling: each rank runs its list in order; an action starts
    when its rank is free and each dependency has ended, plus ``comm`` if that dependency ran on
    another rank. ``F`` takes ``f_time`` and ``B`` ``b_time``; a split backward takes the same
    total: ``I`` takes ``b_time - w_time`` and ``W`` takes ``w_time`` (required then).

    Returns ``(makespan, busy time per rank, timeline)``, the timeline sorted by (start, rank).
    The schedule must be valid (``validate``) for ``k`` microbatches.
    """
    split = any(a.kind in ("I", "W") for acts in per_rank for a in acts)
    validate(per_rank, p, k, v, split_backward=split)
    for name, val in (("f_time", f_time), ("b_time", b_time), ("comm", comm)):
        if val < 0:
            raise ScheduleError(f"{name} must be >= 0, got {val}")
    durations = {"F": float(f_time), "B": float(b_time)}
    if split:
        if w_time is None:
            raise ScheduleError("the schedule splits backwards into I and W: w_time is required")
        if not 0 <= w_time <= b_time:
            raise ScheduleError(f"w_time must be in [0, b_time={b_time}], got {w_time}")
        durations |= {"I": float(b_time - w_time), "W": float(w_time)}
    end: dict[Action, float] = {}
    free = [0.0] * p
    busy = [0.0] * p
    timeline: list[TimedAction] = []
    for r, a in merge(per_rank, p, v):  # a topological order, so every dependency is timed
        start = free[r]
        for d in dependencies(a, p, v):
            start = max(start, end[d] + (comm if stage_of(d.stage, p) != r else 0.0))
        end[a] = free[r] = start + durations[a.kind]
        busy[r] += durations[a.kind]
        timeline.append(TimedAction(r, a, start, end[a]))
    timeline.sort(key=lambda t: (t.start, t.rank))
    return max(free), busy, timeline


def bubble_fraction(makespan: float, busy: Sequence[float]) -> float:
    """Idle share of all ranks' time: ``1 - sum(busy) / (p * makespan)``."""
    if makespan <= 0:
        raise ScheduleError(f"makespan must be > 0, got {makespan}")
    return 1.0 - sum(busy) / (len(busy) * makespan)


def peak_in_flight(per_rank: Sequence[Sequence[Action]]) -> list[int]:
    """Per rank, the most (virtual stage, microbatch) pairs held at once: forward done, backward
    (``B`` or ``I``) not yet, walking the rank's list in order. Each chunk of an interleaved
    rank counts separately, since each holds its own activations."""
    peaks: list[int] = []
    for r, acts in enumerate(per_rank):
        held: set[tuple[int, int]] = set()
        peak = 0
        for i, a in enumerate(acts):
            key = (a.stage, a.microbatch)
            if a.kind == "F":
                held.add(key)
                peak = max(peak, len(held))
            elif a.kind in ("B", "I"):
                if key not in held:
                    raise ScheduleError("backward before its forward", rank=r, index=i, token=str(a))
                held.remove(key)
        peaks.append(peak)
    return peaks


def time_order(
    per_rank: Sequence[Sequence[Action]], p: int, v: int, duration: Callable[[int, Action], float]
) -> list[TimedAction]:
    """All actions with estimated start and end times, in one global order by start time: list
    scheduling with ``duration(rank, action)`` (no communication time), sorted by (start, lock-step
    position).

    This is the order a transform writes the program in. Under DistIR's semantics a device runs
    its ops in program order, so a communication stream shared by several transfers would make a
    transfer wait for one written before it even when it could go first; writing the program in
    (estimated) time order avoids such false waits. Dependencies end before their dependents start,
    and ties keep ``merge``'s order, so the result is a valid order. For 1F1B with p=2, k=2 and
    ``B = 2·F`` it is again the DistIR paper's Figure 2 order."""
    ix = _Indexed(per_rank, p, v)
    end = [0.0] * len(ix.actions)
    free = [0.0] * p
    timed: list[tuple[float, int, TimedAction]] = []
    for i, (r, j) in enumerate(_merge(per_rank, p, v, ix)):
        a = ix.actions[j]
        start = free[r]
        for d in ix.deps[j]:
            start = max(start, end[d])
        end[j] = free[r] = start + max(float(duration(r, a)), 0.0)
        timed.append((start, i, TimedAction(r, a, start, end[j])))
    timed.sort(key=itemgetter(0, 1))
    return [t for _, _, t in timed]


class CompiledSchedule(NamedTuple):
    """A schedule numbered for timing (``compiled_schedule``), its actions in a topological
    order, as flat integer arrays (a search keeps hundreds): per action its rank, its ``slot``
    (virtual stage × 4 + its pass's index in ``KINDS``: an index into ``makespan``'s flattened
    durations) and up to two dependencies, each an action number (−1: none) and its ``hop``,
    the transfer it waits for from another rank (2 × cut + direction, 0 forward and 1
    backward, the cut being the lower of the two virtual stages; −1 on the same rank)."""

    p: int
    rank: array[int]
    slot: array[int]
    dep_a: array[int]
    hop_a: array[int]
    dep_b: array[int]
    hop_b: array[int]


@functools.lru_cache(maxsize=512)
def compiled_schedule(name: str, p: int, k: int, v: int = 1) -> CompiledSchedule:
    """``build_schedule(name, p, k, v)`` in a topological order (each rank's actions in its
    order, every action after its dependencies; list scheduling times any such order alike),
    numbered (memoized: a search times many strategies of each pipeline shape). The order is
    rounds over the ranks, each rank running its actions while their dependencies are numbered.
    The builders' schedules are valid (``validate``, tested), so the walk always advances; a
    schedule that cannot run raises ``ScheduleDeadlock`` through ``merge``.

    Each action is a code ``(stage·k + microbatch)·4 + pass`` (``KINDS``), so its
    dependencies (``_dependency_keys``) are codes at fixed offsets and the numbers a flat list:
    the same arrays as ``compiled_schedule_reference`` (tested), several times faster."""
    per_rank = build_schedule(name, p, k, v)
    last = num_stages(p, v) - 1
    kind_ix = {kd: i for i, kd in enumerate(KINDS)}
    k4 = 4 * k  # one stage further: the same microbatch and pass
    codes = [[(a.stage * k + a.microbatch) * 4 + kind_ix[a.kind] for a in acts] for acts in per_rank]
    number = [-1] * ((last + 1) * k4)
    cols: tuple[list[int], ...] = ([], [], [], [], [], [])
    rank, slot, dep_a, hop_a, dep_b, hop_b = (c.append for c in cols)
    pcs = [0] * p
    done, total = 0, sum(map(len, codes))
    while done < total:
        ran = False
        for r, acts in enumerate(codes):
            pc, end = pcs[r], len(acts)
            while pc < end:
                c = acts[pc]
                st, kd = c // k4, c & 3
                db = hb = -1
                if kd == 0:  # F: the previous stage's forward
                    da = number[c - k4] if st > 0 else -1
                    if st > 0 and da < 0:
                        break
                    ha = -1 if st == 0 or (st - 1) % p == r else 2 * (st - 1)
                else:  # W: this stage's I; B and I: its F and the next stage's same pass
                    da = number[c - 1 if kd == 3 else c - kd]
                    if da < 0:
                        break
                    ha = -1 if st % p == r else 2 * st + 1
                    if kd != 3 and st < last:
                        db = number[c + k4]
                        if db < 0:
                            break
                        hb = -1 if (st + 1) % p == r else 2 * st + 1
                rank(r)
                slot(4 * st + kd)
                dep_a(da)
                hop_a(ha)
                dep_b(db)
                hop_b(hb)
                number[c] = done
                done += 1
                pc += 1
                ran = True
            pcs[r] = pc
        if not ran:
            merge(per_rank, p, v)  # raises ScheduleDeadlock naming the waits
            raise ScheduleError(f"{name} (p={p}, k={k}, v={v}): no rank can run its next action")
    return CompiledSchedule(p, *(array("i", c) for c in cols))


def compiled_schedule_reference(name: str, p: int, k: int, v: int = 1) -> CompiledSchedule:
    """``compiled_schedule`` written plainly (actions keyed by tuples, dependencies by
    ``_dependency_keys``): the reference the tests compare it with."""
    per_rank = [[(a.stage, a.microbatch, a.kind) for a in acts] for acts in build_schedule(name, p, k, v)]
    last = num_stages(p, v) - 1
    kind_ix = {kd: i for i, kd in enumerate(KINDS)}
    number: dict[_Key, int] = {}
    out = CompiledSchedule(p, *(array("i") for _ in range(6)))
    pcs = [0] * p
    total = sum(map(len, per_rank))
    while len(number) < total:
        ran = False
        for r, acts in enumerate(per_rank):
            while pcs[r] < len(acts):
                st, m, kd = acts[pcs[r]]
                ks = _dependency_keys(st, m, kd, last)
                got = [number.get(d, -1) for d in ks]
                if -1 in got:
                    break
                hops = [-1 if d[0] % p == r else 2 * min(d[0], st) + (kd != "F") for d in ks]
                got += [-1] * (2 - len(got))
                hops += [-1] * (2 - len(hops))
                for col, x in zip(
                    out[1:], (r, 4 * st + kind_ix[kd], got[0], hops[0], got[1], hops[1]), strict=True
                ):
                    col.append(x)
                number[(st, m, kd)] = len(number)
                pcs[r] += 1
                ran = True
        if not ran:
            merge(build_schedule(name, p, k, v), p, v)  # raises ScheduleDeadlock naming the waits
            raise ScheduleError(f"{name} (p={p}, k={k}, v={v}): no rank can run its next action")
    return out


class ScheduleTimes(NamedTuple):
    """A list-scheduled schedule's times (``schedule_times``)."""

    rank_end: list[float]  # per rank, when its last action ends
    slot_end: list[float]  # per slot (virtual stage × 4 + pass), when its last action ends (0: none)
    action_end: list[float]  # per action of the compiled schedule, in its numbering


def makespan(
    c: CompiledSchedule, durations: Sequence[Sequence[float]], transfers: Sequence[Sequence[float]]
) -> float:
    """The list-scheduled makespan of ``c``: the latest of ``schedule_times``' rank ends."""
    return max(schedule_times(c, durations, transfers).rank_end)


def schedule_times(
    c: CompiledSchedule, durations: Sequence[Sequence[float]], transfers: Sequence[Sequence[float]]
) -> ScheduleTimes:
    """``c`` list-scheduled: each rank runs its actions in order, an action starts when its
    rank is free and each dependency has ended, plus the transfer of the cut it crosses in its
    direction when it ran on another rank. ``durations[s][i]``: virtual stage ``s``'s pass
    ``KINDS[i]``; ``transfers[cut][0]`` the activation sent from virtual stage ``cut`` to
    ``cut + 1``, ``transfers[cut][1]`` its gradient sent back. A slot's actions run on one rank
    in its order, so the last numbered ends last."""
    dur = [float(x) for row in durations for x in (*row, *[0.0] * (4 - len(row)))]
    hop = [float(x) for pair in transfers for x in pair]
    free = [0.0] * c.p
    end = [0.0] * len(c.rank)
    slot_end = [0.0] * len(dur)
    for i, (r, sl, da, ha, db, hb) in enumerate(
        zip(c.rank, c.slot, c.dep_a, c.hop_a, c.dep_b, c.hop_b, strict=True)
    ):
        start = free[r]
        if da >= 0:
            t = end[da] if ha < 0 else end[da] + hop[ha]
            if t > start:
                start = t
            if db >= 0:
                t = end[db] if hb < 0 else end[db] + hop[hb]
                if t > start:
                    start = t
        end[i] = free[r] = slot_end[sl] = start + dur[sl]
    return ScheduleTimes(free, slot_end, end)
