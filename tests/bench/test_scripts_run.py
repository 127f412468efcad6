"""The quick bench scripts run to the end (they print figures and are not run otherwise, so an
API change that breaks one would go unnoticed; mypy checks the calls, this the runs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .scripts import BENCH

# a 2-block Mistral: its export and 8 simulations take seconds
ONNX_VS_HF_TINY = (
    "--layers 2 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --vocab 128 --window 8 --positions 64 --seq 16"
)
QUICK = [
    ["bench_pipeline.py"],
    ["bench_ring_attention.py"],
    ["bench_memory_kernels.py"],
    ["bench_sim.py", "--max-ops", "10000"],
    ["bench_zero_memory.py"],
    ["bench_onnx_vs_hf.py", *ONNX_VS_HF_TINY.split()],
    [
        "bench_trace_detail.py",
        "--model",
        "gpt:layers=2,hidden=128,heads=4",
        "--strategy",
        "d1.t1.p2.k2.1f1b",
        "--cluster",
        "dgx-a100",
        "--batch",
        "8",
    ],
]


@pytest.mark.parametrize("argv", QUICK, ids=lambda a: a[0])
def test_quick_bench_script_runs(argv: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BENCH.parent / "src")}
    done = subprocess.run(
        [sys.executable, str(BENCH / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "printed nothing"
    assert "Traceback" not in done.stderr
