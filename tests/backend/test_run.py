"""``distir run``: per-rank programs on torch.distributed (gloo, 2 CPU ranks) equal the reference
executor — every collective and point-to-point op, and zoo training steps under DP, TP (with
sp), GPipe, 1F1B, interleaved, ZB-H1, ZeRO 1-3, recomputation, mixed precision and hybrids; a
killed rank, or one that dies while starting, stops the run within the bound; the command under
torchrun verifies a pipeline; the fig2 example verifies, a unit at a ReLU's kink counted.

The cases share launches (spawning ranks is the slow part): one 2-rank launch runs every 2-rank
program, one 4-rank launch the hybrids."""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import distir
from distir.backend.launch import FAIL_STOP_BOUND_S, LaunchOptions, RunFailed, launch
from distir.backend.program import GlobalProgram, file_program, model_program, rank_programs
from distir.backend.verify import compare, reference_outputs
from distir.backend.worker import RankResult
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.ir.types import ScalarType
from distir.ops import REGISTRY

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


@pytest.mark.xdist_group("run-two-ranks")
@pytest.mark.slow
def test_every_collective_and_send_equals_the_reference(two_ranks: Any) -> None:
    progs, results = two_ranks
    v = _verdict(progs[0], results, 0)
    assert v.checked == len(progs[0].module.entry.outputs)
    assert v.verified, v
    assert v.max_abs_error < 1e-5


@pytest.mark.xdist_group("run-two-ranks")
@pytest.mark.slow
@pytest.mark.parametrize("case", TWO_RANKS, ids=[c[0] for c in TWO_RANKS])
def test_training_step_on_two_ranks_equals_the_reference(two_ranks: Any, case: tuple[str, ...]) -> None:
    progs, results = two_ranks
    k = 1 + TWO_RANKS.index(case)  # type: ignore[arg-type]
    v = _verdict(progs[k], results, k)
    assert v.verified, f"{case[0]}: {v}"
    assert v.checked > 1  # the loss and updated weights at least


@pytest.mark.xdist_group("run-two-ranks")
@pytest.mark.slow
def test_real_runs_report_step_times_and_peak_memory(two_ranks: Any) -> None:
    progs, results = two_ranks
    for rank in results:
        for r, p in zip(rank, progs, strict=True):
            assert len(r.step_times) == 1 and r.step_times[0] > 0
            assert r.fallback_ops == []  # every op ran its torch implementation
            # tracked live bytes start with the rank's inputs, which stay live through the step
            inputs = [q.type for q in p.module.entry.params if q.type.device == r.device]  # type: ignore[union-attr]
            least = sum(t.nbytes if isinstance(t, TensorType) else t.dtype.itemsize for t in inputs)
            assert least > 0
            assert r.peak_memory_bytes > least


@pytest.mark.slow
def test_hybrids_on_four_ranks_equal_the_reference() -> None:
    progs = [model_program(m, s, b, dt, prec, "adam") for _, m, s, b, dt, prec in FOUR_RANKS]
    results = _launch(progs, 4)
    for k, case in enumerate(FOUR_RANKS):
        v = _verdict(progs[k], results, k)
        assert v.verified, f"{case[0]}: {v}"


@pytest.mark.slow
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
    # names the op, as printed: the one it was running, or its last one when killed between steps
    assert re.match(r"rank 1 \(d1\) was killed by SIGKILL (at|after its last op) `", str(e)), str(e)
    assert not other.is_alive() and not victim.is_alive()
    for p in (victim, other):
        assert (p.pid is not None and not Path(f"/proc/{p.pid}").exists()) or _zombie(p.pid)


class _DieOnUnpickle:
    """An input whose unpickling in the spawned rank runs ``how(*args)``: the rank dies while
    starting (unpickling its programs), before it joins the process group — no hook in the
    code under test."""

    def __init__(self, how: Any, *args: Any) -> None:
        self.how, self.args = how, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.how, self.args


@pytest.mark.slow
@pytest.mark.parametrize(
    ("death", "why"),
    [
        (_DieOnUnpickle(os._exit, 0), "exited with status 0"),  # a silent, "successful" exit
        (_DieOnUnpickle(os._exit, 3), "exited with status 3"),
        (_DieOnUnpickle(signal.raise_signal, signal.SIGKILL), "was killed by SIGKILL"),
    ],
    ids=["status-0", "status-3", "sigkill"],
)
def test_a_rank_dying_at_startup_stops_every_rank_within_the_bound(death: Any, why: str) -> None:
    # a step whose rank programs pickle to megabytes: the rank dies before reading the rest
    # (a spawn's parent that kept writing it to the rank would wait forever)
    prog = model_program("mlp:layers=2,hidden=512", "p2.k2.1f1b", 4, "f32", "pure", "adam")
    jobs = rank_programs(prog, steps=2)
    assert len(pickle.dumps(jobs[1])) > 1 << 20
    jobs[1] = dataclasses.replace(jobs[1], inputs=(death, *jobs[1].inputs))
    died: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:  # when rank 1's process is seen gone
        while not stop.is_set() and "at" not in died:
            for p in multiprocessing.active_children():
                if p.name == "distir-rank-1" and p.exitcode is not None:
                    died["at"] = time.monotonic()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(RunFailed) as info:
            # rank 0 waits for rank 1 in the rendezvous: gloo's timeout alone would take 120 s
            launch([[j] for j in jobs], LaunchOptions(timeout_s=120))
        end = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    e = info.value
    assert e.rank == 1
    assert str(e) == (
        f"rank 1 (d1) {why} while starting (importing, unpickling its programs), "
        "before it joined the process group"
    )
    assert end - died.get("at", end) <= FAIL_STOP_BOUND_S + 0.5
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("distir-rank-")]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _env() -> dict[str, str]:
    src = str(Path(distir.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
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


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "distir.cli", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=cwd)


@pytest.mark.slow
def test_run_command_reports_json_and_writes_real_traces(tmp_path: Path) -> None:
    trace = tmp_path / "real.json"
    proc = _cli(
        "--model",
        MLP,
        "--strategy",
        "p2.k2.1f1b",
        "--batch",
        "4",
        "--steps",
        "3",
        "--json",
        "--trace",
        str(trace),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["launcher"] == "local" and report["steps"] == 3
    assert 0 <= report["max_abs_error"] <= report["tolerance"]
    assert report["step_time_s"] > 0
    assert report["memory_source"] == "tracked live tensors"
    assert set(report["peak_memory_bytes"]) == {"d0", "d1"} and min(report["peak_memory_bytes"].values()) > 0
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    # the simulator's trace keys, so real and simulated traces load side by side
    assert all({"name", "cat", "ph", "pid", "tid", "ts", "dur"} <= e.keys() for e in slices)
    # each op's thread CPU time: never negative, and no more than its wall time (one thread)
    assert all(0 <= e["args"]["cpu_us"] <= e["dur"] + 50 for e in slices)
    # a batch of point-to-point transfers is one slice, named by its ops ("rank.Send+rank.Recv")
    comm = {(e["pid"], op) for e in slices if e["cat"] == "comm" for op in e["name"].split("+")}
    assert {(0, "rank.Send"), (1, "rank.Recv"), (1, "rank.Send"), (0, "rank.Recv")} <= comm
    for pid in (0, 1):  # one op at a time per rank: slices do not overlap
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["pid"] == pid)
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(mine))


@pytest.mark.slow
def test_the_fig2_example_verifies_counting_its_units_at_a_kink() -> None:
    # seed 0 in float32: a first-layer ReLU input is +3.8e-6 exactly and may be -3.8e-6 in torch's
    # float32 product; the run verifies against exact arithmetic with that unit reversed
    fig2 = Path(__file__).resolve().parents[2] / "examples" / "fig2_mlp_pipeline.distir"
    proc = _cli(str(fig2), "--json", "--steps", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True
    n = report["kink_units_reversed"]
    assert n == 0 or report["kink_max_distance"] <= report["kink_bound"]


BAD = """
func @bad(%x: Tensor[f32, (4, 3), d0], %t: Tensor[f32, (1, 3), d1], %i: Tensor[i64, (5,), d1]) {
  %y = Send(%x, dst=d1)
  %g = Gather(%t, %i, axis=0)
  %s = ReduceSum(%y, axes=[0], keepdims=0)
  return %g, %s
}
"""


@pytest.mark.slow
def test_a_rank_that_raises_stops_the_run_with_one_message(tmp_path: Path) -> None:
    # seeded integer inputs are 0 or 1: row 1 of a 1-row table is out of range on d1
    f = tmp_path / "bad.distir"
    f.write_text(BAD)
    proc = _cli(str(f))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "distir run: rank 1 (d1) failed at `%g: Tensor[f32, (5, 3), d1] = Gather(%t, %i, axis=0)`"
    )
    assert "IndexError" in lines[0]


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(
    _cuda_devices() < 2, reason="NCCL needs 2 CUDA devices; this machine has fewer (CPU gloo runs above)"
)
def test_nccl_runs_the_same_programs_on_cuda() -> None:
    progs = [model_program(m, s, b, dt, prec, "adam") for _, m, s, b, dt, prec in TWO_RANKS[:6]]
    jobs = [rank_programs(p) for p in progs]
    results = launch([[j[r] for j in jobs] for r in range(2)], LaunchOptions(timeout_s=120, backend="nccl"))
    for k, p in enumerate(progs):
        assert _verdict(p, results, k).verified
        assert all(rank[k].memory_source == "cuda allocator" for rank in results)
