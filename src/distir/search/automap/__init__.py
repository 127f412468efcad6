"""Automatic sharding by search (Automap): the placements along one mesh axis, for any program.

Decision points and grouping of repeated layers (``points``); actions, states, conservative
propagation and memoized outcomes (``state``); the analytic judge of programs (``judge``); the
found layout as a program, its collectives per layer and its simulation (``layout``); Monte
Carlo tree search (``mcts``); the search on a program and its plug into ``distribute``
(``search``); zoo models, judged as ``distribute`` runs them, with the hand layout to compare
(``model``); ``distir shard --auto`` and ``simulate --tp-layout auto`` (``command``)."""

from distir.search.automap.mcts import Budget
from distir.search.automap.search import AutomapResult, automap, with_layout

__all__ = ["AutomapResult", "Budget", "automap", "with_layout"]
