"""A callee's plan run symbolically (max-plus over its slots) into a ``CallSummary``.

Under DistIR's semantics a body maps the clocks of its devices at entry to their clocks at exit
by a max-plus linear map: ``out[v] = max_u (in[u] + delay[u][v])`` (``distir.sim.plan``). Running
the plan with a vector per clock (its max-plus form over the entry clocks) gives that map, the
first-start matrix (for traces), busy and communication time per slot; a pass over the memory
events gives the body's peak extra memory per GPU and its memory profile by position in the
body's inlined op order.

``summarize_reference`` says it plainly; ``summarize`` is the same computation with the common
cases taken directly — an op on one slot advances that slot's vector alone, a callee of one slot
shifts one vector — and gives the same summary, bit for bit: each maximum is taken over the same
terms in the same order, each sum of the same floats (``tests/sim/test_summaries.py``). Both take
the memory pass from ``_memory``. The planner calls ``summarize``.
"""

from __future__ import annotations

from itertools import repeat

from distir.sim.records import NEG_INF, CallSummary, FnPlan

__all__ = ["summarize", "summarize_reference"]

Clocks = list[list[float]]


def summarize(plan: FnPlan, slot_gpu: list[int]) -> CallSummary:
    """``summarize_reference``, its common cases taken directly (module docstring)."""
    slots = plan.slots
    k = len(slots)
    pos = {s: j for j, s in enumerate(slots)}
    clock: Clocks = [[0.0 if u == v else NEG_INF for u in range(k)] for v in range(k)]
    first: list[list[float] | None] = [None] * k
    busy = [0.0] * k
    comm_t = [0.0] * k
    stalls = plan.stall if plan.stall is not None else repeat((), len(plan.devs))
    waits = plan.waits if plan.waits is not None else repeat((), len(plan.devs))
    for ds, c, is_comm, held, after in zip(plan.devs, plan.costs, plan.comm, stalls, waits, strict=True):
        if isinstance(c, CallSummary):
            _call(c, pos, clock, first, busy, comm_t)
            continue
        if not ds:
            continue
        if len(ds) == 1 and not after:  # one clock: its vector moves alone (never changed in place)
            j = pos[ds[0]]
            start = clock[j]
            if first[j] is None:
                first[j] = start
            clock[j] = [x + c for x in start]
            if is_comm:
                comm_t[j] += c
            else:
                busy[j] += c
        else:
            idx = [pos[s] for s in ds]
            waited = [*idx, *(pos[s] for s in after)] if after else idx  # ``OpRecord.waits``
            start = list(map(max, *[clock[j] for j in waited]))  # per entry clock, in that order
            end = [x + c for x in start]
            for j in idx:
                if first[j] is None:
                    first[j] = start
                clock[j] = end
                if is_comm:
                    comm_t[j] += c
                else:
                    busy[j] += c
        for s, x in held:  # the compute beside a collective, slowed (``distir.sim.interference``)
            j = pos[s]
            clock[j] = [t + x for t in clock[j]]
            busy[j] += x
    delay = [[clock[v][u] for v in range(k)] for u in range(k)]
    first_m = [[(first[v] or clock[v])[u] for v in range(k)] for u in range(k)]
    peak, profile = _memory(plan)
    n_ops = sum(c.n_ops if isinstance(c, CallSummary) else 1 for c in plan.costs)
    return CallSummary(
        plan.fn.name,
        slots,
        delay,
        first_m,
        busy,
        comm_t,
        sum(plan.flops),
        peak,
        plan.out_roots,
        plan.fresh,
        n_ops,
        profile,
        plan.param_last,
    )


def _call(
    c: CallSummary,
    pos: dict[int, int],
    clock: Clocks,
    first: list[list[float] | None],
    busy: list[float],
    comm_t: list[float],
) -> None:
    """A call instruction's summary applied to the caller's clock vectors."""
    sub = [pos[s] for s in c.slots]
    ins = [clock[j] for j in sub]
    m = len(sub)
    if m == 1:  # the maximum over one term is that term
        j = sub[0]
        if first[j] is None:
            f = c.first[0][0]
            first[j] = [x + f for x in ins[0]]
        busy[j] += c.busy[0]
        comm_t[j] += c.comm[0]
        d = c.delay[0][0]
        clock[j] = [x + d for x in ins[0]]
        return
    for b, j in enumerate(sub):
        if first[j] is None:
            first[j] = list(map(max, *[[x + c.first[a][b] for x in ins[a]] for a in range(m)]))
        busy[j] += c.busy[b]
        comm_t[j] += c.comm[b]
    new = [list(map(max, *[[x + c.delay[a][b] for x in ins[a]] for a in range(m)])) for b in range(m)]
    for b, j in enumerate(sub):
        clock[j] = new[b]


def _memory(plan: FnPlan) -> tuple[dict[int, float], dict[int, list[tuple[int, float]]]]:
    """Live bytes owned by the body, per GPU, from zero, at each op of the body inlined: the peak
    per GPU (only above zero) and the profile; ``summarize`` and ``summarize_reference`` alike."""
    live: dict[int, float] = {}
    peak: dict[int, float] = {}
    profile: dict[int, list[tuple[int, float]]] = {}
    inlined = plan.call_profiles or {}
    at = 0  # the position of the instruction's first op in the body's inlined op order
    for i, ev in enumerate(plan.mem):
        c = plan.costs[i]
        width = c.n_ops if isinstance(c, CallSummary) else 1  # the instruction's ops, inlined
        if ev is None:
            at += width
            continue
        pk, al, fr = ev
        inner = inlined.get(i)
        if inner is None:
            for g, nb in pk:
                val = live.get(g, 0.0) + nb
                profile.setdefault(g, []).append((at, val))
                if val > peak.get(g, 0.0):
                    peak[g] = val
        else:
            for g, points in inner.items():
                base = live.get(g, 0.0)
                rows = profile.setdefault(g, [])
                if not points:
                    continue
                vals = [base + rel for _j, rel in points]
                rows.extend(zip([at + j for j, _rel in points], vals, strict=True))
                top = max(vals)  # the running maximum's final value: the same float
                if top > peak.get(g, 0.0):
                    peak[g] = top
        at += width
        for g, nb in al:
            live[g] = live.get(g, 0.0) + nb
        for g, nb in fr:
            live[g] = live.get(g, 0.0) - nb
    return peak, profile


def summarize_reference(plan: FnPlan, slot_gpu: list[int]) -> CallSummary:
    """Run a plan symbolically (max-plus over its slots) into a call summary."""
    slots = plan.slots
    k = len(slots)
    pos = {s: j for j, s in enumerate(slots)}
    # clock[v] is a vector over entry clocks u: the max-plus form of v's current clock
    clock = [[0.0 if u == v else NEG_INF for u in range(k)] for v in range(k)]
    first: list[list[float] | None] = [None] * k
    busy = [0.0] * k
    comm_t = [0.0] * k
    stalls = plan.stall if plan.stall is not None else repeat((), len(plan.devs))
    waits = plan.waits if plan.waits is not None else repeat((), len(plan.devs))
    for ds, c, is_comm, held, after in zip(plan.devs, plan.costs, plan.comm, stalls, waits, strict=True):
        idx = [pos[s] for s in ds]
        if isinstance(c, CallSummary):
            sub = [pos[s] for s in c.slots]
            ins = [clock[j] for j in sub]
            for b, j in enumerate(sub):
                if first[j] is None:
                    first[j] = [max(ins[a][u] + c.first[a][b] for a in range(len(sub))) for u in range(k)]
                busy[j] += c.busy[b]
                comm_t[j] += c.comm[b]
            new = [
                [max(ins[a][u] + c.delay[a][b] for a in range(len(sub))) for u in range(k)]
                for b in range(len(sub))
            ]
            for b, j in enumerate(sub):
                clock[j] = new[b]
            continue
        if not idx:
            continue
        waited = [*idx, *(pos[s] for s in after)] if after else idx  # ``OpRecord.waits``
        start = [max(clock[j][u] for j in waited) for u in range(k)]
        end = [x + c for x in start]
        for j in idx:
            if first[j] is None:
                first[j] = start
            clock[j] = end
            if is_comm:
                comm_t[j] += c
            else:
                busy[j] += c
        for s, x in held:  # the compute beside a collective, slowed (``distir.sim.interference``)
            j = pos[s]
            clock[j] = [t + x for t in clock[j]]
            busy[j] += x
    delay = [[clock[v][u] for v in range(k)] for u in range(k)]
    first_m = [[(first[v] or clock[v])[u] for v in range(k)] for u in range(k)]
    # memory: the one memory pass (``_memory``: live bytes owned by this body, per GPU, from
    # zero, at each op of the body inlined, a call's its callee's profile above the live set)
    peak, profile = _memory(plan)
    n_ops = sum(c.n_ops if isinstance(c, CallSummary) else 1 for c in plan.costs)
    return CallSummary(
        plan.fn.name,
        slots,
        delay,
        first_m,
        busy,
        comm_t,
        sum(plan.flops),
        peak,
        plan.out_roots,
        plan.fresh,
        n_ops,
        profile,
        plan.param_last,
    )
