"""Exact re-ranking: a strategy transformed (``distribute``) and simulated, as a plain dict.

Every strategy, context-parallel ones (c > 1) included, is built by ``distribute`` and
simulated (``source: simulated``).

``ExactJob`` holds what every evaluation of one search shares (model string, cluster string,
batch, mode, optimizer, dtype) — a frozen, picklable value, so ``functools.partial(evaluate,
job)`` can go to worker processes or Ray tasks; each process builds the model and cluster once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from distir.autodiff.precision import Precision
from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import ModelSpec, build_from
from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir.dtensor import Placement
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.parallel.trainers import trainer_semantics
from distir.search.chunk_times import chunk_times
from distir.search.profile import LayerProfile, TrainerForm, cached_profiler, trainer_form
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.simulate import SharedPlans, SharedRecords, simulate

RESULT_KEYS = (
    "strategy",
    "d",
    "t",
    "p",
    "k",
    "microbatch_size",
    "step_time_s",
    "throughput",
    "peak_memory_bytes",
    "fits",
)
# what each field of ``evaluate``'s result is (a stored result is checked against it when read:
# ``distir.search.final.check_result``); float fields take ints too, int fields never bools
RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "strategy": (str,),
    "d": (int,),
    "t": (int,),
    "c": (int,),
    "p": (int,),
    "k": (int,),
    "microbatch_size": (int,),
    "schedule": (str,),
    "zero": (int,),
    "shard_group": (int, type(None)),
    "recompute": (str,),
    "dtype": (str,),
    "precision": (str,),
    "trainer": (str,),
    "step_time_s": (float, int),
    "throughput": (float, int),
    "mfu": (float, int, type(None)),  # None: unknown (a screened result's HFU, a model's FLOPs)
    "hfu": (float, int, type(None)),
    "peak_memory_bytes": (float, int),
    "capacity_bytes": (float, int),
    "fits": (bool,),
    "bubble_fraction": (float, int),
    "compute_s": (float, int),
    "comm_s": (float, int),
    "source": (str,),
}


@dataclass(frozen=True, slots=True)
class ExactJob:
    model: str
    cluster: str | Cluster
    batch: int
    train: bool = True
    optimizer: str = "adam"
    dtype: str = "f32"
    precision: str = "pure"
    tp: tuple[tuple[str, Placement], ...] = ()  # placements replacing the declared ones (``ModelSpec.tp``)
    model_files: str = ""  # ``content_digest(model)``: the cache below is keyed by file contents
    # the simulator pairs tensor-parallel collectives with their GEMMs in plans with sequence
    # parallelism (Megatron-LM's ``--tp-comm-overlap``, which requires it:
    # ``RooflineCostModel.tp_comm_overlap``)
    tp_comm_overlap: bool = False
    # whose semantics the plans run with (``distir.parallel.trainers``): its switches, kernels
    # and model options
    trainer: str = "distir"

    def spec(self) -> ModelSpec:
        """The model at t = 1 (``trainer_form``)."""
        return self.form()[0]

    def form(self) -> tuple[ModelSpec, TrainerForm]:
        """``trainer_form`` of the job: the model at t = 1 and how the trainer runs it."""
        return _form(self.model, self.trainer, _cluster(self.cluster), self.tp)


@functools.lru_cache(maxsize=8)
def _form(
    model: str, trainer: str, cluster: Cluster, tp: tuple[tuple[str, Placement], ...]
) -> tuple[ModelSpec, TrainerForm]:
    return trainer_form(model, trainer, cluster, tp)


def _model(job: ExactJob, t: int) -> Model:
    """The model of ``job`` run at tensor parallelism ``t``: one object for every t the trainer
    runs the same model at (distir's: all), so the strategies' layers share their
    differentiation by microbatch (``layer_sharder._differentiated``, by the model's identity)."""
    spec, form = job.form()
    return _built(job, form.spec_at(spec, t))


@functools.lru_cache(maxsize=4)
def _built(job: ExactJob, spec: ModelSpec) -> Model:
    """``spec`` built at ``job``'s batch and dtype (its ``model_files`` digest is part of the key:
    an edited file is rebuilt)."""
    return build_from(spec, job.batch, DType.parse(job.dtype))


def _cluster(spec: str | Cluster) -> Cluster:
    """The cluster of ``spec``, parsed on every call: a spec names a file that may have been
    edited since (``search`` passes the resolved ``Cluster``, parsed once)."""
    return spec if isinstance(spec, Cluster) else parse_cluster(spec)


Profiles = dict[tuple[object, ...], list[LayerProfile]]

# The exact simulations of one process share their op records (``SharedRecords``: an op's record
# is a function of the op, its types, the device map, the cost model and the units only, so a
# record one simulation made is the one another would make): the candidates of a search mostly
# run the same optimizer, gradient reductions and layers on the same meshes. Records are shared
# between simulations on the very same device map and cost model objects, so each cluster (by
# identity, kept alive here) has one cost model per ``tp_comm_overlap`` and each device map one
# object per mapping. Bounded: cleared when full.
_SHARED_KEPT = 8


class _Shared(NamedTuple):
    """What the exact simulations on one cluster (with one ``tp_comm_overlap``) share."""

    cluster: Cluster  # kept alive, so its id is not reused while the entry stands
    cost: RooflineCostModel
    records: SharedRecords
    maps: dict[object, DeviceMap]  # one device map object per mapping


# (id of the cluster, tp_comm_overlap, kernels, attention kernel) -> what its simulations share
_SHARED: dict[tuple[int, bool, str, str], _Shared] = {}


def _shared(
    cluster: Cluster, overlap: bool, dmap: DeviceMap, form: TrainerForm
) -> tuple[RooflineCostModel, DeviceMap, SharedRecords]:
    """The cost model of ``cluster`` (with ``overlap`` and the trainer's kernels), the device
    map equal to ``dmap`` and the op records the exact simulations on them share (``_SHARED``)."""
    key = (id(cluster), overlap, form.kernels, form.attention_kernel)
    got = _SHARED.get(key)
    if got is None or got.cluster is not cluster or len(got.maps) >= _SHARED_KEPT:
        if len(_SHARED) >= _SHARED_KEPT:
            _SHARED.clear()
        cost = RooflineCostModel.of_kernels(cluster, form.kernels, form.attention_kernel, overlap)
        got = _SHARED[key] = _Shared(cluster, cost, SharedRecords(), {})
    canonical = got.maps.setdefault(tuple(dmap.mapping.items()), dmap)
    return got.cost, canonical, got.records


def evaluate_seeded(job: ExactJob, profiles: Profiles, strategy: str) -> dict[str, Any]:
    """``evaluate``, its chunk times (``chunk_times``) taken from ``profiles`` where they hold
    them (``Profiler.known`` of the search's screen: the same figures this process would compute,
    by the same code on the same inputs) instead of profiling those layers again here."""
    overlap = job.tp_comm_overlap and parse_strategy(strategy).sp  # ``chunk_times``' profiler
    spec, form = job.form()
    cluster = _cluster(job.cluster)
    cached_profiler(spec, cluster, DType.parse(job.dtype), job.train, _mixed(job), overlap, form).adopt(
        profiles
    )
    return evaluate(job, strategy)


def _mixed(job: ExactJob) -> bool:
    return job.train and job.precision == "mixed"


def evaluate(job: ExactJob, strategy: str) -> dict[str, Any]:
    """Distribute (in the program order of the cost model's chunk times: ``chunk_times``) and
    simulate ``strategy``: step time, throughput, MFU, memory and a compute / communication /
    idle breakdown (means over the compute streams)."""
    s = parse_strategy(strategy)
    model = _model(job, s.t)
    cluster = _cluster(job.cluster)
    overlap = job.tp_comm_overlap and s.sp
    spec, form = job.form()
    dt = DType.parse(job.dtype)
    times = chunk_times(model, spec, cluster, dt, job.train, s, _mixed(job), overlap, form)
    prec = Precision.parse(job.precision if job.train else "pure")
    sem = trainer_semantics(job.trainer, s, prec, dt, cluster.nodes[0].device, job.train)
    prog = distribute(
        model,
        s,
        sem.optimizer(job.optimizer),
        train=job.train,
        comm_streams=True,
        precision=prec,
        chunk_times=times,
        sac_eager=sem.kernels == "eager",  # eager selective checkpointing caches what it saves
        called_only=True,  # the chunk functions the schedule calls: all the simulation plans
        **sem.switches(),
    )
    cost, dmap, records = _shared(cluster, overlap, device_map(s, True), form)
    r = simulate(prog, cluster, dmap, cost, batch=job.batch, shared=SharedPlans(records))
    r = replace(r, model_flops=model.step_flops(job.train))
    compute = [i for i, slot in enumerate(r.slots) if slot.stream == "compute"]
    busy = sum(r.busy_s[i] for i in compute) / max(len(compute), 1)
    comm = sum(r.comm_s[i] for i in compute) / max(len(compute), 1)
    worst = max(r.peak_memory, key=lambda g: r.peak_memory[g] / r.capacity[g])
    return {
        "strategy": str(s),
        "d": s.d,
        "t": s.t,
        "c": s.c,
        "p": s.p,
        "k": s.k,
        "microbatch_size": job.batch // (s.d * s.k),  # samples per replica and microbatch
        "schedule": s.schedule,
        "zero": s.zero,
        "shard_group": s.zero_degree if s.zero else None,  # ZeRO's shard group (HSDP: < d)
        "recompute": s.recompute,
        "dtype": job.dtype,
        "precision": job.precision if job.train else "pure",
        "trainer": job.trainer,
        "step_time_s": r.step_time_s,
        "throughput": r.throughput,
        "mfu": r.mfu,
        "hfu": r.hfu,
        "peak_memory_bytes": max(r.peak_memory.values()),
        "capacity_bytes": r.capacity[worst],
        "fits": not r.oom_gpus,
        "bubble_fraction": r.bubble_fraction,
        "compute_s": busy,
        "comm_s": comm,
        "source": "simulated",
    }


__all__ = ["RESULT_KEYS", "RESULT_TYPES", "ExactJob", "evaluate", "evaluate_seeded"]
