"""Trainer semantics (``distir.parallel.trainers``): each trainer's switches for a strategy, the
strategies it refuses, its switches against the published-runs records of that trainer, and the
memory Megatron-LM's fp32 gradients add over distir's trainer-neutral program."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.hardware.presets import PRESETS
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.parallel.trainers import (
    TRAINERS,
    TrainerError,
    TrainerSemantics,
    model_options,
    trainer_semantics,
    user_switches_fit,
)
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

MIXED = Precision.parse("mixed")
SMALL = "llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32"
STRATEGIES = [
    "d1.t1.p1.k1",
    "d2.t1.p1.k1.z1",
    "d2.t1.p1.k2.z0",
    "d2.t2.sp.p1.k2.z1",
    "d2.t1.p2.k4.1f1b.z1",
    "d2.t1.p1.k2.z2",
    "d2.t1.p1.k2.z3",
    "d4.t1.p1.k1.z3h2",
    "d2.t1.p2.k4.1f1b.z2",
    "d1.t2.p2.k4.interleaved.v2.z1",
    "d2.t1.p2.k4.zb1.z1",
    "d2.t1.p2.k4.gpipe.z1",
    "d2.c2.t1.p1.k1.z3",
    "d2.t2.p1.k2.z3",
]
# what each trainer does not run by default (mixed bf16), by the reason it gives
FSDP_ONLY = "mixed precision through FSDP2 only"
REFUSED = {
    ("deepspeed", "d2.t1.p1.k2.z0"): "that is distir's z1",
    ("deepspeed", "d2.t1.p2.k4.1f1b.z2"): "ZeRO 0 or 1 only",
    ("deepspeed", "d1.t2.p2.k4.interleaved.v2.z1"): "its own 1F1B",
    ("deepspeed", "d2.t1.p2.k4.zb1.z1"): "its own 1F1B",
    ("megatron", "d2.t1.p2.k4.zb1.z1"): "1F1B and interleaved 1F1B",
    ("megatron", "d2.t1.p2.k4.gpipe.z1"): "1F1B and interleaved 1F1B",
    ("torchtitan", "d1.t1.p1.k1"): FSDP_ONLY,
    ("torchtitan", "d2.t1.p1.k1.z1"): FSDP_ONLY,
    ("torchtitan", "d2.t1.p1.k2.z0"): FSDP_ONLY,
    ("torchtitan", "d2.t2.sp.p1.k2.z1"): FSDP_ONLY,
    ("torchtitan", "d2.t1.p2.k4.1f1b.z1"): FSDP_ONLY,
    ("torchtitan", "d1.t2.p2.k4.interleaved.v2.z1"): FSDP_ONLY,
    ("torchtitan", "d2.t1.p2.k4.zb1.z1"): FSDP_ONLY,
    ("torchtitan", "d2.t1.p2.k4.gpipe.z1"): FSDP_ONLY,
    ("deepspeed", "d2.t1.p2.k4.gpipe.z1"): "its own 1F1B",
    ("deepspeed", "d2.c2.t1.p1.k1.z3"): "Ulysses",
    ("torchtitan", "d2.t2.p1.k2.z3"): "SequenceParallel",
}


@pytest.fixture(scope="module")
def small() -> object:
    return build_model(SMALL, batch=16, dtype=DType.bf16)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_trainer_runs_what_it_runs_and_refuses_the_rest_in_one_line(trainer: str, small: object) -> None:
    h100 = PRESETS["h100"].device
    for text in STRATEGIES:
        s = parse_strategy(text)
        reason = REFUSED.get((trainer, text))
        try:
            sem = trainer_semantics(trainer, s, MIXED, DType.bf16, h100)
            distribute(small, s, Optimizer("adam"), comm_streams=True, precision=MIXED, **sem.switches())  # type: ignore[arg-type]
        except StrategyError as e:
            assert reason is not None and reason in str(e), (trainer, text, str(e))
            assert "\n" not in str(e)
        else:
            assert reason is None, (trainer, text)


def test_unknown_trainer_is_a_one_line_error() -> None:
    with pytest.raises(TrainerError, match="trainer must be one of distir, megatron, deepspeed, torchtitan"):
        trainer_semantics("nemo", parse_strategy("d1.t1.p1.k1"), MIXED, DType.bf16)


@pytest.mark.parametrize(
    ("trainer", "strategy", "precision", "dtype", "train", "reason"),
    [
        ("megatron", "d2.z1", "pure", DType.bf16, True, "keeps fp32 master weights"),
        ("deepspeed", "d2.z1", "pure", DType.f16, True, "keeps fp32 master weights"),
        ("megatron", "d2.z1", "mixed", DType.bf16, False, "describes training"),
        (
            "torchtitan",
            "d2.t1.p2.k4.1f1b.z3",
            "mixed",
            DType.bf16,
            True,
            "distir's ZeRO-3 reduce-scatters every",
        ),
    ],
)
def test_what_a_trainer_does_not_run_by_default_is_refused(
    trainer: str, strategy: str, precision: str, dtype: DType, train: bool, reason: str
) -> None:
    with pytest.raises(TrainerError, match=reason) as e:
        trainer_semantics(trainer, parse_strategy(strategy), Precision.parse(precision), dtype, train=train)
    assert "\n" not in str(e.value)


def test_torchtitan_runs_pure_data_parallelism_without_fsdp() -> None:
    # apply_ddp in fp32: no mixed precision to refuse, no FSDP2 copy into a reduce-scatter buffer
    sem = trainer_semantics("torchtitan", parse_strategy("d2.z0"), Precision.parse("pure"), DType.f32)
    assert sem.grad_copy_in == "" and sem.kernels == "eager"


def test_torchtitan_runs_torchs_ring_under_context_parallelism() -> None:
    ring = trainer_semantics("torchtitan", parse_strategy("d2.c4.z3"), MIXED, DType.bf16).ring_form
    assert ring == "torch"
    assert trainer_semantics("torchtitan", parse_strategy("d8.z3"), MIXED, DType.bf16).ring_form == "p2p"
    assert trainer_semantics("megatron", parse_strategy("d2.c4.z1"), MIXED, DType.bf16).ring_form == "p2p"


def test_a_switch_of_another_trainer_is_refused() -> None:
    user_switches_fit("deepspeed", True, True, False)
    user_switches_fit("megatron", False, False, True)
    for trainer in ("megatron", "torchtitan"):
        # the message names the switches given, only those
        for pipe, accum, words in (
            (True, False, f"--deepspeed-pipe is DeepSpeed's pipeline engine, not {trainer}'s"),
            (False, True, f"--fp32-grad-accum is DeepSpeed's BF16_Optimizer, not {trainer}'s"),
            (True, True, "--deepspeed-pipe is DeepSpeed's pipeline engine and --fp32-grad-accum is"),
        ):
            with pytest.raises(TrainerError) as got:
                user_switches_fit(trainer, pipe, accum, False)
            assert words in str(got.value) and str(got.value).count("--") == pipe + accum
    with pytest.raises(TrainerError, match="Megatron-LM's"):
        user_switches_fit("deepspeed", False, False, True)


@pytest.mark.parametrize(("trainer", "why"), [("megatron", "main_grad"), ("torchtitan", "reduce_dtype")])
def test_an_optimizer_without_fp32_masters_is_refused_by_a_trainer_with_fp32_gradients(
    trainer: str, why: str
) -> None:
    """Megatron-LM's fp32 main_grad and torchtitan's fp32 reductions feed fp32 masters: an
    optimizer in bf16 beside them is refused naming the trainer (the refusal named an fp32
    gradient accumulation the user never asked for); f32, and the neutral trainer, are taken."""
    with pytest.raises(TrainerError) as got:
        user_switches_fit(trainer, False, False, False, optimizer_dtype="bf16")
    assert f"--optimizer-dtype bf16 keeps no fp32 masters; --trainer {trainer}" in str(got.value)
    assert why in str(got.value)
    user_switches_fit(trainer, False, False, False, optimizer_dtype="f32")
    user_switches_fit("distir", False, False, False, optimizer_dtype="bf16")


@pytest.mark.parametrize(
    ("strategy", "dtype", "optimizer_dtype", "why"),
    [
        ("d2.t1.p1.k2.z1", DType.bf16, "bf16", "BF16_Optimizer, which always keeps fp32 masters"),
        ("d1.t1.p1.k1", DType.bf16, "bf16", "BF16_Optimizer, which always keeps fp32 masters"),
        ("d2.t1.p2.k4.1f1b.z1", DType.bf16, "bf16", "BF16_Optimizer, which always keeps fp32 masters"),
        ("d2.t1.p1.k2.z2", DType.bf16, "bf16", "a bf16 clone of this rank's partition"),
        ("d2.t1.p1.k2.z3", DType.f16, "f16", "DeepSpeed keeps no f16 optimizer state"),
    ],
)
def test_deepspeed_takes_an_optimizer_without_fp32_masters_only_where_it_keeps_one(
    strategy: str, dtype: DType, optimizer_dtype: str, why: str, small: object
) -> None:
    """DeepSpeed's BF16_Optimizer (its z0/z1) always keeps fp32 masters, its ZeRO-1/2 optimizer a
    bf16 clone of the partition, and it has no fp16 optimizer state: refused, naming why; its
    ZeRO-3 optimizer with bf16 masters and states updates the partition in place, as distir does,
    and runs (the combination was taken under every ZeRO stage, DeepSpeed's z2 unmodelled)."""
    prec = Precision(mixed=True, master=DType(optimizer_dtype))
    with pytest.raises(TrainerError, match=why) as got:
        trainer_semantics("deepspeed", parse_strategy(strategy), prec, dtype)
    assert "\n" not in str(got.value)
    s = parse_strategy("d2.t1.p1.k2.z3")
    bf16 = Precision(mixed=True, master=DType.bf16)
    sem = trainer_semantics("deepspeed", s, bf16, DType.bf16)
    assert not sem.fp32_grad_accum and sem.zero3_fetch is not None
    distribute(small, s, Optimizer("adam"), comm_streams=True, precision=bf16, **sem.switches())  # type: ignore[arg-type]


def test_the_neutral_trainer_sets_no_switch() -> None:
    sem = trainer_semantics("distir", parse_strategy("d8.t1.p1.k4.z3"), MIXED, DType.bf16)
    assert sem == TrainerSemantics()
    assert not any(sem.switches().values())


def test_megatron_attention_follows_the_gpus_published_kernels() -> None:
    s = parse_strategy("d2.t1.p1.k1.z1")
    assert (
        trainer_semantics("megatron", s, MIXED, DType.bf16, PRESETS["h100"].device).attention_kernel
        == "cudnn"
    )
    assert (
        trainer_semantics("megatron", s, MIXED, DType.bf16, PRESETS["dgx-a100"].device).attention_kernel
        == "fa2"
    )
    assert trainer_semantics("megatron", s, MIXED, DType.bf16).attention_kernel == "fa2"
    # Megatron-FSDP reduces every backward: no fusion into whole fp32 gradients
    z3 = trainer_semantics("megatron", parse_strategy("d2.t1.p1.k2.z3"), MIXED, DType.bf16)
    assert (
        not z3.grad_accum_fusion
        and not trainer_semantics("megatron", s, Precision.parse("pure"), DType.f32).grad_accum_fusion
    )


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k2.z1", "d2.t2.p1.k2.z1"])
def test_megatron_holds_fp32_gradients_two_bytes_a_parameter_more(strategy: str) -> None:
    # --bf16 forces Megatron's fp32 main_grad: 4 bytes a gradient where distir's mixed precision
    # accumulates bf16 (2); on one stage that is the whole difference in peak memory
    model = build_model(
        "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1024,seq=64", 16, DType.bf16
    )
    s, cl = parse_strategy(strategy), parse_cluster("h100")
    peaks = {}
    for trainer in ("distir", "megatron"):
        sem = trainer_semantics(trainer, s, MIXED, DType.bf16, cl.nodes[0].device)
        prog = distribute(model, s, Optimizer("adam"), comm_streams=True, precision=MIXED, **sem.switches())  # type: ignore[arg-type]
        r = simulate(
            prog, cl, device_map(s, True), RooflineCostModel(cl, attention_kernel=sem.attention_kernel)
        )
        # the tensors' peak (without the runtime memory: CUDA context, workspaces, allocator reserve)
        peaks[trainer] = max(r.peak_memory[g] - r.runtime_memory.get(g, 0.0) for g in r.peak_memory)
    assert peaks["megatron"] - peaks["distir"] == pytest.approx(2 * model.num_params / s.t, rel=0.01)


# -- against the published-runs records, whose fields cite each trainer's code ------------------
BENCH = Path(__file__).resolve().parents[2] / "bench" / "validate_published.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_published", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


vp = _bench()
FSDP2 = (
    "reduce_fp32",
    "grad_copy_in",
    "gather_copy_out",
    "fsdp2_root",
    "one_dp_stream",
    "gather_cast",
    "fp32_grad_accum",
    "fsdp2_grad_accum",
    "overlap_param_gather",
    "attention_kernel",
    "ring_form",
)
KERNELS = ("kernels", "optimizer_kernels")
CLIP = ("max_norm", "clip_scale")
# the current trainers' records (the MT-NLG rows ran a DeepSpeed before its BF16_Optimizer);
# torchtitan's semantics are 820504e's (the June 2025 page: the fused AdamW), where the December
# 2024 page's torchtitan ran the foreach one, and its rows ran torch.compile or not as each says
CHECKED = {
    "megatron": (
        "megatron-",
        (
            "megatron_ddp",
            "grad_accum_fusion",
            "reduce_fp32",
            "p2p_blocking",
            "attention_kernel",
            *KERNELS,
            *CLIP,
        ),
    ),
    "deepspeed": ("bloom-", ("deepspeed_pipe", "fp32_grad_accum", "attention_kernel", *KERNELS, *CLIP)),
    "torchtitan": ("titan-", (*FSDP2, *CLIP)),
}


def _checked_keys(trainer: str, run: object) -> tuple[str, ...]:
    keys = CHECKED[trainer][1]
    if trainer == "torchtitan" and "2025-06" in run.source:  # type: ignore[attr-defined]
        keys = (*keys, "optimizer_kernels")
    return keys


@pytest.mark.parametrize("trainer", sorted(CHECKED))
def test_switches_are_the_published_records_of_that_trainer(trainer: str) -> None:
    prefix = CHECKED[trainer][0]
    runs = [r for r in vp.load_runs() if r.name.startswith(prefix) and not vp.unsupported(r)]
    assert runs
    for r in runs:
        s = vp.strategy_of(r.strategy)
        prec = Precision.parse(vp.PRECISIONS[r.precision] or "mixed")
        sem = trainer_semantics(trainer, s, prec, DType.bf16, vp.cluster_of(r.cluster).nodes[0].device)
        for key in _checked_keys(trainer, r):
            assert getattr(sem, key) == getattr(r, key), (r.name, key)


def test_model_options_are_the_records_model_strings() -> None:
    """Each trainer's model options are its records' model fields: torchtitan's eager and
    compiled (``inductor``) forms and loss (820504e: the loss compiled with the model under ``--training.compile``, the June 2025
    page; the December 2024 page's 9dec370 ran it uncompiled under ``loss_parallel`` even in its
    compiled TP rows, a version's difference), Megatron-LM's and Megatron-DeepSpeed's fused QKV."""
    checked = 0
    for r in vp.load_runs():
        trainer = next((t for t, (prefix, _) in CHECKED.items() if r.name.startswith(prefix)), None)
        if trainer is None or vp.unsupported(r):
            continue
        s = vp.strategy_of(r.strategy)
        for key, value in model_options(trainer, s, r.kernels).items():
            if key == "loss" and s.t > 1 and r.kernels == "inductor" and "2025-06" not in r.source:
                continue
            assert getattr(r.model, key) == value, (r.name, key)
            checked += 1
    assert checked >= 30
    assert model_options("distir", parse_strategy("d8.t8.sp.z3"), "fused") == {}


def test_no_trainer_splits_a_microbatch_unevenly() -> None:
    s = parse_strategy("d2.t1.p1.k1.b3-1")
    assert trainer_semantics("distir", s, MIXED, DType.bf16).trainer == "distir"
    for trainer in ("megatron", "deepspeed", "torchtitan"):
        with pytest.raises(TrainerError, match="uneven batch shares"):
            trainer_semantics(trainer, s, MIXED, DType.bf16)
    assert trainer_semantics("megatron", parse_strategy("d2.t1.p1.k1.b1-1"), MIXED, DType.bf16).megatron_ddp


def test_torchtitan_mixes_precision_in_bf16_only() -> None:
    s = parse_strategy("d8.t1.p1.k1.z3")
    assert trainer_semantics("torchtitan", s, MIXED, DType.bf16).fsdp2_root
    with pytest.raises(TrainerError, match="mixed_precision_param"):
        trainer_semantics("torchtitan", s, MIXED, DType.f16)
