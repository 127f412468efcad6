"""A finished search's output as stored data (``ResultStore.put_final``) and back.

A rerun of a finished search re-renders from the store without screening or simulating anything.
The store's key (``SearchRequest.key_parts``) names what determines every figure — model,
cluster, batch, options — but not the *view*: which strategies the space held (``--tp 8``,
``--schedule 1f1b`` ...), how many were re-ranked exactly (``--top``), whether the best pure
ones were (``--explain``) and how placements were annealed. The stored output keeps its view,
and only a request with the same view reuses it (``view_matches``); any other request screens
again (exact results already in the store are still reused, ``ResultStore.done``) and replaces
the stored output with its own.

Contract: ``estimates_from_plain(estimates_plain(es)) == es`` (the strategies round-trip through
their strings, the floats through JSON exactly; tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from distir.parallel.strategy import StrategyError, parse_strategy
from distir.search.screen import Estimate
from distir.search.store import StoreError

FORMAT = 1  # of the stored payload; a payload of another format is ignored (searched again)
_FIELDS = tuple(f.name for f in dataclasses.fields(Estimate) if f.name != "strategy")


def estimates_plain(estimates: Sequence[Estimate]) -> dict[str, Any]:
    """Column-wise (a few hundred KB for thousands of strategies, not one object each)."""
    cols: dict[str, Any] = {"strategy": [str(e.strategy) for e in estimates]}
    for name in _FIELDS:
        cols[name] = [getattr(e, name) for e in estimates]
    return cols


def estimates_from_plain(cols: dict[str, Any], where: str) -> list[Estimate]:
    """The estimates ``estimates_plain`` wrote; ``StoreError`` naming ``where`` if malformed."""
    try:
        strategies = [parse_strategy(s) for s in cols["strategy"]]
        columns = [cols[name] for name in _FIELDS]
        if any(len(c) != len(strategies) for c in columns):
            raise StoreError(f"{where}: stored screen columns differ in length")
        return [Estimate(s, *row) for s, *row in zip(strategies, *columns, strict=True)]
    except (KeyError, TypeError, StrategyError) as exc:
        raise StoreError(f"{where}: stored screen estimates are malformed: {exc}") from exc


def view_matches(payload: dict[str, Any], view: dict[str, Any]) -> bool:
    """Whether ``payload`` is a stored output of this format for the very same ``view``."""
    return payload.get("format") == FORMAT and payload.get("view") == view


__all__ = ["FORMAT", "estimates_from_plain", "estimates_plain", "view_matches"]
