"""Actions, states and memoized propagation along the searched axis.

A **state** is a set of decisions: (decision point, placement along the searched axis). Its
**outcome** is what sharding propagation (``distir.parallel.sharding.propagate.place``) makes of it on the
searched axis alone (axes propagate independently): every decided parameter annotated and
pinned (used where it lies, as tensor parallelism uses its weights), each updated parameter's
result tied to it, the rest inferred — what the fixed point cannot place is replicated. The
decision points propagation left open are the state's worklist; those it placed are moot and
never offered. Which points propagation settles is decided by Automap's conservative
propagation (``settle``: a value is placed only when every consistent strategy agrees), not by
``place``'s fixed point, which fills a value from the first consistent strategy even when
others are too; settled points are then annotated as if decided. Outcomes are memoized per
decision set: search trees meet them again and again.

An **action** decides the first open point (points are ordered by bytes, so each decision set is
reached by one sequence of actions), or infers the rest (``INFER``): the state is final, its
open points replicated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from distir.ir.dtensor import Mesh, Partial, Placement, Replicate, Shard
from distir.ir.values import Value
from distir.parallel.sharding.propagate import Placed, Plan, place
from distir.search.automap.points import Problem


class Action(NamedTuple):
    """Decide ``point`` (an index into ``Problem.points``) as ``placement``; ``INFER`` (point
    -1) infers every open point from what is decided."""

    point: int
    placement: Placement | None


INFER = Action(-1, None)
_R = Replicate()

Decisions = tuple[tuple[int, Placement], ...]  # sorted by point


@dataclass(frozen=True)
class Outcome:
    """A state's propagation on the searched axis: ``placed`` (one placement per value: the
    searched axis), and the open decision points, in order."""

    decisions: Decisions
    placed: Placed
    open: tuple[int, ...]


def settle(plan: Plan, n: int, known: Mapping[Value, Placement]) -> dict[Value, Placement]:
    """Automap's conservative propagation of tiling along one axis of ``n`` devices: from the
    ``known`` shards and pending sums, a value is placed only when every strategy of an op
    consistent with what is known (never guessing a parameter to be a pending sum) gives it the
    same shard or sum; to a fixed point (a worklist of the ops around each newly placed value).
    Replication constrains nothing (as PartIR's untiled values): a replicated value may always
    be redistributed, so it is neither a premise nor a conclusion."""
    placed: dict[Value, Placement] = {v: p for v, p in known.items() if not isinstance(p, Replicate)}
    tensors = set(plan.tensors)
    fills = plan.fill(n)
    users: dict[Value, list[int]] = {}
    for j, vals in enumerate(plan.vals):
        for v in vals:
            users.setdefault(v, []).append(j)
    todo = sorted({j for v in known for j in users.get(v, ())})
    queued = set(todo)
    while todo:
        j = todo.pop()
        queued.discard(j)
        vals = plan.vals[j]
        cur = [placed.get(v) if v in tensors else None for v in vals]
        if all(c is None for c in cur) or None not in cur:
            continue
        is_param = plan.is_param[j]
        rows = [
            row
            for row in fills[j]
            if all(
                (c is None and not (param and isinstance(p, Partial))) or c == p
                for c, p, param in zip(cur, row, is_param, strict=True)
            )
        ]
        if not rows:
            continue
        for i, (v, c) in enumerate(zip(vals, cur, strict=True)):
            if (
                c is None
                and v in tensors
                and type(rows[0][i]) is not Replicate
                and all(row[i] == rows[0][i] for row in rows)
            ):
                placed[v] = rows[0][i]
                for u in users[v]:
                    if u not in queued:
                        queued.add(u)
                        todo.append(u)
    return placed


class Propagator:
    """Outcomes of decision sets on one problem, memoized (module docstring)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        name, n = problem.mesh.axes[problem.axis]
        self.mesh = Mesh(((name, n),), problem.mesh.devices[:n])
        self._memo: dict[Decisions, Outcome] = {}
        self.propagations = 0

    def outcome(self, decisions: Decisions) -> Outcome:
        got = self._memo.get(decisions)
        if got is None:
            got = self._memo[decisions] = self._propagate(decisions)
        return got

    def after(self, state: Outcome, action: Action) -> Outcome:
        """The outcome of ``state`` then ``action`` (``INFER``: the state itself)."""
        if action.point < 0:
            return state
        assert action.placement is not None
        return self.outcome(tuple(sorted((*state.decisions, (action.point, action.placement)))))

    def _propagate(self, decisions: Decisions) -> Outcome:
        pr = self.problem
        ax = pr.axis
        fn = pr.fn
        params: dict[int, tuple[Placement, ...]] = {}
        for i, places in pr.fixed.items():
            p = places[ax]
            if p is not None:
                params[i] = (p,)
        for k, pl in decisions:
            for i in pr.points[k].params:
                params[i] = (pl,)
        known = {fn.params[i]: pl[0] for i, pl in params.items()}
        by_name = pr.plan.by_name()
        known.update({by_name[name]: pl[ax] for name, pl in pr.pins.items()})
        settled = settle(pr.plan, pr.size, known)
        decided = {k for k, _ in decisions}
        open_points = []
        for k, pt in enumerate(pr.points):
            if k in decided:
                continue
            if all(
                fn.params[i] in settled and not self._clashes(i, settled[fn.params[i]]) for i in pt.params
            ):
                for i in pt.params:  # settled by propagation: annotated as if decided
                    params[i] = (settled[fn.params[i]],)
            else:
                open_points.append(k)
        results: dict[int, tuple[Placement, ...]] = {r: (Replicate(),) for r in pr.whole_results}
        results.update({r: params[i] for r, i in pr.pairs.items() if i in params})
        self.propagations += 1
        notes = {name: (pl[ax],) for name, pl in pr.pins.items()}
        got = place(pr.plan, self.mesh, notes, params, results, replicate_results=False, pinned=tuple(params))
        return Outcome(decisions, got, tuple(open_points))

    def _clashes(self, i: int, p: Placement) -> bool:
        """Whether parameter ``i`` placed ``p`` on the searched axis shards a dim another axis
        shards."""
        pr = self.problem
        return isinstance(p, Shard) and any(q == p for b, q in enumerate(pr.fixed[i]) if b != pr.axis)

    def actions(self, state: Outcome) -> list[Action]:
        """``INFER``, then every placement of the first open point (none when nothing is open)
        but shards of a dim another axis shards."""
        if not state.open:
            return []
        pr = self.problem
        k = state.open[0]
        pt = pr.points[k]
        # a dim another axis shards is not offered (one dim along two axes: nested only where
        # the annotations nest one, which Automap's decisions do not)
        taken = {
            p for i in pt.params for b, p in enumerate(pr.fixed[i]) if b != pr.axis and isinstance(p, Shard)
        }
        return [INFER, *(Action(k, p) for p in pt.options(pr.size) if p not in taken)]
