"""DeepSpeed ZeRO-3's parameter fetching, module by module (``distribute(zero3_fetch=...)``).

distir's default ZeRO-3 gathers a whole layer's weights in one call right before the layer and
the next layer's while it runs (PyTorch FSDP's unit-by-unit all-gather with its forward and
backward prefetch). DeepSpeed's ZeRO-3 fetches otherwise; this module follows it as DeepSpeed
v0.6.2 writes it (the version of the Megatron-DeepSpeed runs of the DeepSpeed-on-Azure post;
``deepspeed/runtime/zero/partitioned_param_coordinator.py``, ``stage3.py``,
``partition_parameters.py`` and ``runtime/comm/coalesced_collectives.py`` at tag v0.6.2):

- **Module by module.** ``DeepSpeedZeroOptimizer_Stage3`` hooks every submodule (forward
  pre-hook, forward hook, and autograd functions on the module's outputs and inputs for the
  backward, ``_register_hooks_recursively``). Each pre-hook calls
  ``PartitionedParameterCoordinator.fetch_sub_module``, which (1) all-gathers the module's own
  parameters that are not yet gathered, (2) waits for them, and (3) prefetches along the
  recorded trace; each post-hook calls ``release_sub_module``. A module's fetch covers only its
  own parameters (``named_parameters(recurse=False)``): for a transformer block that is one
  linear layer or norm at a time, not the block.
- **The trace.** The first step records the order of the modules and, per module, its
  parameters with the step at which they are used (``record_module``, ``record_parameters``);
  from the second step on (``TraceMode.COMPLETE``) the parameters in that order are the fetch
  queue, ``__param_queue``. distir plans the steady state: the trace complete.
- **Prefetch.** After waiting for the current module, ``fetch_sub_module`` pops the current
  module's own entries off the queue, then pops further entries while the elements popped are
  under ``min(stage3_max_live_parameters − available, stage3_prefetch_bucket_size)``
  (``numel_prefetching < max_params_to_prefetch``: the last parameter popped may overshoot),
  and all-gathers those not yet gathered in one call. ``available`` (``__n_available_params``)
  counts the elements of every parameter gathered or in flight, added at the gather and taken
  off at the release; the live-parameter cap bounds the prefetch only, never the fetch of the
  module about to run.
- **Release.** After a module runs its parameters are released (``param.partition()``: the
  gathered storage freed) unless one of them is used again by a module within
  ``stage3_max_reuse_distance`` elements of the trace: ``__params_to_release`` walks the modules
  after the current one, stopping once the elements of the parameters walked exceed the
  distance, and keeps every parameter it meets.
- **Persistence.** A parameter with fewer elements than ``stage3_param_persistence_threshold``
  is never partitioned (``persistent_parameters``: ``ds_persist``): it stays whole through the
  step, and the fetches skip it (``__all_gather_params`` gathers only ``NOT_AVAILABLE`` ones),
  while the trace and the prefetch count it.
- **One call per fetch.** ``all_gather_coalesced`` all-gathers the parameters of one fetch in
  one ``_all_gather_base`` call (one parameter: into its own buffer; several: one flat buffer,
  then a copy out per parameter on the gather stream); every gather runs on the coordinator's
  ``allgather_stream`` and the compute stream waits for it before the module runs
  (``wait_stream``), so the prefetch overlaps the modules that run before the prefetched one.
- **Gradients.** Each parameter's gradient hook adds it to the reduce bucket
  (``reduce_independent_p_g_buckets_and_remove_grads``): if the bucket holds anything and the
  new gradient would take it past ``reduce_bucket_size`` elements, the bucket is reduced first
  (``__reduce_and_partition_ipg_grads``: one ``reduce_scatter_coalesced`` call over its
  gradients, on the reduction stream with ``overlap_comm``), then the gradient joins it; the
  backward's end reduces what is left (``independent_gradient_partition_epilogue``).

``plan_fetches`` runs those rules over a trace of module uses and says, per module, what is
gathered before it runs (not prefetched), what its prefetch gathers and which parameters it
releases; ``distribute`` writes the gathers where the plan puts them.

What distir's layers do not carry: the module tree. A layer function is a list of ops, so a
*module* here is a run of consecutive ops reading the same weights (``MatMul(x, w)`` is a linear
layer's weight, the ``Add`` of its bias another module, a ``LayerNormalization`` the norm's);
DeepSpeed's hooks also fire on modules that own no parameters (a block, its attention and MLP
containers, dropout, softmax) and each of those fetches prefetches too, which distir's plan
does not see, so its prefetch runs at most as far ahead as DeepSpeed's. The trace is planned
per chunk function (a forward, a backward), not across the step: what DeepSpeed prefetches
across the turn from forward to backward, and what it keeps gathered over it, distir gathers
again at the backward's start.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

# DeepSpeed v0.6.2's defaults (deepspeed/runtime/zero/constants.py):
# ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT, ..._MAX_LIVE_PARAMETERS_DEFAULT,
# ..._MAX_REUSE_DISTANCE_DEFAULT, ..._PARAM_PERSISTENCE_THRESHOLD_DEFAULT,
# ..._REDUCE_BUCKET_SIZE_DEFAULT
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE = 1_000_000_000
DS_MAX_REUSE = 1_000_000_000
DS_PERSISTENCE = 100_000
DS_REDUCE_BUCKET = 500_000_000

FETCH_FORMS = ("layer", "deepspeed")
# a knob's value: ASCII digits with an optional sign, fraction and exponent (``5e7``, ``1.5e8``)
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


class FetchSpecError(ValueError):
    """A malformed ``--zero3-fetch`` text (one line)."""


@dataclass(frozen=True, slots=True)
class Zero3Fetch:
    """DeepSpeed ZeRO-3's fetch knobs, in elements (its ``zero_optimization`` config keys):
    ``prefetch_bucket`` = ``stage3_prefetch_bucket_size``, ``max_live`` =
    ``stage3_max_live_parameters``, ``max_reuse`` = ``stage3_max_reuse_distance``,
    ``persistence`` = ``stage3_param_persistence_threshold``, ``reduce_bucket`` =
    ``reduce_bucket_size``; the defaults are DeepSpeed v0.6.2's."""

    prefetch_bucket: int = DS_PREFETCH_BUCKET
    max_live: int = DS_MAX_LIVE
    max_reuse: int = DS_MAX_REUSE
    persistence: int = DS_PERSISTENCE
    reduce_bucket: int = DS_REDUCE_BUCKET

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise FetchSpecError(
                    f"zero3_fetch {f.name} must be a whole number of elements ≥ 0, got {v!r}"
                )
        if self.reduce_bucket < 1:
            raise FetchSpecError(
                f"zero3_fetch reduce_bucket must be at least 1 element, got {self.reduce_bucket}"
            )

    def __str__(self) -> str:
        kv = ",".join(f"{f.name}={getattr(self, f.name):.3g}" for f in fields(self))
        return f"deepspeed:{kv}"


def parse_zero3_fetch(text: str) -> Zero3Fetch | None:
    """``layer`` (FSDP's whole-layer gathers: None) or ``deepspeed[:key=value,...]`` with keys
    ``prefetch_bucket``, ``max_live``, ``max_reuse``, ``persistence``, ``reduce_bucket`` (element
    counts, ``3e9`` allowed); the keys not given keep DeepSpeed v0.6.2's defaults."""
    form, _, rest = text.strip().partition(":")
    if form == "layer" and not rest:
        return None
    if form != "deepspeed":
        raise FetchSpecError(
            f"zero3 fetch must be one of {', '.join(FETCH_FORMS)}[:key=value,...], got {text!r}"
        )
    known = {f.name for f in fields(Zero3Fetch)}
    values: dict[str, int] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in known:
            what = f"{item!r} is not key=value" if not eq else f"unknown key {key!r}"
            raise FetchSpecError(f"zero3 fetch {text!r}: {what}; keys: {', '.join(sorted(known))}")
        if key in values:
            raise FetchSpecError(f"zero3 fetch {text!r}: key {key!r} is given twice")
        if not _NUMBER.fullmatch(value):  # ASCII only: float() takes '٢' and '1_000'
            raise FetchSpecError(f"zero3 fetch {text!r}: {key}={value!r} is not a number")
        try:
            x = float(value)
        except ValueError:
            raise FetchSpecError(f"zero3 fetch {text!r}: {key}={value!r} is not a number") from None
        if not (math.isfinite(x) and x == int(x)):
            raise FetchSpecError(f"zero3 fetch {text!r}: {key}={value!r} is not a whole number")
        values[key] = int(x)
    return Zero3Fetch(**values)


@dataclass(frozen=True, slots=True)
class FetchStep:
    """What the coordinator does at one module of the trace: ``fetch``, the parameters gathered
    right before it (one call; not prefetched, so the module waits for the whole gather);
    ``prefetch``, those its prefetch gathers after that wait (one call); ``release``, those
    freed after it runs; ``live``, the elements gathered or in flight once its fetch and
    prefetch are issued (``__n_available_params``)."""

    fetch: tuple[int, ...]
    prefetch: tuple[int, ...]
    release: tuple[int, ...]
    live: int


def plan_fetches(
    trace: Sequence[Sequence[int]], numel: Mapping[int, int], persistent: frozenset[int], cfg: Zero3Fetch
) -> list[FetchStep]:
    """DeepSpeed's coordinator over ``trace`` (per module, the parameters it uses, as ids in
    DeepSpeed's ``ds_id`` order: its creation order), ``numel`` per parameter and the
    ``persistent`` ones (never gathered, never released), with a complete trace: one
    ``FetchStep`` per module (module docstring)."""
    mods = [tuple(sorted(set(m))) for m in trace]
    # the fetch queue: every module's parameters with the step they are used at
    queue: deque[tuple[int, int]] = deque((p, i) for i, m in enumerate(mods) for p in m)
    popped_for: dict[int, int] = {}  # ``__most_recent_step_id_param_fetched_for``
    gathered: set[int] = set()  # in flight or available (``ds_status`` != NOT_AVAILABLE)
    live = 0
    out: list[FetchStep] = []

    def gather(ps: Sequence[int]) -> tuple[int, ...]:
        nonlocal live
        got = tuple(p for p in ps if p not in persistent and p not in gathered)
        gathered.update(got)
        live += sum(numel[p] for p in got)
        return got

    for i, m in enumerate(mods):
        now = gather(m)
        # the current module's own entries off the queue, unless an earlier prefetch took them
        due = {p for p in m if popped_for.get(p, -1) < i}
        seen: set[int] = set()
        while queue and len(seen) < len(due):
            p, at = queue.popleft()
            popped_for[p] = at
            seen.add(p)
        assert seen == due, f"trace step {i}: the queue does not follow the trace"
        ahead: dict[int, None] = {}
        if cfg.prefetch_bucket > 0:
            budget, n = min(cfg.max_live - live, cfg.prefetch_bucket), 0
            while queue and n < budget:
                p, at = queue.popleft()
                popped_for[p] = at
                if p not in ahead:
                    ahead[p] = None
                    n += numel[p]
        pre = gather(list(ahead))
        issued = live
        freed = _released(mods, i, numel, persistent, cfg.max_reuse)
        freed = tuple(p for p in freed if p in gathered)
        gathered.difference_update(freed)
        live -= sum(numel[p] for p in freed)
        out.append(FetchStep(now, pre, freed, issued))
    return out


def _released(
    mods: Sequence[tuple[int, ...]], i: int, numel: Mapping[int, int], persistent: frozenset[int], reuse: int
) -> tuple[int, ...]:
    """The parameters of module ``i`` released after it runs (``__params_to_release``): all but
    the persistent ones and those a module after it uses before the walk passes ``reuse``
    elements."""
    free = [p for p in mods[i] if p not in persistent]
    walked = 0
    for m in mods[i + 1 :]:
        if walked > reuse or not free:
            break
        free = [p for p in free if p not in m]
        walked += sum(numel[p] for p in m)
    return tuple(free)


__all__ = [
    "DS_MAX_LIVE",
    "DS_MAX_REUSE",
    "DS_PERSISTENCE",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "FETCH_FORMS",
    "FetchSpecError",
    "FetchStep",
    "Zero3Fetch",
    "parse_zero3_fetch",
    "plan_fetches",
]
