"""``--dtype auto --precision auto`` (``distir.report.numerics``): an unknown precision is named
with every choice, ``auto`` (the default) included."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.report.numerics import NumericsError, resolve_numerics

CHOICES = "--precision must be auto, mixed, pure, fp8 or fp8-delayed, got 'mixd'"


def test_an_unknown_precision_lists_auto_too() -> None:
    with pytest.raises(NumericsError, match=CHOICES):
        resolve_numerics("gpt2-117m", "auto", "mixd", True, "h100")
    r = CliRunner().invoke(app, ["simulate", "--model", "mlp", "--strategy", "d2", "--precision", "mixd"])
    assert r.exit_code == 2 and r.stderr.strip() == CHOICES


def test_a_half_format_the_gpus_compute_no_faster_than_fp32_is_a_warning() -> None:
    """bf16 on a V100 (no bf16 tensor cores: its bf16 peak is its fp32 one) runs at the fp32 rate,
    a bound for PyTorch's emulation: ``simulate`` says so on stderr and in its JSON's
    ``warnings``, naming the GPU and the faster f16; f16 there, and bf16 on an A100, warn of
    nothing. A mixed cluster names only the GPU without it."""
    from distir.hardware.presets import PRESETS
    from distir.report.numerics import slow_half_warnings

    v100 = PRESETS["dgx2-v100"].device
    (got,) = slow_half_warnings("bf16", "dgx2-v100")
    assert got.startswith(f"{v100.name} computes bf16 no faster than fp32")
    assert f"{v100.fp32 / 1e12:g} TFLOP/s" in got and f"f16 runs at {v100.fp16 / 1e12:g} TFLOP/s" in got
    assert slow_half_warnings("f16", "dgx2-v100") == slow_half_warnings("bf16", "dgx-a100") == []
    (mixed,) = slow_half_warnings("bf16", "p3.8xlarge:1+dgx-a100:1")
    assert mixed.startswith(PRESETS["p3.8xlarge"].device.name)
    base = ["simulate", "--model", "mlp:layers=2,hidden=64", "--strategy", "d2", "--batch", "8", "--json"]
    for dtype, want in (("bf16", [got]), ("f16", [])):
        r = CliRunner().invoke(app, [*base, "--dtype", dtype, "--cluster", "dgx2-v100"])
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["warnings"] == want
        assert r.stderr == "".join(f"warning: {w}\n" for w in want)
