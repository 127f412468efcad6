"""The memory events of a long flat entry as columns, and its peak per memory figure in bulk.

An untraced simulation only needs each GPU's peak, and memory does not depend on time: a GPU's
live bytes follow its own events in program order. So instead of a Python tuple of events per op
that the timing loop walks (``FnPlan.mem``), the entry of a long flat program keeps its events as
numpy columns in execution order, and the peak of each GPU is a prefix sum over its events.

Contract: ``peaks`` leaves ``live`` and ``peak`` bit-identical to what the timing loop computes
from the equivalent ``FnPlan.mem``: per op, first its probes (``live + bump`` against the peak),
then its allocations, then its frees, in the order that list holds them. ``np.cumsum`` adds
strictly left to right, subtracting ``b`` is adding ``-b`` and adding ``0.0`` changes nothing, so
each prefix is the very float of the loop's ``live[g] += b`` / ``live[g] -= b`` sequence.

Most ops allocate each of their GPUs' bytes in one piece, and then their probe on that GPU is the
live bytes right after that allocation (``live + b``): such a probe is not an event of its own,
the allocation is marked as a peak candidate instead. That drops a third of the events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from distir.sim.records import OpRecord

_chain = chain.from_iterable
Pairs = Sequence[tuple[int, float]]  # (gpu, bytes) per event
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_MASK_LIMIT = 16  # up to this many GPUs, select each GPU's events by a mask; beyond, sort once


@dataclass(frozen=True, slots=True)
class MemColumns:
    """Memory events in execution order. Per event: its GPU (memory figure), what it adds to the
    GPU's live bytes (an allocation's bytes, a free's negated bytes, 0 for a probe), whether
    the live bytes after it are a peak candidate, and what a candidate adds on top (a probe's
    bump; None when every candidate is an allocation)."""

    gpu: I64
    delta: F64
    check: npt.NDArray[np.bool_]
    extra: F64 | None


def _excl(counts: I64) -> I64:
    """Exclusive prefix sums: where each group starts."""
    out = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def _positions(base: I64, counts: I64) -> I64:
    """Where group ``i``'s ``counts[i]`` items go: ``base[i]``, ``base[i] + 1``, ..."""
    if int(counts.max(initial=0)) <= 1:  # the usual case: no group holds more than one
        return base[counts > 0]
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(base - _excl(counts), counts)


def _table(groups: Sequence[Pairs]) -> tuple[I64, I64, I64, F64]:
    """A small table of pair groups as columns: sizes, starts, GPUs and bytes."""
    sizes = np.fromiter(map(len, groups), np.int64, len(groups))
    flat = np.fromiter(_chain(_chain(groups)), np.float64, 2 * int(sizes.sum())).reshape(-1, 2)
    return sizes, _excl(sizes), flat[:, 0].astype(np.int64), flat[:, 1]


def _expand(table: Sequence[Pairs], which: I64) -> tuple[I64, I64, F64]:
    """The pairs of ``table[which[0]]``, ``table[which[1]]``, ... as a GPU and a bytes column,
    with the number of pairs of each (a long body repeats a few records: the table is small)."""
    sizes, starts, g, b = _table(table)
    counts = sizes[which]
    at = _positions(starts[which], counts)
    return counts, g[at], b[at]


def _one_per_gpu(allocs: Pairs, bump: Pairs) -> bool:
    """Whether an op's probe on each GPU is the live bytes right after its allocation there."""
    return len({g for g, _ in allocs}) == len(allocs) and sorted(allocs) == sorted(bump)


def build_columns(
    kinds: Sequence[int],
    table: Sequence[OpRecord],
    bump_at: Mapping[int, Pairs],
    outs_per_op: Sequence[int] | None,
    fresh: Sequence[bool] | None,
    ends: I64,
    before: Sequence[tuple[int, Pairs]] = (),
) -> MemColumns:
    """The columns of a body of ``n = len(kinds)`` ops whose op ``i`` has record
    ``table[kinds[i]]``: it probes that record's bump (``bump_at[i]`` instead where given) and
    allocates its allocations. Result ``r`` (in program order; ``outs_per_op`` results per op,
    one each when None) holds the bytes its record gives it and, unless ``fresh[r]`` is False (a
    view), is freed after op ``ends[r]`` (never when ``ends[r] >= n``: it outlives the body).
    ``before``: storage owned from the start (donated parameters: after which op each is freed,
    and its bytes), freed after that op before any result. As in ``FnPlan.mem``, an op that
    neither allocates nor frees probes nothing, and the frees after one op come in that order."""
    n = len(kinds)
    kind = np.fromiter(kinds, np.int64, n)
    # frees: the table entry of each result (record, result index), grouped by the op they follow
    per_kind = np.fromiter((len(rec.out_bytes) for rec in table), np.int64, len(table))
    if outs_per_op is None:
        which = _excl(per_kind)[kind]
    else:
        outs = np.array(outs_per_op, dtype=np.int64)
        op_of = np.repeat(np.arange(n, dtype=np.int64), outs)
        which = _excl(per_kind)[kind][op_of] + np.arange(len(op_of), dtype=np.int64) - _excl(outs)[op_of]
    free_at = ends
    keep = free_at < n
    if fresh is not None:
        keep &= np.fromiter(fresh, np.bool_, len(fresh))
    per_result, fg, fb = _expand([x for rec in table for x in rec.out_bytes], which[keep])
    free_at = np.repeat(free_at[keep], per_result)
    early = [(at, pairs) for at, pairs in before if at < n]
    if early:
        pg0, pb0 = _table([p for _, p in early])[2:]
        pat = np.repeat(
            np.fromiter((at for at, _ in early), np.int64, len(early)), [len(p) for _, p in early]
        )
        free_at, fg, fb = np.concatenate([pat, free_at]), np.concatenate([pg0, fg]), np.concatenate([pb0, fb])
    order = np.argsort(free_at, kind="stable")  # the results' order within an op
    free_at, fg, fb = free_at[order], fg[order], fb[order]
    cf = np.bincount(free_at, minlength=n).astype(np.int64)
    # allocations; an op's probes fold into them unless its bump is its own (or overridden)
    ca, ag, ab = _expand([rec.allocs for rec in table], kind)
    folds = np.fromiter((_one_per_gpu(rec.allocs, rec.bump) for rec in table), np.bool_, len(table))[kind]
    bumps: list[Pairs] = [rec.bump for rec in table]
    bump_kind = kind
    if bump_at:
        bump_kind = kind.copy()
        for i, bump in bump_at.items():
            bump_kind[i] = len(bumps)
            bumps.append(bump)
            folds[i] = False
    probing = ((ca > 0) | (cf > 0)) & ~folds
    sizes, starts, bg, bb = _table(bumps)
    cp = np.where(probing, sizes[bump_kind], 0)
    at = _positions(starts[bump_kind], cp)
    pg, pb = bg[at], bb[at]
    start = _excl(cp + ca + cf)
    size = len(pg) + len(ag) + len(fg)
    gpu = np.empty(size, np.int64)
    delta = np.empty(size, np.float64)
    check = np.zeros(size, np.bool_)
    extra = None
    if len(pg):
        extra = np.zeros(size, np.float64)
        at = _positions(start, cp)
        gpu[at], delta[at], check[at], extra[at] = pg, 0.0, True, pb
    at = _positions(start + cp, ca)
    gpu[at], delta[at], check[at] = ag, ab, np.repeat(folds, ca)
    # frees are sorted by op: each goes after its op's probes and allocations, in that order
    at = (start + cp + ca)[free_at] + np.arange(len(free_at), dtype=np.int64) - _excl(cf)[free_at]
    gpu[at], delta[at] = fg, -fb
    return MemColumns(gpu, delta, check, extra)


def peaks(cols: MemColumns, live: list[float], peak: list[float]) -> None:
    """Run the events: ``live[g]`` ends at GPU ``g``'s live bytes after the body and ``peak[g]``
    at the largest of its start value and every candidate."""
    if not len(cols.gpu):
        return
    gpus = np.flatnonzero(np.bincount(cols.gpu))
    if len(gpus) <= _MASK_LIMIT:
        groups = ((int(g), np.flatnonzero(cols.gpu == g)) for g in gpus)
    else:
        order = np.argsort(cols.gpu, kind="stable")
        bounds = [*np.searchsorted(cols.gpu[order], gpus, side="left").tolist(), len(order)]
        groups = ((int(g), order[bounds[j] : bounds[j + 1]]) for j, g in enumerate(gpus))
    for g, at in groups:
        steps = np.empty(len(at) + 1, np.float64)
        steps[0] = live[g]
        steps[1:] = cols.delta[at]
        running = np.cumsum(steps)[1:]  # live bytes after each event
        check = cols.check[at]
        cand = running[check] if cols.extra is None else running[check] + cols.extra[at][check]
        if len(cand):
            top = float(cand.max())
            if top > peak[g]:
                peak[g] = top
        live[g] = float(running[-1])
