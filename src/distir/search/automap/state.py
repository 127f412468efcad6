"""Actions, states and memoized propagation along the searched axis.

A **state** is a set of decisions: (decision point, placement along the searched axis). Its
**outcome** is what sharding propagation (``distir.parallel.propagate.place``) makes of it on the
searched axis alone (axes propagate independently): every decided parameter annotated and
pinned (used where it lies, as tensor parallelism uses its weights), each updated parameter's
result tied to it, the rest inferred — what the fixed point cannot place is replicated. The
decision points propagation left open are the state's worklist; those it placed are moot and
never offered. The fixed point fills a value from the first strategy consistent with what is known
even when others are too, so a point it leaves replicated stays open: only a point propagation
shards is settled by it. Outcomes are memoized per decision set: search trees meet them again and again.

An **action** decides the first open point (points are ordered by bytes, so each decision set is
reached by one sequence of actions), or infers the rest (``INFER``): the state is final, its
open points replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from distir.ir.dtensor import Mesh, Placement, Replicate
from distir.parallel.propagate import Placed, place
from distir.search.automap.points import Problem


class Action(NamedTuple):
    """Decide ``point`` (an index into ``Problem.points``) as ``placement``; ``INFER`` (point
    -1) infers every open point from what is decided."""

    point: int
    placement: Placement | None


INFER = Action(-1, None)

Decisions = tuple[tuple[int, Placement], ...]  # sorted by point


@dataclass(frozen=True)
class Outcome:
    """A state's propagation on the searched axis: ``placed`` (one placement per value: the
    searched axis), and the open decision points, in order."""

    decisions: Decisions
    placed: Placed
    open: tuple[int, ...]


def _replicated(places: list[Placement]) -> bool:
    return all(type(p) is Replicate for p in places)


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
        params: dict[int, tuple[Placement, ...]] = {}
        for i, places in pr.fixed.items():
            if places[ax] is not None:
                params[i] = (places[ax],)
        for k, pl in decisions:
            for i in pr.points[k].params:
                params[i] = (pl,)
        results: dict[int, tuple[Placement, ...]] = {r: (Replicate(),) for r in pr.whole_results}
        results.update({r: params[i] for r, i in pr.pairs.items() if i in params})
        self.propagations += 1
        notes = {name: (pl[ax],) for name, pl in pr.pins.items()}
        got = place(pr.plan, self.mesh, notes, params, results, replicate_results=False, pinned=tuple(params))
        fn = pr.fn
        decided = {k for k, _ in decisions}
        open_points = tuple(
            k
            for k, pt in enumerate(pr.points)
            if k not in decided
            and any(fn.params[i] in got.guessed or _replicated(got.placed[fn.params[i]]) for i in pt.params)
        )
        return Outcome(decisions, got, open_points)

    def actions(self, state: Outcome) -> list[Action]:
        """``INFER``, then every placement of the first open point (none when nothing is open)."""
        if not state.open:
            return []
        k = state.open[0]
        return [INFER, *(Action(k, p) for p in self.problem.points[k].options(self.problem.size))]
