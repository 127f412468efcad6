"""The Python API: ``distir.search``, ``distir.simulate``, ``distir.distribute``, ``distir.Cluster``.

    import distir

    found = distir.search(model="gpt2-1.6b", cluster="dgx-a100:2", batch=512)
    best = found.best                      # a Result: strategy, d, t, p, k, ..., step_time_s, fits
    print(best.strategy, best.step_time_s, best.layers_per_chunk)
    one = distir.simulate(model="llama3-8b", strategy="d2.t4.sp.p2.k8.1f1b", cluster="dgx-a100:2", batch=64)
    program = distir.distribute("gpt2-117m", "d2.t2.p2.k4.1f1b", batch=32)   # a DistIR Module

Models are zoo model strings (``distir models``; ``gpt:layers=24,hidden=2048``) or parsed
``ModelSpec`` objects (``distribute`` also takes a built zoo ``Model``); clusters are spec strings
(``distir clusters``; ``dgx-a100:4``, ``a.toml``) or ``Cluster`` objects (``Cluster.parse(spec)``,
or built from ``NodeSpec``s). Results are frozen dataclasses with the fields of the JSON outputs
(``docs/json.md``: the strategy's parts, then the simulated figures); ``SearchResults.to_dataframe()``
gives a pandas DataFrame when pandas is installed. Bad input raises the typed one-line errors of
the CLI (``StrategyError``, ``ModelError``, ``HardwareError``, ``SpaceError``; a result store that
cannot be opened, ``StoreError``).

``distir.search`` is both the package of the search's modules and this function: the package's
module object is callable (``distir/search/__init__.py``), so ``import distir.search.run`` keeps
working. Type checkers see the function as ``distir.api.search``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import ModelSpec
from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir.function import Module
from distir.parallel.strategy import Strategy, parse_strategy

if TYPE_CHECKING:
    from distir.search.run import SearchOutput

ModelArg = str | ModelSpec
ClusterArg = str | Cluster


@dataclass(frozen=True, slots=True)
class Result:
    """One simulated strategy: a search result or ``simulate``'s answer (``docs/json.md``)."""

    strategy: str
    d: int
    t: int
    p: int
    k: int
    v: int
    schedule: str
    microbatch_size: int
    sp: bool
    c: int  # context-parallel degree (1: none)
    zero: int
    shard_group: int | None  # the GPUs ZeRO shards over (HSDP: fewer than d); None without ZeRO
    recompute: str
    partition: str  # uniform, params or explicit
    layers_per_chunk: tuple[int, ...] | None  # repeated blocks of each pipeline chunk
    placement: tuple[int, ...]  # the cluster GPU of each program device
    shares: tuple[int, ...]  # batch shares of the d replicas (all 1: even)
    dtype: str
    precision: str
    step_time_s: float
    throughput: float  # samples/s
    mfu: float | None
    hfu: float | None
    peak_memory_bytes: float  # the worst device's peak
    capacity_bytes: float  # that device's capacity
    fits: bool
    bubble_fraction: float
    compute_s: float
    comm_s: float
    screen_step_time_s: float | None = None  # the analytic screen's estimate (search results)
    screen_peak_memory_bytes: float | None = None
    source: str = "simulated"
    trainer: str = "distir"  # whose semantics it was simulated with (``distir.parallel.trainers``)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Result:
        """From a JSON result row (lists as tuples; unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items() if k in names}
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Failed:
    """A strategy whose exact simulation failed."""

    strategy: str
    error: str


@dataclass(frozen=True, slots=True)
class SearchResults:
    """A search's answer: the request, the simulated strategies best first (``results``), the
    failed ones, and the screen's counts."""

    model: str
    cluster: str
    devices: int
    batch: int
    mode: str  # train or infer
    optimizer: str
    dtype: str
    precision: str
    results: tuple[Result, ...]
    failed: tuple[Failed, ...]
    screened: int  # strategies screened analytically
    timings_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    explain: tuple[str, ...] = ()  # with explain=True: why the winner beats pure D, T and P
    advice: tuple[str, ...] = ()  # when nothing fits: the smallest changes that would

    @property
    def best(self) -> Result | None:
        """The fastest strategy that fits (the fastest one if none fits); None if none ran."""
        return self.results[0] if self.results else None

    def to_dataframe(self) -> Any:
        """The results as a pandas DataFrame, one row each, the ``Result`` fields as columns."""
        try:
            import pandas as pd  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise ImportError("to_dataframe needs pandas (pip install pandas)") from None
        return pd.DataFrame([dataclasses.asdict(r) for r in self.results])


def _model_text(model: ModelArg) -> str:
    return model.text if isinstance(model, ModelSpec) else model


def _kind(value: object) -> str:
    """``value`` as an error names it: its repr and, but for None, its type."""
    if value is None:
        return "None"
    return f"{value!r} ({type(value).__name__})"


def _check_positive(name: str, value: object, error: type[ValueError]) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be a positive integer, got {_kind(value)}")


def _check_flag(name: str, value: object, error: type[ValueError]) -> None:
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {_kind(value)}")


def _check_inputs(model: object, cluster: object, strategy: object = "", *, built_ok: bool = False) -> None:
    """The model, cluster and strategy arguments' types: the typed errors the docs name, not an
    ``AttributeError`` from deep inside (``built_ok``: a built zoo ``Model`` is a model too)."""
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import ClusterError
    from distir.parallel.strategy import StrategyError

    if not isinstance(model, (str, ModelSpec)) and not (built_ok and isinstance(model, Model)):
        raise ModelError(f"model must be a model string or a ModelSpec, got {_kind(model)}")
    if cluster is not None and not isinstance(cluster, (str, Cluster)):
        raise ClusterError(f"cluster must be a cluster spec string or a Cluster, got {_kind(cluster)}")
    if not isinstance(strategy, (str, Strategy)):
        raise StrategyError(f"strategy must be a strategy string or a Strategy, got {_kind(strategy)}")


def _check_numbers(batch: object, train: object) -> None:
    """``simulate``'s and ``distribute``'s batch (None: the default) and mode."""
    from distir.parallel.strategy import StrategyError

    if batch is not None:
        _check_positive("batch", batch, StrategyError)
    _check_flag("train", train, StrategyError)


def _check_training_parts(s: Strategy, train: bool) -> None:
    """In inference, the strategy's parts only a training step has (``Strategy.training_parts``),
    refused as ``distir simulate --infer`` refuses them, not ignored."""
    from distir.parallel.strategy import StrategyError

    named = [] if train else s.training_parts()
    if named:
        raise StrategyError(
            f"{s}: train=False runs the forward only: no optimizer step, gradients or backward, so "
            f"{', '.join(named)} would be ignored; drop {'it' if len(named) == 1 else 'them'} or train"
        )


def _check_store(store: object) -> None:
    """The result store's path, checked writable before the search as ``distir search --store``
    checks it (``distir.files.check_output``): a directory or an unwritable place is a
    ``SpaceError`` naming it, before any work."""
    from distir.files import OutputPathError, check_output
    from distir.search.space import SpaceError

    if store is None:
        return
    if not isinstance(store, (str, Path)):
        raise SpaceError(f"store must be a path or None, got {_kind(store)}")
    try:
        check_output(store, "store")
    except OutputPathError as e:
        raise SpaceError(str(e)) from None


def _check_search(model: str, batch: object, train: object, a: Mapping[str, Any]) -> None:
    """What ``distir search``'s options refuse before any work (``search_cli._check_options``):
    types, ranges, the batch's and the workers' bounds, the size of the programs simulated."""
    from distir.report.bounds import search_error, search_ops_error
    from distir.report.numerics import exact_inference_error
    from distir.search.space import MAX_K, SpaceError, max_k_error

    _check_positive("batch", batch, SpaceError)
    _check_flag("train", train, SpaceError)
    for name in ("top", "workers", "max_microbatches"):
        if name != "max_microbatches" or a[name] is not None:
            _check_positive(name, a[name], SpaceError)
    if (why := max_k_error(a["microbatches"], a["max_microbatches"])) is not None:
        raise SpaceError(why)
    for name in ("explain", "tp_comm_overlap"):
        _check_flag(name, a[name], SpaceError)
    _check_optimizer(a["optimizer"], train is True, SpaceError)
    _check_store(a["store"])
    if a["tp_layout"] not in ("declared", "auto"):
        raise SpaceError(f"tp_layout must be declared or auto, got {a['tp_layout']!r}")
    if a["precision"] not in ("auto", "mixed", "pure"):  # as ``distir search --precision``
        raise SpaceError(
            f"precision must be auto, mixed or pure, got {_kind(a['precision'])}: the search screens "
            "no FP8 plans (distir.simulate takes fp8 and fp8-delayed)"
        )
    assert isinstance(batch, int) and isinstance(train, bool)
    if why := exact_inference_error(a["precision"], train, flag=""):
        raise SpaceError(why)
    why = search_error(a["workers"], "local", batch) or search_ops_error(
        model, a["microbatches"], a["max_microbatches"] or MAX_K, batch, train
    )
    if why is not None:
        raise SpaceError(why)


def _check_optimizer(optimizer: object, train: bool, error: type[ValueError]) -> str:
    """The optimizer (None: Adam), refused in inference as ``--infer`` refuses ``--optimizer``:
    an inference program takes no optimizer step, so one given would be ignored."""
    if optimizer is None:
        return "adam"
    if optimizer not in ("sgd", "adam"):
        raise error(f"optimizer must be sgd or adam, got {_kind(optimizer)}")
    if not train:
        raise error(f"train=False runs no optimizer step: drop optimizer={optimizer!r}, or train")
    return str(optimizer)


def _numerics(
    dtype: str,
    precision: str,
    train: bool,
    cluster: ClusterArg | None,
    model: str,
    error: type[ValueError],
) -> tuple[str, str]:
    """``auto`` as the CLI resolves it (``distir.export.plan.resolve_numerics``), a dtype or
    precision it refuses raised as ``error`` (the function's documented type); a half format the
    GPUs compute no faster than fp32 (bf16 on a V100) is a ``UserWarning``, as the CLI's warning
    on stderr (``distir.report.numerics.slow_half_warnings``)."""
    import warnings

    from distir.export.plan import ExportError, resolve_numerics
    from distir.report.numerics import NumericsError, check_choices, slow_half_warnings

    try:
        check_choices(dtype, precision, flag="")
        got = resolve_numerics(dtype, precision, cluster, model, train)
    except (NumericsError, ExportError) as e:
        raise error(str(e)) from None
    for line in slow_half_warnings(got[0], cluster) if cluster is not None else ():
        warnings.warn(line, UserWarning, stacklevel=3)
    return got


def search(
    model: ModelArg = "gpt2-1.6b",
    cluster: ClusterArg = "dgx2-v100",
    batch: int = 512,
    *,
    train: bool = True,
    optimizer: str | None = None,
    dtype: str = "auto",
    precision: str = "auto",
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    microbatches: int | None = None,
    schedule: str | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    microbatch_size: int | None = None,
    hsdp: int | None = None,
    cp: int | None = None,
    cp_from_seq: int | None = None,
    max_microbatches: int | None = None,
    top: int = 8,
    workers: int = 1,
    store: str | Path | None = None,
    explain: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    tp_layout: str = "declared",
    tp_comm_overlap: bool = False,
    trainer: str = "distir",
) -> SearchResults:
    """Find the fastest strategy that fits, as ``distir search`` does: screen the space
    analytically, simulate the ``top`` best exactly, rank by throughput (those that do not fit
    last). ``dp``/``tp``/``pp``/``microbatches``/``schedule``/``zero``/``recompute``/
    ``microbatch_size``/``hsdp``/``cp`` pin a part, as ``distir search``'s flags do; ``cp_from_seq``:
    context parallelism searched from this sequence length (default 16384);
    ``dtype``/``precision`` ``auto``: mixed precision in the GPUs' fast half format (training).
    ``store``: a SQLite result store (a finished search comes back from it; None: none).
    ``progress(phase, done, total)`` is called as the phases advance. ``tp_layout``: the
    model's own tensor-parallel placements (``declared``) or those Automap finds (``auto``).
    ``tp_comm_overlap``: cost the plans with sequence parallelism with their tensor-parallel
    collectives overlapping their GEMMs, as Megatron-LM's ``--tp-comm-overlap`` runs them (it
    requires sequence parallelism). ``trainer``: search the plans as that trainer runs them
    (``megatron``, ``deepspeed``, ``torchtitan``; ``distir search --trainer``)."""
    from distir.search.run import SearchRequest
    from distir.search.run import search as run_search
    from distir.search.space import CP_MIN_SEQ, MAX_K, Pins, SpaceError

    _check_inputs(model, cluster)
    _check_search(_model_text(model), batch, train, locals())
    dtype, precision = _numerics(dtype, precision, train, cluster, _model_text(model), SpaceError)
    pins = Pins(
        dp,
        tp,
        pp,
        microbatches,
        schedule,
        zero,
        recompute,
        MAX_K if max_microbatches is None else max_microbatches,
        mbs=microbatch_size,
        hsdp=hsdp,
        cp=cp,
        cp_from_seq=CP_MIN_SEQ if cp_from_seq is None else cp_from_seq,
    )
    req = SearchRequest(
        model=_model_text(model),
        cluster=cluster,
        batch=batch,
        train=train,
        optimizer=_check_optimizer(optimizer, train, SpaceError),
        dtype=dtype,
        precision=precision,
        pins=pins,
        top=top,
        workers=workers,
        store=Path(store) if store is not None else None,
        explain=explain,
        tp_layout=tp_layout,
        tp_comm_overlap=tp_comm_overlap,
        trainer=trainer,
    )
    return _results(run_search(req, progress))


def _results(o: SearchOutput) -> SearchResults:
    from distir.report.search_report import explain, search_json

    js = search_json(o)
    ok = tuple(Result.from_row(r) for r in js["results"] if "error" not in r)
    failed = tuple(Failed(r["strategy"], r["error"]) for r in js["results"] if "error" in r)
    return SearchResults(
        js["model"],
        js["cluster"],
        js["devices"],
        js["batch"],
        js["mode"],
        js["optimizer"],
        js["dtype"],
        js["precision"],
        ok,
        failed,
        js["screened"],
        dict(o.timings),
        tuple(explain(o)) if o.request.explain else (),
        tuple(o.advice),
    )


def simulate(
    model: ModelArg,
    strategy: str | Strategy = "d1.t1.p1.k1.1f1b",
    cluster: ClusterArg = "dgx2-v100",
    batch: int | None = None,
    *,
    train: bool = True,
    optimizer: str | None = None,
    dtype: str = "auto",
    precision: str = "auto",
    trainer: str = "distir",
) -> Result:
    """Distribute zoo ``model`` under ``strategy`` and simulate one step on ``cluster``, exactly as
    the search's exact simulation does (program order from the cost model's chunk times). ``batch``
    (the global batch) defaults to 8·d·k. ``trainer``: as that trainer runs the plan (``distir
    simulate --trainer``: its switches, kernels and model options). A tensor-parallel degree
    that splits the model's heads, query groups or FFN columns raises ``StrategyError``."""
    from distir.export.plan import tp_split_refusal
    from distir.parallel.strategy import StrategyError
    from distir.report.fields import fields_for
    from distir.report.numerics import exact_inference_error
    from distir.search.rerank import ExactJob, evaluate

    _check_inputs(model, cluster, strategy)
    _check_numbers(batch, train)
    opt = _check_optimizer(optimizer, train, StrategyError)
    s = parse_strategy(strategy) if isinstance(strategy, str) else strategy
    _check_training_parts(s, train)
    why = tp_split_refusal(_model_text(model), s.t) or exact_inference_error(precision, train, flag="")
    if why:
        raise StrategyError(why)
    b = batch if batch is not None else 8 * s.d * s.k
    dtype, precision = _numerics(dtype, precision, train, cluster, _model_text(model), StrategyError)
    spec = _model_text(model)
    row = evaluate(ExactJob(spec, cluster, b, train, opt, dtype, precision, trainer=trainer), str(s))
    return Result.from_row({**fields_for(spec, s, b), **row})


def distribute(
    model: ModelArg | Model,
    strategy: str | Strategy,
    batch: int | None = None,
    *,
    train: bool = True,
    optimizer: str | None = None,
    dtype: str = "f32",
    precision: str = "pure",
    cluster: ClusterArg | None = None,
) -> Module:
    """The DistIR program of ``model`` under ``strategy``: per-device compute, collectives, sends,
    the pipeline schedule. ``model``: a zoo model string or spec (built for the global ``batch``,
    default 8·d·k, in ``dtype``) or a built zoo ``Model``. With a ``cluster``, the program order
    follows the cost model's chunk times there (as ``simulate`` does)."""
    from distir.autodiff.precision import Precision, PrecisionError
    from distir.autodiff.train import Optimizer
    from distir.frontends.zoo.registry import parse_model_string
    from distir.ir.local_types import IRTypeError
    from distir.ir.types import DType
    from distir.parallel.distribute import distribute as run_distribute
    from distir.parallel.strategy import StrategyError
    from distir.search.chunk_times import chunk_times

    _check_inputs(model, cluster, strategy, built_ok=True)
    _check_numbers(batch, train)
    opt = _check_optimizer(optimizer, train, StrategyError)
    s = parse_strategy(strategy) if isinstance(strategy, str) else strategy
    _check_training_parts(s, train)
    try:
        dt, prec = DType.parse(dtype), Precision.parse(precision)
    except (IRTypeError, PrecisionError) as e:
        raise StrategyError(str(e)) from None
    if isinstance(model, Model):
        built, spec = model, None
    else:
        spec = parse_model_string(_model_text(model))
        built = spec.build(batch if batch is not None else 8 * s.d * s.k, dt)
    times = None
    if cluster is not None and spec is not None:
        cl = parse_cluster(cluster)
        times = chunk_times(built, spec, cl, dt, train, s, train and str(prec) == "mixed")
    try:
        return run_distribute(
            built, s, Optimizer(opt), train=train, comm_streams=True, precision=prec, chunk_times=times
        )
    except PrecisionError as e:  # a precision the model's dtype cannot train in (mixed in f32)
        raise StrategyError(str(e)) from None


__all__ = ["Cluster", "Failed", "Result", "SearchResults", "distribute", "search", "simulate"]
