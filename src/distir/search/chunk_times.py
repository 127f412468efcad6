"""Per pipeline chunk, its forward and backward time for one microbatch, from the layer profiles
(``distir.search.profile``): the times ``distribute`` writes the schedule's program order by.

Under DistIR's semantics the program order is the schedule, and ``distribute`` lists the
actions of all ranks in estimated time order. Its default estimate (forward ∝ a chunk's weights)
misjudges layers whose compute does not follow their weights — TransGAN's 16-stage GPipe
(``d1.t1.p16.k64.gpipe.rsel``, AMP's generator on 4 × p3.8xlarge) took 1844 ms in that order and
1275 ms in this one. Each chunk is timed on its own stage's first TP group
(the GPU kind there) at the even per-replica microbatch, with the cost model the simulator uses;
the profiles are those the search's screen computed, shared through the process's profiler. A
model whose layers fix the batch is timed at that batch, its chunks in the same proportions.
"""

from __future__ import annotations

from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import ModelSpec
from distir.hardware.cluster import Cluster
from distir.ir.types import DType
from distir.parallel.pipeline.partition import partition
from distir.parallel.strategy import Strategy
from distir.search.profile import TrainerForm, cached_profiler


def chunk_times(
    model: Model,
    spec: ModelSpec,
    cluster: Cluster,
    dtype: DType,
    train: bool,
    s: Strategy,
    mixed: bool = False,
    tp_comm_overlap: bool = False,
    form: TrainerForm | None = None,
) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds per chunk of ``model`` (built from ``spec``) under ``s`` on
    ``cluster``, in chunk order; backward is 0 for inference (``tp_comm_overlap``: with the
    simulator's tensor-parallel overlap, ``RooflineCostModel.tp_comm_overlap``; ``form``: as a
    trainer runs the layers, ``spec`` being its model at t = 1). Raises what
    ``partition`` and the profiler raise for a strategy the model or cluster cannot take."""
    n_layers = len(model.layers) if train else len(model.layers) - 1
    chunks = partition(model, s, n_layers)
    prof = cached_profiler(spec, cluster, dtype, train, mixed, tp_comm_overlap, form)
    # a model whose layers fix the batch runs it whole (``Model.fixed_batch``): its chunks timed so
    b = model.batch if model.fixed_batch is not None else max(1, model.batch // (s.d * s.k))
    place = s.gpus
    n = s.d * s.t
    by_stage = [prof.layers(s.t, b, list(place[j * n : j * n + s.t]), s.recompute, s.sp) for j in range(s.p)]
    fwd: list[float] = []
    bwd: list[float] = []
    for c, r in enumerate(chunks):
        layers = by_stage[c % s.p]
        fwd.append(sum(layers[i].fwd_s for i in r))
        bwd.append(sum(layers[i].bwd_s for i in r))
    return fwd, bwd


__all__ = ["chunk_times"]
