"""Automatic sharding by search (Automap): decision points (``points``), states with memoized
propagation (``state``), the analytic and simulated judges (``judge``, ``layout``), Monte Carlo
tree search (``mcts``), the search itself and its plug into ``distribute`` (``search``), and the
``distir shard --auto`` command (``command``)."""

from distir.search.automap.mcts import Budget
from distir.search.automap.search import AutomapResult, automap, with_layout

__all__ = ["AutomapResult", "Budget", "automap", "with_layout"]
