"""Monte Carlo tree search (UCT) over decision sequences.

A node is a state (``distir.search.automap.state``); its children are the actions on its first
open decision point, tried in an order drawn from the seeded generator. An episode descends by
UCB1 (mean reward + ``C·sqrt(ln N / n)``) through fully expanded nodes, expands one untried
action, and scores the new state by inferring the rest from it — one memoized propagation and
the judge, the rollout Automap's "infer the rest" tactic makes cheap. The search optimizes (one
player, deterministic costs), so a node is worth the best cost met below it (max-backup, not
the mean): UCB1 reads the least cost met anywhere over that, a reward in (0, 1], 1 on the path
to the best layout so far. Subtrees with nothing left to try are closed, and
the search ends when the root is (every state visited), or when the budget is spent: episodes,
or seconds. For a given seed and an episode budget it is deterministic.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from distir.search.automap.judge import Cost
from distir.search.automap.state import Action, Outcome, Propagator

EXPLORE = 0.2  # UCB1's exploration constant (rewards in (0, 1])


@dataclass(frozen=True, slots=True)
class Budget:
    """Stop after ``episodes`` episodes or ``seconds`` seconds, whichever comes first (None: no
    such limit; at least one must be set)."""

    episodes: int | None = 200
    seconds: float | None = None

    def spent(self, episodes: int, elapsed: float) -> bool:
        return (self.episodes is not None and episodes >= self.episodes) or (
            self.seconds is not None and elapsed >= self.seconds
        )


@dataclass
class Node:
    state: Outcome
    cost: Cost
    terminal: bool
    untried: list[Action]
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    best: float = math.inf  # the least cost (seconds) met below
    closed: bool = False


class Scored(dict[tuple[object, ...], tuple[Cost, Outcome, int, float]]):
    """Every distinct state scored: decisions -> (cost, outcome, episode and seconds when first
    met)."""


@dataclass
class Tree:
    """The search (module docstring): ``run`` it, then read ``scored``."""

    propagator: Propagator
    judge: Callable[[Outcome], Cost]
    rng: random.Random
    scored: Scored = field(default_factory=Scored)
    episodes: int = 0
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.root = self._node(self.propagator.outcome(()), terminal=False)
        self.lo = self.root.cost.seconds  # the least cost met

    def _node(self, state: Outcome, terminal: bool) -> Node:
        cost = self._score(state)
        untried = [] if terminal else self.propagator.actions(state)
        self.rng.shuffle(untried)
        return Node(state, cost, terminal or not untried, untried)

    def _score(self, state: Outcome) -> Cost:
        got = self.scored.get(state.decisions)
        if got is None:
            cost = self.judge(state)
            got = (cost, state, self.episodes, time.perf_counter() - self.started)
            self.scored[state.decisions] = got
        return got[0]

    def run(self, budget: Budget) -> None:
        while not self.root.closed and not budget.spent(self.episodes, time.perf_counter() - self.started):
            self.episode()

    def episode(self) -> None:
        node = self.root
        path = [node]
        lo = self.lo
        while not node.terminal and not node.untried:
            parent = node
            node = max(
                (c for c in parent.children if not c.closed),
                key=lambda c: (
                    (lo / c.best if c.best > 0 else 1.0)
                    + EXPLORE * math.sqrt(math.log(parent.visits + 1) / (c.visits + 1))
                ),
            )
            path.append(node)
        if node.untried:
            action = node.untried.pop()
            child = self._node(self.propagator.after(node.state, action), terminal=action.point < 0)
            node.children.append(child)
            path.append(child)
            node = child
        c = node.cost.seconds
        self.lo = min(self.lo, c)
        for n in path:
            n.visits += 1
            n.best = min(n.best, c)
        for n in reversed(path):  # close what has nothing left to try
            n.closed = n.terminal or (not n.untried and all(c.closed for c in n.children))
        self.episodes += 1
