"""Which tensor-parallel degrees split a transformer into whole heads, query groups and FFN columns.

Megatron-Core divides the attention heads, the query groups (the KV heads under GQA) and the FFN's
columns by the tensor-parallel size (``megatron/core/utils.py``'s ``divide`` asserts on each), and
torchtitan's attention views a rank's columns as ``n_heads // tp`` heads: a degree that leaves a
remainder stops them at startup. The IR itself can lay such a split out unevenly, but no trainer
runs it, so ``simulate``, the search and ``export`` refuse it with this one rule
(``split_refusal``), on the sizes a model string's shape declares (``tp_sizes``). The vocabulary
is not among them: Megatron-LM pads it to a multiple of 128·t.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol


class _Shape(Protocol):
    """A transformer's sizes (``distir.export.shape.ModelShape``)."""

    @property
    def heads(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def ffn(self) -> int: ...


def tp_sizes(shape: _Shape, ffn: bool = True) -> dict[str, int]:
    """The sizes a tensor-parallel degree must divide: ``heads``, ``kv_heads`` (under GQA: fewer
    than the heads) and (``ffn``) the FFN's columns."""
    sizes = {"heads": shape.heads}
    if shape.kv_heads != shape.heads:
        sizes["kv_heads"] = shape.kv_heads
    if ffn:
        sizes["ffn"] = shape.ffn
    return sizes


def dividing_degrees(sizes: Mapping[str, int]) -> list[int]:
    """Every tensor-parallel degree that divides all of ``sizes``, ascending."""
    g = math.gcd(*sizes.values())
    small = [d for d in range(1, math.isqrt(g) + 1) if g % d == 0]
    return sorted({*small, *(g // d for d in small)})


def split_refusal(sizes: Mapping[str, int], t: int) -> str:
    """Why degree ``t`` splits one of ``sizes`` (a head, a query group, an FFN column) across
    ranks, naming the sizes it does not divide and the degrees that divide them all; "" when it
    splits none."""
    split = [f"{name}={n}" for name, n in sizes.items() if n % t]
    if t == 1 or not split:
        return ""
    names = {"heads": "attention heads", "kv_heads": "query groups", "ffn": "FFN columns"}
    parts = [names.get(k, k) for k in sizes]
    what = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return (
        f"t={t} does not divide {', '.join(split)}: tensor parallelism gives each rank whole {what} "
        f"(t dividing them all: {', '.join(map(str, dividing_degrees(sizes)))})"
    )


__all__ = ["dividing_degrees", "split_refusal", "tp_sizes"]
