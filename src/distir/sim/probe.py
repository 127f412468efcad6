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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from distir.hardware.cluster import Cluster
from distir.ir.function import Function
from distir.ir.types import Type
from distir.sim.cost import CostModel
from distir.sim.devices import DeviceMap
from distir.sim.liveness import WHOLE_CALL  # the last use inside a call of an argument it never reads
from distir.sim.plan import CallSummary, PlanDomain
from distir.sim.simulate import SharedPlans


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What ``simulate`` reports of a probe program, by real GPU (``SimResult``'s fields)."""

    step_time_s: float
    flops: float
    peak_memory: dict[int, float]
    param_memory: dict[int, float]
    runtime_memory: dict[int, float]
    final_memory: dict[int, float]  # the memory timeline's last point


def probe(
    shared: SharedPlans,
    fn: Function,
    args: Sequence[Type],
    cluster: Cluster,
    dmap: DeviceMap,
    cost: CostModel,
    dying: frozenset[int] = frozenset(),
    keep: Sequence[int] | None = None,
) -> ProbeResult | None:
    """The figures of a program calling ``fn`` once on ``args``, those at positions ``dying``
    donated, returning its results at positions ``keep`` (default: all) — ``simulate``'s, on
    ``shared``'s domains (module docstring); None when this path does not apply."""
    got = shared.summary(fn, list(args), dmap, cost)
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


__all__ = ["ProbeResult", "probe"]
