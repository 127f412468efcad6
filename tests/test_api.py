"""The Python API (``distir.api``): the docs' example runs, results carry the JSON's fields,
models and clusters as objects or strings, ``distir.search`` both callable and a package."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import distir
from distir.api import Failed, Result, SearchResults
from distir.cli import app
from distir.frontends.zoo.model import ModelError
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.specs import HardwareError
from distir.parallel.strategy import StrategyError
from distir.report.fields import STRATEGY_FIELDS
from distir.search.rerank import RESULT_KEYS
from distir.search.space import SpaceError

ROOT = Path(__file__).resolve().parents[1]
GPT = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128"


@pytest.mark.slow
def test_the_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks and "distir.search(" in blocks[0]
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), namespace)
    out = capsys.readouterr().out
    best = namespace["best"]
    assert isinstance(best, Result) and best.strategy in out
    assert "MEGATRON_ARGS=(" in out


@pytest.fixture(scope="module")
def found() -> SearchResults:
    return distir.search(model=GPT, cluster="dgx-a100", batch=16, top=3)


def test_search_results_are_typed_with_the_json_fields(found: SearchResults) -> None:
    assert isinstance(found, SearchResults) and found.results and found.best is found.results[0]
    names = [f.name for f in dataclasses.fields(Result)]
    assert names[: len(STRATEGY_FIELDS)] == list(STRATEGY_FIELDS)
    assert set(RESULT_KEYS) <= set(names)
    for r in found.results:
        assert r.microbatch_size * r.d * r.k == found.batch
        assert r.layers_per_chunk is not None and sum(r.layers_per_chunk) == 2
        assert len(r.placement) == r.d * r.t * r.c * r.p
    assert found.results == tuple(sorted(found.results, key=lambda r: (not r.fits, -r.throughput)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.best.d = 3  # type: ignore[misc, union-attr]


@pytest.mark.slow
def test_the_search_json_has_exactly_the_result_fields(tmp_path: Path) -> None:
    args = ["search", "--model", GPT, "--cluster", "dgx-a100", "--batch", "16", "--top", "3"]
    res = CliRunner().invoke(app, [*args, "--workers", "1", "--fresh", "--json"])
    assert res.exit_code == 0, res.output
    names = {f.name for f in dataclasses.fields(Result)}
    for row in json.loads(res.stdout)["results"]:
        assert set(row) == names


def test_objects_and_strings_give_the_same_search(found: SearchResults) -> None:
    again = distir.search(
        model=parse_model_string(GPT), cluster=distir.Cluster.parse("dgx-a100"), batch=16, top=3
    )
    assert [r.strategy for r in again.results] == [r.strategy for r in found.results]
    assert again.best is not None and found.best is not None
    assert again.best.step_time_s == found.best.step_time_s


def test_simulate_agrees_with_the_cli() -> None:
    one = distir.simulate(GPT, "d2.t2.p2.k4.1f1b", "dgx-a100", 16, dtype="bf16", precision="mixed")
    args = ["simulate", "--model", GPT, "--strategy", "d2.t2.p2.k4.1f1b", "--cluster", "dgx-a100"]
    res = CliRunner().invoke(
        app, [*args, "--batch", "16", "--dtype", "bf16", "--precision", "mixed", "--json"]
    )
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)
    assert one.step_time_s == pytest.approx(cli["step_time_s"], rel=1e-9)
    assert (one.v, one.microbatch_size, one.layers_per_chunk) == (1, 2, (1, 1))
    assert [cli[f] for f in ("d", "t", "p", "k", "microbatch_size")] == [2, 2, 2, 4, 2]


def test_distribute_returns_a_verified_program() -> None:
    prog = distir.distribute(GPT, "d2.t1.p2.k2.1f1b", batch=8)
    distir.verify(prog)
    model = parse_model_string(GPT).build(8)
    assert distir.distribute(model, "d2.t1.p2.k2.1f1b") is not None  # a built model


def test_bad_input_is_a_typed_error() -> None:
    with pytest.raises(StrategyError, match="unknown part"):
        distir.simulate(GPT, "d2.x3", "dgx-a100", 16)


_API_BAD: list[tuple[str, dict[str, object], type[Exception], str]] = [
    ("search", {"batch": "8"}, SpaceError, "batch must be a positive integer, got '8' (str)"),
    ("search", {"batch": 8.0}, SpaceError, "batch must be a positive integer, got 8.0 (float)"),
    ("search", {"batch": True}, SpaceError, "batch must be a positive integer, got True (bool)"),
    ("search", {"batch": 0}, SpaceError, "batch must be a positive integer, got 0"),
    ("search", {"batch": 10**12}, SpaceError, "is above distir's bound of 16,777,216"),
    ("search", {"model": 3}, ModelError, "model must be a model string or a ModelSpec, got 3 (int)"),
    ("search", {"model": None}, ModelError, "model must be a model string or a ModelSpec, got None"),
    ("search", {"cluster": 8}, HardwareError, "cluster must be a cluster spec string or a Cluster, got 8"),
    ("search", {"top": 0}, SpaceError, "top must be a positive integer, got 0"),
    ("search", {"top": "2"}, SpaceError, "top must be a positive integer, got '2' (str)"),
    ("search", {"workers": 10**6}, SpaceError, "--workers 1,000,000: a local search starts one process"),
    ("search", {"train": "no"}, SpaceError, "train must be True or False, got 'no' (str)"),
    ("search", {"optimizer": "lion"}, SpaceError, "optimizer must be sgd or adam, got 'lion'"),
    ("search", {"tp_layout": "x"}, SpaceError, "tp_layout must be declared or auto, got 'x'"),
    # `distir search --precision fp8` is refused: the search screens no FP8 plans
    ("search", {"precision": "fp8"}, SpaceError, "precision must be auto, mixed or pure, got 'fp8' (str)"),
    ("search", {"precision": "fp8-delayed"}, SpaceError, "must be auto, mixed or pure, got 'fp8-delayed'"),
    ("search", {"cp": "2"}, SpaceError, "--cp must be a positive integer, got '2'"),
    ("search", {"hsdp": 3}, SpaceError, "--hsdp 3 must divide the data-parallel degree d"),
    ("search", {"microbatch_size": 3}, SpaceError, "--microbatch-size 3 does not divide the batch 16"),
    ("search", {"cp_from_seq": 0}, SpaceError, "--cp-from-seq must be a positive integer, got 0"),
    ("search", {"microbatches": 4, "max_microbatches": 2}, SpaceError, "-k 4 is above --max-microbatches 2"),
    ("search", {"max_microbatches": 0}, SpaceError, "max_microbatches must be a positive integer, got 0"),
    ("simulate", {"strategy": 2}, StrategyError, "strategy must be a strategy string or a Strategy, got 2"),
    ("simulate", {"strategy": None}, StrategyError, "got None"),
    ("simulate", {"cluster": ["dgx-a100"]}, HardwareError, "got ['dgx-a100'] (list)"),
    ("simulate", {"model": 3}, ModelError, "model must be a model string or a ModelSpec, got 3 (int)"),
    ("simulate", {"batch": 8.5}, StrategyError, "batch must be a positive integer, got 8.5 (float)"),
    ("simulate", {"batch": True}, StrategyError, "batch must be a positive integer, got True (bool)"),
    ("simulate", {"train": 1}, StrategyError, "train must be True or False, got 1 (int)"),
    ("distribute", {"strategy": 2}, StrategyError, "strategy must be a strategy string or a Strategy"),
    ("distribute", {"batch": "8"}, StrategyError, "batch must be a positive integer, got '8' (str)"),
    # the numerics, the optimizer and the store, each the function's own documented type (the
    # numerics raised distir.export's ExportError, the optimizer AutodiffError, the store StoreError)
    ("search", {"dtype": "f64"}, SpaceError, "dtype must be auto, f32, bf16 or f16, got 'f64'"),
    ("search", {"dtype": 5}, SpaceError, "dtype must be auto, f32, bf16 or f16, got 5"),
    ("search", {"dtype": "f32", "precision": "mixed"}, SpaceError, "mixed computes in a half format"),
    ("search", {"store": "."}, SpaceError, "store .: not a file name"),
    ("search", {"store": 5}, SpaceError, "store must be a path or None, got 5 (int)"),
    ("simulate", {"dtype": "f64"}, StrategyError, "dtype must be auto, f32, bf16 or f16, got 'f64'"),
    ("simulate", {"precision": "fp9"}, StrategyError, "precision must be auto, mixed, pure, fp8 or"),
    ("simulate", {"optimizer": "adamw"}, StrategyError, "optimizer must be sgd or adam, got 'adamw'"),
    ("distribute", {"dtype": "f99"}, StrategyError, "unknown dtype 'f99'"),
    ("distribute", {"precision": "mixed"}, StrategyError, "mixed precision computes in bf16 or f16"),
    ("distribute", {"optimizer": "adamw"}, StrategyError, "optimizer must be sgd or adam, got 'adamw'"),
    # inference takes no optimizer step: what only training has is refused, as --infer refuses it
    ("search", {"train": False, "optimizer": "sgd"}, SpaceError, "train=False runs no optimizer step"),
    ("simulate", {"train": False, "optimizer": "adam"}, StrategyError, "train=False runs no optimizer"),
    ("simulate", {"train": False, "strategy": "d2.z1"}, StrategyError, "so ZeRO-1 (z1) would be ignored"),
    ("simulate", {"train": False, "strategy": "d2.rfull"}, StrategyError, "recomputation (rfull) would"),
    ("distribute", {"train": False, "strategy": "d1.p2.k2.zb1"}, StrategyError, "zero-bubble schedule"),
    # the search and its exact simulation run inference in pure precision: a mixed one was ignored
    ("search", {"train": False, "precision": "mixed"}, SpaceError, "precision='mixed' would be ignored"),
    ("simulate", {"train": False, "precision": "fp8"}, StrategyError, "precision='fp8' would be ignored"),
]


@pytest.mark.parametrize(("function", "bad", "error", "words"), _API_BAD)
def test_arguments_of_a_wrong_type_or_range_are_typed_errors_before_any_work(
    function: str, bad: dict[str, object], error: type[Exception], words: str
) -> None:
    """What the CLI's options refuse (a type, a range, a bound) the API refuses with the typed
    one-line errors the docs name, never an AttributeError or TypeError from deep inside."""
    base: dict[str, object] = {"model": GPT, "cluster": "dgx-a100", "batch": 16}
    if function != "search":
        base["strategy"] = "d2.t1.p1.k1.1f1b"
    if function == "distribute":
        del base["cluster"]
    with pytest.raises(error, match=re.escape(words)) as got:
        getattr(distir, function)(**(base | bad))
    assert "\n" not in str(got.value)


def test_cluster_parse_names_a_spec_of_the_wrong_type() -> None:
    with pytest.raises(HardwareError, match=re.escape("got 8 (int)")):
        distir.Cluster.parse(8)  # type: ignore[arg-type]


def test_search_is_callable_and_still_a_package() -> None:
    import distir.search.run as run

    assert callable(distir.search) and run.SearchRequest is not None
    assert isinstance(Failed("d1", "boom"), Failed)


def test_import_distir_needs_neither_torch_nor_pandas() -> None:
    code = (
        "import sys, distir; distir.Cluster; print(sorted({'torch', 'pandas', 'typer'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_to_dataframe(found: SearchResults) -> None:
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            found.to_dataframe()
        return
    df = found.to_dataframe()
    assert list(df["strategy"]) == [r.strategy for r in found.results]


def test_simulate_as_a_trainer_agrees_with_the_cli() -> None:
    one = distir.simulate(
        GPT, "d2.t2.sp.p1.k2.z1", "h100", 16, dtype="bf16", precision="mixed", trainer="megatron"
    )
    args = [
        "simulate",
        "--model",
        GPT,
        "--strategy",
        "d2.t2.sp.p1.k2.z1",
        "--cluster",
        "h100",
        "--batch",
        "16",
    ]
    args += ["--dtype", "bf16", "--precision", "mixed", "--trainer", "megatron", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)
    assert one.trainer == "megatron" and one.step_time_s == cli["step_time_s"]
    assert one.peak_memory_bytes == max(cli["peak_memory_bytes"].values())
    neutral = distir.simulate(GPT, "d2.t2.sp.p1.k2.z1", "h100", 16, dtype="bf16", precision="mixed")
    assert neutral.step_time_s != one.step_time_s


def test_search_takes_every_pin_the_cli_takes() -> None:
    """``distir.search`` pins what ``distir search`` pins: microbatch size, HSDP and context
    parallelism too (``cp_from_seq`` as ``--cp-from-seq``)."""
    found = distir.search(model=GPT, cluster="dgx-a100", batch=16, top=1, cp=2, microbatch_size=2)
    assert found.best.c == 2 and found.best.microbatch_size == 2
    found = distir.search(model=GPT, cluster="dgx-a100", batch=16, top=1, hsdp=2)
    assert found.best.shard_group is not None and found.best.zero == 3


def test_a_half_format_the_gpus_compute_no_faster_than_fp32_is_a_user_warning() -> None:
    """bf16 on a V100 (no bf16 tensor cores) runs at the fp32 peak: ``simulate`` and ``search``
    say so as a ``UserWarning`` naming the GPU, as the CLI does on stderr; f16 there warns of
    nothing."""
    import warnings

    from distir.hardware.presets import PRESETS

    name = PRESETS["dgx2-v100"].device.name
    with pytest.warns(UserWarning, match=re.escape(f"{name} computes bf16 no faster than fp32")):
        distir.simulate(GPT, "d2", "dgx2-v100", 16, dtype="bf16")
    with pytest.warns(UserWarning, match=re.escape(PRESETS["p3.8xlarge"].device.name)):
        distir.search(GPT, "p3.8xlarge", 16, dtype="bf16", top=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        distir.simulate(GPT, "d2", "dgx2-v100", 16, dtype="f16")
