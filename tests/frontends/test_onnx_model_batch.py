"""An ONNX file as a model at other batches: a dynamic export's sizes that follow the batch become
batch-free Reshape targets (so microbatches and pipelines run it and equal the sequential step);
a static export's layers fix the batch, which every command says in one line instead of costing
the file's batch as another; ``model.onnx:seq=N`` sizes the other dynamic dims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distir.frontends.files import file_dims, is_model_file, load_file
from distir.frontends.zoo.model import ModelError
from distir.ir.ops import Op
from distir.parallel.strategy import StrategyError, parse_strategy


@pytest.fixture
def dynamic(gpt2_dynamic_onnx: Path) -> Path:
    """The 2-layer GPT-2's dynamic export (conftest.py's, shared with test_onnx_import.py)."""
    return gpt2_dynamic_onnx


@pytest.fixture
def static(gpt2_onnx: Path) -> Path:
    """Its static export (batch 2, seq 8)."""
    return gpt2_onnx


def _reshape_targets(model: Any) -> list[tuple[int, ...]]:
    block = next(f for f in model.module.functions if f.name == "block")
    return [tuple(i.attrs["shape"]) for i in block.body if isinstance(i, Op) and i.name == "Reshape"]


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_dynamic_exports_batch_sized_targets_become_batch_free(dynamic: Path) -> None:
    model = load_file(f"{dynamic}:seq=8", 4)
    assert model.fixed_batch is None and model.batch == 4
    targets = _reshape_targets(model)
    # the export's (batch, seq, ...) targets: the batch inferred (-1) or copied (0), never 4
    assert targets and all(t[0] in (-1, 0) for t in targets if len(t) >= 3)
    assert all(4 not in t for t in targets)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["d1.t1.p1.k2.1f1b", "d2.t1.p2.k2.1f1b", "d1.t1.p2.k4.gpipe", "d2.t2.p1.k2.1f1b"]
)
def test_a_dynamic_export_split_into_microbatches_equals_the_sequential_step(
    dynamic: Path, strategy: str
) -> None:
    from distir.parallel.check import check_against_sequential

    model = load_file(f"{dynamic}:seq=8", 8)
    cmp = check_against_sequential(model, parse_strategy(strategy))
    assert cmp.max_rel_diff < 1e-4, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"  # f32 sums
    assert {n for n, r in cmp.results.items() if r[0] == "weight"} >= {w.name for w in model.weights}


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_static_exports_layers_fix_the_batch(static: Path) -> None:
    from distir.autodiff.train import Optimizer
    from distir.parallel.distribute import distribute

    model = load_file(str(static), 2)
    assert model.fixed_batch == 2 and "Reshape" in model.fixed_by
    distribute(model, parse_strategy("d2.t1.p1.k1.1f1b"), Optimizer())  # replicas share it: fine
    with pytest.raises(StrategyError, match=r"fix the batch at 2 .*k=1"):
        distribute(model, parse_strategy("d1.t1.p1.k2.1f1b"), Optimizer())
    with pytest.raises(ModelError, match=r"fix the batch at 2 .* not 4"):
        load_file(str(static), 4)


def test_file_dims_parse_the_sizes_after_the_path() -> None:
    assert file_dims("a/m.onnx") == ("a/m.onnx", {})
    assert file_dims(" a/m.ONNX:seq=128,past=4 ") == ("a/m.ONNX", {"seq": 128, "past": 4})
    assert is_model_file("m.onnx:seq=8") and not is_model_file("hf:cfg:seq=8")
    for bad in ("m.onnx:seq", "m.onnx:seq=0", "m.onnx:=3", "m.distir:seq=8", "m.onnx:seq=1/2"):
        with pytest.raises(ModelError) as e:
            file_dims(bad)
        assert "\n" not in str(e.value)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_the_cli_says_in_one_line_that_a_static_export_fixes_the_batch(static: Path) -> None:
    from distir.cli import app

    runner = CliRunner()
    for args in (
        ["simulate", "--model", str(static), "--strategy", "d1.t1.p1.k2.1f1b", "--batch", "2"],
        ["simulate", "--model", str(static), "--strategy", "d1.t1.p1.k1.1f1b", "--batch", "4"],
        ["search", "--model", str(static), "--cluster", "dgx-a100:1", "--batch", "2"],
    ):
        got = runner.invoke(app, [*args, "--cluster", "dgx-a100"] if args[0] == "simulate" else args)
        assert got.exit_code == 2, got.output
        lines = [ln for ln in got.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "fix the batch at 2" in lines[0], got.output
    ok = runner.invoke(
        app,
        [
            "simulate",
            "--model",
            str(static),
            "--strategy",
            "d2.t1.p1.k1.1f1b",
            "--batch",
            "2",
            "--cluster",
            "dgx-a100",
        ],
    )
    assert ok.exit_code == 0, ok.output


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_mask_too_large_to_know_is_causal_if_it_was_at_batch_1(
    dynamic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hugging Face's (B, 1, S, S) mask, computed from the sizes, is over ``KNOWN_LIMIT`` at a
    large batch (here the limit lowered so that even batch 1's would be): the import at batch 1,
    under its own limit (``ONE_SAMPLE_LIMIT``), finds it causal and the one at batch 4 fuses the
    same chains; the result still matches onnxruntime, and the model still splits into
    microbatches."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    import distir
    from distir.frontends.onnx_import import import_onnx, values
    from distir.interp.reference import run_reference
    from distir.parallel.check import check_against_sequential

    monkeypatch.setattr(values, "KNOWN_LIMIT", 32)  # not 1 × 1 × 8 × 8, known at batch 1 all the same
    one = import_onnx(str(dynamic), dims={"seq": 8}, batch=1)
    assert len(one.causal) == 2  # both blocks' attention
    plain = import_onnx(str(dynamic), dims={"seq": 8}, batch=4)
    hinted = import_onnx(str(dynamic), dims={"seq": 8}, batch=4, causal_at=one.causal)

    def ops(imp: Any) -> list[str]:
        return [i.name for f in imp.module.functions for i in f.body if isinstance(i, Op)]

    assert "Attention" not in ops(plain) and "Softmax" in ops(plain)
    assert "Attention" in ops(hinted) and "Softmax" not in ops(hinted)
    ids = np.random.default_rng(0).integers(0, 50, (4, 8))
    got = run_reference(distir.check(hinted.module), hinted.arguments({"input_ids": ids}))
    sess = ort.InferenceSession(dynamic.read_bytes(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        np.asarray(got[0]), sess.run(None, {"input_ids": ids})[0], rtol=1e-4, atol=1e-5
    )
    model = load_file(f"{dynamic}:seq=8", 4)
    assert model.fixed_batch is None
    cmp = check_against_sequential(model, parse_strategy("d2.t1.p1.k2.1f1b"))
    assert cmp.max_rel_diff < 1e-4, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_mask_too_large_to_know_even_at_batch_1_fixes_the_batch_but_splits_over_replicas(
    dynamic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask no import can know (both limits lowered below 1 × 1 × 8 × 8) stays the exporter's
    computation for the whole batch: microbatches are refused in one line (exit 2) with the
    dynamic export's reason; replicas and tensor parallelism run, each device making the mask
    and data parallelism slicing its share (``Redistribute`` of a plain tensor), and equal the
    sequential step."""
    from distir.cli import app
    from distir.frontends import files
    from distir.frontends.onnx_import import values
    from distir.parallel.check import check_against_sequential

    monkeypatch.setattr(values, "KNOWN_LIMIT", 32)
    monkeypatch.setattr(values, "ONE_SAMPLE_LIMIT", 32)
    files._load.cache_clear()
    files._onnx_import.cache_clear()
    try:
        base = ["simulate", "--model", f"{dynamic}:seq=8", "--batch", "4", "--cluster", "dgx-a100"]
        got = CliRunner().invoke(app, [*base, "--strategy", "d1.t1.p1.k2.1f1b"])
        assert got.exit_code == 2, got.output
        lines = [ln for ln in got.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "the export's batch dim is dynamic, but the graph computes" in lines[0]
        model = load_file(f"{dynamic}:seq=8", 4)
        assert model.fixed_batch == 4
        for strategy in ("d2.t1.p1.k1.1f1b", "d2.t2.p1.k1.1f1b"):
            cmp = check_against_sequential(model, parse_strategy(strategy))
            assert cmp.max_rel_diff < 1e-4, f"{strategy}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    finally:
        files._load.cache_clear()
        files._onnx_import.cache_clear()


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_misspelt_dim_is_an_error_not_a_size_ignored(dynamic: Path) -> None:
    with pytest.raises(
        ModelError, match=r"dims sq: no graph input has a dynamic dim so named \(they have: batch, seq\)"
    ):
        load_file(f"{dynamic}:sq=8", 4)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_the_batch_dim_is_not_a_size_of_the_suffix(dynamic: Path) -> None:
    """The batch comes from ``--batch`` (``load_file``'s batch), not ``model.onnx:batch=N``."""
    with pytest.raises(ModelError, match=r":batch=3: 'batch' is the batch \(dim 0 of the inputs\)"):
        load_file(f"{dynamic}:batch=3,seq=8", 4)


@pytest.mark.xdist_group("onnx-gpt2")
def test_a_file_is_read_once_for_both_imports_and_not_kept(
    dynamic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The imports at the model's batch and at the other batch share one read of the file (a
    500 MB export took two), which is then dropped, also when the load fails."""
    from distir.frontends import files
    from distir.frontends.onnx_import import reader

    reads: list[object] = []
    real = reader.read_model
    monkeypatch.setattr(reader, "read_model", lambda source: reads.append(source) or real(source))
    files._load.cache_clear()
    files._onnx_import.cache_clear()
    files._read_onnx.cache_clear()
    try:
        load_file(f"{dynamic}:seq=8", 4)
        assert len(reads) == 1
        assert files._read_onnx.cache_info().currsize == 0
        with pytest.raises(ModelError):
            load_file(f"{dynamic}:batch=3,seq=8", 4)
        assert files._read_onnx.cache_info().currsize == 0
    finally:
        files._load.cache_clear()
        files._onnx_import.cache_clear()
