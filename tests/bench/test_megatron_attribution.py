"""bench/bench_megatron_attribution.py's bookkeeping (no simulation): op classes and the
data-parallel floor's arithmetic on a made-up split."""

from __future__ import annotations

import pytest

from .scripts import load_script

ba = load_script("bench_megatron_attribution")
RUNS = {r.name: r for r in ba.vp.load_runs()}


def test_the_rows_are_megatrons_h100_records() -> None:
    names = [n for n in RUNS if n.startswith(ba.PREFIX)]
    assert len(names) == 9
    assert sum(RUNS[n].strategy.pp == 1 for n in names) == 4  # the default set: no pipeline


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("MatMul", "gemm"),
        ("Attention", "attention"),
        ("AttentionGrad", "attention"),
        ("Redistribute", "tp_exposed"),
        ("Add", "rest"),
    ],
)
def test_op_classes(op: str, kind: str) -> None:
    assert ba._class_of(op) == kind


def _split(gemm_flops: float, published: float) -> object:
    per = dict.fromkeys(ba.CLASSES + ba.STREAMS, 0.0)
    per.update(gemm=0.5, attention=0.05, rest=0.08, tp_exposed=0.07, dp_reduce=0.34, dp_gather=0.18)
    return ba.Split(1.0, published, per, gemm_flops)


def test_floor_of_a_row_without_a_pipeline() -> None:
    """k = 192 / 48 = 4 microbatches: floor = AG + RS + 3/4 C; C max = (published - AG - RS) 4/3;
    C min = the GEMM FLOPs at the best measured rate + attention + rest."""
    run = RUNS["megatron-h100-32b"]
    dev = ba.vp.cluster_of(run.cluster).device_spec(0)
    flops = 0.4 * dev.bf16 * dev.gemm.fraction  # 0.4 s at the best rate
    line = ba.floor_line(run, _split(flops, 0.9))
    assert "floor  1045.0" in line  # AG 180 + RS 340 + 3/4 of C, C = 500 + 50 + 80 + 70 ms
    assert f"C max {1e3 * (0.9 - 0.52) * 4 / 3:7.1f}" in line
    assert f"C min {1e3 * (0.4 + 0.05 + 0.08):7.1f}" in line
    assert line.endswith("published below the floor")


def test_no_floor_under_a_pipeline() -> None:
    assert "no floor" in ba.floor_line(RUNS["megatron-h100-70b"], _split(1.0, 2.0))
