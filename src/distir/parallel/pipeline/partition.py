"""The stage partition: a model's layer calls as consecutive ranges, one per pipeline chunk.

The strategy's partition counts the model's repeated blocks (Megatron's ``--num-layers`` split:
uniform, by parameters, or explicit ``L…`` counts); the layer calls around them (``Ends``: the
embedding before, head and loss after) join the first and last chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from distir.frontends.zoo.model import Model
from distir.parallel.strategy import Strategy, StrategyError


class Ends(NamedTuple):
    """The layer calls around a model's repeated blocks: ``pre`` ones (the embedding) go with the
    first pipeline chunk, ``post`` ones (head, loss) with the last."""

    pre: int
    post: int


def ends(model: Model, n_layers: int) -> Ends:
    """``model``'s ends among its first ``n_layers`` calls (inference leaves the loss out)."""
    post = max(model.post - (len(model.layers) - n_layers), 0)
    return Ends(min(model.pre, n_layers - post), post)


def call_counts(blocks: Sequence[int], e: Ends) -> tuple[int, ...]:
    """Layer calls per chunk from blocks per chunk: the ends join the first and last chunk."""
    counts = list(blocks)
    counts[0] += e.pre
    counts[-1] += e.post
    return tuple(counts)


def block_counts(calls: Sequence[int], e: Ends) -> tuple[int, ...] | None:
    """Blocks per chunk from layer calls per chunk, or None when a chunk boundary would split
    the ends (the embedding away from the first chunk, head or loss away from the last)."""
    counts = list(calls)
    counts[0] -= e.pre
    counts[-1] -= e.post
    return None if counts[0] < 0 or counts[-1] < 0 else tuple(counts)


def partition(model: Model, strategy: Strategy, n_layers: int) -> list[range]:
    """Consecutive layer-call ranges, one per chunk (p·v of them): the strategy's partition
    counts the model's repeated blocks (Megatron's ``--num-layers`` split: uniform, by
    parameters, or explicit ``L…`` counts); the embedding joins the first chunk and the head and
    loss the last (``Model.pre``/``post``), so an explicit partition may give those two
    chunks no block at all, as the trainers allow."""
    e = ends(model, n_layers)
    n, n_blocks = strategy.chunks, n_layers - e.pre - e.post
    if isinstance(strategy.partition, tuple):
        counts = strategy.partition
        if sum(counts) != n_blocks:
            raise StrategyError(
                f"partition {'-'.join(map(str, counts))} covers {sum(counts)} blocks, not {n_blocks}"
            )
        for c, x in enumerate(counts):
            if x == 0 and not (c == 0 and e.pre) and not (c == n - 1 and e.post):
                raise StrategyError(
                    f"partition {'-'.join(map(str, counts))}: chunk {c} would hold no layer (only the "
                    "first chunk, with the embedding, and the last, with the head, may hold 0 blocks)"
                )
    elif n > n_blocks:
        raise StrategyError(f"{strategy}: {n} pipeline chunks but the model has only {n_blocks} blocks")
    elif strategy.partition == "uniform":
        counts = uniform_counts(n_blocks, n)
    else:  # balance parameters greedily: cut when the running share passes the next quota
        sizes = []
        weights = {v for v in model.forward.params[len(model.inputs) :]}
        for call in model.layers[e.pre : e.pre + n_blocks]:
            sizes.append(sum(model.weight(v.name).type.numel for v in call.inputs if v in weights) + 1)
        counts = tuple(_balanced(sizes, n))
    out, start = [], 0
    for c in call_counts(counts, e):
        out.append(range(start, start + c))
        start += c
    return out


def chunk_blocks(model: Model, strategy: Strategy) -> tuple[int, ...]:
    """The repeated blocks of every chunk (``partition`` counted in blocks: the embedding, head
    and loss not counted)."""
    n = len(model.layers)
    counts = block_counts([len(r) for r in partition(model, strategy, n)], ends(model, n))
    assert counts is not None  # partition keeps the ends on the first and last chunks
    return counts


def uniform_counts(n_layers: int, chunks: int) -> tuple[int, ...]:
    """The uniform partition: layers per chunk, the first ``n_layers mod chunks`` one more."""
    q, r = divmod(n_layers, chunks)
    return tuple(q + (1 if i < r else 0) for i in range(chunks))


def _balanced(sizes: Sequence[int], n: int) -> list[int]:
    total = sum(sizes)
    counts: list[int] = []
    acc, start = 0, 0
    for i, s in enumerate(sizes):
        acc += s
        left_layers = len(sizes) - i - 1
        left_chunks = n - len(counts) - 1
        if left_chunks == 0:
            continue
        if acc >= total * (len(counts) + 1) / n or left_layers == left_chunks:
            counts.append(i + 1 - start)
            start = i + 1
    counts.append(len(sizes) - start)
    return counts
