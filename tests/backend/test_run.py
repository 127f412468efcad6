"""``distir run``: per-rank programs on torch.distributed (gloo, 2 CPU ranks) equal the reference
executor — every collective and point-to-point op, and zoo training steps under DP, TP (with
sp), GPipe, 1F1B, interleaved, ZB-H1, ZeRO 1-3, recomputation, mixed precision and hybrids; a
killed rank stops the run within the bound; the command under torchrun verifies a pipeline.

The cases share launches (spawning ranks is the slow part): one 2-rank launch runs every 2-rank
program, one 4-rank launch the hybrids."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import distir  # noqa: E402
from distir.backend.launch import FAIL_STOP_BOUND_S, LaunchOptions, RunFailed, launch  # noqa: E402
from distir.backend.program import GlobalProgram, file_program, model_program, rank_programs  # noqa: E402
from distir.backend.verify import compare, reference_outputs  # noqa: E402
from distir.backend.worker import RankResult  # noqa: E402
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType  # noqa: E402
from distir.ir.types import ScalarType  # noqa: E402
from distir.ops import REGISTRY  # noqa: E402

MLP = "mlp:layers=4,hidden=6"
GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=4,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4"

# (name, model, strategy, batch, dtype, precision)
TWO_RANKS = [
    ("dp-mlp", MLP, "d2", 4, "f32", "pure"),
    ("tp-sp-gpt", GPT, "t2.sp", 2, "f32", "pure"),
    ("tp-llama", LLAMA, "t2", 2, "f32", "pure"),
    ("gpipe-mlp", MLP, "p2.k2.gpipe", 4, "f32", "pure"),
    ("1f1b-gpt", GPT, "p2.k4.1f1b", 4, "f32", "pure"),
    ("interleaved-llama", LLAMA, "p2.k2.interleaved.v2", 2, "f32", "pure"),
    ("zb1-gpt", GPT, "p2.k2.zb1", 2, "f32", "pure"),
    ("zero1-mlp", MLP, "d2.z1", 4, "f32", "pure"),
    ("zero2-gpt", GPT, "d2.z2", 2, "f32", "pure"),
    ("zero3-llama", LLAMA, "d2.z3", 2, "f32", "pure"),
    ("recompute-full-gpt", GPT, "p2.k2.1f1b.rfull", 2, "f32", "pure"),
    ("recompute-selective-llama", LLAMA, "t2.rsel", 2, "f32", "pure"),
    ("mixed-bf16-gpt", GPT, "d2", 2, "bf16", "mixed"),
    ("mixed-bf16-pp-llama", LLAMA, "p2.k2.1f1b", 2, "bf16", "mixed"),
    ("f64-gpt-tp", GPT, "t2.sp", 2, "f64", "pure"),
]
FOUR_RANKS = [
    ("hybrid-dp-tp-sp-gpt", GPT, "d2.t2.sp.z1", 4, "f32", "pure"),
    ("hybrid-tp-pp-llama", LLAMA, "t2.p2.k2.1f1b.rsel", 2, "f32", "pure"),
    ("hybrid-dp-pp-mlp", MLP, "d2.p2.k2.zb1", 4, "f32", "pure"),
]


def _collectives() -> Module:
    """Every collective and point-to-point op on 2 devices, with groups out of rank order,
    uneven pieces, scalars and every reduction the backend maps specially."""
    d0, d1 = Device(0), Device(1)
    fb = FunctionBuilder("colls", REGISTRY.out_arity)
    a = fb.param("a", TensorType(DType.f32, (5, 3), d0))
    b = fb.param("b", TensorType(DType.f32, (4, 3), d1))
    c = fb.param("c", TensorType(DType.f32, (5, 3), d1))
    s = fb.param("s", ScalarType(DType.f32, d0))
    outs: list[Any] = []
    outs += fb.op("AllReduce", a, c, op="mean")
    outs += fb.op("AllReduce", c, a, op="max")
    outs += fb.op("AllGather", a, b, dim=0)  # uneven: 5 and 4 rows
    outs += fb.op("AllGather", b, a, dim=0)  # group d1, d0: out of rank order
    outs += fb.op("ReduceScatter", a, c, dim=0)  # 5 rows over 2: 3 and 2
    outs += fb.op("ReduceScatter", a, c, dim=1, op="prod")
    outs += fb.op("Broadcast", b, devices=[d1, d0])
    outs += fb.op("Scatter", a, dim=0, devices=[d1, d0])
    outs += fb.op("MPIGather", a, b, dim=0, root=d1)
    outs += fb.op("Reduce", a, c, root=d0, op="min")
    outs += fb.op("AllToAll", a, b, split_dim=1, concat_dim=0)  # pieces of different shapes
    outs += fb.op("AllToAll", a, c, split_dim=0, concat_dim=1)
    outs += fb.op("Send", s, dst=d1)
    outs += fb.op("Send", b, dst=d0)
    outs += fb.op("Send", a, dst=d1)  # consecutive sends and receives, batched
    outs = [fb.op("Neg", o)[0] for o in outs]  # a local op after each, so ranks compute too
    return distir.check(Module((fb.ret(*outs),)))


def _launch(programs: list[GlobalProgram], world: int) -> list[list[RankResult]]:
    jobs = [rank_programs(p) for p in programs]
    assert all(len(j) == world for j in jobs)
    return launch([[j[r] for j in jobs] for r in range(world)], LaunchOptions(timeout_s=120))


def _verdict(prog: GlobalProgram, results: list[list[RankResult]], k: int) -> Any:
    want = reference_outputs(prog.module, prog.args)
    return compare(prog.module, want, {rank[k].device: rank[k].outputs for rank in results})


@pytest.fixture(scope="module")
def two_ranks() -> tuple[list[GlobalProgram], list[list[RankResult]]]:
    progs = [file_program(_collectives(), "collectives", seed=1)]
    progs += [model_program(m, s, b, dt, prec, "adam") for _, m, s, b, dt, prec in TWO_RANKS]
    return progs, _launch(progs, 2)


def test_every_collective_and_send_equals_the_reference(two_ranks: Any) -> None:
    progs, results = two_ranks
    v = _verdict(progs[0], results, 0)
    assert v.checked == len(progs[0].module.entry.outputs)
    assert v.verified, v
    assert v.max_abs_error < 1e-5


@pytest.mark.parametrize("case", TWO_RANKS, ids=[c[0] for c in TWO_RANKS])
def test_training_step_on_two_ranks_equals_the_reference(two_ranks: Any, case: tuple[str, ...]) -> None:
    progs, results = two_ranks
    k = 1 + TWO_RANKS.index(case)  # type: ignore[arg-type]
    v = _verdict(progs[k], results, k)
    assert v.verified, f"{case[0]}: {v}"
    assert v.checked > 1  # the loss and updated weights at least


def test_real_runs_report_step_times_and_peak_memory(two_ranks: Any) -> None:
    progs, results = two_ranks
    for rank in results:
        for r, p in zip(rank, progs, strict=True):
            assert len(r.step_times) == 1 and r.step_times[0] > 0
            # tracked live bytes start with the rank's inputs, which stay live through the step
            inputs = [q.type for q in p.module.entry.params if q.type.device == r.device]  # type: ignore[union-attr]
            least = sum(t.nbytes if isinstance(t, TensorType) else t.dtype.itemsize for t in inputs)
            assert least > 0
            assert r.peak_memory_bytes > least


def test_hybrids_on_four_ranks_equal_the_reference() -> None:
    progs = [model_program(m, s, b, dt, prec, "adam") for _, m, s, b, dt, prec in FOUR_RANKS]
    results = _launch(progs, 4)
    for k, case in enumerate(FOUR_RANKS):
        v = _verdict(progs[k], results, k)
        assert v.verified, f"{case[0]}: {v}"


def test_a_killed_rank_stops_every_rank_within_the_bound() -> None:
    prog = model_program(MLP, "p2.k2.1f1b", 4, "f32", "pure", "adam")
    jobs = rank_programs(prog, steps=10**6)  # runs until killed
    running = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            launch([[j] for j in jobs], LaunchOptions(timeout_s=120, running=running))
        except RunFailed as e:
            outcome["error"] = e
        outcome["end"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    assert running.wait(120), "the ranks never started"
    time.sleep(0.5)
    procs = {p.name: p for p in multiprocessing.active_children()}
    victim, other = procs["distir-rank-1"], procs["distir-rank-0"]
    killed_at = time.monotonic()
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    assert outcome["end"] - killed_at <= FAIL_STOP_BOUND_S + 1.0
    e = outcome["error"]
    assert e.rank == 1
    assert str(e).startswith("rank 1 (d1) was killed by SIGKILL at `")  # names the op, as printed
    assert not other.is_alive() and not victim.is_alive()
    for p in (victim, other):
        assert p.pid is not None and not Path(f"/proc/{p.pid}").exists() or _zombie(p.pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _env() -> dict[str, str]:
    src = str(Path(distir.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}


def test_torchrun_runs_a_two_stage_pipeline_and_verifies() -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not installed")
    cmd = [
        str(torchrun if torchrun.exists() else shutil.which("torchrun")),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "distir.cli",
        "run",
        "--model",
        MLP,
        "--strategy",
        "p2.k2.1f1b",
        "--batch",
        "4",
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["launcher"] == "torchrun"
    assert report["verified"] is True
    assert set(report["peak_memory_bytes"]) == {"d0", "d1"}
