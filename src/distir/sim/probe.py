"""A probe: the figures of a program that calls one function once, from the call's summary.

The search's layer profiles (``distir.search.profile``) simulate programs whose entry calls one
layer function on typed arguments, some donated (freed at their last use inside), returning some
of its results. ``probe`` gives what ``simulate`` gives for such a program — its step time,
FLOPs, each GPU's peak, parameter and runtime memory, and the live bytes it ends with (the memory
timeline's last point) — without planning and running the entry: the callee is planned as the
call site would plan it, on the same ``SharedPlans`` domain (``SharedPlans.summary``), and the
entry's one instruction is worked out from its summary, the liveness of ``build_plan`` for a
body of one call written out (the donated arguments first, then the call's own buffers; what is
not returned dies at the call, freed in that order) and the arithmetic of the simulator's run in
the same order, so the figures are the same floats. A summary whose results share or mix
buffers (``CallSummary.own_ks`` is None) is not probed here (None: simulate the program).

**One domain per group** (``GroupPlans``). ``SharedPlans`` plans each (function, arguments) on a
domain of its own, its units assumed from those arguments. The probes of one layer sharding (the
functions ``distribute`` would emit into one module: one function per name) on one TP group can
instead all plan on one domain, its units assumed once, from the first probe's arguments: a
summary is a function of the callee, its argument types, the units and the cost model only, and
the domain notes each later probe's arguments as ``assume`` does and confirms its units after
planning (``Units.confirm``: no type met calls for a group they do not hold; units finer than
needed give the same figures, as for ``assume``'s own guess of ``sent_groups``). A program whose
types the units do not hold (uneven shards met inside) is planned again on a domain assumed anew
from its arguments and every type met so far (so as fine as all of them call for), which the
group keeps. A function of a name met before as another object, or a mesh named by an attribute
the first function did not name, takes ``SharedPlans.summary``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

from distir.hardware.cluster import Cluster
from distir.interp.shapes import type_of
from distir.ir.function import Function, Module
from distir.ir.types import Type
from distir.sim.cost import CostModel
from distir.sim.devices import DeviceMap
from distir.sim.grouping import attribute_meshes
from distir.sim.liveness import WHOLE_CALL  # the last use inside a call of an argument it never reads
from distir.sim.plan import PROGRAM_ERRORS, CallSummary, PlanDomain, PlanOptions
from distir.sim.simulate import SharedPlans
from distir.sim.units import has_dtensor


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What ``simulate`` reports of a probe program, by real GPU (``SimResult``'s fields)."""

    step_time_s: float
    flops: float
    peak_memory: dict[int, float]
    param_memory: dict[int, float]
    runtime_memory: dict[int, float]
    final_memory: dict[int, float]  # the memory timeline's last point


class _Kept(NamedTuple):
    """A group's domain, the meshes attributes named in the functions its units were assumed
    for, and the device map and cost model its key names by id (kept alive)."""

    domain: PlanDomain
    meshes: frozenset[object]
    alive: tuple[object, ...]


class GroupPlans:
    """One planning domain per (device map, cost model) for the probes of one layer sharding
    (module docstring); ``summary`` is ``SharedPlans.summary``'s, from that domain where it can."""

    def __init__(self, shared: SharedPlans) -> None:
        self.shared = shared
        # (ids of the device map and cost model, whether the arguments hold DTensors) -> its domain
        self._domains: dict[tuple[int, int, bool], _Kept] = {}
        # function name -> the function (kept alive), and the meshes its attributes name
        self._fns: dict[str, tuple[Function, frozenset[object]]] = {}
        self.hits = 0  # probes planned on a group's domain after its first (for tests)
        self.failed = 0  # probes whose types its units did not hold (for tests)

    def summary(
        self, fn: Function, args: list[Type], dmap: DeviceMap, cost: CostModel
    ) -> tuple[CallSummary, PlanDomain] | None:
        """``SharedPlans.summary(fn, args, dmap, cost)``: the same summary, planned on the group's
        domain when the module docstring's conditions hold."""
        named = self._fns.get(fn.name)
        if named is None:
            named = self._fns[fn.name] = (fn, frozenset(attribute_meshes(Module((fn,)), fn)))
        elif named[0] is not fn:  # another function of this name: not one module's
            return self.shared.summary(fn, args, dmap, cost)
        # (a program of plain tensors has no units to assume: it plans on a domain of its own kind)
        key = (id(dmap), id(cost), any(has_dtensor(type_of(a)) for a in args))
        kept = self._domains.pop(key, None)
        met: list[Type] = []
        if kept is not None:
            if not named[1] <= kept.meshes:  # a mesh its assumption did not see
                self._domains[key] = kept
                return self.shared.summary(fn, args, dmap, cost)
            domain = kept.domain
            domain.module = Module((fn,))
            for a in args:  # as ``Units.assume`` notes its arguments
                domain.units.note(type_of(a))
            got = self._plan(domain, fn, args)
            if got is not None:
                self._domains[key] = kept
                self.hits += 1
                return got, domain
            # its units do not hold for this program: units assumed anew, as fine as every type
            # met so far calls for (this program's among them)
            met = domain.units.met_types()
            self.failed += 1
        options = PlanOptions(relabel=self.shared.relabel, entry_param_uses=False, assume_units=True)
        module = Module((fn,))
        # a domain assumed from the arguments (and the types met so far), as ``SharedPlans.summary``
        # makes one; where its units do not hold either, one assumed from every type it met
        for _ in range(2):
            domain = PlanDomain(module, dmap, cost, options)
            domain.units.assume(module, fn, args, also=met)
            self.shared.records.attach(domain)
            got = self._plan(domain, fn, args)
            if got is not None:
                self._domains[key] = _Kept(domain, named[1], (dmap, cost))
                return got, domain
            met = domain.units.met_types()
        return self.shared.summary(fn, args, dmap, cost)  # units prepared, or the usual way

    def _plan(self, domain: PlanDomain, fn: Function, args: list[Type]) -> CallSummary | None:
        """The summary of calling ``fn`` on ``args`` planned on ``domain`` (its records kept),
        or None when its units are not confirmed or the program is wrong (the domain is then
        spoilt)."""
        try:
            summary = domain.summary_of(fn, args)
            if not domain.units.confirm():
                return None
        except PROGRAM_ERRORS:
            return None
        self.shared.records.keep(domain)
        return summary


def probe(
    shared: SharedPlans,
    fn: Function,
    args: Sequence[Type],
    cluster: Cluster,
    dmap: DeviceMap,
    cost: CostModel,
    dying: frozenset[int] = frozenset(),
    keep: Sequence[int] | None = None,
    group: GroupPlans | None = None,
) -> ProbeResult | None:
    """The figures of a program calling ``fn`` once on ``args``, those at positions ``dying``
    donated, returning its results at positions ``keep`` (default: all) — ``simulate``'s, on
    ``shared``'s domains, or ``group``'s (module docstring); None when this path does not apply."""
    got = (group or shared).summary(fn, list(args), dmap, cost)
    if got is None or got[0].own_ks is None:
        return None
    c, domain = got
    pk, al, fr = _call_event(c, domain, args, dying, range(len(fn.outputs)) if keep is None else keep)
    return _run(c, domain, cluster, args, (pk, al, fr))


def _call_event(
    c: CallSummary, domain: PlanDomain, args: Sequence[Type], dying: frozenset[int], keep: Sequence[int]
) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]]:
    """The call's memory event (peak bumps, allocations, frees), as ``build_plan`` makes it for
    an entry of this one call."""
    own_ks = c.own_ks
    assert own_ks is not None  # ``probe`` takes only such summaries
    own = c.pick_own(range(len(c.out_roots)))  # the first result that is each own buffer
    root: dict[int, tuple[object, ...]] = {o: (("o", o),) for o in own}
    for o, j in c.aliases:  # a result that is argument j: its storage if donated, else none
        root[o] = (("p", j),) if j in dying else ()
    for o, f in c.repeats:  # a result that is an earlier result's buffer
        root[o] = (("o", f),)
    returned = set(chain.from_iterable(root[o] for o in keep))
    # roots in creation order: the donated arguments, then the call's own buffers
    gifts = [j for j in range(len(args)) if j in dying]
    keys = [("p", j) for j in gifts] + [("o", o) for o in own]
    vals = [domain.units.bytes_by_gpu(args[j]) for j in gifts] + list(c.own_bytes)
    dies = [k not in returned for k in keys]  # all else dies at the call (its only instruction)
    fr = tuple(chain.from_iterable(v for v, d in zip(vals, dies, strict=True) if d))
    if not any(dies):
        pk = tuple(c.peak_extra.items())
    else:
        read_last = dict(zip(c.read_pos, c.read_last, strict=True))
        first = len(gifts)
        dying_args = [
            (read_last.get(j, WHOLE_CALL), g, b)
            for j, v, d in zip(gifts, vals[:first], dies[:first], strict=True)
            if d
            for g, b in v
        ]
        own_k = [k for k, d in zip(own_ks, dies[first:], strict=True) if d]
        dead = [(c.fresh[k][1], g, b) for k in own_k for g, b in c.fresh[k][0]]
        pk = c.with_dying(dying_args, dead)[0]
    return pk, tuple(c.own_allocs), fr


def _run(
    c: CallSummary,
    domain: PlanDomain,
    cluster: Cluster,
    args: Sequence[Type],
    event: tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]],
) -> ProbeResult:
    """The simulator's run of the entry (``simulate._run``), its one call and its memory event."""
    units = domain.units
    clock = [0.0] * len(units.slot_gpu)
    sub = c.slots
    ins = [clock[j] for j in sub]
    for b, j in enumerate(sub):
        clock[j] = max([ins[a] + c.delay[a][b] for a in range(len(sub))])
    live = {g: 0.0 for g in sorted(set(units.slot_gpu))}
    for t in args:
        for g, nb in units.bytes_by_gpu(t):
            live[g] += nb
    params, peak = dict(live), dict(live)
    pk, al, fr = event
    for g, nb in pk:
        v = live[g] + nb
        if v > peak[g]:
            peak[g] = v
    for g, nb in al:
        live[g] += nb
    for g, nb in fr:
        live[g] -= nb
    if units.units is not None:  # units of a DTensor program: back to slots, memory figures to GPUs
        unit_of = [0] * len(domain.dmap.slots)
        for u, members in enumerate(units.units):
            for j in members:
                unit_of[j] = u
        clock = [clock[u] for u in unit_of]
        figure = units.gpu_figure
        peak, params, live = ({g: xs[f] for g, f in figure.items()} for xs in (peak, params, live))
    runtime = {g: cluster.device_spec(g).runtime.overhead(peak[g]) for g in sorted(peak)}
    return ProbeResult(
        step_time_s=max(clock) if clock else 0.0,
        flops=sum([c.flops]),
        peak_memory={g: peak[g] + runtime[g] for g in runtime},
        param_memory=params,
        runtime_memory=runtime,
        final_memory=live,
    )


__all__ = ["GroupPlans", "ProbeResult", "probe"]
