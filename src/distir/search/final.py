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
their strings, the floats through JSON exactly; tested). What is read back is checked, field by
field, before anything uses it: a hand-edited or damaged row is a ``StoreError`` naming the file,
the search and the field (``check_result``, ``output_from_plain``), never a ``KeyError`` or
``TypeError`` later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

from distir.parallel.strategy import StrategyError, parse_strategy
from distir.search.rerank import RESULT_TYPES
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


_HINT = "(edited or damaged: search again with --fresh, or delete the store)"


def _is(value: object, types: tuple[type, ...]) -> bool:
    """``isinstance``, except that a bool is no int or float (JSON tells them apart)."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def estimates_from_plain(cols: object, where: str) -> list[Estimate]:
    """The estimates ``estimates_plain`` wrote; ``StoreError`` naming ``where`` if malformed."""
    try:
        if not isinstance(cols, dict):
            raise TypeError(f"a {type(cols).__name__}, not an object")
        strategies = [parse_strategy(s) for s in cols["strategy"]]
        columns = [cols[name] for name in _FIELDS]
        if any(not isinstance(c, list) or len(c) != len(strategies) for c in columns):
            raise StoreError(f"{where}: stored screen columns differ in length {_HINT}")
        for name, column in zip(_FIELDS, columns, strict=True):
            types = (bool,) if name == "fits" else (float, int)
            if not all(_is(v, types) for v in column):
                raise TypeError(f"column {name!r} holds a value that is not a {types[0].__name__}")
        return [Estimate(s, *row) for s, *row in zip(strategies, *columns, strict=True)]
    except (KeyError, TypeError, AttributeError, StrategyError) as exc:
        raise StoreError(f"{where}: stored screen estimates are malformed: {exc} {_HINT}") from exc


def check_result(row: object, where: str) -> dict[str, Any]:
    """``row``, a stored exact result, if it has every field of ``evaluate``'s results with its
    type (``RESULT_TYPES``) and a strategy that parses, or is an evaluation error
    (``{"error": str, ...}``); else ``StoreError`` naming ``where`` and the field."""
    if not isinstance(row, dict):
        raise StoreError(f"{where}: a {type(row).__name__}, not a result object {_HINT}")
    if "error" in row:
        if not isinstance(row["error"], str):
            raise StoreError(f"{where}: its 'error' is not a string {_HINT}")
        return row
    for name, types in RESULT_TYPES.items():
        if name not in row:
            raise StoreError(f"{where}: no field {name!r} {_HINT}")
        if not _is(row[name], types):
            raise StoreError(f"{where}: field {name!r} is {row[name]!r}, not a {types[0].__name__} {_HINT}")
    try:
        parse_strategy(row["strategy"])
    except StrategyError as exc:
        raise StoreError(f"{where}: field 'strategy': {exc} {_HINT}") from exc
    return row


class StoredOutput(NamedTuple):
    """A finished search's output as read back (``output_from_plain``)."""

    results: list[dict[str, Any]]
    screened: list[Estimate]
    n_screened: int
    timings: dict[str, float]
    profiles: int
    advice: list[str]


def output_from_plain(payload: dict[str, Any], where: str) -> StoredOutput:
    """The output ``_final_payload`` stored, every part checked; ``StoreError`` naming ``where``
    and the part if malformed."""
    parts = {"results": list, "screened": dict, "n_screened": int, "timings": dict, "profiles": int}
    for name, kind in parts.items():
        if name not in payload:
            raise StoreError(f"{where}: stored output has no {name!r} {_HINT}")
        if not _is(payload[name], (kind,)):
            raise StoreError(f"{where}: the stored output's {name!r} is not a {kind.__name__} {_HINT}")
    timings = payload["timings"]
    if not all(isinstance(k, str) and _is(v, (float, int)) for k, v in timings.items()):
        raise StoreError(f"{where}: the stored output's 'timings' are not numbers {_HINT}")
    advice = payload.get("advice", [])
    if not isinstance(advice, list) or not all(isinstance(line, str) for line in advice):
        raise StoreError(f"{where}: the stored output's 'advice' is not a list of strings {_HINT}")
    results = [check_result(r, f"{where}: stored result {i}") for i, r in enumerate(payload["results"])]
    return StoredOutput(
        results,
        estimates_from_plain(payload["screened"], where),
        payload["n_screened"],
        {k: float(v) for k, v in timings.items()},
        payload["profiles"],
        list(advice),
    )


def view_matches(payload: dict[str, Any], view: dict[str, Any]) -> bool:
    """Whether ``payload`` is a stored output of this format for the very same ``view``."""
    return payload.get("format") == FORMAT and payload.get("view") == view


__all__ = [
    "FORMAT",
    "StoredOutput",
    "check_result",
    "estimates_from_plain",
    "estimates_plain",
    "output_from_plain",
    "view_matches",
]
