"""The ``distir`` command.

Every command that reports figures takes ``--json`` and then prints exactly one JSON object on
stdout. Any user error exits with status 2 and one message ``FILE:LINE:COL: what is wrong`` on
stderr (no traceback unless ``--debug``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, NoReturn, TypeVar

import typer

try:  # typer vendors click from 0.26 on; before, it depends on it
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer
    from click.exceptions import UsageError as _UsageError  # type: ignore[no-redef,import-not-found,assignment,unused-ignore]
from rich.console import Console

import distir
from distir.files import OutputPathError, OutputWriteError, check_distinct, check_output, write_atomically
from distir.hardware.attention import KERNELS as ATTENTION_KERNELS
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.interp.reference import random_inputs, run_reference
from distir.ir.function import Module
from distir.ir.parser import parse_with_positions
from distir.ir.printer import print_module
from distir.ir.types import Device, DType
from distir.limits import MAX_EXEC_BYTES, MAX_OPS, RESERVED_OPS_SHARE
from distir.report.errors import USER_ERRORS, locate
from distir.report.fields import SCHEMA
from distir.report.summary import module_stats, output_names, outputs_table, value_summary

if TYPE_CHECKING:
    from distir.parallel.trainers import TrainerSemantics
    from distir.parallel.zero3_fetch import Zero3Fetch

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="distir: find, simulate and check distributed strategies for neural networks.",
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]
EntryOpt = Annotated[str | None, typer.Option("--entry", help="Entry function (default: the last).")]
FileArg = Annotated[Path, typer.Argument(help="A .distir program file.")]


def _fail(message: str) -> NoReturn:
    err.print(message, markup=False)
    raise typer.Exit(2)


def _check_outputs(model: str | None = None, cluster: str | None = None, **paths: Path | None) -> None:
    """Every output path (by option: ``trace=`` checks ``--trace``) writable, before any work
    (``distir.files.check_output``), none naming another nor a file the command reads (the
    ``--model``'s, the ``--cluster`` file); else one line, exit 2."""
    from distir.frontends.files import model_input
    from distir.hardware.cluster import cluster_input

    options = {"--" + name.replace("_", "-"): path for name, path in paths.items()}
    reads = {"--model": model_input(model) if model else None, "--cluster": cluster_input(cluster)}
    try:
        for option, path in options.items():
            if path is not None:
                check_output(path, option)
        check_distinct(options, reads)  # two options naming one file: the later write would replace it
    except OutputPathError as e:
        _fail(str(e))


class _Session:
    """One command's file and error context."""

    def __init__(self, file: Path, debug: bool) -> None:
        self.file = file
        self.debug = debug
        self.positions: dict[object, tuple[int, int]] = {}

    def guard(self, thunk: Callable[[], T]) -> T:
        try:
            return thunk()
        except USER_ERRORS as e:
            if self.debug:
                traceback.print_exc()
            _fail(locate(e, str(self.file), self.positions))

    def load(self, entry: str | None) -> Module:
        try:
            text = self.file.read_text(encoding="utf-8")
        except FileNotFoundError:
            _fail(f"{self.file}: no such file")
        except (OSError, UnicodeDecodeError) as e:
            _fail(f"{self.file}: cannot read: {e}")
        m, self.positions = self.guard(lambda: parse_with_positions(text, str(self.file)))
        if entry is not None:
            m = self.guard(lambda: m.with_entry(entry))
        return self.guard(lambda: distir.verify(m))

    def explicit(self, m: Module) -> Module:
        """``m`` itself, or, for a sharded (DTensor) program, its materialized per-device form."""
        from distir.ir.dtensor import DTensorType
        from distir.parallel.sharding.materialize import materialize
        from distir.parallel.sharding.propagate import ShardingError

        if not any(isinstance(p.type, DTensorType) for p in m.entry.params):
            return m
        typed = self.guard(lambda: distir.check(m))
        try:
            return self.guard(lambda: distir.check(materialize(typed)))
        except ShardingError as e:
            if self.debug:
                traceback.print_exc()
            _fail(f"{self.file}: {e}")


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


@app.command()
def show(file: FileArg, entry: EntryOpt = None, json_out: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Print the canonical text of a verified, type-checked program (types filled in)."""
    s = _Session(file, debug)
    m = s.load(entry)
    typed = s.guard(lambda: distir.check(m))
    text = print_module(typed)
    if json_out:
        _emit_json({"file": str(file), **module_stats(typed), "text": text})
    else:
        out.print(text, end="", markup=False)


@app.command()
def lower(
    file: FileArg,
    rank: Annotated[int | None, typer.Option("--rank", min=0, help="Device id N (dN) to print.")] = None,
    all_ranks: Annotated[bool, typer.Option("--all", help="Print every rank's program.")] = False,
    entry: EntryOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Print per-rank programs, after checking that they cannot deadlock."""
    if (rank is None) == (not all_ranks):
        _fail("lower: give exactly one of --rank N or --all")
    s = _Session(file, debug)
    m = s.load(entry)
    s.guard(lambda: distir.check(m))
    m = s.explicit(m)  # a sharded program is lowered from its materialized form
    ranks = s.guard(lambda: project(m))
    s.guard(lambda: check_deadlock_free(ranks))
    if rank is not None:
        if Device(rank) not in ranks:
            _fail(f"{file}: the program has no rank d{rank}; its ranks: {', '.join(map(str, ranks))}")
        chosen = {Device(rank): ranks[Device(rank)]}
    else:
        chosen = ranks
    texts = {str(d): print_module(pm) for d, pm in chosen.items()}
    if json_out:
        _emit_json({"file": str(file), "ranks": texts, "deadlock_free": True})
        return
    for name, text in texts.items():
        out.print(f"// rank {name}", markup=False)
        out.print(text, markup=False)


@app.command("exec")
def exec_(
    file: FileArg,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the random inputs.")] = 0,
    max_gib: Annotated[
        float,
        typer.Option(
            "--max-gib", min=0.0, help="Refuse a program whose values would take more GiB than this."
        ),
    ] = MAX_EXEC_BYTES.max / 2**30,
    entry: EntryOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a program on the reference executor with seeded random inputs; summarize outputs."""
    from distir.report.bounds import value_bytes

    s = _Session(file, debug)
    m = s.load(entry)
    typed = s.guard(lambda: distir.check(m))
    need = value_bytes(typed)
    if need > max_gib * 2**30:
        _fail(
            f"{file}: running @{typed.entry.name} takes up to {need:,} bytes ({need / 2**30:,.1f} GiB: "
            f"its inputs and every op's results), above --max-gib {max_gib:g}"
        )
    args = s.guard(lambda: random_inputs(typed.entry, seed))
    # run the program as written, so a failing op is located in the file
    outs = s.guard(lambda: run_reference(m, args))
    rows = [value_summary(n, v) for n, v in zip(output_names(typed.entry.outputs), outs, strict=True)]
    for r, v in zip(rows, typed.entry.outputs, strict=True):
        r["type"] = str(v.type)
    if json_out:
        _emit_json({"file": str(file), "entry": typed.entry.name, "seed": seed, "outputs": rows})
        return
    out.print(outputs_table(rows, f"@{typed.entry.name} on the reference executor (seed {seed})"))


# ``distir simulate``'s options, declared apart so that the command reads as its steps
_SimFile = Annotated[
    Path | None, typer.Argument(help="A .distir program file (or use --model and --strategy).")
]
_SimCluster = Annotated[
    str,
    typer.Option(
        "--cluster",
        help="A preset (dgx2-v100, dgx-a100:4, p3.8xlarge:3+g4dn.12xlarge:1) or a .toml file.",
    ),
]
# what --model takes (docs/import.md)
_MODEL_KINDS = "a zoo model (distir models), hf:CONFIG, package.module:factory, or an .onnx or .distir file"
_SimModel = Annotated[
    str | None,
    typer.Option("--model", help=f"{_MODEL_KINDS[0].upper()}{_MODEL_KINDS[1:]}, e.g. gpt2-1.6b."),
]
_SimStrategy = Annotated[
    str | None,
    typer.Option("--strategy", help="With --model: e.g. d2.t4.p2.k8.1f1b (default d1.t1.p1.k1)."),
]
_SimTrain = Annotated[
    bool, typer.Option("--train/--infer", help="With --model: a training step (default) or inference.")
]
_SimOptimizer = Annotated[
    str | None, typer.Option("--optimizer", help="With --model, training: sgd or adam (default adam).")
]
_SimDtype = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="With --model: auto (the GPUs' fast half: bf16, else f16; f32 for an ONNX file or "
        "GPUs without one), f32, bf16 or f16.",
    ),
]
_SimPrecision = Annotated[
    str,
    typer.Option(
        "--precision",
        help="With --model: auto (mixed for training in a half --dtype, else pure), pure "
        "(everything in --dtype) or mixed (compute in --dtype bf16/f16, "
        "fp32 master weights and optimizer state); fp8: mixed with the linear layers in float8 "
        "(torchao's Float8Linear, dynamic tensorwise scaling; --dtype bf16, GPUs with FP8 tensor "
        "cores); fp8-delayed: the same with Transformer Engine's delayed scaling.",
    ),
]
_SimKernels = Annotated[
    str | None,
    typer.Option(
        "--kernels",
        help="fused (elementwise chains fused into their producer's kernel, a GEMM's epilogue "
        "too, as Megatron-LM runs them), inductor (the same chains, none joining a GEMM, as "
        "torch.compile runs them by default) or eager (one kernel per op, as eager PyTorch). "
        "Default: the --trainer's (fused; eager for torchtitan).",
    ),
]
_SimAttentionKernel = Annotated[
    str | None,
    typer.Option(
        "--attention-kernel",
        help="The fused-attention kernel the trainer runs, costed at its published speed on the "
        "GPU: fa2 (FlashAttention-2: flash-attn, PyTorch SDPA), cudnn (Transformer Engine's "
        "FusedAttention, preferred on Hopper) or fa-triton (FlashAttention in Triton, "
        "llm-foundry's attn_impl: triton). Default: the --trainer's (fa2; cudnn for megatron on "
        "GPUs with its published speed).",
    ),
]
_SimTrainer = Annotated[
    str,
    typer.Option(
        "--trainer",
        help="With --model: run the plan as this trainer runs it (distir.parallel.trainers): distir "
        "(trainer-neutral; default), megatron (fp32 main_grad with gradient-accumulation fusion, "
        "its DDP buckets, fp32 reductions), deepspeed (its pipeline engine, BF16_Optimizer's fp32 "
        "gradient accumulation) or torchtitan (FSDP2's copies and fp32 reduce-scatters, eager "
        "kernels).",
    ),
]
_SearchTrainer = Annotated[
    str,
    typer.Option(
        "--trainer",
        help="Search the plans as this trainer runs them (distir.parallel.trainers; as simulate "
        "--trainer): only the strategies it runs by default, costed with its switches, kernels "
        "and model options. distir (trainer-neutral; default), megatron, deepspeed or torchtitan.",
    ),
]
_SimTpCommOverlap = Annotated[
    bool,
    typer.Option(
        "--tp-comm-overlap",
        help="Tensor-parallel AllGather/ReduceScatter pipelined with the GEMM beside them, as "
        "Megatron-LM's --tp-comm-overlap (Transformer Engine) runs them; it requires sequence "
        "parallelism: refused for a strategy (simulate) or a space (search) without .sp.",
    ),
]
_SimBucketMb = Annotated[
    float,
    typer.Option(
        "--bucket-mb",
        help="With --model and d > 1: gradient bucket size in MiB, reduced during the backward "
        "(PyTorch DDP's bucket_cap_mb; default 25).",
    ),
]
_SimOverlapParamGather = Annotated[
    bool,
    typer.Option(
        "--overlap-param-gather",
        help="With --model, mixed precision and ZeRO-1/2: all-gather the new weights in the next "
        "step's first forward, layer by layer, instead of after the optimizer (Megatron-LM's "
        "--overlap-param-gather).",
    ),
]
_SimDeepspeedPipe = Annotated[
    bool,
    typer.Option(
        "--deepspeed-pipe",
        help="With --model: DeepSpeed's pipeline engine (Megatron-DeepSpeed): its TrainSchedule "
        "(1f1b only), pipeline transfers that block the compute streams, split over the "
        "tensor-parallel ranks, and the data-parallel gradient all-reduce after the pipeline "
        "flush, not during the backward. ZeRO 0/1.",
    ),
]
_SimFp8WeightCache = Annotated[
    bool,
    typer.Option(
        "--fp8-weight-cache",
        help="With --model, training under --precision fp8-delayed, ZeRO 0-2: each linear weight "
        "cast to float8 once per step, one copy per stage read by every microbatch (Transformer "
        "Engine's cache under Megatron-Core's is_first_microbatch; on with --trainer megatron).",
    ),
]
_SimFloat8AllGather = Annotated[
    bool,
    typer.Option(
        "--float8-all-gather",
        help="With --model, --trainer torchtitan, --precision fp8 and FSDP (z3, d·c > 1): the linear "
        "weights' shards cast to float8 before FSDP gathers them, gathered in float8 and read so by "
        "the layers (torchao's enable_fsdp_float8_all_gather with precomputed scales, torchtitan's "
        "--float8.enable_fsdp_float8_all_gather); needs recomputation (rops, rfull).",
    ),
]
_SimMasterRemainders = Annotated[
    bool,
    typer.Option(
        "--master-remainders",
        help="With --model, training in mixed precision (bf16 compute, fp32 masters), ZeRO-1, Adam: "
        "each master shard kept as an int16 remainder beside the bf16 copy, the fp32 value its "
        "bf16 half and remainder joined (Apex DistributedFusedAdam's store_param_remainders, "
        "NeMo's default): 2 bytes per master parameter, not 4.",
    ),
]
_SimOptimizerDtype = Annotated[
    str,
    typer.Option(
        "--optimizer-dtype",
        help="With --model and mixed precision: the dtype of the master weights and optimizer "
        "state, f32 (default), or the compute --dtype: no masters, the optimizer updating the "
        "weights themselves with m and v in that dtype (NeMo's optim.dtype: bf16, Apex "
        "DistributedFusedAdam's store_params=False): 8 bytes per parameter with Adam, not 16.",
    ),
]
_SimOffloadOptimizer = Annotated[
    bool,
    typer.Option(
        "--offload-optimizer",
        help="With --model, training in mixed precision (fp32 masters), ZeRO 1-3, Adam: the masters, "
        "Adam's state and the step on each GPU's host, as DeepSpeed's ZeRO-Offload runs them "
        "(offload_optimizer device cpu, its CPU Adam): the gradient partition copied to the host, "
        "the step on its CPUs, the new master copied back; needs a cluster whose nodes describe "
        "their host (ndm-a100-v4).",
    ),
]
_SimZero3Fetch = Annotated[
    str | None,
    typer.Option(
        "--zero3-fetch",
        help="With --model and ZeRO-3: how weights are gathered. layer: a whole layer per call, the "
        "next layer prefetched (PyTorch FSDP; the default); deepspeed[:key=value,...]: module by "
        "module as DeepSpeed's ZeRO-3 fetches them, with its prefetch bucket, live-parameter cap, "
        "reuse distance, persistence threshold and reduce bucket (keys prefetch_bucket, max_live, "
        "max_reuse, persistence, reduce_bucket, in elements; DeepSpeed's defaults otherwise; on "
        "with --trainer deepspeed).",
    ),
]
_SimFp32GradAccum = Annotated[
    bool,
    typer.Option(
        "--fp32-grad-accum",
        help="With --model and mixed precision: every backward adds its gradients, cast to fp32, "
        "into fp32 ones, which are reduced and stepped on (DeepSpeed's BF16_Optimizer).",
    ),
]
_SimLaunchBlocking = Annotated[
    bool,
    typer.Option(
        "--launch-blocking",
        help="Every kernel launch synchronous, as CUDA_LAUNCH_BLOCKING=1 makes them: each GPU runs "
        "its streams' kernels one at a time in program order, the host's time per kernel (2 us, "
        "a lower bound) in series with them. Not with --tp-comm-overlap.",
    ),
]
_SimClipGrad = Annotated[
    float | None,
    typer.Option(
        "--clip-grad",
        min=0.0,
        help="With --model: clip the step's gradients by their global L2 norm at this bound before "
        "the update (0: no clipping). Default: the trainer's (1.0 for megatron, deepspeed and "
        "torchtitan; none for distir).",
    ),
]
_SimTrace = Annotated[Path | None, typer.Option("--trace", help="Write a Perfetto/Chrome trace JSON here.")]
_SimTraceDetail = Annotated[
    str | None,
    typer.Option(
        "--trace-detail",
        help="With --trace: chunk (a slice per op and call of the step: pipeline chunks; the default), "
        "layer (also the layers and ops inside each chunk) or op (every op, nested in its layer "
        "and chunk). Slices carry op, types, FLOPs and bytes; sends are flow arrows.",
    ),
]
_SimTraceGpus = Annotated[
    str | None,
    typer.Option(
        "--trace-gpus",
        help="With --trace: the GPUs traced, as ids and ranges (0-7,64; default: every GPU). A "
        "trace is refused above 2,000,000 events (about 1 GB of JSON); the error says how many "
        "GPUs fit.",
    ),
]
_SimDeviceMap = Annotated[
    str | None, typer.Option("--device-map", help="Program devices to GPUs/streams: d0=0,d1=1,d8=0:comm.")
]
_SimBatch = Annotated[
    int | None, typer.Option("--batch", min=1, help="Samples per step (with --model: the global batch).")
]
_SimTpLayout = Annotated[
    str,
    typer.Option(
        "--tp-layout",
        help="With --model: declared (the weights' tensor-parallel placements) or auto (found by "
        "search, as distir shard --auto).",
    ),
]
_SimMaxOps = Annotated[
    int,
    typer.Option(
        "--max-ops",
        min=1,
        help="With --model: refuse a program estimated above this many ops (calls expanded); "
        "--reserved: a program of more than a twentieth of it (its walk replays every op).",
    ),
]


_SimPlanner = Annotated[
    str,
    typer.Option(
        "--planner",
        help="fast (default) or reference (distir.sim.reference: the simulator's semantics "
        "written plainly, slower; the same figures, bit for bit; no --trace).",
    ),
]


_SimReserved = Annotated[
    bool,
    typer.Option(
        "--reserved",
        help="also predict the CUDA caching allocator's reserved peak per GPU from its per-stream "
        "pools (distir.sim.allocator: one more walk of the program).",
    ),
]


@app.command()
def simulate(
    file: _SimFile = None,
    cluster: _SimCluster = "dgx2-v100",
    model: _SimModel = None,
    strategy: _SimStrategy = None,
    train: _SimTrain = True,
    optimizer: _SimOptimizer = None,
    dtype: _SimDtype = "auto",
    precision: _SimPrecision = "auto",
    kernels: _SimKernels = None,
    attention_kernel: _SimAttentionKernel = None,
    trainer: _SimTrainer = "distir",
    tp_comm_overlap: _SimTpCommOverlap = False,
    launch_blocking: _SimLaunchBlocking = False,
    bucket_mb: _SimBucketMb = 25.0,
    overlap_param_gather: _SimOverlapParamGather = False,
    deepspeed_pipe: _SimDeepspeedPipe = False,
    fp32_grad_accum: _SimFp32GradAccum = False,
    fp8_weight_cache: _SimFp8WeightCache = False,
    float8_all_gather: _SimFloat8AllGather = False,
    zero3_fetch: _SimZero3Fetch = None,
    master_remainders: _SimMasterRemainders = False,
    optimizer_dtype: _SimOptimizerDtype = "f32",
    offload_optimizer: _SimOffloadOptimizer = False,
    clip_grad: _SimClipGrad = None,
    trace: _SimTrace = None,
    trace_detail: _SimTraceDetail = None,
    trace_gpus: _SimTraceGpus = None,
    device_map: _SimDeviceMap = None,
    batch: _SimBatch = None,
    tp_layout: _SimTpLayout = "declared",
    max_ops: _SimMaxOps = MAX_OPS.max,
    planner: _SimPlanner = "fast",
    reserved: _SimReserved = False,
    entry: EntryOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Predict step time, per-device busy/communication/idle time and peak memory — of a program
    file, or of a zoo model under a strategy (built with distribute(model, strategy))."""
    from distir.sim.summary import summary_dict

    trace_detail = _trace_detail(trace_detail, trace)
    _check_simulate_options(file, model, kernels, attention_kernel, trainer, clip_grad)
    _check_outputs(model, cluster, trace=trace)
    traced_gpus = _traced_gpus(trace_gpus, trace)
    _check_run(planner, trace, launch_blocking, tp_comm_overlap)
    opts = (bucket_mb, overlap_param_gather, deepspeed_pipe, fp32_grad_accum, tp_comm_overlap, clip_grad)
    switches = _SimSwitches(
        trainer, kernels, attention_kernel, *opts, fp8_weight_cache, zero3_fetch, master_remainders
    )._replace(
        optimizer_dtype=optimizer_dtype,
        offload_optimizer=offload_optimizer,
        float8_all_gather=float8_all_gather,
    )
    if model is not None:
        built, dtype, precision = _model_simulated(
            model,
            strategy,
            batch,
            train,
            optimizer,
            (dtype, precision),
            cluster,
            tp_layout,
            max_ops,
            switches,
            debug,
        )
        m, dmap0, source, batch, model_flops, semantics, built_spec = built
    else:
        assert file is not None
        _check_file_simulate_options(strategy, precision, bucket_mb, overlap_param_gather)
        _check_file_model_options(train, optimizer, dtype, tp_layout)
        m = _file_program(file, entry, switches, debug)
        dmap0, source, model_flops, semantics, built_spec = None, str(file), None, None, None
    kernels = semantics.kernels if semantics else kernels or "fused"
    attention_kernel = semantics.attention_kernel if semantics else attention_kernel or "fa2"
    cl, dmap = _simulated_cluster(m, cluster, device_map, dmap0, source, debug)
    result = _run_simulation(
        m,
        cl,
        dmap,
        file,
        source,
        kernels,
        attention_kernel,
        tp_comm_overlap,
        trace,
        batch,
        trace_detail,
        debug,
        planner,
        reserved,
        semantics.ring_form if semantics else "p2p",
        traced_gpus,
        max_ops,
        launch_blocking,
    )
    result = dataclasses.replace(result, model_flops=model_flops)
    _write_simulation_trace(result, trace, file)
    summary = summary_dict(result)
    warnings = _numerics_warnings(dtype if model is not None else "f32", cl)
    if json_out:
        fields = _strategy_json(model, strategy, batch, dtype, precision) if model is not None else {}
        if model is not None:
            fields["optimizer_dtype"] = optimizer_dtype if precision != "pure" else dtype
        options = _sim_options(cluster, kernels, attention_kernel, semantics, built_spec)
        flags = {
            "tp_comm_overlap": tp_comm_overlap,
            "launch_blocking": launch_blocking,
            "float8_all_gather": float8_all_gather,
        }
        where = {"schema": SCHEMA, "file" if file is not None else "model": source}
        traced = _trace_json(trace, trace_detail, trace_gpus)
        _emit_json({**where, **fields, **options, **flags, **summary, **traced, "warnings": warnings})
        return
    _print_simulation(result, summary, _sim_title(source, cluster, cl.num_devices, summary), trace)


def _numerics_warnings(dtype: str, cl: Any) -> list[str]:
    """``simulate``'s warnings on its numerics (``distir.report.numerics.slow_half_warnings``:
    a half format the GPUs compute no faster than fp32), each printed on stderr."""
    from distir.report.numerics import slow_half_warnings

    got = slow_half_warnings(dtype, cl)
    for line in got:
        err.print(f"warning: {line}", markup=False, soft_wrap=True)
    return got


def _check_inference(train: bool, optimizer: str | None, strategy: str | None, sw: _SimSwitches) -> None:
    """``--infer`` with what only a training step has (a trainer, an optimizer, its gradients' buckets,
    clipping and accumulation, ZeRO-1/2's sharded optimizer state, recomputation for the
    backward, a zero-bubble schedule's split backward, the FP8 weight cache kept across a step's
    microbatches, DeepSpeed's ZeRO-3 fetch of a training step): refused, never ignored."""
    from distir.parallel.distribute import DDP_BUCKET_MB
    from distir.parallel.strategy import StrategyError, parse_strategy

    if train:
        return
    given = [
        f"--trainer {sw.trainer}" if sw.trainer != "distir" else "",
        f"--optimizer {optimizer}" if optimizer is not None else "",
        f"--bucket-mb {sw.bucket_mb:g}" if sw.bucket_mb != DDP_BUCKET_MB else "",
        "--overlap-param-gather" if sw.overlap_param_gather else "",
        "--fp32-grad-accum" if sw.fp32_grad_accum else "",
        "--offload-optimizer" if sw.offload_optimizer else "",
        f"--clip-grad {sw.clip_grad:g}" if sw.clip_grad is not None else "",
        "--master-remainders" if sw.master_remainders else "",
        f"--optimizer-dtype {sw.optimizer_dtype}" if sw.optimizer_dtype != "f32" else "",
        "--fp8-weight-cache" if sw.fp8_weight_cache else "",
        "--float8-all-gather" if sw.float8_all_gather else "",
        f"--zero3-fetch {sw.zero3_fetch}" if _fetches_by_module(sw) else "",
    ]
    try:
        st = parse_strategy(_strategy_text(strategy))
    except StrategyError:
        st = None  # reported where the model is built
    if st is not None:
        given += st.training_parts()
    named = [g for g in given if g]
    if named:
        _fail(
            f"--infer runs the forward only: no optimizer step, gradients or backward, so "
            f"{', '.join(named)} would be ignored; drop {'it' if len(named) == 1 else 'them'} or simulate "
            "a training step (--train)"
        )


def _model_simulated(
    model: str,
    strategy: str | None,
    batch: int | None,
    train: bool,
    optimizer: str | None,
    numerics: tuple[str, str],
    cluster: str,
    tp_layout: str,
    max_ops: int,
    switches: _SimSwitches,
    debug: bool,
) -> tuple[ModelProgram, str, str]:
    """``simulate --model``'s program (``_model_program``) with its ``numerics`` (``--dtype``,
    ``--precision``) resolved and checked (``_model_numerics``), and the numerics resolved."""
    dtype, precision = _model_numerics(model, *numerics, train, cluster, optimizer, strategy, switches)
    with _status(f"building {model} under {_strategy_text(strategy)}"):
        built = _model_program(
            model,
            strategy,
            batch,
            train,
            optimizer or "adam",
            dtype,
            debug,
            precision,
            cluster,
            tp_layout,
            max_ops,
            switches,
        )
    return built, dtype, precision


def _status(what: str) -> Any:
    """A spinner on stderr naming the work under way while it runs (on a terminal only; transient:
    gone when the work ends)."""
    if not err.is_terminal:
        return contextlib.nullcontext()
    return err.status(f"{what}…", spinner="dots")


def _model_numerics(
    model: str,
    dtype: str,
    precision: str,
    train: bool,
    cluster: str,
    optimizer: str | None,
    strategy: str | None,
    sw: _SimSwitches,
) -> tuple[str, str]:
    """``simulate --model``'s numerics (``_sim_numerics``), after refusing the training-only
    options under ``--infer`` (``_check_inference``) and before the switches that apply to one
    kind of plan only (``_check_switches_apply``)."""
    _check_inference(train, optimizer, strategy, sw)
    dtype, precision = _sim_numerics(model, dtype, precision, train, cluster)
    _check_switches_apply(strategy, precision, sw)
    return dtype, precision


def _check_switches_apply(strategy: str | None, precision: str, sw: _SimSwitches) -> None:
    """The switches that act on one kind of plan only, given for another, are refused, not
    ignored: ``--overlap-param-gather`` gathers ZeRO-1/2's sharded new weights (mixed precision,
    d·c > 1), ``--fp8-weight-cache`` caches Transformer Engine's delayed-scaling float8 weights,
    ``--float8-all-gather`` gathers torchao's float8 weights under ZeRO-3 (fp8, d > 1, p = 1),
    ``--tp-comm-overlap`` pipelines sequence parallelism's collectives, ``--zero3-fetch
    deepspeed`` gathers ZeRO-3's shards (d·c > 1), ``--deepspeed-pipe`` runs a pipeline (p > 1)."""
    from distir.parallel.strategy import StrategyError, parse_strategy

    if sw.fp8_weight_cache and precision != "fp8-delayed":
        _fail(
            f"--fp8-weight-cache caches Transformer Engine's delayed-scaling float8 weights; --precision "
            f"{precision} has none: give --precision fp8-delayed, or drop it"
        )
    if sw.float8_all_gather and precision != "fp8":
        _fail(
            f"--float8-all-gather gathers torchao's float8 weights (dynamic scaling); --precision "
            f"{precision} has none: give --precision fp8, or drop it"
        )
    try:
        st = parse_strategy(_strategy_text(strategy))
    except StrategyError:
        return  # reported where the model is built
    if sw.float8_all_gather and not (st.zero == 3 and (st.shard_group or st.d) > 1 and st.p == 1):
        _fail(
            f"--float8-all-gather is FSDP's gather of the weights ZeRO-3 shards over d > 1 data-parallel "
            f"ranks (torchtitan's dp_shard; not modelled under pipelining, where torchtitan's FSDP keeps "
            f"the gathered weights: z2); {st} has none: use z3 with d > 1 and p = 1, or drop it"
        )
    if sw.tp_comm_overlap and not st.sp:
        _fail(
            f"--tp-comm-overlap pipelines sequence parallelism's AllGather/ReduceScatter with the GEMMs, "
            f"as Megatron-LM's flag, which requires it; {st} has none: add .sp (t > 1)"
        )
    if _fetches_by_module(sw) and not (st.zero == 3 and st.d * st.c > 1):
        _fail(
            f"--zero3-fetch {sw.zero3_fetch} gathers the weights ZeRO-3 shards over d·c > 1 ranks; "
            f"{st} has none to gather: use z3 with d > 1, or drop it"
        )
    if sw.deepspeed_pipe and st.p == 1:
        _fail(
            f"--deepspeed-pipe runs DeepSpeed's pipeline engine over p > 1 stages; {st} has one: "
            "add a pipeline degree (.p2), or drop it"
        )
    if sw.overlap_param_gather and (st.zero not in (1, 2) or st.d * st.c == 1 or precision == "pure"):
        _fail(
            f"--overlap-param-gather gathers the new weights ZeRO-1/2 shard over d·c > 1 ranks in mixed "
            f"precision; {st} with --precision {precision} has none to gather"
        )


def _fetches_by_module(sw: _SimSwitches) -> bool:
    """The user asked for DeepSpeed's ZeRO-3 fetch (``--zero3-fetch deepspeed[:...]``; a malformed
    text fails, one line); ``layer``, FSDP's whole-layer gathers, is what ZeRO-3 does anyway."""
    return sw.zero3_fetch is not None and _zero3_fetch(sw.zero3_fetch) is not None


def _check_run(planner: str, trace: Path | None, launch_blocking: bool, tp_comm_overlap: bool) -> None:
    """How ``simulate`` runs: ``_check_blocking``, ``_check_planner``."""
    _check_blocking(launch_blocking, tp_comm_overlap)
    _check_planner(planner, trace)


def _check_blocking(launch_blocking: bool, tp_comm_overlap: bool) -> None:
    """``--launch-blocking`` runs one kernel at a time: not beside ``--tp-comm-overlap``."""
    if launch_blocking and tp_comm_overlap:
        _fail("--launch-blocking runs one kernel at a time, --tp-comm-overlap two: give one")


def _trace_json(trace: Path | None, detail: str, gpus: str | None) -> dict[str, str | None]:
    """``simulate --json``'s trace keys: the file, its detail and the GPUs asked for (null: none
    traced, or every GPU)."""
    if trace is None:
        return {"trace": None, "trace_detail": None, "trace_gpus": None}
    return {"trace": str(trace), "trace_detail": detail, "trace_gpus": gpus}


def _file_program(file: Path, entry: str | None, sw: _SimSwitches, debug: bool) -> Any:
    """The program ``simulate`` runs from ``file`` (its ``entry``), in its materialized form; the
    switches that build a zoo model's program (a trainer's, the user's) are refused."""
    if (
        sw.deepspeed_pipe
        or sw.fp32_grad_accum
        or sw.fp8_weight_cache
        or sw.float8_all_gather
        or sw.zero3_fetch is not None
        or sw.master_remainders
        or sw.optimizer_dtype != "f32"
        or sw.offload_optimizer
        or sw.trainer != "distir"
        or sw.clip_grad is not None
    ):
        _fail(
            "--deepspeed-pipe, --fp32-grad-accum, --fp8-weight-cache, --float8-all-gather, --zero3-fetch, "
            "--master-remainders, "
            "--optimizer-dtype, --offload-optimizer, --clip-grad and --trainer apply to --model, not to "
            "a program file"
        )
    s = _Session(file, debug)
    m = s.load(entry)
    s.guard(lambda: distir.check(m))  # a type error named at its line, as ``show`` names it
    return s.explicit(m)  # a sharded program is simulated in its materialized form


def _sim_options(
    cluster: str | None,
    kernels: str,
    attention_kernel: str,
    semantics: TrainerSemantics | None,
    built_spec: str | None,
) -> dict[str, str | None]:
    """``simulate --json``'s options: the cluster, the kernels, and with ``--model`` the trainer
    and the model string built (``_trainer_model``)."""
    options: dict[str, str | None] = {"cluster": cluster, "kernels": kernels}
    options["attention_kernel"] = attention_kernel
    if semantics is not None:
        options |= {"trainer": semantics.trainer, "model_built": built_spec}
    return options


def _check_simulate_options(
    file: Path | None,
    model: str | None,
    kernels: str | None,
    attention_kernel: str | None,
    trainer: str = "distir",
    clip_grad: float | None = None,
) -> None:
    """``simulate``'s options with a fixed set of values, each one of its set (None: the
    trainer's); ``--clip-grad`` finite; a FILE or a ``--model``, not both."""
    if clip_grad is not None and not math.isfinite(clip_grad):
        _fail(f"--clip-grad must be a finite norm (0: no clipping), got {clip_grad}")
    from distir.parallel.trainers import TRAINERS
    from distir.sim.cost import KERNELS

    if trainer not in TRAINERS:
        _fail(f"--trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if kernels is not None and kernels not in KERNELS:
        _fail(f"--kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if attention_kernel is not None and attention_kernel not in ATTENTION_KERNELS:
        _fail(f"--attention-kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {attention_kernel!r}")
    if (file is None) == (model is None):
        _fail(
            "give a program FILE or --model (with --strategy), not both"
            if file
            else "give a program FILE or --model"
        )


def _trace_detail(detail: str | None, trace: Path | None) -> str:
    """``--trace-detail`` read (default ``chunk``); refused without ``--trace``, as
    ``--trace-gpus`` is (it would shape no trace)."""
    if detail is None:
        return "chunk"
    if detail not in ("chunk", "layer", "op"):
        _fail(f"--trace-detail must be chunk, layer or op, got {detail!r}")
    if trace is None:
        _fail("--trace-detail needs --trace")
    return detail


def _traced_gpus(text: str | None, trace: Path | None) -> frozenset[int] | None:
    """``--trace-gpus`` read (None: every GPU); refused without ``--trace``."""
    from distir.sim.trace import parse_gpus

    if text is None:
        return None
    if trace is None:
        _fail("--trace-gpus needs --trace")
    try:
        return parse_gpus(text)
    except ValueError as e:
        _fail(f"--trace-gpus {text[:60]!r}: {e}")


def _check_planner(planner: str, trace: Path | None) -> None:
    """``--planner``: fast or reference; the reference draws no timeline (no ``--trace``)."""
    if planner not in ("fast", "reference"):
        _fail(f"--planner must be fast or reference, got {planner!r}")
    if planner == "reference" and trace is not None:
        _fail("--trace needs the fast planner (the reference draws no memory timeline)")


def _sim_numerics(model: str, dtype: str, precision: str, train: bool, cluster: str) -> tuple[str, str]:
    """``simulate --model``'s ``--dtype`` and ``--precision`` with ``auto`` resolved as ``search``
    resolves them (``distir.report.numerics``)."""
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import HardwareError
    from distir.report.numerics import NumericsError, resolve_numerics

    try:
        return resolve_numerics(model, dtype, precision, train, cluster)
    except (HardwareError, ModelError, NumericsError) as e:
        _fail(str(e))


def _check_file_simulate_options(
    strategy: str | None, precision: str, bucket_mb: float, overlap_param_gather: bool
) -> None:
    """``simulate FILE``: none of the options that only apply to ``--model`` is given."""
    if strategy is not None:
        _fail("--strategy applies to --model, not to a program file")
    if precision not in ("auto", "pure"):
        _fail("--precision applies to --model, not to a program file")
    if bucket_mb != 25.0:
        _fail("--bucket-mb applies to --model, not to a program file")
    if overlap_param_gather:
        _fail("--overlap-param-gather applies to --model, not to a program file")


def _check_file_model_options(train: bool, optimizer: str | None, dtype: str, tp_layout: str) -> None:
    """``simulate FILE``: the options that build a ``--model``'s program (a program file is
    already built: its own mode, optimizer, dtype and placements) are refused, not ignored."""
    given = [
        "--infer" if not train else "",
        f"--optimizer {optimizer}" if optimizer is not None else "",
        f"--dtype {dtype}" if dtype != "auto" else "",
        f"--tp-layout {tp_layout}" if tp_layout != "declared" else "",
    ]
    named = [g for g in given if g]
    if named:
        _fail(f"{', '.join(named)} applies to --model, not to a program file (it runs as it is written)")


def _simulated_cluster(
    m: Module, cluster: str, device_map: str | None, dmap0: Any, source: str, debug: bool
) -> tuple[Any, Any]:
    """The cluster ``--cluster`` names and the program's device map on it (``--device-map``,
    else the strategy's ``dmap0``), checked to fit; else one line, exit 2."""
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.specs import HardwareError
    from distir.sim.devices import STREAMS, DeviceMap, DeviceMapError
    from distir.sim.simulate import _program_devices

    try:
        cl = parse_cluster(cluster)
        dmap = (
            DeviceMap.parse(device_map, _program_devices(m, m.entry), cl.num_devices, STREAMS)
            if device_map is not None
            else dmap0
        )
        if dmap is not None and max(s.gpu for s in dmap.mapping.values()) >= cl.num_devices:
            raise DeviceMapError(
                f"the strategy needs {1 + max(s.gpu for s in dmap.mapping.values())} GPUs but {cluster} has "
                f"{cl.num_devices}"
            )
    except (HardwareError, DeviceMapError) as e:
        if debug:
            traceback.print_exc()
        if isinstance(e, HardwareError):
            _fail(str(e))
        _fail(f"{source}: {e}{_strategy_map_hint(device_map, dmap0)}")
    return cl, dmap


def _strategy_map_hint(device_map: str | None, dmap0: Any) -> str:
    """A ``--device-map`` refused over a strategy's program (``--model``): the strategy's own map
    (its communication streams' devices too), the text to edit."""
    if device_map is None or dmap0 is None:
        return ""
    text = ",".join(
        f"{d}={s.gpu}" + ("" if s.stream == "compute" else f":{s.stream}")
        for d, s in sorted(dmap0.mapping.items(), key=lambda kv: int(str(kv[0])[1:]))
    )
    return f" (the strategy's map, every device of the program: {text[:600]}{'…' if len(text) > 600 else ''})"


def _run_simulation(
    m: Module,
    cl: Any,
    dmap: Any,
    file: Path | None,
    source: str,
    kernels: str,
    attention_kernel: str,
    tp_comm_overlap: bool,
    trace: Path | None,
    batch: int | None,
    trace_detail: str,
    debug: bool,
    planner: str = "fast",
    allocator: bool = False,
    ring_form: str = "p2p",
    trace_gpus: frozenset[int] | None = None,
    max_ops: int = MAX_OPS.max,
    launch_blocking: bool = False,
) -> Any:
    """The simulator's result for ``m`` on ``cl`` under the roofline cost model (errors located
    in ``file`` when there is one); ``allocator``: with the caching allocator's reserved peak;
    ``ring_form``: the trainer's ring attention (``RooflineCostModel.ring_form``);
    ``launch_blocking``: every launch synchronous (``DeviceMap.blocking``, ``host_s``)."""
    from distir.sim.cost import EAGER_HOST_S, RooflineCostModel
    from distir.sim.devices import DeviceMapError
    from distir.sim.simulate import simulate as run_sim

    guard = _Session(file, debug).guard if file is not None else _plain_guard(debug)
    try:
        cost = RooflineCostModel.of_kernels(cl, kernels, attention_kernel, tp_comm_overlap, ring_form)
        if launch_blocking:  # a default map (None) has one device per GPU: no streams to join
            cost = dataclasses.replace(cost, host_s=EAGER_HOST_S)
            dmap = dmap.blocking() if dmap is not None else None
        with _status(f"simulating {source}"):
            return guard(
                lambda: run_sim(
                    m,
                    cl,
                    dmap,
                    cost,
                    trace=trace is not None,
                    batch=batch,
                    trace_detail=trace_detail,
                    planner=planner,
                    allocator=allocator,
                    trace_gpus=trace_gpus,
                    allocator_max_ops=max_ops // RESERVED_OPS_SHARE,
                )
            )
    except DeviceMapError as e:
        _fail(f"{source}: {e}")


def _write_simulation_trace(result: Any, trace: Path | None, file: Path | None) -> None:
    """``--trace``: the result's timeline written there (never over the program file)."""
    from distir.sim.trace import write_trace

    if trace is not None:
        if file is not None and trace.resolve() == file.resolve():
            _fail(f"{trace}: refusing to overwrite the program with its trace")
        with _status(f"writing the trace {trace}"):
            write_trace(result, trace)


def _sim_title(source: str, cluster: str, num_gpus: int, summary: dict[str, Any]) -> str:
    """The report's title: what ran on which cluster, and how many of its GPUs a program on only
    some of them used (the others idle, outside the MFU)."""
    used = len({d["gpu"] for d in summary["devices"]})
    return f"{source} on {cluster}" + (f" ({used} of its {num_gpus} GPUs)" if used < num_gpus else "")


def _print_simulation(result: Any, summary: dict[str, Any], title: str, trace: Path | None) -> None:
    """``simulate``'s text report: the summary table, out-of-memory devices, the trace's path."""
    from distir.sim.summary import summary_table

    out.print(summary_table(result, title))
    if summary["oom"]:
        out.print(f"[red]out of memory on {', '.join(summary['oom_devices'])}[/red]")
    if trace is not None:
        out.print(f"trace written to {trace} (open it at https://ui.perfetto.dev)")


def _strategy_json(
    model: str, strategy: str | None, batch: int | None, dtype: str, precision: str
) -> dict[str, Any]:
    """``simulate --model --json``: every part of the strategy as its own field (``docs/json.md``)."""
    from distir.parallel.strategy import parse_strategy
    from distir.report.fields import fields_for

    assert batch is not None  # _model_program resolved it
    return {
        **fields_for(model, parse_strategy(_strategy_text(strategy)), batch),
        "dtype": dtype,
        "precision": precision,
    }


def _strategy_text(strategy: str | None) -> str:
    """``--strategy``, by default ``d1.t1.p1.k1.1f1b``; an empty one is an error, not the default."""
    return "d1.t1.p1.k1.1f1b" if strategy is None else strategy


def _plain_guard(debug: bool) -> Callable[[Callable[[], T]], T]:
    def guard(thunk: Callable[[], T]) -> T:
        from distir.interp.loop import InterpretError

        try:
            return thunk()
        except (InterpretError, ValueError) as e:
            if debug:
                traceback.print_exc()
            _fail(e.brief() if isinstance(e, InterpretError) else str(e))

    return guard


class _SimSwitches(NamedTuple):
    """``simulate``'s trainer and the switches the user adds to it (kernels None: the trainer's)."""

    trainer: str
    kernels: str | None
    attention_kernel: str | None
    bucket_mb: float
    overlap_param_gather: bool
    deepspeed_pipe: bool
    fp32_grad_accum: bool
    tp_comm_overlap: bool = False  # the cost model's (the program order follows its chunk times)
    clip_grad: float | None = None  # the gradient-norm bound (None: the trainer's; 0: none)
    fp8_weight_cache: bool = False  # TE's FP8 weight cache (``distribute(fp8_weight_cache=True)``)
    # ``--zero3-fetch``: "layer" or DeepSpeed's knobs (``distribute(zero3_fetch=...)``); None: the trainer's
    zero3_fetch: str | None = None
    # Apex's store_param_remainders (``distribute(master_remainders=True)``)
    master_remainders: bool = False
    # the masters' and optimizer state's dtype (``Precision.with_optimizer_dtype``)
    optimizer_dtype: str = "f32"
    # DeepSpeed's ZeRO-Offload (``distribute(offload_optimizer=True)``)
    offload_optimizer: bool = False
    # torchao's float8 all-gather under FSDP (``distribute(float8_gather=True)``)
    float8_all_gather: bool = False


def _semantics(sw: _SimSwitches, st: Any, prec: Any, dt: Any, cl: Any, train: bool) -> TrainerSemantics:
    """The trainer's semantics for strategy ``st`` with the user's switches on top: its kernels
    unless given, the switches the user adds (refused where they are another trainer's)."""
    from distir.parallel.distribute import DDP_BUCKET_MB
    from distir.parallel.trainers import trainer_semantics, user_switches_fit

    fetch = None if sw.zero3_fetch is None else _zero3_fetch(sw.zero3_fetch)
    user_switches_fit(
        sw.trainer,
        sw.deepspeed_pipe,
        sw.fp32_grad_accum,
        sw.overlap_param_gather,
        zero3_fetch=fetch is not None,
        master_remainders=sw.master_remainders,
        offload_optimizer=sw.offload_optimizer,
        optimizer_dtype=sw.optimizer_dtype,
    )
    if sw.trainer == "megatron" and sw.bucket_mb != DDP_BUCKET_MB:
        _fail(
            "--bucket-mb does not apply to --trainer megatron: Megatron-LM sizes its buckets itself "
            "(max(40M, 1M·d) parameters)"
        )
    sem = trainer_semantics(sw.trainer, st, prec, dt, cl.nodes[0].device if cl is not None else None, train)
    if sw.float8_all_gather and not sem.gather_cast:
        _fail(
            f"--float8-all-gather is FSDP's (torchao's float8 all-gather): give --trainer torchtitan, "
            f"whose FSDP2 casts each shard as it gathers it; --trainer {sw.trainer} does not"
        )
    return dataclasses.replace(
        sem,
        float8_gather=sw.float8_all_gather,
        kernels=sw.kernels or sem.kernels,
        attention_kernel=sw.attention_kernel or sem.attention_kernel,
        overlap_param_gather=sem.overlap_param_gather or sw.overlap_param_gather,
        deepspeed_pipe=sem.deepspeed_pipe or sw.deepspeed_pipe,
        fp32_grad_accum=sem.fp32_grad_accum or sw.fp32_grad_accum,
        fp8_weight_cache=sem.fp8_weight_cache or sw.fp8_weight_cache,
        master_remainders=sem.master_remainders or sw.master_remainders,
        offload_optimizer=sem.offload_optimizer or sw.offload_optimizer,
        zero3_fetch=sem.zero3_fetch if sw.zero3_fetch is None else fetch,
        max_norm=sem.max_norm if sw.clip_grad is None else sw.clip_grad,
    )


def _zero3_fetch(text: str) -> Zero3Fetch | None:
    """``--zero3-fetch``'s text parsed: DeepSpeed's knobs, or None for "layer" (a malformed text
    fails, one line)."""
    from distir.parallel.zero3_fetch import FetchSpecError, parse_zero3_fetch

    try:
        return parse_zero3_fetch(text)
    except FetchSpecError as e:
        _fail(f"--zero3-fetch: {e}")


def _trainer_model(spec: str, sw: _SimSwitches, st: Any) -> str:
    """``spec`` with the trainer's model options it does not set itself
    (``distir.parallel.trainers.model_options``, ``with_options``)."""
    from distir.frontends.zoo.registry import with_options
    from distir.parallel.trainers import model_options, trainer_kernels

    return with_options(spec, model_options(sw.trainer, st, sw.kernels or trainer_kernels(sw.trainer)))


def _check_tp_split(spec: str, t: int, tp_layout: str) -> None:
    """A tensor-parallel degree that splits the model's heads, query groups or FFN columns over
    its ranks is refused (``distir.export.plan.tp_split_refusal``; the declared layout: an
    automatic one places whole heads by construction)."""
    from distir.export.plan import tp_split_refusal

    why = tp_split_refusal(spec, t) if tp_layout == "declared" else ""
    if why:
        _fail(why)


class ModelProgram(NamedTuple):
    """A zoo model's distributed program (``_model_program``), with what its report needs."""

    module: Module
    device_map: Any
    label: str
    batch: int
    model_flops: float | None  # the model's FLOPs per step (MFU), recomputation excluded
    semantics: TrainerSemantics  # what the trainer runs (``distir.parallel.trainers``)
    spec: str  # the model string built: the user's, with the trainer's model options


def _model_program(
    spec: str,
    strategy: str | None,
    batch: int | None,
    train: bool,
    optimizer: str,
    dtype: str,
    debug: bool,
    precision: str,
    cluster: str | None,
    tp_layout: str,
    max_ops: int,
    switches: _SimSwitches,
) -> ModelProgram:
    """Build zoo model ``spec`` in ``dtype`` and distribute it with ``precision`` (pure, or mixed:
    fp32 masters). With a ``cluster`` that has the
    strategy's GPUs, the program order follows the cost model's chunk times there, as the
    search's exact simulation does (``distir.search.chunk_times``); the caller reports a cluster
    that cannot run it."""
    from distir.autodiff.precision import Precision
    from distir.autodiff.reverse import AutodiffError
    from distir.frontends.zoo import build_model
    from distir.frontends.zoo.model import ModelError
    from distir.frontends.zoo.registry import parse_model_string, parse_training_dtype
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.specs import HardwareError
    from distir.interp.loop import InterpretError
    from distir.parallel.distribute import device_map as strategy_map
    from distir.parallel.distribute import distribute
    from distir.parallel.sharding.propagate import ShardingError
    from distir.parallel.strategy import StrategyError, parse_strategy
    from distir.report.bounds import check_cluster_fits, check_elements, check_program_ops
    from distir.search.chunk_times import chunk_times
    from distir.search.profile import TrainerForm

    try:
        st = parse_strategy(_strategy_text(strategy))
        dt = parse_training_dtype(dtype)
        b = batch if batch is not None else 8 * st.d * st.k
        prec = Precision.parse(precision).with_optimizer_dtype(switches.optimizer_dtype)
        _check_tp_split(spec, st.t, tp_layout)
        spec = _trainer_model(spec, switches, st)
        check_cluster_fits(st, cluster)  # before anything is built
        check_elements(spec, b, dt, spec)
        mod = build_model(spec, batch=b, dtype=dt)
        check_program_ops(mod, st.k, train, max_ops, f"{spec} {st}")
        if tp_layout != "declared":
            from distir.search.automap.command import auto_layout

            mod = auto_layout(mod, st, tp_layout, cluster)
        times, cl = None, None
        if cluster is not None:
            try:
                cl = parse_cluster(cluster)
            except HardwareError:
                cl = None  # reported by the caller, with the other cluster errors
            if cl is not None:
                prec.check_devices(n.device for n in cl.nodes)
        sem = _semantics(switches, st, prec, dt, cl, train)
        if cl is not None and st.devices <= cl.num_devices:
            # in the order of the trainer's chunk times, as the search's exact phase
            form = TrainerForm(sem.kernels, sem.attention_kernel)
            overlap = switches.tp_comm_overlap and st.sp
            times = chunk_times(
                mod, parse_model_string(spec), cl, dt, train, st, train and prec.mixed, overlap, form
            )
        prog = distribute(
            mod,
            st,
            sem.optimizer(optimizer),
            train=train,
            comm_streams=True,
            precision=prec,
            chunk_times=times,
            bucket_mb=switches.bucket_mb,
            sac_eager=sem.kernels == "eager",  # eager selective checkpointing caches what it saves
            **sem.switches(),
        )
    except (StrategyError, ModelError, AutodiffError, ShardingError) as e:
        if debug:
            traceback.print_exc()
        _fail(str(e))
    except InterpretError as e:  # the model's program does not type under the strategy
        if debug:
            traceback.print_exc()
        _fail(f"{spec} under {strategy}: {e.brief()}")
    mode = f"{'train' if train else 'infer'}, {dt}{f' {prec}' if prec.mixed else ''}"
    mode += f", {prec.master} optimizer" if prec.mixed and prec.master is not DType.f32 else ""
    label = f"{mod.name} {st} ({mode}{'' if sem.trainer == 'distir' else ', as ' + sem.trainer})"
    dmap = strategy_map(st, True, host=sem.offload_optimizer)
    return ModelProgram(prog, dmap, label, b, mod.step_flops(train), sem, spec)


@app.command()
def run(
    file: Annotated[
        Path | None, typer.Argument(help="A distributed .distir program (or use --model and --strategy).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help=f"With --strategy: {_MODEL_KINDS}.")] = None,
    strategy: Annotated[
        str | None,
        typer.Option("--strategy", help="With --model: e.g. d1.t1.p2.k2.1f1b (default d1.t1.p1.k1)."),
    ] = None,
    batch: Annotated[
        int | None, typer.Option("--batch", min=1, help="With --model: the global batch.")
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=1, help="Steps to run; the first is a warm-up when there are more.")
    ] = 3,
    optimizer: Annotated[str, typer.Option("--optimizer", help="With --model: sgd or adam.")] = "adam",
    dtype: Annotated[
        str, typer.Option("--dtype", help="With --model: f32, bf16, f16 or f64 (exact comparisons).")
    ] = "f32",
    precision: Annotated[
        str,
        typer.Option("--precision", help="With --model: pure, mixed (fp32 masters), fp8 or fp8-delayed."),
    ] = "pure",
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="Seed of the inputs, weights and optimizer state.")
    ] = 0,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify", help="Compare every rank's outputs with the reference executor."
        ),
    ] = True,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Write the ranks' real op timelines (Perfetto/Chrome JSON)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds any one communication may wait for a peer.")
    ] = 300.0,
    entry: EntryOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a distributed program for real: one process per rank (torch.distributed: gloo on CPU,
    NCCL with CUDA), each running its per-rank program; check every rank's loss, outputs and
    updated weights against the reference executor; report step time and peak memory per rank.
    Under torchrun the same command runs this process's rank."""
    from distir.backend import TorchMissing
    from distir.backend.launch import LaunchOptions, RunFailed
    from distir.backend.program import file_program, model_program
    from distir.backend.run import execute, report_dict
    from distir.backend.worker import RankFailure
    from distir.frontends.zoo.model import ModelError
    from distir.parallel.strategy import StrategyError

    if (file is None) == (model is None):
        _fail(
            "give a program FILE or --model (with --strategy), not both"
            if file
            else "give a program FILE or --model"
        )
    _check_steps(steps)
    _check_outputs(model, trace=trace)
    try:
        if model is not None:
            prog = _plain_guard(debug)(
                lambda: model_program(model, strategy, batch, dtype, precision, optimizer, seed)
            )
        else:
            assert file is not None
            if strategy is not None or batch is not None:
                _fail("--strategy and --batch apply to --model, not to a program file")
            s = _Session(file, debug)
            m = s.explicit(s.load(entry))
            typed = s.guard(lambda: distir.check(m))
            prog = file_program(typed, str(file), seed)
        if trace is not None and file is not None and trace.resolve() == file.resolve():
            _fail(f"{trace}: refusing to overwrite the program with its trace")
        guard = _Session(file, debug).guard if file is not None else _plain_guard(debug)
        rep = guard(lambda: execute(prog, steps, verify, trace, LaunchOptions(timeout_s=timeout)))
    except (StrategyError, ModelError, TorchMissing) as e:
        if debug:
            traceback.print_exc()
        _fail(str(e))
    except RankFailure as e:  # under torchrun: this rank failed (torchrun stops the others)
        err.print(f"distir run: {e}", markup=False)
        raise typer.Exit(2) from None
    except RunFailed as e:
        err.print(f"distir run: {e}", markup=False)
        raise typer.Exit(2 if "killed by" not in str(e) and "exited with" not in str(e) else 1) from None
    if rep is None:  # a torchrun rank other than 0: rank 0 reports
        return
    d = report_dict(rep)
    if json_out:
        _emit_json(d)
    else:
        _print_run(d)
    if rep.verdict is not None and not rep.verdict.verified:
        raise typer.Exit(1)


def _print_run(d: dict[str, Any]) -> None:
    steps = f"{d['steps']} step{'s' if d['steps'] != 1 else ''}"
    out.print(f"{d['program']}: {d['ranks']} ranks, {d['backend']} ({d['launcher']}), {steps}", markup=False)
    if d["verified"] is not None:
        status = "verified" if d["verified"] else "NOT verified"
        off = d["elements_outside_tolerance"]
        where = f"{d['worst_output']}" + (f": {off} of {d['worst_output_size']} elements off" if off else "")
        out.print(
            f"  {status} against the reference executor: max abs error {d['max_abs_error']:.3g} "
            f"(worst {where}; allowed {d['tolerance']:g} x max(1, |reference|))",
            markup=False,
        )
        if d.get("kink_units_reversed"):
            n = d["kink_units_reversed"]
            out.print(
                f"  ({n} unit{'s' if n != 1 else ''} at a kink within rounding, decided the other way "
                f"as the run did: |input - threshold| <= {d['kink_max_distance']:.2g}, within "
                f"{d['kink_bound']:.2g}; every output compared, none excluded)",
                markup=False,
            )
    out.print(
        f"  step time {d['step_time_s'] * 1e3:.2f} ms (median after warm-up, slowest rank)", markup=False
    )
    for dev, b in d["peak_memory_bytes"].items():
        t = d["step_time_s_per_rank"][dev]
        out.print(f"  {dev}: {t * 1e3:.2f} ms, peak memory {b} B ({d['memory_source']})", markup=False)
    if d["reference_fallback_ops"]:
        ops = ", ".join(d["reference_fallback_ops"])
        out.print(f"  ran on the numpy reference (no torch implementation): {ops}", markup=False)
    if d["trace"] is not None:
        out.print(f"  trace written to {d['trace']} (open it at https://ui.perfetto.dev)", markup=False)


# ``distir shard``'s options, declared apart so that the command reads as its steps
_ShardFile = Annotated[Path | None, typer.Argument(help="A .distir program file (or --model with --auto).")]
_ShardModel = Annotated[
    str | None, typer.Option("--model", help="With --auto: a zoo model (its training step).")
]
_ShardAuto = Annotated[
    str | None,
    typer.Option("--auto", help="Search the placements along this mesh axis (Automap), e.g. tp."),
]
_ShardSeconds = Annotated[
    float | None, typer.Option("--seconds", min=0.0, help="With --auto: search seconds at most.")
]
_ShardNoGroup = Annotated[
    bool, typer.Option("--no-group", help="With --auto: one decision per layer, not per repeated layer.")
]
_ShardBatch = Annotated[int | None, typer.Option("--batch", min=1, help="With --model: the global batch.")]
_ShardDevices = Annotated[
    str | None, typer.Option("--devices", help="Mesh devices in row-major order (default d0, d1, ...).")
]
_ShardAnnotate = Annotated[
    list[str] | None,
    typer.Option("--annotate", help="VALUE=PLACEMENTS, e.g. w1=S(1) or x=S(0),R; repeat."),
]
_ShardStage = Annotated[
    str, typer.Option("--stage", help="propagate, legalize, optimize, materialize or ranks.")
]
_ShardMaxOps = Annotated[
    int,
    typer.Option("--max-ops", min=1, help="Refuse a mesh whose per-device programs would exceed this size."),
]


def _check_steps(steps: int) -> None:
    """``run``'s and ``validate``'s ``--steps`` within ``MAX_STEPS``."""
    from distir.limits import MAX_STEPS, exceeds, over

    if exceeds(steps, MAX_STEPS):
        _fail(over("--steps", steps, MAX_STEPS))


def _check_automap_budget(episodes: int, seconds: float | None) -> None:
    """``shard --auto``'s budget within its bounds (``MAX_EPISODES``, ``MAX_AUTOMAP_SECONDS``)."""
    from distir.limits import MAX_AUTOMAP_SECONDS, MAX_EPISODES, exceeds, over

    if exceeds(episodes, MAX_EPISODES):
        _fail(over("--episodes", episodes, MAX_EPISODES))
    if seconds is not None and seconds > MAX_AUTOMAP_SECONDS.max:
        _fail(over("--seconds", int(seconds), MAX_AUTOMAP_SECONDS))


@app.command()
def shard(
    file: _ShardFile = None,
    mesh: Annotated[str, typer.Option("--mesh", help="Mesh axes, e.g. tp=2 or dp=2,tp=4.")] = "tp=2",
    model: _ShardModel = None,
    auto: _ShardAuto = None,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="With --auto: search episodes.")] = 200,
    seconds: _ShardSeconds = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="With --auto: the search's seed.")] = 0,
    no_group: _ShardNoGroup = False,
    cluster: Annotated[
        str, typer.Option("--cluster", help="With --auto: the cluster that judges.")
    ] = "dgx2-v100",
    batch: _ShardBatch = None,
    devices: _ShardDevices = None,
    annotate: _ShardAnnotate = None,
    stage: _ShardStage = "materialize",
    max_ops: _ShardMaxOps = MAX_OPS.max,
    entry: EntryOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Shard a sequential program on a device mesh: propagate the annotated placements, make
    redistributions explicit, and materialize per-device (and per-rank) programs."""
    if auto is not None:
        _check_automap_budget(episodes, seconds)
        _shard_auto(
            file,
            model,
            mesh,
            devices,
            annotate,
            auto,
            episodes,
            seconds,
            seed,
            not no_group,
            cluster,
            batch,
            entry,
            json_out,
            debug,
        )
        return
    if file is None:
        _fail("shard: give a program FILE (--model needs --auto)")
    if stage not in SHARD_STAGES:
        _fail(f"shard: --stage must be one of {', '.join(SHARD_STAGES)}, got {stage!r}")
    s = _Session(file, debug)
    m = s.load(entry)
    sharded = _sharded(s, m, mesh, devices, annotate, stage, max_ops)
    result: dict[str, Any] = {
        "file": str(file),
        "mesh": str(sharded.mesh),
        "stage": stage,
        "communication": _communication_counts(sharded.module),
        "conflicts": [str(c) for c in sharded.conflicts],
    }
    if stage == "ranks":
        result["ranks"] = _rank_groups(s, sharded.module)
    else:
        result["text"] = print_module(sharded.module)
    if json_out:
        _emit_json(result)
        return
    for c in sharded.conflicts:
        err.print(f"note: {c}", markup=False)
    if stage == "ranks":
        for g in result["ranks"]:
            out.print(f"// ranks {', '.join(g['devices'])}", markup=False)
            out.print(g["text"], markup=False)
    else:
        out.print(result["text"], end="", markup=False)


SHARD_STAGES = ("propagate", "legalize", "optimize", "materialize", "ranks")


class _Sharded(NamedTuple):
    """``shard``'s program after its ``--stage``, the mesh and propagation's conflicts."""

    module: Module
    mesh: Any
    conflicts: Any


def _shard_annotations(annotate: list[str] | None) -> dict[str, str]:
    """``--annotate VALUE=PLACEMENTS`` options: value name (without ``%``) -> placements text."""
    from distir.parallel.sharding.propagate import ShardingError

    notes: dict[str, str] = {}
    for a in annotate or []:
        name, eq, places = a.partition("=")
        if not eq:
            raise ShardingError(f"annotation {a!r} is not like w1=S(1)")
        notes[name.strip().lstrip("%")] = places
    return notes


def _sharded(
    s: _Session,
    m: Module,
    mesh: str,
    devices: str | None,
    annotate: list[str] | None,
    stage: str,
    max_ops: int,
) -> _Sharded:
    """``m`` on the mesh, run through the passes up to ``stage`` (``SHARD_STAGES``: ``ranks``
    is ``materialize`` then projected by the caller); a sharding error is one line, exit 2."""
    from distir.ir.dtensor import Mesh
    from distir.ir.types import IRTypeError
    from distir.parallel.sharding.legalize import legalize
    from distir.parallel.sharding.materialize import materialize
    from distir.parallel.sharding.propagate import ShardingError, propagate
    from distir.parallel.sharding.sink_reductions import sink_reductions
    from distir.report.bounds import check_shard_size

    try:
        mesh_v = Mesh.parse(mesh, devices)
        check_shard_size(m, len(mesh_v.devices), max_ops)
        notes = _shard_annotations(annotate)
        typed = s.guard(lambda: distir.check(m))
        prop = propagate(typed, mesh_v, notes)
        out_m = prop.module
        if stage != "propagate":
            out_m = s.guard(lambda: distir.check(legalize(prop.module)))
        if stage in ("optimize", "materialize", "ranks"):
            out_m = s.guard(lambda: distir.check(sink_reductions(out_m)))
        if stage in ("materialize", "ranks"):
            out_m = s.guard(lambda: distir.check(materialize(out_m)))
    except (ShardingError, IRTypeError) as e:
        if s.debug:
            traceback.print_exc()
        _fail(f"{s.file}: {e}")
    return _Sharded(out_m, mesh_v, prop.conflicts)


def _communication_counts(m: Module) -> dict[str, int]:
    """How many of each communication op (``OpKind.COMM``) the entry function runs, by op name
    in program order."""
    from distir.ops.registry import OpKind

    counts: dict[str, int] = {}
    for op in m.entry.ops():
        if distir.REGISTRY[op.name].kind is OpKind.COMM:
            counts[op.name] = counts.get(op.name, 0) + 1
    return counts


def _rank_groups(s: _Session, m: Module) -> list[dict[str, Any]]:
    """``--stage ranks``: the per-rank programs, checked deadlock-free, one per group of ranks
    running the same text."""
    from distir.parallel.sharding.materialize import shared_programs

    ranks = s.guard(lambda: project(m))
    s.guard(lambda: check_deadlock_free(ranks))
    return [
        {"devices": [str(d) for d in devs], "text": print_module(pm)} for devs, pm in shared_programs(ranks)
    ]


def _shard_auto(
    file: Path | None,
    model: str | None,
    mesh: str,
    devices: str | None,
    annotate: list[str] | None,
    axis: str,
    episodes: int,
    seconds: float | None,
    seed: int,
    group: bool,
    cluster: str,
    batch: int | None,
    entry: str | None,
    json_out: bool,
    debug: bool,
) -> None:
    """``distir shard --auto AXIS`` (``distir.search.automap.command``)."""
    from distir.autodiff.reverse import AutodiffError
    from distir.frontends.zoo import build_model
    from distir.frontends.zoo.model import Model, ModelError
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.specs import HardwareError
    from distir.ir.dtensor import Mesh
    from distir.ir.types import IRTypeError
    from distir.parallel.sharding.propagate import ShardingError, parsed_placements
    from distir.search.automap.command import report, run_auto, text
    from distir.search.automap.mcts import Budget

    if (file is None) == (model is None):
        _fail(
            "shard --auto: give a program FILE or --model, not both"
            if file
            else "shard --auto: give a program FILE or --model"
        )
    try:
        mesh_v = Mesh.parse(mesh, devices)
        cl = parse_cluster(cluster)
        fixed: dict[str, tuple[Any, ...]] = {}
        for a in annotate or []:
            name, eq, places = a.partition("=")
            if not eq:
                raise ShardingError(f"annotation {a!r} is not like x=S(0),R")
            fixed[name.strip().lstrip("%")] = parsed_placements(places)
        source: Any
        if model is not None:
            if annotate:
                raise ShardingError("--annotate applies to a program file, not to --model")
            source = build_model(model, batch or 8 * len(mesh_v.devices))
            label = model
        else:
            assert file is not None
            s = _Session(file, debug)
            source = s.guard(lambda: distir.check(s.load(entry)))
            label = str(file)
        result, hand = run_auto(source, mesh_v, axis, cl, fixed, Budget(episodes, seconds), seed, group)
    except (ShardingError, IRTypeError, ModelError, HardwareError, AutodiffError) as e:
        if debug:
            traceback.print_exc()
        _fail(f"{label if 'label' in locals() else (file or model)}: {e}")
    if json_out:
        _emit_json(report(result, hand, label))
        return
    _ = Model  # the model type is what ``run_auto`` dispatches on
    for line in text(result, hand):
        out.print(line, markup=False)


@app.command()
def clusters(
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="List this cluster's node types (a .toml file or spec) instead."),
    ] = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """List the cluster presets (or a cluster file's node types) with their figures and sources."""
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.presets import clusters_json, render_clusters_table
    from distir.hardware.specs import HardwareError

    cl = None
    if cluster is not None:
        try:
            cl = parse_cluster(cluster)
        except HardwareError as e:
            if debug:
                traceback.print_exc()
            _fail(str(e))
    if json_out:
        _emit_json(clusters_json(cl))
    else:
        out.print(render_clusters_table(cl))


@app.command()
def calibrate(
    out_file: Annotated[
        Path, typer.Option("--out", help="Where to write the profile (a cluster .toml file).")
    ] = Path("profile.toml"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny sizes, short timings: under a minute (a smoke test).")
    ] = False,
    dtypes: Annotated[
        str, typer.Option("--dtypes", help="Compute dtypes to measure, comma-separated (f32 required).")
    ] = "f32,bf16",
    nproc: Annotated[
        int, typer.Option("--nproc", min=2, help="Processes (ranks) for the communication benchmarks.")
    ] = 2,
    threads: Annotated[
        int,
        typer.Option("--threads", min=1, help="Threads for the compute benchmarks (1: as each rank runs)."),
    ] = 1,
    raw: Annotated[
        Path | None, typer.Option("--raw", help="Also write every timing the fits used (JSON) here.")
    ] = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure this machine (op families over sizes and dtypes, collectives and point-to-point
    over message and group sizes, on torch), fit the cost model and write a device profile that
    --cluster accepts. On a GPU node it profiles GPU 0 and NCCL over the first --nproc GPUs."""
    from distir.backend import TorchMissing
    from distir.backend.calibrate import CalibrateOptions, CalibrationError
    from distir.backend.calibrate import calibrate as run_calibration
    from distir.hardware.cluster import cluster_from_toml
    from distir.hardware.profile import profile_toml
    from distir.ir.types import DType

    _check_nproc("calibrate", nproc)
    _check_outputs(out=out_file, raw=raw)
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    known = {d.name: d for d in (DType.f32, DType.bf16, DType.f16)}
    bad = [n for n in names if n not in known]
    if bad or not names:
        _fail(
            f"calibrate: --dtypes {dtypes!r}: unknown dtype {bad[0] if bad else '(none)'}; use f32, bf16, f16"
        )
    opts = CalibrateOptions(
        dtypes=tuple(known[n] for n in dict.fromkeys(names)), nproc=nproc, quick=quick, threads=threads
    )
    bar = _progress_bar(json_out)

    def progress(total: int) -> Callable[[str], None]:
        task = bar.add_task("measuring", total=total)
        return lambda label: bar.update(task, advance=1, description=f"measuring {label}")

    try:
        with bar:
            cal = run_calibration(opts, progress)
        text = profile_toml(cal)
        cluster_from_toml(text, str(out_file))  # the written file must load
        write_atomically(out_file, text)
        if raw is not None:
            write_atomically(raw, json.dumps(cal.measurements.as_json(), indent=1))
    except (CalibrationError, TorchMissing, OSError) as e:
        if debug:
            traceback.print_exc()
        _fail(str(e))
    if quick:
        _warn_quick(str(out_file))
    if json_out:
        _emit_json(_calibration_json(cal, out_file) | {"quick": quick})
        return
    out.print(_calibration_table(cal, out_file))


def _warn_quick(profile: str) -> None:
    """A ``--quick`` profile's warning (stderr): ``calibrate`` writing one, ``validate`` using one."""
    from distir.hardware.profile import QUICK

    err.print(
        f"warning: {profile} was calibrated with {QUICK}; run distir calibrate without --quick for one",
        markup=False,
    )


CP_HELP = "Pin context parallelism: ring attention over N GPUs (cN; searched from seq 16K)."
CP_FROM_HELP = "Search context parallelism from this sequence length on (default 16384)."


@app.command()
def search(
    model: Annotated[
        str, typer.Option("--model", help=f"{_MODEL_KINDS[0].upper()}{_MODEL_KINDS[1:]}.")
    ] = "gpt2-1.6b",
    cluster: Annotated[
        str,
        typer.Option("--cluster", help="A preset (distir clusters), NAME:NODES, A:n+B:m or a .toml file."),
    ] = "dgx2-v100",
    batch: Annotated[int, typer.Option("--batch", min=1, help="Global batch (samples per step).")] = 512,
    train: Annotated[
        bool, typer.Option("--train/--infer", help="A training step (default) or inference.")
    ] = True,
    top: Annotated[
        int, typer.Option("--top", min=1, help="How many screened strategies to simulate exactly.")
    ] = 8,
    optimizer: Annotated[
        str | None, typer.Option("--optimizer", help="Training: sgd or adam (default adam).")
    ] = None,
    dtype: Annotated[
        str,
        typer.Option("--dtype", help="auto (the GPUs' fast half: bf16, else f16), f32, bf16 or f16."),
    ] = "auto",
    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            help="auto (mixed for training, pure for inference), mixed (compute in --dtype, fp32 "
            "master weights and optimizer state) or pure (everything in --dtype).",
        ),
    ] = "auto",
    dp: Annotated[int | None, typer.Option("--dp", min=1, help="Pin data parallelism.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="Pin tensor parallelism.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", min=1, help="Pin pipeline stages.")] = None,
    microbatches: Annotated[
        int | None, typer.Option("--microbatches", "-k", min=1, help="Pin k (gradient-accumulation steps).")
    ] = None,
    microbatch_size: Annotated[
        int | None,
        typer.Option("--microbatch-size", min=1, help="Pin the samples per replica and microbatch."),
    ] = None,
    schedule: Annotated[
        str | None, typer.Option("--schedule", help="Pin gpipe, 1f1b, interleaved or zb1.")
    ] = None,
    zero: Annotated[int | None, typer.Option("--zero", min=0, max=3, help="Pin the ZeRO stage.")] = None,
    hsdp: Annotated[
        int | None,
        typer.Option("--hsdp", min=2, help="Pin HSDP: ZeRO-3 sharded over groups of N replicas (z3hN)."),
    ] = None,
    cp: Annotated[int | None, typer.Option("--cp", min=1, help=CP_HELP)] = None,
    cp_from_seq: Annotated[int | None, typer.Option("--cp-from-seq", min=1, help=CP_FROM_HELP)] = None,
    recompute: Annotated[
        str | None, typer.Option("--recompute", help="Pin none, selective, full or ops.")
    ] = None,
    max_k: Annotated[
        int | None, typer.Option("--max-microbatches", min=1, help="Largest k to try (default 128).")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker processes: profiles, placement, exact sims.")
    ] = 2,
    executor: Annotated[str, typer.Option("--executor", help="local (processes) or ray.")] = "local",
    store: Annotated[
        Path | None,
        typer.Option("--store", help="SQLite result store (default: ~/.cache/distir/search.sqlite)."),
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore and do not write the result store.")] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write the ranked results as CSV.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the Pareto plot (PNG).")] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Write the interactive Pareto page (HTML).")
    ] = None,
    explain_: Annotated[
        bool, typer.Option("--explain", help="Say why the winner beats pure D, pure T and pure P.")
    ] = False,
    tp_layout: Annotated[
        str,
        typer.Option(
            "--tp-layout",
            help="declared (the weights' tensor-parallel placements) or auto (found once by search, "
            "as distir shard --auto, and used by every strategy).",
        ),
    ] = "declared",
    tp_comm_overlap: _SimTpCommOverlap = False,
    trainer: _SearchTrainer = "distir",
    export_to: Annotated[
        str | None,
        typer.Option("--export", help="Also write the winner for torchtitan, megatron, deepspeed or fsdp."),
    ] = None,
    export_out: Annotated[
        Path | None, typer.Option("--export-out", help="With --export: write it here (default: stdout).")
    ] = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Find the fastest strategy that fits: screen the space analytically, simulate the best."""
    from distir.report.search_cli import run_search_command

    run_search_command(locals(), out, err, json_out, debug)


@app.command("export")
def export_(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="torchtitan (job TOML), megatron (arguments), deepspeed (config JSON) or fsdp "
            "(a PyTorch file).",
        ),
    ],
    model: Annotated[str, typer.Option("--model", help=f"{_MODEL_KINDS[0].upper()}{_MODEL_KINDS[1:]}.")],
    strategy: Annotated[str, typer.Option("--strategy", help="e.g. d2.t4.sp.p2.k8.1f1b.z1.")],
    batch: Annotated[int, typer.Option("--batch", min=1, help="Global batch (samples per step).")],
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Check the GPU count and resolve --dtype auto on it.")
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, f32, bf16 or f16.")] = "auto",
    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            help="auto (mixed in a half dtype), mixed, pure, fp8 (torchao's dynamic scaling: torchtitan, "
            "megatron, fsdp) or fp8-delayed (Transformer Engine's delayed scaling: megatron).",
        ),
    ] = "auto",
    optimizer: Annotated[str, typer.Option("--optimizer", help="adam or sgd.")] = "adam",
    out_path: Annotated[
        Path | None, typer.Option("--out", help="Write the configuration here (default: stdout).")
    ] = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write a strategy as the configuration of a trainer: what the target cannot express is an
    error naming it, what it expresses only approximately a warning (stderr)."""
    from distir.report.export_cli import run_export_command

    run_export_command(locals(), out, err, json_out, debug)


@app.command()
def models(json_out: JsonOpt = False) -> None:
    """List the model zoo with layer counts, widths and parameter counts."""
    from distir.frontends.zoo.registry import render_zoo_table, zoo_json

    if json_out:
        _emit_json(zoo_json())
    else:
        out.print(render_zoo_table())


def _onnx_model(path: str, batch: int, dt: Any, staged: bool) -> Any:
    """An ONNX file (``model.onnx[:dim=N,...]``) as a model with the zoo's cross-entropy loss, at
    ``batch`` (``distir.frontends.files``); f32 only; split options do not apply."""
    from distir.frontends.files import load_file
    from distir.frontends.zoo.model import ModelError

    if staged:
        raise ModelError(
            "--split/--multi-use apply to PyTorch models (hf:PATH, module:factory), not ONNX files"
        )
    return load_file(path, batch, dt)


def _imported(spec: str, batch: int, dt: Any, split: tuple[str, ...], multi_use: str) -> Any:
    """The model of ``distir import``: an ONNX file's (``to_model``, at ``batch``), with split
    options the torch importer's stages, else the model string's."""
    from distir.frontends.files import file_dims, is_model_file
    from distir.frontends.zoo import build_model

    if is_model_file(spec) and file_dims(spec)[0].lower().endswith(".onnx"):
        return _onnx_model(spec, batch, dt, bool(split) or multi_use != "replicate")
    if not split and multi_use == "replicate":
        return build_model(spec, batch=batch, dtype=dt)
    from distir.frontends.torch_import.source import is_import_spec, load
    from distir.frontends.torch_import.stages import StageSpec
    from distir.frontends.zoo.model import ModelError

    if not is_import_spec(spec):
        raise ModelError(
            f"--split/--multi-use apply to PyTorch models (hf:PATH, module:factory), not {spec!r}"
        )
    return load(spec, batch, dt, StageSpec(split, multi_use))  # type: ignore[arg-type]


@app.command("import")
def import_(
    source: Annotated[
        str,
        typer.Argument(
            help="hf:PATH (a Hugging Face config.json or its directory), package.module:factory, "
            "a config path, an .onnx file, or a zoo model string."
        ),
    ],
    batch: Annotated[int, typer.Option("--batch", min=1, help="The global batch of the program.")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="f32, bf16 or f16.")] = "f32",
    split: Annotated[
        list[str] | None,
        typer.Option(
            "--split",
            help="A pipeline stage boundary before this module (e.g. model.layers.12); repeatable. "
            "With split points (or distir.pipe_split() markers) the layers are the stages.",
        ),
    ] = None,
    multi_use: Annotated[
        str,
        typer.Option(
            "--multi-use",
            help="How a parameter used by several stages crosses them: replicate (tied, gradients "
            "summed) or transmit (sent on from its first stage).",
        ),
    ] = "replicate",
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Import a model (PyTorch module, Hugging Face config or ONNX file): print its program and a
    summary."""
    from distir.frontends.zoo.model import ModelError
    from distir.frontends.zoo.registry import parse_training_dtype
    from distir.report.import_cli import render, source_string, summary

    spec = source_string(source)
    try:
        dt = parse_training_dtype(dtype)
        model = _imported(spec, batch, dt, tuple(split or ()), multi_use)
    except ModelError as e:
        if debug:
            traceback.print_exc()
        _fail(str(e))
    info = summary(model)
    if json_out:
        _emit_json({**info, "program": print_module(model.module)})
        return
    out.print(print_module(model.module), markup=False)
    out.print(render(info), markup=False)


@app.command()
def ops(json_out: JsonOpt = False) -> None:
    """List the registered ops with their signatures."""
    defs = sorted(distir.REGISTRY, key=lambda d: (d.family, d.name))
    if json_out:
        _emit_json(
            {
                "ops": [
                    {
                        "name": d.name,
                        "family": d.family,
                        "kind": d.kind.value,
                        "signature": d.signature(),
                        "doc": d.doc,
                    }
                    for d in defs
                ]
            }
        )
        return
    family = None
    for d in defs:
        if d.family != family:
            family = d.family
            out.print(f"\n[bold]{family}[/bold]")
        out.print(f"  {d.signature()}", markup=False)


@app.command()
def demo(json_out: JsonOpt = False, debug: DebugOpt = False) -> None:
    """The built-in tour: the paper's Figure 2 pipeline program, checked, lowered and run."""
    from distir.report.demo import run_demo

    try:
        result = run_demo(out if not json_out else None)
    except USER_ERRORS as e:  # pragma: no cover - the bundled examples are valid
        if debug:
            traceback.print_exc()
        _fail(str(e))
    if json_out:
        _emit_json(result)
    if not result["ok"]:
        raise typer.Exit(1)


@app.command()
def validate(
    model: Annotated[
        str,
        typer.Option("--model", help=f"{_MODEL_KINDS[0].upper()}{_MODEL_KINDS[1:]}."),
    ] = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=256",
    samples: Annotated[int, typer.Option("--samples", min=2, help="Strategies to run and simulate.")] = 20,
    nproc: Annotated[
        int, typer.Option("--nproc", min=2, help="Ranks (processes) each strategy runs on.")
    ] = 2,
    cluster: Annotated[
        str,
        typer.Option("--cluster", help="The calibrated profile (distir calibrate --out FILE) or a cluster."),
    ] = "profile.toml",
    batch: Annotated[int, typer.Option("--batch", min=1, help="Global batch of every strategy.")] = 8,
    steps: Annotated[int, typer.Option("--steps", min=2, help="Steps per run; the first is a warm-up.")] = 4,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the strategy draw.")] = 0,
    strategy: Annotated[
        list[str] | None,
        typer.Option(
            "--strategy",
            help="Run this strategy (repeatable; each on --nproc ranks) instead of drawing --samples.",
        ),
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the scatter plot (PNG) here.")] = Path(
        "validate.png"
    ),
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run --samples strategies of --model (or each --strategy) for real on --nproc local ranks
    and simulate each on the calibrated --cluster; report each one's real and simulated step time
    and peak memory, Spearman's rho of throughput, the median and max errors, and a scatter plot."""
    from distir.backend import TorchMissing
    from distir.backend.launch import RunFailed
    from distir.backend.validate import ValidateError, chosen, fidelity_dict, scatter_png
    from distir.backend.validate import validate as run_validation
    from distir.backend.worker import RankFailure
    from distir.hardware.profile import is_quick

    _check_nproc("validate", nproc)
    _check_steps(steps)
    _check_outputs(model, cluster, plot=plot)
    cl = _validate_cluster(cluster, lambda: chosen(strategy or (), nproc))
    quick = is_quick(n.source for n in cl.nodes)
    if quick:
        _warn_quick(cluster)
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    bar = _progress_bar(json_out)
    task = bar.add_task("running", total=samples)
    try:
        with bar:
            f = run_validation(
                model,
                samples,
                nproc,
                cl,
                batch,
                steps,
                seed,
                tick=lambda label: bar.update(task, advance=1, description=f"ran {label}"),
                strategies=strategy or (),
            )
        if plot is not None:
            scatter_png(f, plot)
    except (ValidateError, TorchMissing, RunFailed, RankFailure, OSError) as e:
        if debug:
            traceback.print_exc()
        _fail(f"validate: {e}")
    load = max(load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
    d = fidelity_dict(f) | {
        "cluster": cluster,  # as given, as simulate and search give it
        "quick_profile": quick,
        "plot": str(plot) if plot else None,
        "load_average": load,
        "cpus": os.cpu_count(),
    }
    if json_out:
        _emit_json(d)
        return
    _print_validation(f, load, plot)


def _validate_cluster(cluster: str, check_strategies: Callable[[], object]) -> Any:
    """``validate``'s cluster, and its strategies checked to run here (``check_strategies``),
    before any run; the default profile, not written yet, named with the command that writes it."""
    from distir.backend.validate import ValidateError
    from distir.hardware.cluster import parse_cluster
    from distir.hardware.specs import HardwareError

    try:
        cl = parse_cluster(cluster)
        check_strategies()
    except (HardwareError, ValidateError) as e:
        if cluster == "profile.toml" and not Path(cluster).exists():
            _fail(
                "profile.toml: no such file; validate simulates on the profile distir calibrate writes "
                "(run distir calibrate --out profile.toml first) or on the cluster --cluster names"
            )
        _fail(f"validate: {e}" if isinstance(e, ValidateError) else str(e))
    return cl


def _print_validation(f: Any, load: float, plot: Path | None) -> None:
    """``validate``'s text: the setting, the per-strategy table, the statistics."""
    out.print(
        f"{f.model}, batch {f.batch}, {f.nproc} ranks, {len(f.points)} "
        f"{'strategy' if len(f.points) == 1 else 'strategies'}, simulated on {f.cluster} "
        f"(load average {load:.1f} on {os.cpu_count()} CPUs)",
        markup=False,
    )
    _print_points(f)
    rho = f.rho_throughput
    out.print(
        f"  Spearman rho of throughput: {'n/a (one strategy)' if math.isnan(rho) else f'{rho:.3f}'}",
        markup=False,
    )
    out.print(
        f"  step time error: median {100 * f.step_time.median:.1f}%, max {100 * f.step_time.max:.1f}%",
        markup=False,
    )
    out.print(
        f"  peak memory error: median {100 * f.peak_memory.median:.1f}%, max {100 * f.peak_memory.max:.1f}% "
        f"({f.memory_source})",
        markup=False,
    )
    if plot is not None:
        out.print(f"  scatter plot: {plot}", markup=False)


def _print_points(f: Any) -> None:
    """``validate``'s table: per strategy its real and simulated step time and peak memory, and
    how far the simulation is from the run (signed: + the simulation slower / larger)."""
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), show_edge=False)
    for name in ("strategy", "real step", "simulated", "error", "real peak", "simulated", "error"):
        if name == "strategy":  # folds when the terminal is narrow, never cut: it names the run
            table.add_column(name, overflow="fold", ratio=1, min_width=12)
        else:
            table.add_column(name, justify="right", no_wrap=True)
    for p in f.points:
        table.add_row(
            p.strategy,
            f"{p.real_step_s * 1e3:.2f} ms",
            f"{p.sim_step_s * 1e3:.2f} ms",
            f"{100 * (p.sim_step_s / p.real_step_s - 1):+.1f}%",
            f"{p.real_peak_bytes / 2**20:.2f} MiB",
            f"{p.sim_peak_bytes / 2**20:.2f} MiB",
            f"{100 * (p.sim_peak_bytes / p.real_peak_bytes - 1):+.1f}%",
        )
    out.print(table)


def _check_nproc(command: str, nproc: int) -> None:
    """``--nproc``: one local process per rank, at most ``max_local_ranks()`` (docs/limitations.md)."""
    from distir.limits import max_local_ranks

    if nproc > max_local_ranks():
        _fail(
            f"{command}: --nproc {nproc:,}: one process per rank, at most {max_local_ranks()} on this machine"
        )


def _progress_bar(disable: bool) -> Any:
    """A rich progress bar on stderr (transient; off with --json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=disable,
    )


def _calibration_json(cal: Any, path: Path) -> dict[str, Any]:
    return {
        "profile": str(path),
        "source": cal.stamp,
        "launch_us": cal.launch_s * 1e6,
        "insitu_overhead_us": {
            "op": cal.insitu.op_s * 1e6,
            "collective": cal.insitu.collective_s * 1e6,
            "p2p": cal.insitu.p2p_s * 1e6,
        },
        "memory_bandwidth_gb_s": cal.bandwidth / 1e9,
        "peak_tflops": {k: v / 1e12 for k, v in cal.gemm.peak.items()},
        "gemm": {
            "sm_count": cal.gemm.sms,
            "anchor": list(cal.gemm.anchor),
            "fit": cal.gemm.quality._asdict(),
        },
        "families": {
            k: {
                "flop_efficiency": f.flop,
                "memory_efficiency": f.memory,
                "launch_us": f.launch_s * 1e6,
                "fit": f.quality._asdict(),
            }
            for k, f in cal.families.items()
        },
        "links": {
            k: {
                "bandwidth_gb_s": f.link.bandwidth / 1e9,
                "latency_us": f.link.latency_s * 1e6,
                "fit": f.quality._asdict(),
            }
            for k, f in cal.links.items()
        },
        "skipped": dict(cal.skipped),  # what was measured but not fitted, and why
    }


def _calibration_table(cal: Any, path: Path) -> Any:
    from rich.table import Table

    t = Table(title=f"{path}: {cal.stamp}", title_justify="left")
    for h in ("what", "figure", "fit: median / max error"):
        t.add_column(h)
    g = cal.gemm
    fit = f"{100 * g.quality.median:.0f}% / {100 * g.quality.max:.0f}%"
    for k, v in g.peak.items():
        t.add_row(f"GEMM peak {k}", f"{v / 1e9:.1f} GFLOP/s (sm_count {g.sms})", fit)
    t.add_row("memory bandwidth", f"{cal.bandwidth / 1e9:.1f} GB/s", "")
    t.add_row("launch overhead", f"{cal.launch_s * 1e6:.2f} µs", "")
    for k, f in cal.families.items():
        q = f.quality
        t.add_row(
            f"family {k}",
            f"flop {100 * f.flop:.1f}%, memory {100 * f.memory:.1f}%, launch {f.launch_s * 1e6:.2f} µs",
            f"{100 * q.median:.0f}% / {100 * q.max:.0f}%",
        )
    for k, lf in cal.links.items():
        q = lf.quality
        t.add_row(
            k,
            f"{lf.link.bandwidth / 1e9:.3f} GB/s, {lf.link.latency_s * 1e6:.1f} µs",
            f"{100 * q.median:.0f}% / {100 * q.max:.0f}%",
        )
    return t


def _non_ascii_number(argv: list[str]) -> str | None:
    """An argument that Python's ``int``/``float`` would read as a number though it is not
    written in ASCII digits (``٢``, ``１２``): distir reads ASCII digits only (``distir.limits``)."""
    for tok in argv:
        value = tok.partition("=")[2] if tok.startswith("--") else tok
        if value.isascii():
            continue
        try:
            float(value)
        except ValueError:
            continue
        return value
    return None


def main(argv: list[str] | None = None) -> None:
    """The ``distir`` command (on ``argv``, default ``sys.argv[1:]``). A usage error (an unknown
    option, a value out of range) is one line on stderr naming the command and the option, exit
    status 2, as every other user error. Ends by ``sys.exit`` (``SystemExit``) with the status."""
    if (bad := _non_ascii_number(sys.argv[1:] if argv is None else argv)) is not None:
        err.print(f"distir: {bad!r} is not a number distir reads: write it in ASCII digits 0-9", markup=False)
        sys.exit(2)
    try:
        code = app(args=argv, standalone_mode=False, prog_name="distir")
    except _UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "distir"
        why = e.format_message() or "give a command (listed above)"  # no arguments: the help, then this
        err.print(f"{where}: {why}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except OutputWriteError as e:  # an output check_output could not foresee failing (/proc, a full disk)
        err.print(str(e), markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err.print("distir: aborted", markup=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
