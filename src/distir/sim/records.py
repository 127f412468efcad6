"""The planner's data: op records, call summaries and plans (see ``distir.sim.plan``).

A ``CallSummary`` also precomputes, once per summary, what every call site of it needs in bulk
(``read_pos``/``read_last``: the parameters the body reads, by last use; ``own_ks``: the fresh
buffer of each result when every result is a buffer of its own) — a pipeline chunk call passes
hundreds of arguments and returns hundreds of results, and its call sites repeat per microbatch.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import Any, NamedTuple

from distir.interp.shapes import Mixed
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ir.values import Value
from distir.ops.registry import CommPattern
from distir.sim.memcols import MemColumns

NEG_INF = float("-inf")


def picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function taking the items at ``positions`` of a sequence, as a tuple (C-level for 2+)."""
    if len(positions) >= 2:
        return itemgetter(*positions)
    if len(positions) == 1:
        j = positions[0]
        return lambda xs: (xs[j],)
    return lambda xs: ()


# a storage root: a value (a parameter or an op's fresh result) or a call's fresh buffer, named
# by (the call's index in the body, the buffer's index in the callee's summary)
Root = Value | tuple[int, int]


@dataclass(slots=True)
class CallSummary:
    name: str
    slots: tuple[int, ...]
    delay: list[list[float]]  # [u][v] over positions in ``slots``
    first: list[list[float]]  # [u][v]: when v's first op starts, relative to u's clock at entry
    busy: list[float]  # compute seconds per position in ``slots``
    comm: list[float]  # communication seconds per position
    flops: float
    peak_extra: dict[int, float]  # gpu -> bytes above the caller's live set at the call
    # per result, the storage it uses: j >= 0 is parameter j, -1-k is the body's fresh buffer k
    out_roots: tuple[tuple[int, ...], ...]
    # per fresh buffer returned: its bytes per GPU and its last use inside the body (its position
    # in the body's inlined op order: a nested call's ops count one each; -1: none)
    fresh: tuple[tuple[tuple[tuple[int, float], ...], int], ...]
    n_ops: int
    # memory profile: per GPU, (position of an op in the body's inlined order, owned live bytes at
    # its probe), in order; a nested call's ops each have their point
    profile: dict[int, list[tuple[int, float]]]
    # per parameter: its last use in the body (a position in its inlined op order), not counting
    # the return (-1: none)
    param_last: tuple[int, ...]
    # the body's plan, kept for a detailed trace (``PlanOptions(keep_bodies=True)``), and the
    # renaming of its clocks onto this summary's (None: the same clocks; a summary carried to
    # another mesh runs the body planned on the first: ``distir.sim.tracedetail``)
    body: FnPlan | None = field(default=None, repr=False, compare=False)
    body_clocks: dict[int, int] | None = field(default=None, repr=False, compare=False)
    _extra_memo: dict[Any, tuple[dict[int, list[tuple[int, float]]], tuple[tuple[int, float], ...]]] = field(
        default_factory=dict, repr=False
    )
    # the parameters the body reads (param_last >= 0), ordered by last use (ties by position),
    # and those last uses: a call site maps each root passed to its last use inside with one
    # ``dict(zip(...))`` (a later, larger last use overwrites an earlier one)
    read_pos: tuple[int, ...] = field(init=False, repr=False)
    read_last: tuple[int, ...] = field(init=False, repr=False)
    pick_read: Callable[[Sequence[Any]], tuple[Any, ...]] = field(init=False, repr=False)
    # when every result is one parameter or one fresh buffer: the first result that is each
    # buffer (positions, a picker, buffer indices, bytes per GPU of each, all their allocations
    # in result order), the aliases (result position, parameter) and the results that are a
    # buffer an earlier result is (result position, that result's position); else None
    own_ks: tuple[int, ...] | None = field(init=False, repr=False)
    pick_own: Callable[[Sequence[Any]], tuple[Any, ...]] = field(init=False, repr=False)
    own_bytes: tuple[tuple[tuple[int, float], ...], ...] = field(init=False, repr=False)
    own_allocs: tuple[tuple[int, float], ...] = field(init=False, repr=False)
    aliases: tuple[tuple[int, int], ...] = field(init=False, repr=False)
    repeats: tuple[tuple[int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        read = sorted((pl, j) for j, pl in enumerate(self.param_last) if pl >= 0)
        self.read_pos = tuple(j for _, j in read)
        self.read_last = tuple(pl for pl, _ in read)
        self.pick_read = picker(self.read_pos)
        pos = [o for o, refs in enumerate(self.out_roots) if len(refs) == 1 and refs[0] < 0]
        aliases = tuple(
            (o, refs[0]) for o, refs in enumerate(self.out_roots) if len(refs) == 1 and refs[0] >= 0
        )
        first_of: dict[int, int] = {}  # buffer -> the first result that is it
        for o in pos:
            first_of.setdefault(-1 - self.out_roots[o][0], o)
        own = sorted(first_of.values())
        self.repeats = ()
        if len(pos) + len(aliases) == len(self.out_roots):
            ks = tuple(-1 - self.out_roots[o][0] for o in own)
            self.own_ks = ks
            self.own_bytes = tuple(self.fresh[k][0] for k in ks)
            self.own_allocs = tuple(x for b in self.own_bytes for x in b)
            self.aliases = aliases
            if len(own) < len(pos):
                firsts = ((o, first_of[-1 - self.out_roots[o][0]]) for o in pos)
                self.repeats = tuple((o, f) for o, f in firsts if f != o)
        else:
            self.own_ks = None
            self.own_bytes = ()
            self.own_allocs = ()
            self.aliases = ()
        self.pick_own = picker(own)

    def extra_with_dying(
        self,
        dying: list[tuple[int, int, float]],
        dead: list[tuple[int, int, float]] = (),  # type: ignore[assignment]
    ) -> tuple[tuple[int, float], ...]:
        """Peak bumps per GPU above a caller live set that includes the ``dying`` arguments
        (``(last use inside the body, gpu, bytes)``, freed after the call), for a call whose
        returned fresh buffers ``dead`` (same form) the caller never uses: while the body runs an
        argument counts until its last use inside and a dead result from its last use inside on
        no more — exactly as if the call were inlined (last uses are positions in the body's
        inlined op order, as ``profile``'s)."""
        if not dying and not dead:
            return tuple(self.peak_extra.items())
        return self._with_dying(dying, dead)[1]

    def profile_with_dying(
        self, dying: list[tuple[int, int, float]], dead: list[tuple[int, int, float]]
    ) -> dict[int, list[tuple[int, float]]]:
        """``profile`` relative to the same caller live set as ``extra_with_dying``'s: per GPU,
        (position, bytes above that live set) at each op of the body, inlined."""
        if not dying and not dead:
            return self.profile
        return self._with_dying(dying, dead)[0]

    def with_dying(
        self, dying: list[tuple[int, int, float]], dead: list[tuple[int, int, float]]
    ) -> tuple[tuple[tuple[int, float], ...], dict[int, list[tuple[int, float]]]]:
        """``extra_with_dying`` and ``profile_with_dying`` at once."""
        if not dying and not dead:
            return tuple(self.peak_extra.items()), self.profile
        profile, extra = self._with_dying(dying, dead)
        return extra, profile

    def _with_dying(
        self, dying: list[tuple[int, int, float]], dead: list[tuple[int, int, float]]
    ) -> tuple[dict[int, list[tuple[int, float]]], tuple[tuple[int, float], ...]]:
        key = (tuple(dying), tuple(dead))  # call sites of one summary repeat (microbatches)
        hit = self._extra_memo.get(key)
        if hit is None:
            hit = self._extra_memo[key] = self._extra(dying, dead)
        return hit

    def _extra(
        self, dying: list[tuple[int, int, float]], dead: list[tuple[int, int, float]]
    ) -> tuple[dict[int, list[tuple[int, float]]], tuple[tuple[int, float], ...]]:
        out = dict(self.peak_extra)
        profile = dict(self.profile)
        by_gpu: dict[int, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
        for last, g, b in dying:
            by_gpu.setdefault(g, ([], []))[0].append((last, b))
        for last, g, b in dead:
            by_gpu.setdefault(g, ([], []))[1].append((last, b))
        for g, (mine, gone) in by_gpu.items():
            prof = self.profile.get(g)
            if prof:
                # sorted last uses with prefix sums: bytes still live / already gone at each point
                mine.sort()
                gone.sort()
                m_last = [x for x, _ in mine]
                g_last = [x for x, _ in gone]
                m_pre = list(accumulate((b for _, b in mine), initial=0.0))
                g_pre = list(accumulate((b for _, b in gone), initial=0.0))
                total = m_pre[-1]
                profile[g] = [
                    (i, val + (total - m_pre[bisect_left(m_last, i)]) - g_pre[bisect_left(g_last, i)] - total)
                    for i, val in prof
                ]
                out[g] = max(v for _, v in profile[g])
        return profile, tuple(out.items())


class OpRecord(NamedTuple):
    """What the planner knows of one primitive op: where it runs, what it costs, what it allocates.

    Memoized per (op, attributes, input types): records are shared by every op alike."""

    devs: tuple[int, ...]  # the plan's clocks (slots, or units) it runs on
    seconds: float
    comm: bool  # communicates (a collective or a send), else computes
    name: str
    flops: float
    view: bool  # writes no bytes: its results alias its inputs (allocates nothing)
    out_bytes: tuple[list[tuple[int, float]], ...]  # bytes per GPU of each result
    allocs: tuple[tuple[int, float], ...]  # all its allocations (empty for a view)
    bump: tuple[tuple[int, float], ...]  # the allocations summed per GPU: its peak bump
    # the peak bump when its first input dies at it (a multi-step Redistribute frees its source
    # after the first step), or None: the same as ``bump``
    bump_dying: tuple[tuple[int, float], ...] | None
    # a one-step collective along one mesh axis (what ``distir.sim.overlap`` may pair with a
    # matrix product), or None
    collective: Collective | None = None
    # the compute clocks a communication kernel slows while it runs beside them, each with the
    # seconds it adds to that clock (``distir.sim.interference``); empty for most ops
    stall: tuple[tuple[int, float], ...] = ()
    # the clocks it waits for without occupying them (an ``event`` hand-over: the destination
    # stream waits for the source's work issued before it, the source goes on): it starts at the
    # largest clock of ``devs`` and ``waits``, and only ``devs`` advance to its end; empty for most
    waits: tuple[int, ...] = ()
    # its scratch beyond its results as the separate blocks the trainer allocates, (gpu, bytes)
    # each, summing to ``bump`` less the results (the caching allocator's replay,
    # ``distir.sim.allocator``); empty: one block per GPU
    scratch: tuple[tuple[int, float], ...] = ()


def waits_column(records: Sequence[OpRecord | CallSummary]) -> list[tuple[int, ...]] | None:
    """Per record, the clocks it waits for without occupying them (``OpRecord.waits``; a call
    summary: none), or None when no record waits so (``FnPlan.waits``)."""
    col = [r.waits if type(r) is OpRecord else () for r in records]
    return col if any(col) else None


class Collective(NamedTuple):
    """A collective of one step: its pattern and the size of the mesh axis it runs along."""

    pattern: CommPattern
    size: int


# per-instruction memory: (peak bumps, allocations, frees), each a tuple of (gpu, bytes)
class Gift(NamedTuple):
    """A donated entry parameter (``Function.donated``) as the plan owns it: its bytes per GPU
    (memory figure), and the instruction that writes its in-place successor (-1: none)."""

    bytes: Sequence[tuple[int, float]]
    until: int

    def end(self, last_use: int) -> int:
        """After which instruction the parameter's storage is released, given its last use: an
        in-place update (nothing reads it after the instruction making its successor) hands the
        storage over to that instruction — it is released just before it, so the successor
        takes its place instead of being counted beside it; otherwise after its last use or its
        successor, whichever is later (a parameter nothing reads: after the first instruction)."""
        if self.until > 0 and last_use <= self.until:
            return self.until - 1
        return max(last_use, self.until, 0)


MemEvents = tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]]


@dataclass(slots=True)
class FnPlan:
    fn: Function
    devs: list[tuple[int, ...]]
    costs: list[float | CallSummary]
    comm: list[bool]
    names: list[str]
    flops: list[float]
    mem: list[MemEvents | None]
    slots: tuple[int, ...]
    out_roots: tuple[tuple[int, ...], ...]
    fresh: tuple[tuple[tuple[tuple[int, float], ...], int], ...]
    out_types: tuple[Type, ...]
    param_last: tuple[int, ...]
    out_values: tuple[Mixed, ...] = ()  # the results, with any known (concrete) values
    # a flat entry run untraced may be kept compact instead (the per-op lists above are then empty)
    columns: FlatColumns | None = None
    # planned by the fast path (``distir.sim.flatplan``): primitive ops only, no concrete value
    flat: bool = False
    # the fast path's distinct communicating ops with their input and result types
    comm_ops: tuple[tuple[Op, tuple[Type, ...], tuple[Type, ...]], ...] = ()
    # the arguments it was planned at, kept with ``CallSummary.body`` (a detailed trace's types)
    in_values: tuple[Mixed, ...] = ()
    # a plan to summarize with calls: per call instruction, the callee's memory profile relative to
    # the live set at the call (``CallSummary.profile_with_dying``), for ``summarize`` to inline
    call_profiles: dict[int, dict[int, list[tuple[int, float]]]] | None = None
    # per instruction, the compute clocks it stalls (``OpRecord.stall``, ``distir.sim.interference``;
    # a call: none), or None when no instruction stalls any (a compact plan: its table's records)
    stall: list[tuple[tuple[int, float], ...]] | None = None
    # per instruction, the clocks it waits for without occupying them (``OpRecord.waits``; a call:
    # none), or None when no instruction does (a compact plan: its table's records)
    waits: list[tuple[int, ...]] | None = None


@dataclass(slots=True)
class FlatColumns:
    """A plan of primitive ops kept compact: op ``i``'s record is ``table[kinds[i]]`` (a long
    body repeats a few), its memory events are columns (``distir.sim.memcols``)."""

    kinds: list[int]
    table: list[OpRecord]
    mem: MemColumns
