"""``distir export`` and ``distir search --export``: text on stdout or --out, warnings and notes on
stderr, the JSON object, one-line errors with exit status 2."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app

runner = CliRunner()
GPT = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128"


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _export(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["export", *args])
    return res.exit_code, res.stdout, res.stderr


def test_export_writes_the_configuration_to_stdout_and_warnings_to_stderr() -> None:
    code, out, err = _export(
        "--to", "deepspeed", "--model", "gpt2-1.6b", "--strategy", "d2.t4.sp.p2.k8.gpipe", "--batch", "64",
        "--cluster", "dgx-a100:2",
    )  # fmt: skip
    assert code == 0, err
    cfg = json.loads(out)
    # pipeline with TP: the tensor axis is the pipeline's topology's (AutoTP has no pipeline axis)
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and "tensor_parallel" not in cfg
    assert "warning: DeepSpeed's pipeline has no GPipe schedule" in err
    assert "note: pipeline:" in err and "PipeModelDataParallelTopology(num_pp=2, num_mp=4, num_dp=2)" in err


def test_export_to_a_file_and_as_json(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    args = [
        "--to",
        "torchtitan",
        "--model",
        "llama3-8b:loss=parallel",  # torchtitan's loss under TP: nothing to warn of
        "--strategy",
        "d4.t2.sp.p1.k1.1f1b.z3",
        "--batch",
        "32",
    ]
    code, out, err = _export(*args, "--dtype", "bf16", "--out", str(path))
    assert code == 0, err
    assert tomllib.loads(path.read_text())["parallelism"]["data_parallel_shard_degree"] == 4
    code, out, err = _export(*args, "--dtype", "bf16", "--json")
    payload = json.loads(out)
    assert payload["target"] == "torchtitan" and payload["warnings"] == []
    assert tomllib.loads(payload["text"]) == tomllib.loads(path.read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "colossal"], "--to must be one of torchtitan, megatron, deepspeed, fsdp"),
        (["--to", "deepspeed", "--strategy", "d1.t1.p4.k8.interleaved.v2"], "interleaved virtual pipeline"),
        (["--to", "megatron", "--strategy", "d2.t1.p1.k1.1f1b.b1-3"], "uneven batch shares"),
        (["--to", "megatron", "--strategy", "d2.t1.p1.k3.1f1b"], "equal microbatches"),
        (["--to", "megatron", "--strategy", "d2.x4"], "unknown part"),
        (["--to", "deepspeed", "--precision", "fp8"], "deepspeed cannot express fp8 training"),
        (["--to", "megatron", "--precision", "fp8", "--cluster", "dgx-a100"], "needs FP8 tensor cores"),
        (["--to", "megatron", "--precision", "fp8", "--dtype", "f16"], "computes what is not float8 in bf16"),
        (["--to", "torchtitan", "--precision", "fp8-delayed"], "torchtitan cannot express fp8-delayed"),
    ],
)
def test_errors_are_one_line_with_status_2(args: list[str], message: str) -> None:
    base = {"--to": "megatron", "--model": "gpt2-1.6b", "--strategy": "d1.t1.p1.k1.1f1b", "--batch": "64"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    code, _, err = _export(*[x for kv in base.items() for x in kv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_search_exports_the_winner(tmp_path: Path) -> None:
    out_path = tmp_path / "winner.toml"
    args = [
        "search",
        "--model",
        GPT,
        "--cluster",
        "dgx-a100",
        "--batch",
        "16",
        "--top",
        "2",
        "--workers",
        "1",
    ]
    args += ["--fresh", "--json", "--export", "torchtitan", "--export-out", str(out_path)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    winner = payload["results"][0]
    doc = tomllib.loads(out_path.read_text())
    assert payload["export"]["out"] == str(out_path) and winner["strategy"] in payload["export"]["text"]
    par = doc["parallelism"]
    d = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert (d, par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (
        winner["d"],
        winner["t"],
        winner["p"],
    )


def test_search_rejects_an_unknown_export_target_before_searching(tmp_path: Path) -> None:
    res = runner.invoke(app, ["search", "--model", GPT, "--fresh", "--export", "colossal"])
    assert res.exit_code == 2 and "--export must be one of" in res.stderr
