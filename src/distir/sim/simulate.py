"""The simulator: step time, busy/communication/idle time and peak memory per device.

DistIR semantics: ops run in program order; an op waits until all its devices are free, then all
of them advance to its end; ops on disjoint device sets overlap. An ``event`` hand-over
(``MeshSend``/``Send`` with ``event=true``) also waits for the devices it sends from, which do not
advance (``OpRecord.waits``): a stream waiting for a CUDA event of another. The entry function is
compiled into a plan (``distir.sim.plan``: types, devices, costs and memory events precomputed, repeated
calls summarized once) and this module's loop runs it with one clock per slot.

Memory per GPU starts with the entry's parameters (weights, optimizer state, inputs) and follows
the plan's allocations and frees. The reported peak adds what the process holds besides tensors
(the device's ``RuntimeMemory``: CUDA context, library workspaces, communication buffers, and
the caching allocator's reserve as a fraction of the tensors' peak; ``SimResult.runtime_memory``
says how much) and is compared with each GPU's capacity.

A DTensor program is simulated directly (``distir.sim.spmd``): an op on distributed tensors
runs on every device of its mesh at once. Its plan runs over units of devices
(``distir.sim.units``), which this module expands back into slots and GPUs. The units are
assumed from the entry's types and confirmed after planning (``Units.assume``); when the program
calls for others (``Units.confirm`` says so), or is wrong (planning raises one of the typed
``PROGRAM_ERRORS``), it is planned again after the full type pass (``Units.prepare``), which
reports any error precisely — the results are the same either way. Any other exception is a bug
and propagates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import Any, NamedTuple, cast

from distir.gcpause import paused_gc
from distir.hardware.cluster import Cluster
from distir.hardware.specs import DeviceSpec, HostError
from distir.interp.shapes import entry_args
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import Device, IRTypeError, TensorType, TupleType, Type, devices_of
from distir.limits import MAX_RESERVED_OPS, MAX_TRACE_EVENTS, RESERVED_OPS_SHARE
from distir.ops.dist import parse_mesh_attr
from distir.ops.elementwise import CAST
from distir.sim.allocator import reserved_bytes, stream_pools
from distir.sim.cost import CostModel, RooflineCostModel
from distir.sim.devices import HOST_STREAM, DeviceMap, Slot
from distir.sim.interference import apply_stall
from distir.sim.layout import piece_bytes
from distir.sim.memcols import peaks
from distir.sim.plan import PROGRAM_ERRORS, CallSummary, FnPlan, PlanDomain, PlanOptions, SharedRecord
from distir.sim.records import FlatColumns
from distir.sim.reference import run_reference
from distir.sim.tracedetail import (
    LEVELS,
    DetailSource,
    TraceDetail,
    TraceScope,
    TraceSizeError,
    estimate_events,
)
from distir.sim.tracedetail import build as build_detail

_attrs = attrgetter("attrs")

# one traced slice: (name, start s, end s, slot index, is communication)
TraceSlice = tuple[str, float, float, int, bool]
# the planners ``simulate`` can plan with: ``distir.sim.plan`` (with its fast paths) and
# ``distir.sim.reference`` (the semantics, plainly: the same figures)
PLANNERS = ("fast", "reference")


@dataclass(slots=True)
class SimResult:
    step_time_s: float
    slots: tuple[Slot, ...]
    slot_devices: tuple[tuple[Device, ...], ...]  # program devices on each slot
    busy_s: list[float]
    comm_s: list[float]
    peak_memory: dict[int, float]  # gpu -> bytes (tensors at their peak + runtime_memory)
    param_memory: dict[int, float]  # gpu -> bytes of the entry's parameters
    capacity: dict[int, float]  # gpu -> bytes
    flops: float
    n_ops: int
    peak_flops: float  # sum of the used GPUs' peak FLOP/s for the program's dtype
    batch: int | None = None
    model_flops: float | None = None  # the model's FLOPs per step (``mfu``), when known
    slices: list[TraceSlice] | None = None
    memory_timeline: dict[int, list[tuple[float, float]]] | None = None
    cluster: Cluster | None = field(default=None, repr=False)
    # gpu -> bytes held besides tensors at the peak (context, workspaces, buffers, allocator)
    runtime_memory: dict[int, float] = field(default_factory=dict)
    # ``simulate(..., allocator=True)`` (``distir.sim.allocator``): gpu -> the caching allocator's
    # reserved peak (its streams' segments, holes included) plus the runtime memory's
    # fixed part, and gpu -> stream -> that stream's pool (bytes); empty when not asked for
    reserved_memory: dict[int, float] = field(default_factory=dict)
    stream_pools: dict[int, dict[str, float]] = field(default_factory=dict)
    # gpu -> bytes of the entry's parameters on its host (``HOST_STREAM``: an offloaded
    # optimizer's masters and state), which its peak leaves out; empty when none
    host_memory: dict[int, float] = field(default_factory=dict)
    # a traced run: what its detailed trace is built from (``distir.sim.tracedetail``)
    trace_source: DetailSource | None = field(default=None, repr=False, compare=False)

    def trace_detail(self) -> TraceDetail:
        """The trace's slices with arguments, nested to the level the run was traced at, and its
        point-to-point flows (``distir.sim.tracedetail``); needs ``trace=True``."""
        if self.trace_source is None:
            raise ValueError("the simulation was run without trace=True, so it has no trace")
        return build_detail(self.trace_source)

    @property
    def oom_gpus(self) -> list[int]:
        return sorted(g for g, p in self.peak_memory.items() if p > self.capacity[g])

    @property
    def throughput(self) -> float:
        """Samples per second when the batch size is known, else steps per second."""
        if self.step_time_s <= 0:
            return float("inf")
        return (self.batch or 1) / self.step_time_s

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: all FLOPs executed (recomputation included) per second over
        the used GPUs' peak."""
        if self.step_time_s <= 0 or self.peak_flops <= 0:
            return 0.0
        return self.flops / self.step_time_s / self.peak_flops

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: the model's FLOPs for the step (``model_flops``: forward and
        backward of the sequential model, recomputation excluded) per second over the used GPUs'
        peak; None when the program does not say what its model's FLOPs are (a program file)."""
        if self.model_flops is None:
            return None
        if self.step_time_s <= 0 or self.peak_flops <= 0:
            return 0.0
        return self.model_flops / self.step_time_s / self.peak_flops

    @property
    def bubble_fraction(self) -> float:
        """Mean fraction of the step that compute slots spend neither computing nor communicating."""
        t = self.step_time_s
        idle = (
            [
                max(t - b - c, 0.0) / t
                for s, b, c in zip(self.slots, self.busy_s, self.comm_s, strict=True)
                if s.stream == "compute"
            ]
            if t > 0
            else []
        )
        return sum(idle) / len(idle) if idle else 0.0


def simulate(
    module: Module,
    cluster: Cluster,
    device_map: DeviceMap | None = None,
    cost_model: CostModel | None = None,
    *,
    trace: bool = False,
    batch: int | None = None,
    concrete: Mapping[str, Any] | None = None,
    fn: Function | None = None,
    trace_detail: str = "chunk",
    planner: str = "fast",
    shared: SharedPlans | None = None,
    allocator: bool = False,
    trace_gpus: Collection[int] | None = None,
    allocator_max_ops: int = MAX_RESERVED_OPS.max,
) -> SimResult:
    """Simulate ``fn`` (default: the module's entry) on ``cluster``. ``trace_detail`` (with
    ``trace``): how deep ``SimResult.trace_detail`` looks into calls — ``chunk``, ``layer`` or
    ``op`` (``distir.sim.tracedetail``); ``trace_gpus``: the GPUs traced (None: every one): the
    slices, memory timeline and trace of the others are not kept. A trace of more than
    ``MAX_TRACE_EVENTS`` events (``tracedetail.estimate_events``) raises ``TraceSizeError``
    after planning, before the timing loop records it.
    ``planner``: ``fast`` (``distir.sim.plan`` with its fast
    paths) or ``reference`` (``distir.sim.reference``: the same figures, slowly, with no memory
    timeline and no trace detail). ``allocator``: also size the caching allocator's per-stream
    pools (``distir.sim.allocator``: one more walk of the program, with every call expanded) into
    ``SimResult.reserved_memory`` and ``stream_pools``; a program of more than
    ``allocator_max_ops`` ops raises ``AllocatorSizeError`` before that walk."""
    scope = TraceScope(trace_detail, None if trace_gpus is None else frozenset(trace_gpus)) if trace else None
    check_hosts(cluster, device_map)
    result = _simulate_planned(
        module, cluster, device_map, cost_model, scope, batch, concrete, fn, trace_detail, planner, shared
    )
    if allocator:
        if result.n_ops > allocator_max_ops:
            raise AllocatorSizeError(
                f"the caching allocator's walk replays each of the program's {result.n_ops:,} ops "
                f"(calls expanded; about {result.n_ops * 1e-4:,.0f} s), above {allocator_max_ops:,} "
                f"(--max-ops / {RESERVED_OPS_SHARE}, docs/limitations.md): raise --max-ops, or give "
                f"fewer microbatches"
            )
        _add_reserved(
            result, module, fn if fn is not None else module.entry, concrete, cluster, device_map, cost_model
        )
    return result


class AllocatorSizeError(ValueError):
    """``simulate(allocator=True)`` refused: the program is above ``allocator_max_ops``."""


def _add_reserved(
    r: SimResult,
    module: Module,
    fn: Function,
    concrete: Mapping[str, Any] | None,
    cluster: Cluster,
    device_map: DeviceMap | None,
    cost_model: CostModel | None,
) -> None:
    """Fill ``r.reserved_memory`` and ``r.stream_pools`` (``distir.sim.allocator``)."""
    dmap = (
        device_map
        if device_map is not None
        else DeviceMap.default(_program_devices(module, fn), cluster.num_devices)
    )
    cost = cost_model if cost_model is not None else RooflineCostModel(cluster)
    pools = stream_pools(module, fn, entry_args(fn, concrete), dmap, cost)
    for g in r.peak_memory:
        rt = cluster.device_spec(g).runtime
        r.reserved_memory[g] = reserved_bytes(pools, g, rt.fixed_bytes)
        r.stream_pools[g] = pools.pools.get(g, {})


def _simulate_planned(
    module: Module,
    cluster: Cluster,
    device_map: DeviceMap | None,
    cost_model: CostModel | None,
    scope: TraceScope | None,
    batch: int | None,
    concrete: Mapping[str, Any] | None,
    fn: Function | None,
    trace_detail: str,
    planner: str,
    shared: SharedPlans | None,
) -> SimResult:
    """``simulate`` by the chosen planner (``scope``: what is traced; None: no trace)."""
    trace = scope is not None
    if trace_detail not in LEVELS:
        raise ValueError(f"trace detail must be one of {', '.join(LEVELS)}, got {trace_detail!r}")
    if planner not in PLANNERS:
        raise ValueError(f"planner must be one of {', '.join(PLANNERS)}, got {planner!r}")
    fn = fn if fn is not None else module.entry
    args = entry_args(fn, concrete)
    if planner == "reference":
        return _simulate_reference(module, fn, args, cluster, device_map, cost_model, trace, batch)
    # planning allocates many small, long-lived objects: the cyclic GC only slows it down. The
    # planning domain, its plans and memos are freed (by reference counting: they hold no
    # cycle) before the collector is back on, so its first collection does not walk them
    keep_bodies = trace and trace_detail != "chunk"
    with paused_gc():
        got = (
            shared.simulate(module, fn, args, cluster, device_map, cost_model, trace, batch)
            if shared is not None and device_map is not None and cost_model is not None and not keep_bodies
            else None
        )
        if got is None:
            got = _simulate(
                module, fn, args, cluster, device_map, cost_model, trace, batch, keep_bodies, scope
            )
        result, plan, domain = got
        if scope is not None and result.trace_source is None:  # planned on shared plans
            result.trace_source = _detail_source(scope, plan, domain, module, fn, args)
        del plan, domain  # freed while the collector is paused (the trace keeps the plan)
    return result


def _detail_source(
    scope: TraceScope, plan: FnPlan, domain: PlanDomain, module: Module, fn: Function, args: list[Any]
) -> DetailSource:
    dmap = domain.dmap
    index = {slot: i for i, slot in enumerate(dmap.slots)}
    units = domain.units.units
    n = len(domain.slot_gpu)
    clocks = tuple(tuple(u) for u in units) if units is not None else tuple((j,) for j in range(n))
    dev_slot = {dev: index[slot] for dev, slot in dmap.mapping.items()}
    traced = scope.slots(dmap)
    return DetailSource(scope.level, plan, module, fn, tuple(args), clocks, dev_slot, traced)


def _checked_source(
    scope: TraceScope, plan: FnPlan, domain: PlanDomain, module: Module, fn: Function, args: list[Any]
) -> DetailSource:
    """The trace's source (``_detail_source``), or ``TraceSizeError`` when its GPUs are not the
    program's or it would hold more than ``MAX_TRACE_EVENTS`` events."""
    scope.check_gpus(domain.dmap)
    src = _detail_source(scope, plan, domain, module, fn, args)
    n = estimate_events(src)
    if n > MAX_TRACE_EVENTS.max:
        raise TraceSizeError(scope.too_large(n, domain.dmap))
    return src


def _simulate(
    module: Module,
    fn: Function,
    args: list[Any],
    cluster: Cluster,
    device_map: DeviceMap | None,
    cost_model: CostModel | None,
    trace: bool,
    batch: int | None,
    keep_bodies: bool = False,
    scope: TraceScope | None = None,
) -> tuple[SimResult, FnPlan, PlanDomain]:
    """Plan ``fn`` and run its timing loop; ``scope``: the trace, checked against its bound
    after planning (``_checked_source``) and keeping only its GPUs' slices and timeline."""
    if device_map is None:
        device_map = DeviceMap.default(_program_devices(module, fn), cluster.num_devices)
    cost = cost_model if cost_model is not None else RooflineCostModel(cluster)
    # units assumed from the entry's types (``Units.assume``), confirmed after planning; if the
    # program calls for other units (or is wrong), plan it again after ``Units.prepare``'s pass,
    # which also reports any error precisely
    plan: FnPlan | None = None
    entry = PlanOptions(entry_param_uses=False, entry_memory_columns=not trace, keep_bodies=keep_bodies)
    domain = PlanDomain(module, device_map, cost, replace(entry, assume_units=True))
    try:
        plan = domain.plan(fn, args)
    except PROGRAM_ERRORS:  # a wrong program: planned again below, where the type pass names it
        plan = None
    if plan is None or not domain.units.confirm():
        del plan, domain  # freed before planning again
        domain = PlanDomain(module, device_map, cost, entry)
        plan = domain.plan(fn, args)
    if scope is None:
        return _run(plan, domain, cluster, device_map, trace, batch), plan, domain
    src = _checked_source(scope, plan, domain, module, fn, args)
    result = _run(plan, domain, cluster, device_map, trace, batch, scope.gpus)
    result.trace_source = src
    return result, plan, domain


class SharedPlans:
    """Callee plans shared by the simulations of programs that call the same functions (the same
    objects) on the same device map and cost model (the same objects) with arguments of the same
    types (the same objects): e.g. the search's layer probes (``distir.search.profile``), which
    simulate one layer's function several times under entries that differ only in what they
    donate and return.

    Such simulations plan on one ``PlanDomain``: each entry is planned anew (its options, its
    donations, its results), its calls take the callees' summaries the first simulation made —
    exactly what planning them again would give, since a summary is a function of the callee,
    its argument types, the units and the cost model only (``distir.sim.plan``; an argument
    donated by the entry is freed at its last use inside the summary's inlined order, whoever
    donates it). The units are the first simulation's: assumed from the same entry types and
    confirmed after each simulation; where they are not confirmed, the first simulation plans
    again on a domain of the units ``Units.prepare``'s pass makes (what ``simulate`` does next on
    its own), which is kept instead (its records shared only with domains of prepared units). A
    program that planning finds wrong is simulated the usual way (the precise error), and its
    domain is dropped."""

    def __init__(self, records: SharedRecords | None = None, relabel: bool = True) -> None:
        # carry a callee's summary to another mesh alike (``PlanOptions.relabel``: the same plans
        # either way); False for programs that call each function on one mesh only, e.g. the
        # search's layer probes, where it would only key and remember every callee for nothing
        self.relabel = relabel
        # (ids of the callees, of the device map, of the cost model and of the argument types) ->
        # (the domain, and those objects: kept alive so their ids stay valid)
        self._domains: dict[tuple[int, ...], tuple[PlanDomain, tuple[object, ...]]] = {}
        self.hits = 0  # simulations planned on a kept domain (for tests)
        # op records shared by every domain of one device map, cost model and units (also
        # across ``SharedPlans``: a caller may hand one store to several)
        self.records = records if records is not None else SharedRecords()

    def simulate(
        self,
        module: Module,
        fn: Function,
        args: list[Any],
        cluster: Cluster,
        dmap: DeviceMap,
        cost: CostModel,
        trace: bool,
        batch: int | None,
    ) -> tuple[SimResult, FnPlan, PlanDomain] | None:
        """``_simulate``'s result on the kept domain of this program's callees, else on a new one
        that is then kept if its units are confirmed; None when the program cannot share one."""
        callees = tuple(f for f in module.functions if f is not fn)
        options = PlanOptions(
            relabel=self.relabel, entry_param_uses=False, entry_memory_columns=not trace, assume_units=True
        )
        got = self._on_domain(module, fn, args, dmap, cost, (*callees, dmap, cost, *args), options, "plan")
        if got is None:
            return None
        plan, domain = got
        assert isinstance(plan, FnPlan)
        return _run(plan, domain, cluster, dmap, trace, batch), plan, domain

    def summary(
        self, fn: Function, args: list[Any], dmap: DeviceMap, cost: CostModel
    ) -> tuple[CallSummary, PlanDomain] | None:
        """The summary of one call of ``fn`` on ``args``, as ``simulate`` plans it for a program
        whose entry calls ``fn`` once (the same domain: kept by the same key, the units assumed
        from the same types and confirmed after), and the domain (``distir.sim.probe``); None
        when the program cannot share one (a wrong program: simulate it, which reports it)."""
        options = PlanOptions(relabel=self.relabel, entry_param_uses=False, assume_units=True)
        got = self._on_domain(
            Module((fn,)), fn, args, dmap, cost, (fn, dmap, cost, *args), options, "summary"
        )
        if got is None:
            return None
        summary, domain = got
        assert isinstance(summary, CallSummary)
        return summary, domain

    def _on_domain(
        self,
        module: Module,
        fn: Function,
        args: list[Any],
        dmap: DeviceMap,
        cost: CostModel,
        alive: tuple[object, ...],
        options: PlanOptions,
        what: str,
    ) -> tuple[FnPlan | CallSummary, PlanDomain] | None:
        """``fn`` on ``args`` planned (``what = "plan"``: ``PlanDomain.plan``) or summarized
        (``"summary"``: ``PlanDomain.summary_of``) on the domain kept for ``alive``'s objects, else
        on a new one with units assumed from the arguments — or, where the program calls for other
        units, prepared as ``_simulate`` prepares them — kept when planning succeeds; None when
        planning finds the program wrong (planned again, and reported, the usual way)."""
        key = tuple(map(id, alive))
        kept = self._domains.get(key)
        if kept is not None:
            domain = kept[0]
            domain.module, domain.options = module, options
        try:
            if kept is None:
                domain = PlanDomain(module, dmap, cost, options)
                domain.units.assume(module, fn, args)  # what ``plan`` does first: here, to
                self.records.attach(domain)  # take the records of domains of the same units
            got = domain.plan(fn, args) if what == "plan" else domain.summary_of(fn, args)
            if not domain.units.confirm():  # the program calls for other units: ``prepare``'s
                domain = PlanDomain(module, dmap, cost, replace(options, assume_units=False))
                domain.units.prepare(module, fn, args)  # (as ``_simulate`` plans it next)
                self.records.attach(domain)
                got = domain.plan(fn, args) if what == "plan" else domain.summary_of(fn, args)
        except PROGRAM_ERRORS:
            self._domains.pop(key, None)
            return None
        self.records.keep(domain)
        if kept is not None:
            self.hits += 1
        else:
            self._domains[key] = (domain, alive)
        return got, domain


_Records = dict[tuple[Any, ...], SharedRecord]


class SharedRecords:
    """Op records (result types, record) shared by planning domains on the same device map and
    cost model (the same objects) whose units are the same: an op's record is a function of the
    op, its attributes, its input types, its fused link, the units and the cost model only
    (``distir.sim.oprecord``), so a domain takes the ones another made instead of inferring and
    costing them again (``PlanDomain.shared_records``) — e.g. the search's probes of the forward,
    backward and input-gradient part of one layer, or of the same layer with and without
    sequence parallelism, which share most of their ops. A record taken also notes the types its
    making noted (``Units.note``), so ``Units.confirm`` sees what it would have seen. Only the
    records of domains whose units were confirmed are kept."""

    def __init__(self) -> None:
        # (ids of the device map and cost model, the units) -> (records by op key, those objects)
        self._stores: dict[tuple[Any, ...], tuple[_Records, tuple[object, ...]]] = {}
        self.size = 0  # records kept, all stores
        self.taken = 0  # records domains took from here (for tests)

    @staticmethod
    def _key(domain: PlanDomain) -> tuple[Any, ...]:
        # domains of prepared units (``Units.prepare``) share records only among themselves: their
        # records note no types (``Units.note`` is for assumed units), which an assuming domain
        # taking them would then miss in ``Units.confirm``
        u = domain.units
        units = tuple(u.units) if u.units is not None else None
        slots = (tuple(u.dev_slot.items()), tuple(u.slot_gpu), units)
        return (id(domain.dmap), id(domain.cost), *slots, u.assumed)

    def attach(self, domain: PlanDomain) -> None:
        """Let ``domain`` (its units assumed or prepared) take the records of its store and note
        the ones it makes for ``keep``."""
        got = self._stores.get(self._key(domain))
        domain.shared_records = got[0] if got is not None else None
        domain.noted = {}

    def keep(self, domain: PlanDomain) -> None:
        """Keep the records ``domain`` made (its units confirmed) for the domains alike."""
        self.taken += domain.adopted
        domain.adopted = 0
        new = domain.take_new_records()
        if not new:
            return
        key = self._key(domain)
        got = self._stores.get(key)
        if got is None:
            got = self._stores[key] = ({}, (domain.dmap, domain.cost))
        store = got[0]
        n = len(store)
        store.update((k, r) for k, r in new if k not in store)
        self.size += len(store) - n
        domain.shared_records = store


def _simulate_reference(
    module: Module,
    fn: Function,
    args: list[Any],
    cluster: Cluster,
    device_map: DeviceMap | None,
    cost_model: CostModel | None,
    trace: bool,
    batch: int | None,
) -> SimResult:
    """``simulate`` with the reference planner (``distir.sim.reference``)."""
    if device_map is None:
        device_map = DeviceMap.default(_program_devices(module, fn), cluster.num_devices)
    cost = cost_model if cost_model is not None else RooflineCostModel(cluster)
    run = run_reference(module, fn, args, device_map, cost, trace)
    figures = _Figures(run.clock, run.busy, run.comm, run.peak, run.params, run.flops, run.n_ops)
    return _result(fn, cluster, device_map, sorted(run.peak), figures, batch, run.slices, None)


def _program_devices(module: Module, fn: Function) -> set[Device]:
    """Every device named by the entry's parameter types or by any attribute in the module."""
    devs: set[Device] = set()
    for p in fn.params:
        if p.type is not None:
            devs.update(devices_of(p.type))
    seen: set[int] = set()  # attribute objects already scanned (builders intern them)
    reachable = [fn, *(module[n] for n in _callees(module, fn))]
    for f in reachable:
        # attributes are interned by the builder: scan each distinct object once (the scan
        # stays at C speed on long bodies: ids are mapped, not looped over)
        ops = cast(tuple[Op, ...], f.body) if Call not in set(map(type, f.body)) else tuple(f.ops())
        for key, a in dict(zip(map(id, map(_attrs, ops)), map(_attrs, ops), strict=True)).items():
            if key in seen:
                continue
            seen.add(key)
            mesh = a.get("mesh")  # MeshSend's destination mesh, in its text form
            if isinstance(mesh, str):
                with contextlib.suppress(IRTypeError):  # the type rule reports a bad attribute
                    devs.update(parse_mesh_attr(mesh).devices)
            stack: list[object] = list(a.values())
            while stack:
                x = stack.pop()
                if isinstance(x, Device):
                    devs.add(x)
                elif isinstance(x, tuple):
                    stack.extend(x)
    return devs


def _callees(module: Module, fn: Function) -> list[str]:
    """Names of the functions ``fn`` reaches through calls."""
    seen: dict[str, None] = {}
    if Call not in set(map(type, fn.body)):
        return []
    stack = [c.callee for c in fn.calls()]
    while stack:
        name = stack.pop()
        if name not in seen and name in module:
            seen[name] = None
            stack.extend(c.callee for c in module[name].calls())
    return list(seen)


def _run(
    plan: FnPlan,
    domain: PlanDomain,
    cluster: Cluster,
    dmap: DeviceMap,
    trace: bool,
    batch: int | None,
    traced: frozenset[int] | None = None,
) -> SimResult:
    """The timing loop's figures; with ``trace``, the slices and memory timeline of the
    ``traced`` GPUs (None: every GPU)."""
    slot_gpu = domain.slot_gpu
    n_slots = len(slot_gpu)
    gpus = sorted(set(slot_gpu))
    clock = [0.0] * n_slots
    busy = [0.0] * n_slots
    commt = [0.0] * n_slots
    live = {g: 0.0 for g in gpus}
    for p in plan.fn.params:
        assert p.type is not None
        for g, b in domain.units.bytes_by_gpu(p.type):
            live[g] += b
    params = dict(live)
    peak = dict(live)
    slices: list[TraceSlice] | None = [] if trace else None
    timeline: dict[int, list[tuple[float, float]]] | None = (
        {g: [(0.0, live[g])] for g in gpus} if trace else None
    )
    if trace:
        _run_traced(plan, clock, busy, commt, live, peak, slices, timeline)
    else:  # live bytes and peaks in lists indexed by GPU (memory figure): no hashing per event
        size = max(gpus, default=-1) + 1
        live_l, peak_l = [0.0] * size, [0.0] * size
        for g in gpus:
            live_l[g], peak_l[g] = live[g], peak[g]
        if plan.columns is not None:
            _run_kinds(plan.columns, clock, busy, commt)
            peaks(plan.columns.mem, live_l, peak_l)
        else:
            _run_fast(plan, clock, busy, commt, live_l, peak_l)
        live, peak = {g: live_l[g] for g in gpus}, {g: peak_l[g] for g in gpus}
    units = domain.units.units
    if units is not None:  # units of a DTensor program: back to slots, memory figures to GPUs
        unit_of = [0] * len(dmap.slots)
        for u, members in enumerate(units):
            for j in members:
                unit_of[j] = u
        clock, busy, commt = ([xs[u] for u in unit_of] for xs in (clock, busy, commt))
        figure = domain.units.gpu_figure
        peak, params = ({g: xs[f] for g, f in figure.items()} for xs in (peak, params))
        if slices is not None:
            shown = [[j for j in us if traced is None or dmap.slots[j].gpu in traced] for us in units]
            slices = [(nm, t0, t1, j, cm) for nm, t0, t1, u, cm in slices for j in shown[u]]
        if timeline is not None:  # GPUs that hold alike share their figure's samples
            timeline = {g: timeline[f] for g, f in figure.items() if traced is None or g in traced}
        gpus = sorted(figure)
    elif traced is not None and slices is not None and timeline is not None:
        slices = [x for x in slices if dmap.slots[x[3]].gpu in traced]
        timeline = {g: xs for g, xs in timeline.items() if g in traced}
    if plan.columns is not None:  # a compact flat plan: op records by index, no calls
        n_ops = len(plan.columns.kinds)
        flops = sum(map([rec.flops for rec in plan.columns.table].__getitem__, plan.columns.kinds))
    else:
        costs = plan.costs
        calls = compress(costs, map(is_not, map(type, costs), repeat(float)))
        summaries = cast(list[CallSummary], list(calls))
        n_ops = len(costs) - len(summaries) + sum(c.n_ops for c in summaries)
        flops = sum(plan.flops)
    figures = _Figures(clock, busy, commt, peak, params, flops, n_ops)
    return _result(plan.fn, cluster, dmap, gpus, figures, batch, slices, timeline)


class _Figures(NamedTuple):
    """What a planner's run gives per real slot and GPU: clocks at the end, busy and
    communication seconds, the tensors' peak and the entry's parameters' bytes, FLOPs, ops."""

    clock: list[float]
    busy: list[float]
    comm: list[float]
    peak: dict[int, float]
    params: dict[int, float]
    flops: float
    n_ops: int


def _result(
    fn: Function,
    cluster: Cluster,
    dmap: DeviceMap,
    gpus: list[int],
    f: _Figures,
    batch: int | None,
    slices: list[TraceSlice] | None,
    timeline: dict[int, list[tuple[float, float]]] | None,
) -> SimResult:
    """A run's figures as a ``SimResult``: with the runtime memory, capacities and peak FLOP/s."""
    on_slot: dict[Slot, list[Device]] = {slot: [] for slot in dmap.slots}
    for dev, slot in dmap.mapping.items():
        on_slot[slot].append(dev)
    slot_devices = tuple(tuple(sorted(on_slot[slot])) for slot in dmap.slots)
    specs = {g: cluster.device_spec(g) for g in gpus}  # each looked up once
    runtime = {g: specs[g].runtime.overhead(f.peak[g]) for g in gpus}
    return SimResult(
        step_time_s=max(f.clock) if f.clock else 0.0,
        slots=dmap.slots,
        slot_devices=slot_devices,
        busy_s=f.busy,
        comm_s=f.comm,
        peak_memory={g: f.peak[g] + runtime[g] for g in gpus},
        param_memory=f.params,
        capacity={g: float(specs[g].memory_bytes) for g in gpus},
        flops=f.flops,
        n_ops=f.n_ops,
        peak_flops=_peak_flops(fn, [specs[g] for g in gpus]),
        batch=batch,
        slices=slices,
        memory_timeline=timeline,
        cluster=cluster,
        runtime_memory=runtime,
        host_memory=host_params(fn, dmap),
    )


def check_hosts(cluster: Cluster, dmap: DeviceMap | None) -> None:
    """``HostError`` when ``dmap`` puts program devices on the host (``HOST_STREAM``: an
    offloaded optimizer) of a GPU whose node type describes none."""
    if dmap is None:
        return
    for g in sorted({s.gpu for s in dmap.slots if s.stream == HOST_STREAM}):
        if g < cluster.num_devices and (node := cluster.nodes[cluster.node_of(g)]).host is None:
            raise HostError(
                f"node type {node.name!r} describes no host (CPUs, host memory, PCIe links) for an "
                "offloaded optimizer: use a preset with one (ndm-a100-v4) or a node type with a host"
            )


def _leaf_types(t: Type | None) -> list[Type]:
    if t is None:
        return []
    return [x for e in t.elements for x in _leaf_types(e)] if isinstance(t, TupleType) else [t]


def host_params(fn: Function, dmap: DeviceMap) -> dict[int, float]:
    """Per GPU, the bytes of ``fn``'s parameters on its host (``HOST_STREAM``): an offloaded
    optimizer's fp32 masters and state, the whole step long in host memory."""
    host = {d: s.gpu for d, s in dmap.mapping.items() if s.stream == HOST_STREAM}
    out: dict[int, float] = {}
    if not host:
        return out
    for p in fn.params:
        for t in _leaf_types(p.type):
            if isinstance(t, DTensorType):
                for i, d in enumerate(t.mesh.devices):
                    if d in host:
                        out[host[d]] = out.get(host[d], 0.0) + piece_bytes(t, i)
            elif isinstance(t, TensorType) and t.device in host:
                out[host[t.device]] = out.get(host[t.device], 0.0) + float(t.nbytes)
    return out


def _run_traced(
    plan: FnPlan,
    clock: list[float],
    busy: list[float],
    commt: list[float],
    live: dict[int, float],
    peak: dict[int, float],
    slices: list[TraceSlice] | None,
    timeline: dict[int, list[tuple[float, float]]] | None,
) -> None:
    """The timing loop, recording trace slices and the memory timeline."""
    names = plan.names
    stalls = plan.stall
    waits = plan.waits
    for i, (ds, c, is_comm, ev) in enumerate(zip(plan.devs, plan.costs, plan.comm, plan.mem, strict=True)):
        if type(c) is float:
            if waits is not None and waits[i] and ds:  # an ``event`` hand-over (``OpRecord.waits``)
                s = max([clock[d] for d in (*ds, *waits[i])])
                e = s + c
                for d in ds:
                    clock[d] = e
                    (commt if is_comm else busy)[d] += c
            elif len(ds) == 1:
                d = ds[0]
                s = clock[d]
                e = clock[d] = s + c
                if is_comm:
                    commt[d] += c
                else:
                    busy[d] += c
            else:
                s = max([clock[d] for d in ds]) if ds else 0.0
                e = s + c
                for d in ds:
                    clock[d] = e
                    if is_comm:
                        commt[d] += c
                    else:
                        busy[d] += c
            if slices is not None:
                slices.extend((names[i], s, e, d, is_comm) for d in ds)
            if stalls is not None and stalls[i]:
                apply_stall(stalls[i], clock, busy)
        else:
            assert isinstance(c, CallSummary)
            sub = c.slots
            ins = [clock[j] for j in sub]
            m = len(sub)
            if m == 0:  # a callee that runs nothing (it only passes values through)
                e = max(clock) if clock else 0.0
                new = []
            elif m == 1:
                e = ins[0] + c.delay[0][0]
                new = [e]
            else:
                new = [max([ins[a] + c.delay[a][b] for a in range(m)]) for b in range(m)]
                e = max(new)
            for b, j in enumerate(sub):
                if slices is not None:
                    start = max([ins[a] + c.first[a][b] for a in range(m)])
                    slices.append((names[i], start, new[b], j, False))
                clock[j] = new[b]
                busy[j] += c.busy[b]
                commt[j] += c.comm[b]
        if ev is not None:
            pk, al, fr = ev
            for g, nb in pk:
                v = live[g] + nb
                if v > peak[g]:
                    peak[g] = v
            for g, nb in al:
                live[g] += nb
            for g, nb in fr:
                live[g] -= nb
            if timeline is not None:
                for g in {g for g, _ in (*pk, *al, *fr)}:
                    timeline[g].append((e, live[g]))


def _run_fast(
    plan: FnPlan,
    clock: list[float],
    busy: list[float],
    commt: list[float],
    live: list[float],
    peak: list[float],
) -> None:
    """The timing loop without a trace: the same semantics as ``_run_traced``, fewer branches
    (a search runs it once per candidate program)."""
    if plan.stall is not None or plan.waits is not None:
        _run_fast_stalled(plan, clock, busy, commt, live, peak)
        return
    for ds, c, is_comm, ev in zip(plan.devs, plan.costs, plan.comm, plan.mem, strict=True):
        if type(c) is float:
            if len(ds) == 1:
                d = ds[0]
                clock[d] += c
                if is_comm:
                    commt[d] += c
                else:
                    busy[d] += c
            elif ds:
                e = max([clock[d] for d in ds]) + c
                acc = commt if is_comm else busy
                for d in ds:
                    clock[d] = e
                    acc[d] += c
        else:
            _apply_summary(c, clock, busy, commt)  # type: ignore[arg-type]
        if ev is not None:
            pk, al, fr = ev
            for g, b in pk:
                v = live[g] + b
                if v > peak[g]:
                    peak[g] = v
            for g, b in al:
                live[g] += b
            for g, b in fr:
                live[g] -= b


def _run_fast_stalled(
    plan: FnPlan,
    clock: list[float],
    busy: list[float],
    commt: list[float],
    live: list[float],
    peak: list[float],
) -> None:
    """``_run_fast`` of a plan whose collectives stall the compute beside them
    (``distir.sim.interference``): each op's stall applied after it; or whose ops wait for clocks
    they do not occupy (``OpRecord.waits``)."""
    none = repeat((), len(plan.devs))
    stalls = plan.stall if plan.stall is not None else none
    waits = plan.waits if plan.waits is not None else none
    for ds, c, is_comm, ev, held, after in zip(
        plan.devs, plan.costs, plan.comm, plan.mem, stalls, waits, strict=True
    ):
        if type(c) is float:
            if ds:
                e = max([clock[d] for d in (*ds, *after)] if after else [clock[d] for d in ds]) + c
                acc = commt if is_comm else busy
                for d in ds:
                    clock[d] = e
                    acc[d] += c
            if held:
                apply_stall(held, clock, busy)
        else:
            _apply_summary(c, clock, busy, commt)
        if ev is not None:
            pk, al, fr = ev
            for g, b in pk:
                v = live[g] + b
                if v > peak[g]:
                    peak[g] = v
            for g, b in al:
                live[g] += b
            for g, b in fr:
                live[g] -= b


def _run_kinds(cols: FlatColumns, clock: list[float], busy: list[float], commt: list[float]) -> None:
    """``_run_fast``'s timing for a compact flat plan (memory runs apart, in bulk): the same
    additions in the same order, with each distinct record's slots and cost unpacked once."""
    steps = [
        (d0, c, commt if is_comm else busy, ds, rec.stall, rec.waits)
        for rec in cols.table
        for d0 in [rec.devs[0] if len(rec.devs) == 1 and not rec.waits else -1]
        for ds, c, is_comm in [rec[:3]]
    ]
    stalled = any(st[4] for st in steps)  # a collective slows the compute beside it
    for k in cols.kinds:
        d, c, acc, ds, held, after = steps[k]
        if d >= 0:
            clock[d] += c
            acc[d] += c
        elif ds:
            e = max([clock[x] for x in (*ds, *after)] if after else [clock[x] for x in ds]) + c
            for x in ds:
                clock[x] = e
                acc[x] += c
        if stalled and held:
            apply_stall(held, clock, busy)


def _apply_summary(c: CallSummary, clock: list[float], busy: list[float], commt: list[float]) -> None:
    """Advance the clocks of a call's slots by its summary (max-plus)."""
    sub = c.slots
    m = len(sub)
    if m == 1:
        j = sub[0]
        clock[j] += c.delay[0][0]
        busy[j] += c.busy[0]
        commt[j] += c.comm[0]
        return
    ins = [clock[j] for j in sub]
    delay = c.delay
    for b, j in enumerate(sub):
        clock[j] = max([ins[a] + delay[a][b] for a in range(m)])
        busy[j] += c.busy[b]
        commt[j] += c.comm[b]


def _peak_flops(fn: Function, specs: list[DeviceSpec]) -> float:
    """The peak FLOP/s of the GPUs of ``specs`` (in order) in the program's compute dtype."""
    from distir.ir.dtensor import DTensorType
    from distir.ir.types import DType, TensorType

    dtype = DType.f32
    for p in fn.params:
        if isinstance(p.type, TensorType | DTensorType) and p.type.dtype.is_float:
            dtype = p.type.dtype
            break
    # mixed precision: fp32 master parameters, cast to the compute dtype in the entry
    for op in fn.ops():
        to = op.attrs.get("to") if op.name == CAST.name else None
        if isinstance(to, DType) and to.is_float and to.itemsize < dtype.itemsize:
            dtype = to
    return sum(spec.peak_flops(dtype) for spec in specs)
