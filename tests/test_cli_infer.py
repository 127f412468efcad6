"""``distir simulate --infer`` with what only a training step has, and ``simulate FILE`` with what
only builds a ``--model``'s program: one line naming every such option, exit 2, never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app

MODEL = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--infer"]
FIG2 = str(Path(__file__).resolve().parents[1] / "examples" / "fig2_mlp_pipeline.distir")


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--optimizer", "adam"], "--optimizer adam"),
        (
            ["--optimizer", "sgd", "--clip-grad", "1", "--bucket-mb", "10"],
            "--optimizer sgd, --bucket-mb 10, --clip-grad 1",
        ),
        (["--fp32-grad-accum"], "--fp32-grad-accum"),
        (["--strategy", "d2.t1.p1.k1.z1", "--overlap-param-gather"], "--overlap-param-gather, ZeRO-1 (z1)"),
        (["--strategy", "d1.t1.p1.k1.rsel"], "recomputation (rsel)"),
        (["--strategy", "d1.t1.p2.k4.zb1"], "the zero-bubble schedule (zb1)"),
        (["--strategy", "d2.t1.p1.k1.z3", "--zero3-fetch", "deepspeed"], "--zero3-fetch deepspeed"),
        (["--precision", "fp8-delayed", "--fp8-weight-cache"], "--fp8-weight-cache"),
    ],
)
def test_inference_refuses_training_only_options(extra: list[str], named: str) -> None:
    code, out, err = _run(*MODEL, *extra)
    assert code == 2 and out == ""
    assert err.strip().startswith(
        f"--infer runs the forward only: no optimizer step, gradients or backward, so {named} "
    )
    assert len(err.strip().splitlines()) == 1


def test_inference_keeps_what_it_runs() -> None:
    """ZeRO-3's sharded weights (gathered per layer) and microbatches are forward work too."""
    code, _, err = _run(*MODEL, "--strategy", "d2.t1.p1.k2.z3", "--json")
    assert code == 0, err
    code, _, err = _run(*MODEL, "--strategy", "d2.t1.p1.k2.z3", "--zero3-fetch", "layer", "--json")
    assert code == 0, err


def test_training_takes_the_optimizer() -> None:
    code, _, err = _run(*MODEL[:-1], "--optimizer", "sgd", "--json")
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--infer"], "--infer"),
        (["--optimizer", "sgd"], "--optimizer sgd"),
        (["--dtype", "bf16", "--tp-layout", "auto"], "--dtype bf16, --tp-layout auto"),
    ],
)
def test_a_program_file_refuses_the_options_that_build_a_model(extra: list[str], named: str) -> None:
    code, _, err = _run("simulate", FIG2, *extra)
    assert (
        code == 2
        and err.strip() == f"{named} applies to --model, not to a program file (it runs as it is written)"
    )


def test_an_inference_search_refuses_an_optimizer() -> None:
    args = ("search", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--batch", "16", "--infer")
    code, out, err = _run(*args, "--optimizer", "sgd")
    assert code == 2 and out == ""
    assert err.strip() == "--infer runs no optimizer step: drop --optimizer sgd, or search training (--train)"


def test_an_inference_search_refuses_mixed_precision_it_would_ignore() -> None:
    """The search simulates inference in pure precision: ``--precision mixed`` was reported as the
    search's precision while every result was the pure program's (and the winner's ``simulate``
    line, with ``--precision mixed --infer``, gave other figures)."""
    args = ("search", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--batch", "16", "--infer")
    code, out, err = _run(*args, "--precision", "mixed", "--fresh")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(
        "--infer searches and simulates the forward in the dtype (pure precision): --precision mixed"
    )


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            ["--strategy", "d1.t2.p1.k2", "--fp8-weight-cache"],
            "--precision mixed has none: give --precision fp8-delayed",
        ),
        (
            ["--strategy", "d2.t1.p1.k2", "--overlap-param-gather"],
            "d2.t1.p1.k2.1f1b with --precision mixed has none",
        ),
        (
            ["--strategy", "d1.t1.p1.k2.z1", "--overlap-param-gather"],
            "d1.t1.p1.k2.1f1b.z1 with --precision mixed",
        ),
        (
            [
                "--strategy",
                "d2.t1.p1.k2.z1",
                "--overlap-param-gather",
                "--dtype",
                "bf16",
                "--precision",
                "pure",
            ],
            "with --precision pure has none to gather",
        ),
    ],
)
def test_a_switch_for_another_kind_of_plan_is_refused(extra: list[str], words: str) -> None:
    """``--fp8-weight-cache`` without delayed float8 scaling, ``--overlap-param-gather`` without
    ZeRO-1/2's sharded weights in mixed precision over d·c > 1: the plan would run without them."""
    code, out, err = _run("simulate", "--model", "gpt2-117m:layers=2", "--cluster", "h100", *extra)
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


def test_a_switch_for_its_plan_runs() -> None:
    args = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "h100", "--json"]
    code, _, err = _run(*args, "--strategy", "d2.t1.p1.k2.z1", "--overlap-param-gather")
    assert code == 0, err
    code, _, err = _run(
        *args, "--strategy", "d1.t1.p2.k2", "--precision", "fp8-delayed", "--fp8-weight-cache"
    )
    assert code == 0, err


def test_the_tp_comm_overlap_needs_sequence_parallelism() -> None:
    """Megatron-LM's --tp-comm-overlap requires --sequence-parallel: a strategy without .sp is
    refused, one with it runs."""
    args = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--tp-comm-overlap"]
    code, _, err = _run(*args, "--strategy", "d1.t2")
    assert code == 2 and "d1.t2.p1.k1.1f1b has none: add .sp (t > 1)" in err
    code, _, err = _run(*args, "--strategy", "d1.t2.sp", "--json")
    assert code == 0, err
