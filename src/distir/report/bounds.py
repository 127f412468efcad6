"""Size estimates the commands check against ``distir.limits`` before they build or run anything.

- ``flat_ops``: a module's primitive ops with every call expanded (what the simulator and the
  interpreters walk), counted per function once, bottom-up, without recursion.
- ``program_ops_estimate``: the ops ``distribute`` would give a model under a strategy — the
  model's flat ops times the microbatches times 6 for a training step (forward, backward,
  optimizer and communication; measured 4.5–6 on the zoo), 2 for inference.
- ``value_bytes``: the bytes the reference executor holds running a typed module (every value
  of every call, an upper bound: it frees nothing early).
- ``check_elements``: a model has no tensor beyond ``MAX_ELEMENTS``.
- ``check_cluster_fits``: a strategy's GPUs exist on the cluster (before its program is built).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import distir
from distir.frontends.zoo.model import Model, ModelError
from distir.frontends.zoo.registry import IMPORTED, parse_model_string
from distir.interp.loop import InterpretError
from distir.ir.function import Function, Module
from distir.ir.ops import Call
from distir.ir.types import DType, IRTypeError
from distir.limits import MAX_BATCH, MAX_OPS, MAX_RAY_WORKERS, exceeds, max_local_workers, over
from distir.parallel.strategy import Strategy, StrategyError


def per_function_totals(module: Module, own: Callable[[Function], int]) -> dict[str, int]:
    """``own(f)`` plus, for each call in ``f``, the callee's total — for every function reachable
    from the entry. Iterative (call chains of any depth); a call cycle counts its back edge as 0."""
    totals: dict[str, int] = {}
    names = {f.name for f in module.functions}
    stack: list[tuple[str, bool]] = [(module.entry.name, False)]
    started: set[str] = set()
    while stack:
        name, ready = stack.pop()
        if name in totals:
            continue
        fn = module[name]
        callees = [c.callee for c in fn.calls() if c.callee in names]
        if not ready:
            if name in started:
                continue  # a cycle: the verifier reports it
            started.add(name)
            stack.append((name, True))
            stack.extend((c, False) for c in callees if c not in totals)
            continue
        totals[name] = own(fn) + sum(totals.get(c, 0) for c in callees)
    return totals


def flat_ops(module: Module) -> int:
    """The entry's primitive ops with every call expanded."""
    return per_function_totals(module, lambda f: sum(1 for _ in f.ops()))[module.entry.name]


def program_ops_estimate(model: Model, microbatches: int, train: bool) -> int:
    return flat_ops(model.module) * microbatches * (6 if train else 2)


def check_program_ops(model: Model, microbatches: int, train: bool, max_ops: int, what: str) -> None:
    """Raise ModelError when ``distribute`` would build more than ``max_ops`` ops (estimated)."""
    n = program_ops_estimate(model, microbatches, train)
    if n > max_ops:
        raise ModelError(
            f"{what}: the program would have about {n:,} ops ({flat_ops(model.module):,} model ops x "
            f"{microbatches:,} microbatches x {6 if train else 2}), above --max-ops {max_ops:,}"
        )


def value_bytes(typed: Module) -> int:
    """Bytes of every value the reference executor makes running the entry (parameters, and
    every op's results, calls expanded): an upper bound on what it holds at once."""

    def own(fn: Function) -> int:
        vals = [*fn.params, *(v for i in fn.body if not isinstance(i, Call) for v in i.outputs)]
        return sum(getattr(v.type, "nbytes", 0) or 0 for v in vals)

    return per_function_totals(typed, own)[typed.entry.name]


def check_elements(spec: str, batch: int, dtype: DType, what: str) -> None:
    """Raise ModelError when a tensor of zoo model ``spec`` at ``batch`` has more than
    ``MAX_ELEMENTS`` elements (its sizes would overflow the int64 shapes of numpy and torch):
    the type constructors refuse such a type (``TensorType``, ``DTensorType``), here met in a
    type check of the model with one layer of each kind (shapes do not depend on the number of
    layers: milliseconds for any model string)."""
    parsed = parse_model_string(spec)
    if parsed.family == IMPORTED or not dataclasses.is_dataclass(parsed.config):
        return
    cfg = parsed.config
    short = {
        f.name: 1 for f in dataclasses.fields(cfg) if f.name.endswith("layers") and getattr(cfg, f.name) > 1
    }
    small = dataclasses.replace(parsed, config=dataclasses.replace(cfg, **short))  # type: ignore[type-var]
    try:
        distir.check(small.build(batch, dtype).module)
    except (IRTypeError, InterpretError) as e:  # the op whose result is above the bound
        raise ModelError(f"{what}: {str(e).splitlines()[0]}") from e


def check_cluster_fits(strategy: Strategy, cluster: str | None) -> None:
    """Raise StrategyError when ``cluster`` (a spec or file; None: no cluster) has fewer GPUs than
    ``strategy`` uses. A cluster that does not load is left to the caller to report."""
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.specs import HardwareError

    if cluster is None:
        return
    try:
        n = parse_cluster(cluster).num_devices
    except HardwareError:
        return
    if strategy.devices > n:
        raise StrategyError(
            f"the strategy {strategy} needs {strategy.devices:,} GPUs but {cluster} has {n:,}"
        )


def search_error(workers: int, executor: str, batch: int) -> str | None:
    """Why a search's ``--workers`` or ``--batch`` is refused (None: accepted): a local search
    starts one process per worker, at most ``max_local_workers()``; Ray runs at most
    ``MAX_RAY_WORKERS`` tasks at once; the batch is at most ``MAX_BATCH``."""
    if exceeds(batch, MAX_BATCH):
        return over("--batch", batch, MAX_BATCH)
    if executor == "ray":
        return over("--workers", workers, MAX_RAY_WORKERS) if exceeds(workers, MAX_RAY_WORKERS) else None
    most = max_local_workers()
    if workers > most:
        return (
            f"--workers {workers:,}: a local search starts one process per worker; at most {most} "
            f"on this machine ({os.cpu_count()} CPUs; more only slows it)"
        )
    return None


def check_shard_size(module: Module, devices: int, max_ops: int) -> None:
    """Raise ShardingError when sharding ``module`` over ``devices`` would build more than
    ``max_ops`` op-device entries: each op on each device, and a collective lists every device
    of its group — ops x devices² (``distir shard``, before propagation)."""
    from distir.parallel.sharding.propagate import ShardingError

    n = flat_ops(module) * devices * devices
    if n > max_ops:
        raise ShardingError(
            f"sharding over {devices:,} devices would build about {n:,} op-device entries "
            f"({flat_ops(module):,} ops x {devices:,}²), above --max-ops {max_ops:,}"
        )


def search_ops_error(model: str, k_pin: int | None, max_k: int, batch: int, train: bool) -> str | None:
    """Why a search is refused for the size of the programs it would simulate exactly (None:
    accepted): the most microbatches it tries (``--microbatches``, else ``--max-microbatches``,
    at most the batch) times the model's ops, as ``program_ops_estimate``, above ``MAX_OPS``.
    Model strings that do not parse are left to the search to report; imported models too."""
    try:
        spec = parse_model_string(model)
        if spec.family == IMPORTED:
            return None
        built = spec.build(1)
    except ModelError:
        return None
    k = min(k_pin or max_k, batch)
    n = program_ops_estimate(built, k, train)
    if n <= MAX_OPS.max:
        return None
    flag = "--microbatches" if k_pin else "--max-microbatches"
    return (
        f"a program of {model} with k = {k:,} microbatches would have about {n:,} ops, above distir's "
        f"bound of {MAX_OPS.max:,} (docs/limitations.md); give a smaller {flag}"
    )
