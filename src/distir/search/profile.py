"""Per-layer costs for the analytic screen, measured by the simulator on single layers.

A ``LayerProfile`` is what one layer call of the model costs on one device of a tensor-parallel
group of ``t`` GPUs, for one microbatch of ``b`` samples per data-parallel replica: forward and
backward time (compute and the layer's own TP collectives), the bytes it keeps between its
forward and backward (activation memory per microbatch in flight: each piece of storage once, as
the simulator counts it), its weights' bytes and the activation it hands to the next layer (the
pipeline transfer when a stage boundary falls after it), and its working sets: the forward's
above what it leaves, the backward's above what is live when it starts with the arguments that
die in it in ``distribute``'s program freed at their last use (input, residuals, incoming
gradient; for ZeRO-3 the gathered weights too; the zero-bubble input-gradient part's likewise).

The numbers come from the same layer functions ``distribute`` uses (``sharded_layers`` on the
model's distinct layers, ``distinct_layers``: one differentiation, one propagation per (t, b)),
each simulated alone on a real group of GPUs of the cluster — so the screen and the exact
simulation share one cost model, and the screen's error is only in how it *composes* layers
(the pipeline formula), never in what a layer costs.
A profiler runs one trainer's form (``TrainerForm``: its kernels, attention kernel and model by
tensor-parallel degree; distir's trainer-neutral one by default), in its cost model and in the
layers it shards. Profiles are memoized per (t, b, recompute, sequence parallelism, kind of the
TP group): a search over thousands of strategies profiles each distinct layer a few dozen times. The probes
of one layer function share its plan (``SharedPlans``), and all probes on one TP group share op
records (``SharedRecords``: the forward, backward and input-gradient parts of a layer, with and
without sequence parallelism, under each recomputation, have most ops in common) — the same
figures as probes planned anew (``share_plans=False``, tested); a probe's figures are worked out
from the layer call's summary (``distir.sim.probe``) instead of planning and running the
one-call program (``fast_probes=False`` simulates it, tested equal), all those of one key on one
TP group on one planning domain, its units assumed once (``distir.sim.probe.GroupPlans``;
``one_domain=False`` gives each function its own, tested equal). The memory-only probes (what a
forward leaves, what an input-gradient pass carries, the ZeRO-3 backward's working set) are not
repeated on a TP group of another device kind alike in arrangement and runtime memory: the
simulator's memory follows types and liveness in program order, never costs, so they give the
first kind's figures bit for bit (``Profiler._memory_key``; ``share_kinds=False`` probes every
kind anew, tested).
``Profiler.prefetch`` hands profiles the search will need to worker processes
(``run_profile_task``: the same code on the same model and cluster, so the same figures),
``layers`` then takes their results.

Why each microbatch size b is differentiated and sharded anew rather than the functions of one b
retyped: they are not batch-polymorphic. Differentiation bakes the batch into the backward's
reshapes, and propagation's choices depend on the shapes (divisibility, the size-1 batch, the
cheaper of two redistributions: e.g. an MLP layer with full recomputation shards its backward
differently at b = 64 than at b = 8), so a retyped function can cost other than ``distribute``'s.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from distir.autodiff.precision import MIXED
from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import ModelSpec, build_from, parse_model_string, with_options
from distir.hardware.cluster import Cluster
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Placement, Shard
from distir.ir.function import Function, Module
from distir.ir.types import Device, DType, TensorType, Type
from distir.ops.registry import REGISTRY
from distir.parallel.distribute import ShardedLayer, sharded_layers
from distir.parallel.layer_sharder import split_backward, unsharded_layers
from distir.parallel.pipeline.partition import Ends, ends
from distir.parallel.strategy import Strategy
from distir.parallel.trainers import model_options, trainer_attention, trainer_kernels
from distir.search.distinct import Reduced, distinct_layers
from distir.search.executor import TASK_LOST
from distir.sim.cost import CostModel, RooflineCostModel, gpu_class
from distir.sim.devices import DeviceMap, Slot
from distir.sim.probe import GroupPlans, ProbeResult, probe
from distir.sim.simulate import SharedPlans, SharedRecords, SimResult, simulate
from distir.sim.units import piece_bytes

# op records the probes of one profiler share (``SharedRecords``) before it starts a new store:
# AMP's searches keep 1,500-3,700, a record a few hundred bytes
RECORDS_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class TrainerForm:
    """How a trainer runs the layers (``distir.parallel.trainers``): its ``kernels`` (``fused`` or
    ``eager``: the cost model's, ``RooflineCostModel.of_kernels``, and eager selective
    checkpointing's caching, ``distribute(sac_eager=True)``), its ``attention_kernel``, and the
    model it runs under tensor parallelism when that differs from the profiler's ``spec``
    (``spec_tp``: torchtitan's loss form changes with t; None: the same model at every t).
    The default is distir's trainer-neutral program."""

    kernels: str = "fused"
    attention_kernel: str = "fa2"
    spec_tp: ModelSpec | None = None

    def spec_at(self, spec: ModelSpec, t: int) -> ModelSpec:
        """The model run at tensor parallelism ``t``: ``spec`` (``spec_tp`` when t > 1 and set)."""
        return self.spec_tp if t > 1 and self.spec_tp is not None else spec

    def policy(self, recompute: str) -> str:
        """The recompute policy the layers are differentiated under: ``ops-eager`` for ``ops``
        run by eager kernels (eager selective checkpointing caches what it saves), else
        ``recompute``."""
        return "ops-eager" if self.kernels == "eager" and recompute == "ops" else recompute


def trainer_form(
    model: str, trainer: str, cluster: Cluster, tp: tuple[tuple[str, Placement], ...] = ()
) -> tuple[ModelSpec, TrainerForm]:
    """The model ``trainer`` runs at t = 1 (model string ``model`` with the trainer's options,
    ``model_options``, and the placements ``tp`` replacing the declared ones) and how it runs the
    layers on ``cluster`` (``TrainerForm``: its kernels, its attention kernel on the first node's
    GPUs, its model under tensor parallelism)."""
    if trainer == "distir":
        return replace(parse_model_string(model), tp=tp), TrainerForm()
    kernels = trainer_kernels(trainer)
    one, many = (
        replace(
            parse_model_string(with_options(model, model_options(trainer, Strategy(t=t), kernels))), tp=tp
        )
        for t in (1, 2)
    )
    attention = trainer_attention(trainer, cluster.nodes[0].device)
    return one, TrainerForm(kernels, attention, None if many == one else many)


class Wanted(NamedTuple):
    """A profile ``Profiler.prefetch`` is to compute: ``layers(t, b, gpus, recompute, sp)``."""

    t: int
    b: int
    recompute: str
    gpus: Sequence[int]
    sp: bool = False


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """One layer call on one device of its TP group, per microbatch (module docstring)."""

    fwd_s: float
    bwd_s: float  # 0 for inference
    flops: float  # forward + backward FLOPs on this device
    weight_bytes: float  # this device's share of the layer's weights
    n_weights: int
    saved_bytes: float  # kept from forward to backward, per microbatch
    out_bytes: float  # the activation leaving the layer, per device
    # transient memory while the forward or backward runs, above its arguments and, for the
    # forward, above what it leaves (its result and residuals, counted as activations)
    work_bytes: float
    # held from the input-gradient pass to the weight-gradient pass of a zero-bubble schedule
    carried_bytes: float = 0.0
    largest_weight_bytes: float = 0.0  # this device's share of the layer's largest weight
    fwd_work_bytes: float = 0.0  # ``work_bytes`` of the forward alone
    bwd_work_bytes: float = 0.0  # ``work_bytes`` of the backward alone
    ibwd_work_bytes: float = 0.0  # ``bwd_work_bytes`` of a zero-bubble input-gradient pass
    zbwd_work_bytes: float = 0.0  # ``bwd_work_bytes`` with its (ZeRO-3 gathered) weights dying too
    ibwd_s: float = 0.0  # the zero-bubble input-gradient pass's time (the part ZeRO-3's gathers overlap)
    # this device's bytes of the weight gradients the backward leaves pending over tp (sequence
    # parallelism: summed over tp once per step, ``LayerSharder``)
    tp_pending_bytes: float = 0.0

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s


def local_nbytes(t: Type) -> float:
    """Bytes of one device's part of ``t`` (the first device's piece of a DTensor)."""
    if isinstance(t, DTensorType):
        return piece_bytes(t, 0)
    if isinstance(t, TensorType):
        return float(t.nbytes)
    return 0.0


def _probe(
    fn: Function, args: Sequence[Type], dying: frozenset[int] = frozenset(), keep: Sequence[int] | None = None
) -> Module:
    """A module whose entry calls ``fn`` once on typed arguments, the arguments at positions
    ``dying`` donated (freed at their last use inside, as a chunk's backward frees a layer's
    residuals), returning the results at positions ``keep`` (default: all)."""
    fb = FunctionBuilder("probe", REGISTRY.out_arity)
    params = [fb.param(f"a{i}", t, donated=i in dying) for i, t in enumerate(args)]
    outs = fb.call(fn, *params, n_out=len(fn.outputs))
    return Module((fn, fb.ret(*(outs if keep is None else [outs[j] for j in keep]))))


def _final_memory(r: SimResult) -> dict[int, float]:
    """Each GPU's live bytes at the end of a traced simulation (its memory timeline's last point)."""
    assert r.memory_timeline is not None
    return {g: tl[-1][1] for g, tl in r.memory_timeline.items()}


def _pattern(xs: Sequence[Hashable]) -> tuple[int, ...]:
    """Which positions of ``xs`` hold equal items: each item as the index of its first kind."""
    first = {x: i for i, x in enumerate(dict.fromkeys(xs))}
    return tuple(first[x] for x in xs)


def _dying(L: ShardedLayer, weights: bool = False) -> frozenset[int]:
    """The positions of ``L.bwd``'s arguments that die in it in ``distribute``'s program: the
    layer's input and residuals (saved for this backward alone) and the incoming gradient; its
    weights too with ``weights`` (ZeRO-3 gathers them for this backward); the model inputs it
    reads (labels) stay."""
    assert L.vjp is not None
    n = len(L.vjp.bwd_params)
    ws = set(range(1, 1 + len(L.weights))) if weights else set()
    own = [j for j, p in enumerate(L.vjp.bwd_params) if p == 0 or p in ws]
    return frozenset(own + list(range(n, len(L.bwd_args))))


@dataclass
class Profiler:
    """Layer profiles of one model on one cluster, memoized (module docstring)."""

    spec: ModelSpec
    cluster: Cluster
    dtype: DType = DType.f32
    train: bool = True
    cost_model: CostModel | None = None
    mixed: bool = False  # mixed precision: the loss layer casts to fp32 (``Precision.prepare``)
    form: TrainerForm = field(default_factory=TrainerForm)  # the trainer's kernels and model by t
    # the probes of one layer function share its plan (``SharedPlans``: the same figures; False
    # plans every probe anew, the reference the tests compare with)
    share_plans: bool = True
    # without ``cost_model``: the simulator's, pairing tensor-parallel collectives with their GEMMs
    # as Megatron-LM's ``--tp-comm-overlap`` runs them (``RooflineCostModel.tp_comm_overlap``) —
    # with sequence parallelism, which Megatron-LM requires for it (``arguments.py`` asserts it)
    tp_comm_overlap: bool = False
    # the memory-only probes (``_kept``, the ZeRO-3 backward's working set) of a TP group of
    # another device kind take the figures the first kind's gave (``_memory_key``: memory does not
    # depend on costs); False probes every kind anew, the reference the tests compare with
    share_kinds: bool = True
    # the probes' figures from the call's summary (``distir.sim.probe``: the same figures; False
    # simulates each probe program, the reference the tests compare with); with ``share_plans``
    fast_probes: bool = True
    # the fast probes of one layers key on one TP group plan on one domain, its units assumed once
    # (``distir.sim.probe.GroupPlans``: the same figures; False: a domain per function and
    # arguments, the reference the tests compare with)
    one_domain: bool = True
    _cache: dict[tuple[object, ...], list[LayerProfile]] = field(default_factory=dict)
    _fn_cache: dict[tuple[object, ...], tuple[float, float]] = field(default_factory=dict)
    _work: dict[tuple[object, ...], float] = field(default_factory=dict)
    _layers: dict[tuple[int, int, str, bool], list[ShardedLayer]] = field(default_factory=dict)
    # (id of a layer's backward, its inputs with a gradient, argument types) -> (that backward,
    # kept alive so its id stays valid; its input-gradient part): layers sharing a backward share
    # the part, so their probes are one whatever ``split_backward``'s bounded memo still holds
    _split: dict[tuple[object, ...], tuple[Function, Function]] = field(default_factory=dict)
    _models: dict[tuple[int, ModelSpec], Reduced] = field(default_factory=dict)
    _pending: dict[tuple[object, ...], Future[TaskResult]] = field(default_factory=dict)
    _shared: SharedPlans = field(default_factory=SharedPlans)  # ``layers``' current key's
    _group: GroupPlans | None = None  # ``layers``' current key's (``one_domain``)
    _records: SharedRecords = field(default_factory=SharedRecords)  # every key's (``_domain``)
    _domains: dict[tuple[tuple[int, ...], bool], tuple[DeviceMap, CostModel]] = field(default_factory=dict)
    probes: int = 0  # layer simulations run (for benches), by workers too
    worker_cpu_s: float = 0.0  # CPU seconds workers spent on the profiles taken from them
    cpu_s: float = 0.0  # CPU seconds this process spent computing profiles (``layers``), sharding included
    shard_cpu_s: float = 0.0  # of which differentiating and sharding layers (``sharded``)

    def group_key(self, gpus: Sequence[int]) -> tuple[object, ...]:
        """GPUs that cost alike: same node types, in the same arrangement over nodes."""
        nodes = [self.cluster.node_of(g) for g in gpus]
        first = {n: i for i, n in enumerate(dict.fromkeys(nodes))}
        return tuple((self.cluster.nodes[n].name, first[n]) for n in nodes)

    def _memory_key(
        self, t: int, b: int, recompute: str, sp: bool, gpus: Sequence[int], cost: CostModel
    ) -> tuple[object, ...]:
        """What the memory figures of a probe on the TP group ``gpus`` (costed by ``cost``) depend
        on besides the probe: the profile's key with the group's kinds replaced by their pattern
        (which positions share a node, a kind, a class of ``cost``: the simulator's units) and each
        GPU's runtime memory. The simulator's memory events follow the program's types and
        liveness in program order, never its costs (``distir.sim.plan``), and a figure subtracts
        the runtime memory it added (``Profiler._run``): groups alike in all of this have the same
        figures, bit for bit, whatever their GPUs' speed. Without ``share_kinds``, the profile's
        own key (nothing shared across kinds)."""
        if not self.share_kinds:
            return ("mem", t, b, recompute, sp, self.group_key(gpus))
        nodes = _pattern([self.cluster.node_of(g) for g in gpus])
        kinds = _pattern([self.cluster.kind_of(g) for g in gpus])
        classes = _pattern([gpu_class(cost, g) for g in gpus])
        runtime = tuple(self.cluster.device_spec(g).runtime for g in gpus)
        return ("mem", t, b, recompute, sp, nodes, kinds, classes, runtime)

    def model(self, b: int, t: int = 1) -> Reduced:
        """The model run at tensor parallelism ``t`` (``TrainerForm.spec_at``) at microbatch ``b``
        with its repeated layers dropped (``distinct_layers``)."""
        spec = self.form.spec_at(self.spec, t)
        got = self._models.get((b, spec))
        if got is None:
            model = unit_model(spec, self.dtype) if b == 1 else build_from(spec, b, self.dtype)
            if self.mixed and self.train:  # the program distribute builds: the loss in fp32
                model = MIXED.prepare(model)
            got = self._models[(b, spec)] = distinct_layers(model)
        return got

    def sharded(self, t: int, b: int, recompute: str, sp: bool = False) -> list[ShardedLayer]:
        """The distinct layers of ``model(b)``, differentiated and sharded as ``distribute`` does
        (``sp``: with sequence parallelism, t > 1)."""
        key = (t, b, recompute, sp)
        got = self._layers.get(key)
        if got is None:
            c0 = time.process_time()
            model = self.model(b, t).model
            policy = self.form.policy(recompute)
            if t == 1:  # the same costs without sharding on a one-device mesh (``unsharded_layers``)
                got = unsharded_layers(model, policy, self.train)
            else:
                got = sharded_layers(model, 1, t, recompute, self.train, sp=sp, policy=policy)
            self._layers[key] = got
            self.shard_cpu_s += time.process_time() - c0
        return got

    def layers(
        self, t: int, b: int, gpus: Sequence[int], recompute: str = "none", sp: bool = False
    ) -> list[LayerProfile]:
        """Profiles of every layer call for microbatch ``b`` per replica on the TP group ``gpus``
        (``len(gpus) == t``). Raises the sharding/model errors of ``sharded_layers``.

        A repeated layer shares the profile of the call standing for it (``distinct_layers``):
        the list has one entry per layer call of the full model, repeats being the same object."""
        key = (t, b, recompute, sp, self.group_key(gpus))
        got = self._cache.get(key)
        if got is None and key in self._pending:
            got = self._collect(key)
        if got is not None:
            return got
        c0 = time.process_time()
        got = self._cache[key] = self._profile(t, b, gpus, recompute, sp, key)
        self.cpu_s += time.process_time() - c0
        return got

    def _profile(
        self, t: int, b: int, gpus: Sequence[int], recompute: str, sp: bool, key: tuple[object, ...]
    ) -> list[LayerProfile]:
        """``layers``' profiles of ``key``, computed here."""
        layers = self.sharded(t, b, recompute, sp)
        reduced = self.model(b, t)
        model = reduced.model
        dmap, cost = self._domain(gpus, sp)
        mkey = self._memory_key(t, b, recompute, sp, gpus, cost)
        # the probes of one layer function share its plan; only this key's are kept, so the plans
        # of a long search do not pile up. Op records are shared by every probe on this TP group
        # (``SharedRecords``, up to ``RECORDS_KEPT`` of them)
        if self._records.size > RECORDS_KEPT:
            self._records = SharedRecords()
        # (a probe calls one layer function on one mesh: nothing to carry to another mesh)
        self._shared = SharedPlans(self._records, relabel=False)
        self._group = GroupPlans(self._shared) if self.one_domain else None
        distinct: list[LayerProfile] = []
        for i, L in enumerate(layers):
            fwd = self._run(L.fwd, L.fwd_args, dmap, cost, key)
            bwd = (0.0, 0.0, 0.0)
            i_time = i_work = carried = z_work = 0.0
            if L.bwd is not None and L.vjp is not None:
                bwd = self._run(L.bwd, L.bwd_args, dmap, cost, key, _dying(L))
                # ZeRO-3: the gathered weights die in the backward too
                z_work = self._work_of(L.bwd, L.bwd_args, dmap, cost, key, mkey, _dying(L, weights=True))
                i_time, i_work, carried = self._input_pass(L, dmap, cost, key, mkey)
            saved = made = 0.0
            if L.vjp is not None:
                n_first = sum(1 for j in L.vjp.bwd_params if j == 0)
                res = list(L.bwd_args[:n_first]) if 0 in L.vjp.bwd_params else []
                # the residuals' storage: one that views another (or an argument) counts once
                n_out = L.vjp.n_outputs
                res_at = range(n_out, n_out + L.vjp.n_residuals)
                made = self._kept(L.fwd, L.fwd_args, res_at, dmap, cost, mkey)
                saved = sum(local_nbytes(r) for r in res) + made
                if not res and L.fwd_args and L.vjp.n_residuals:
                    # a residual viewing the input keeps its storage, which the backward does
                    # not take as such (a loss's reshaped logits): the input freed at its last
                    # use, the storage the residuals hold beyond it counts too
                    with_input = self._kept(L.fwd, L.fwd_args, res_at, dmap, cost, mkey, frozenset({0}))
                    saved += with_input - made
            # a kept layer's result has the type its dropped repeats hand on (distinct_layers)
            nxt = layers[i + 1].fwd_args[0] if i + 1 < len(layers) else None
            made += local_nbytes(nxt) if nxt is not None and self.train else 0.0
            shares = [
                model.weight(w.name).type.nbytes / (t if isinstance(model.weight(w.name).tp, Shard) else 1)
                for w in L.weights
            ]
            wbytes = sum(shares, 0.0)
            distinct.append(
                LayerProfile(
                    fwd_s=fwd[0],
                    bwd_s=bwd[0],
                    flops=fwd[1] + bwd[1],
                    weight_bytes=wbytes,
                    n_weights=len(L.weights),
                    saved_bytes=saved,
                    out_bytes=local_nbytes(nxt) if nxt is not None else 0.0,
                    # the forward's peak less what it leaves (its result and residuals, counted
                    # as activations in flight); the backward's above what is live when it
                    # starts, its input, residuals and incoming gradient freed as they die
                    work_bytes=max(fwd[2] - made, bwd[2], 0.0),
                    fwd_work_bytes=max(fwd[2] - made, 0.0),
                    bwd_work_bytes=bwd[2],
                    carried_bytes=carried,
                    largest_weight_bytes=max(shares, default=0.0),
                    ibwd_work_bytes=i_work,
                    zbwd_work_bytes=z_work,
                    ibwd_s=i_time,
                    tp_pending_bytes=sum((b for b, p in zip(shares, L.tp_pending, strict=True) if p), 0.0)
                    if L.tp_pending
                    else 0.0,
                )
            )
        return [distinct[r] for r in reduced.rep[: len(reduced.rep) - (0 if self.train else 1)]]

    # -- profiles computed by worker processes --------------------------------------------------
    def prefetch(self, pool: Executor, wanted: Iterable[Wanted]) -> int:
        """Start computing ``layers(t, b, gpus, recompute, sp)`` for each ``Wanted`` of
        ``wanted`` in ``pool`` (processes: a task is a ``ProfileTask``), in that order; ``layers``
        then waits for and takes the result. What is known or pending already is skipped; the TP
        group kinds of one (t, b, recompute, sp) go to one task (one sharding serves them all). If a
        task fails, ``layers`` computes its profiles here (raising what that raises). Returns the
        number of tasks submitted."""
        jobs: dict[tuple[int, int, str, bool], dict[tuple[object, ...], tuple[int, ...]]] = {}
        for t, b, recompute, gpus, sp in wanted:
            key = (t, b, recompute, sp, self.group_key(gpus))
            if key not in self._cache and key not in self._pending:
                jobs.setdefault((t, b, recompute, sp), {}).setdefault(key, tuple(gpus))
        # the tasks of one microbatch size go to one worker together: they share the model and
        # its differentiation, and their probes on one TP group share op records (``SharedRecords``)
        by_b: dict[int, list[tuple[ProfileTask, Iterable[tuple[object, ...]]]]] = {}
        for (t, b, recompute, sp), groups in jobs.items():
            task = ProfileTask(
                self.spec,
                self.cluster,
                self.dtype,
                self.train,
                self.cost_model,
                t,
                b,
                recompute,
                tuple(groups.values()),
                self.mixed,
                sp,
                self.tp_comm_overlap,
                self.form,
            )
            by_b.setdefault(b, []).append((task, groups))
        for tasks in by_b.values():
            fut = pool.submit(run_profile_tasks, tuple(task for task, _ in tasks))
            for _, keys in tasks:
                for k in keys:
                    self._pending[k] = fut
        return len(by_b)

    def _collect(self, key: tuple[object, ...]) -> list[LayerProfile] | None:
        """The profiles of ``key`` from its pending task (None if the task failed)."""
        fut = self._pending.pop(key)
        try:
            results, probes, cpu = fut.result()
        except TASK_LOST:  # a dead worker or a stopped pool: ``layers`` computes it here
            return None
        for k, profiles in results:
            self._pending.pop(k, None)
            self._cache.setdefault(k, profiles)
        self.probes += probes
        self.worker_cpu_s += cpu
        return self._cache.get(key)

    def known(
        self, t: int, b: int, recompute: str, sp: bool = False
    ) -> dict[tuple[object, ...], list[LayerProfile]]:
        """The profiles computed so far for (t, b, recompute, sp), by group kind (for ``adopt``)."""
        return {k: v for k, v in self._cache.items() if k[:4] == (t, b, recompute, sp)}

    def adopt(self, profiles: dict[tuple[object, ...], list[LayerProfile]]) -> None:
        """Take profiles another profiler of the same model and cluster computed (``known``)."""
        for k, v in profiles.items():
            self._cache.setdefault(k, v)

    def _plans(self) -> SharedPlans | None:
        return self._shared if self.share_plans else None

    def _domain(self, gpus: Sequence[int], sp: bool) -> tuple[DeviceMap, CostModel]:
        """The device map of the TP group ``gpus`` and the cost model of its probes, the same
        objects for every key on that group (so ``SharedRecords`` shares their op records)."""
        overlap = self.tp_comm_overlap and sp
        key = (tuple(gpus), overlap)
        got = self._domains.get(key)
        if got is None:
            dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate(gpus)})
            got = self._domains[key] = (dmap, self.cost_model or self.default_cost(overlap))
        return got

    def default_cost(self, tp_comm_overlap: bool = False) -> RooflineCostModel:
        """The simulator's cost model of the trainer's kernels (``TrainerForm``), the profiles'
        without a ``cost_model``."""
        f = self.form
        return RooflineCostModel.of_kernels(self.cluster, f.kernels, f.attention_kernel, tp_comm_overlap)

    def _run(
        self,
        fn: Function,
        args: Sequence[Type],
        dmap: DeviceMap,
        cost: CostModel,
        key: tuple[object, ...],
        dying: frozenset[int] = frozenset(),
    ) -> tuple[float, float, float]:
        """(time, FLOPs per device, transient bytes) of one call of ``fn``: its peak above its
        arguments, those at positions ``dying`` freed after their last use inside (the others
        held throughout, as a chunk holds a layer's weights)."""
        k2 = (*key, fn, tuple(args), dying)  # fn by identity, kept alive
        got = self._fn_cache.get(k2)
        if got is not None:
            return (*got, self._work.get(k2, 0.0))
        r = self._simulate(fn, args, dmap, cost, dying)
        self.probes += 1
        n = len(dmap.mapping)
        # the tensors' transient peak (the runtime memory is the device's, not the layer's)
        work = max(
            (r.peak_memory[g] - r.runtime_memory.get(g, 0.0) - r.param_memory[g] for g in r.peak_memory),
            default=0.0,
        )
        self._fn_cache[k2] = (r.step_time_s, r.flops / max(n, 1))
        self._work[k2] = work
        return r.step_time_s, r.flops / max(n, 1), work

    def _work_of(
        self,
        fn: Function,
        args: Sequence[Type],
        dmap: DeviceMap,
        cost: CostModel,
        key: tuple[object, ...],
        mkey: tuple[object, ...],
        dying: frozenset[int] = frozenset(),
    ) -> float:
        """The transient bytes of ``_run`` alone (its time unused), shared by the TP groups of
        one ``_memory_key`` ``mkey``."""
        k2 = (*mkey, fn, tuple(args), "work", dying)  # fn by identity, kept alive
        got = self._work.get(k2)
        if got is None:
            got = self._work[k2] = self._run(fn, args, dmap, cost, key, dying)[2]
        return got

    def _kept(
        self,
        fn: Function,
        args: Sequence[Type],
        keep: range,
        dmap: DeviceMap,
        cost: CostModel,
        mkey: tuple[object, ...],
        dying: frozenset[int] = frozenset(),
    ) -> float:
        """Bytes one device holds for ``fn``'s results at positions ``keep`` beyond its
        arguments, those at positions ``dying`` freed unless a result uses them: each piece of
        storage once (a result that views another, or a held argument, adds nothing), as the
        simulator counts them — the memory timeline's last point after a call returning only
        them. Shared by the TP groups of one ``_memory_key`` ``mkey``."""
        k2 = (*mkey, fn, tuple(args), "kept", keep.start, keep.stop, dying)
        got = self._work.get(k2)
        if got is not None:
            return got
        if not keep:
            return 0.0
        r = self._simulate(fn, args, dmap, cost, dying, keep)
        self.probes += 1
        final = r.final_memory if isinstance(r, ProbeResult) else _final_memory(r)
        gone = sum(local_nbytes(args[j]) for j in dying)  # one device's share, as ``local_nbytes``
        got = self._work[k2] = max((final[g] - r.param_memory[g] + gone for g in final), default=0.0)
        return got

    def _simulate(
        self,
        fn: Function,
        args: Sequence[Type],
        dmap: DeviceMap,
        cost: CostModel,
        dying: frozenset[int],
        keep: Sequence[int] | None = None,
    ) -> SimResult | ProbeResult:
        """The simulation of ``_probe(fn, args, dying, keep)``: the probe's figures from the
        call's summary (``distir.sim.probe``) with ``fast_probes``, else (or where that does not
        apply) ``simulate``'s, traced when ``keep`` asks for what a call leaves."""
        shared = self._plans()
        if self.fast_probes and shared is not None:
            got = probe(shared, fn, args, self.cluster, dmap, cost, dying, keep, self._group)
            if got is not None:
                return got
        module = _probe(fn, args, dying, keep)
        return simulate(module, self.cluster, dmap, cost, trace=keep is not None, shared=shared)

    def _input_pass(
        self,
        L: ShardedLayer,
        dmap: DeviceMap,
        cost: CostModel,
        key: tuple[object, ...],
        mkey: tuple[object, ...],
    ) -> tuple[float, float, float]:
        """``L``'s input-gradient part in a zero-bubble schedule (``split_backward``): its time, its working
        set above what is live when it starts (its input, residuals and incoming gradient dying
        in it), and the bytes it carries to the weight-gradient part (its results after the
        input gradient, each piece of storage once)."""
        assert L.vjp is not None and L.bwd is not None
        n_dx = 1 if 0 in L.vjp.wrt else 0
        skey = (id(L.bwd), n_dx, tuple(L.bwd_args))
        hit = self._split.get(skey)
        if hit is None or hit[0] is not L.bwd:
            hit = self._split[skey] = (L.bwd, split_backward(L.bwd, n_dx, L.bwd_args)[0])
        bwd_i = hit[1]
        dying = _dying(L)
        time, _, work = self._run(bwd_i, L.bwd_args, dmap, cost, key, dying)
        carried = self._kept(bwd_i, L.bwd_args, range(n_dx, len(bwd_i.outputs)), dmap, cost, mkey, dying)
        return time, work, carried


TaskResult = tuple[list[tuple[tuple[object, ...], list[LayerProfile]]], int, float]


@dataclass(frozen=True)
class ProfileTask:
    """Profiles for a worker process to compute (``run_profile_task``); picklable."""

    spec: ModelSpec
    cluster: Cluster
    dtype: DType
    train: bool
    cost_model: CostModel | None
    t: int
    b: int
    recompute: str
    groups: tuple[tuple[int, ...], ...]  # one TP group of each kind wanted
    mixed: bool = False
    sp: bool = False
    tp_comm_overlap: bool = False
    form: TrainerForm = field(default_factory=TrainerForm)


# a worker's profiler of the current model and cluster: the tasks of one search share its models
# and shardings (only the latest is kept, so a long-lived worker does not accumulate searches)
_PROFILERS: dict[tuple[ModelSpec, Cluster, DType, bool, bool, bool, TrainerForm], Profiler] = {}


def cached_profiler(
    spec: ModelSpec,
    cluster: Cluster,
    dtype: DType,
    train: bool,
    mixed: bool = False,
    tp_comm_overlap: bool = False,
    form: TrainerForm | None = None,
) -> Profiler:
    """This process's profiler of ``spec`` on ``cluster`` (the latest one kept: ``_PROFILERS``)."""
    form = form or TrainerForm()
    key = (spec, cluster, dtype, train, mixed, tp_comm_overlap, form)
    prof = _PROFILERS.get(key)
    if prof is None:
        _PROFILERS.clear()
        prof = Profiler(spec, cluster, dtype, train, mixed=mixed, tp_comm_overlap=tp_comm_overlap, form=form)
        _PROFILERS[key] = prof
    return prof


def run_profile_task(task: ProfileTask) -> TaskResult:
    """``Profiler.layers`` for each group of ``task``: ((cache key, profiles) per group, layer
    simulations run, CPU seconds spent)."""
    c0 = time.process_time()
    if task.cost_model is None:
        overlap = task.tp_comm_overlap
        prof = cached_profiler(
            task.spec, task.cluster, task.dtype, task.train, task.mixed, overlap, task.form
        )
    else:
        prof = Profiler(
            task.spec, task.cluster, task.dtype, task.train, task.cost_model, task.mixed, form=task.form
        )
    n0 = prof.probes
    out: list[tuple[tuple[object, ...], list[LayerProfile]]] = []
    for g in task.groups:
        out.append(
            (
                (task.t, task.b, task.recompute, task.sp, prof.group_key(g)),
                prof.layers(task.t, task.b, g, task.recompute, task.sp),
            )
        )
    return out, prof.probes - n0, time.process_time() - c0


def run_profile_tasks(tasks: tuple[ProfileTask, ...]) -> TaskResult:
    """``run_profile_task`` of each of ``tasks`` in turn, their results together."""
    out: list[tuple[tuple[object, ...], list[LayerProfile]]] = []
    probes, cpu = 0, 0.0
    for task in tasks:
        got, n, c = run_profile_task(task)
        out += got
        probes += n
        cpu += c
    return out, probes, cpu


# the model at one sample per (spec, dtype), while a search runs (``unit_models``): the space's
# and the screen's questions about the model's shape (below) build it once rather than six times
_UNIT: dict[tuple[ModelSpec, DType], Model] | None = None


@contextmanager
def unit_models() -> Iterator[None]:
    """Within the block, the functions below build the model at one sample once per (spec,
    dtype) (a search: the model files it reads are read once); outside, on every call."""
    global _UNIT
    outer, _UNIT = _UNIT, {} if _UNIT is None else _UNIT
    try:
        yield
    finally:
        _UNIT = outer


def unit_model(spec: ModelSpec, dtype: DType) -> Model:
    """``build_from(spec, 1, dtype)``, once per (spec, dtype) inside ``unit_models``."""
    if _UNIT is None:
        return build_from(spec, 1, dtype)
    got = _UNIT.get((spec, dtype))
    if got is None:
        got = _UNIT[(spec, dtype)] = build_from(spec, 1, dtype)
    return got


def allowed_tp(spec: ModelSpec, dtype: DType, limit: int) -> list[int]:
    """TP degrees up to ``limit`` that divide every tensor-parallel weight dimension of the model
    (shapes allow them; uneven TP shards are legal DistIR but no one trains that way) but the
    vocabulary (``config["vocab"]``): Megatron-LM pads it to a multiple of 128·t, and distir
    shards it unevenly instead (GPT-2's 50257 over t = 8: 6283 or 6282 rows, not 6288 — the same
    cost within 0.1%). A model none of whose weights is tensor-parallel (an imported module whose
    weight names match no pattern of ``torch_import.placements``, a ``.distir`` file) takes t = 1
    only: under t > 1 each rank would compute the whole model, t times the work for the same step
    time, so the search would rank such plans as fast as t = 1 on t times the GPUs. With the
    declared layout, t also divides the heads, query groups and FFN columns
    (``distir.export.plan.split_sizes``): the trainers run whole ones per rank."""
    from distir.export.plan import split_sizes

    model = unit_model(spec, dtype)
    if not any(isinstance(w.tp, Shard) for w in model.weights):
        return [1]
    vocab = model.config.get("vocab")
    dims = [n for w in model.weights if isinstance(w.tp, Shard) and (n := w.type.shape[w.tp.dim]) != vocab]
    if not spec.tp:  # the declared layout: whole heads per rank (``distir.parallel.tp_split``)
        dims += split_sizes(spec.text).values()
    return [t for t in range(1, limit + 1) if all(n % t == 0 for n in dims)]


def num_layers(spec: ModelSpec, dtype: DType, train: bool) -> int:
    model = unit_model(spec, dtype)
    return len(model.layers) if train else len(model.layers) - 1


def model_ends(spec: ModelSpec, dtype: DType, train: bool) -> Ends:
    """The layer calls around the model's repeated blocks, as ``distribute`` places them."""
    model = unit_model(spec, dtype)
    return ends(model, len(model.layers) if train else len(model.layers) - 1)


def sequence_length(spec: ModelSpec, dtype: DType) -> int:
    """The model's sequence length (its first input along ``Model.seq_dim``), 0 without one."""
    model = unit_model(spec, dtype)
    t = model.inputs[0].type if model.inputs else None
    if model.seq_dim is None or not isinstance(t, TensorType) or len(t.shape) <= model.seq_dim:
        return 0
    return int(t.shape[model.seq_dim])


def has_sequence(spec: ModelSpec) -> bool:
    """Whether the model declares the sequence dim of its activations (``Model.seq_dim``), which
    sequence parallelism shards."""
    return unit_model(spec, DType.f32).seq_dim is not None


def num_blocks(spec: ModelSpec, dtype: DType, train: bool) -> int:
    """The repeated blocks that a pipeline partition divides (``distir.parallel.pipeline.partition``)."""
    e = model_ends(spec, dtype, train)
    return num_layers(spec, dtype, train) - e.pre - e.post


__all__ = [
    "LayerProfile",
    "ProfileTask",
    "Profiler",
    "TrainerForm",
    "Wanted",
    "allowed_tp",
    "cached_profiler",
    "has_sequence",
    "local_nbytes",
    "model_ends",
    "num_blocks",
    "num_layers",
    "run_profile_task",
    "run_profile_tasks",
    "sequence_length",
    "trainer_form",
    "unit_model",
    "unit_models",
]
