"""Model files as ``--model``: a ``.distir`` file that follows the model contract (a zoo model
printed to a file) builds the same model — parameters, FLOPs, and the same simulated step as the
zoo model it was printed from, at its own batch and another — and an ``.onnx`` file imports at
the batch asked for; files that do not parse or break the contract are one-line errors (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.frontends.zoo import build_model
from distir.frontends.zoo.model import ModelError
from distir.ir.printer import print_module

ZOO = "gpt2-117m:layers=2,hidden=64,heads=4,seq=16,vocab=96"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def zoo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("files") / "tiny-gpt.distir"
    path.write_text(print_module(build_model(ZOO, batch=4).module))
    return path


@pytest.mark.parametrize("batch", [4, 8])
def test_distir_file_is_the_model_it_was_printed_from(zoo_file: Path, batch: int) -> None:
    zoo, got = build_model(ZOO, batch=batch), build_model(str(zoo_file), batch=batch)
    assert got.batch == batch and [i.type for i in got.inputs] == [i.type for i in zoo.inputs]
    assert [w.type for w in got.weights] == [w.type for w in zoo.weights]
    assert got.flops_per_sample == zoo.flops_per_sample > 0
    assert [c.callee for c in got.layers] == [c.callee for c in zoo.layers]


def test_distir_file_simulates_like_the_zoo_model(zoo_file: Path) -> None:
    """The file computes in its own dtype (f32: ``--dtype auto`` is that), the zoo model in f32
    when asked."""
    times = []
    for model, dtype in ((ZOO, ["--dtype", "f32"]), (str(zoo_file), [])):
        code, out, err = run(
            "simulate", "--model", model, "--strategy", "d2.t1.p2.k2.1f1b", "--batch", "8", "--json", *dtype
        )
        assert code == 0, err
        assert (json.loads(out)["dtype"], json.loads(out)["precision"]) == ("f32", "pure")
        times.append(json.loads(out)["step_time_s"])
    assert times[0] == pytest.approx(times[1], rel=1e-12)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "func @forward(%x: Tensor[f32, (2, 3), d0]) {\n  %y = Relu(%x)\n  return %y\n}\n",
            "chain of layer calls",
        ),
        ("garbage(\n", "expected 'func'"),
    ],
)
def test_a_file_that_is_not_a_model_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.distir"
    path.write_text(text)
    with pytest.raises(ModelError, match=words):
        build_model(str(path), batch=2)
    code, _, err = run("simulate", "--model", str(path), "--batch", "2")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    code, _, err = run("simulate", "--model", str(tmp_path / "missing.distir"), "--batch", "2")
    assert code == 2 and "no such model file" in err


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        # a weight's type that the layer's product refuses: named at the op, in the layer function
        (", %wq_1: Tensor[f32, (64, 64), d0]", ", %wq_1: Tensor[f32, (63, 64), d0]", "MatMul contraction"),
        ("%q_xw = MatMul(%ln1, %wq)", "%q_xw = Matmul(%ln1, %wq)", "unknown op 'Matmul'"),
        ("%q_xw = MatMul(%ln1, %wq)", "%q_xw = MatMul(%ln1, %wq, bogus=1)", "no attribute 'bogus'"),
        ("%q_xw = MatMul(%ln1, %wq)", "%q_xw = MatMul(%ln1, %wq", "expected"),
    ],
)
def test_an_error_in_a_model_file_names_its_line_once_in_one_line(
    zoo_file: Path, tmp_path: Path, old: str, new: str, words: str
) -> None:
    """``--model FILE.distir`` names ``FILE:LINE:COL`` as ``distir show FILE`` does (the file
    once, not ``FILE: FILE:…``), one line: the call chain follows on it, not on lines of its own."""
    text = zoo_file.read_text()
    assert old in text
    path = tmp_path / "bad.distir"
    path.write_text(text.replace(old, new, 1))
    at = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "%q_xw =" in ln)
    # the op the error is at (a parse error: where the parser stopped, at or after it)
    line = rf"{at}:3" if words != "expected" else r"\d+:\d+"
    for command in (["simulate", "--strategy", "d1", "--batch", "4"], ["import"]):
        args = [*command, "--model", str(path)] if command[0] == "simulate" else [*command, str(path)]
        code, _, err = run(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert re.match(rf"{re.escape(str(path))}:{line}: ", err) and words in err, err
        assert err.count(str(path)) == 1, err


@pytest.mark.slow
def test_onnx_file_as_model_of_simulate_and_search(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5])
    w1, w2 = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [x], [y], [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    )
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    model = build_model(str(path), batch=6)
    assert model.batch == 6 and model.num_params == 4 * 6 + 6 * 5
    code, out, err = run(
        "simulate", "--model", str(path), "--strategy", "d2.t1.p1.k1", "--batch", "8", "--json"
    )
    assert code == 0 and json.loads(out)["step_time_s"] > 0, err
    # an ONNX file computes in the dtype asked: the search's auto is the GPUs' half, mixed
    code, out, err = run("search", "--model", str(path), "--cluster", "dgx-a100", "--batch", "8", "--json")
    assert code == 0, err
    assert (json.loads(out)["dtype"], json.loads(out)["precision"]) == ("bf16", "mixed")
    import distir

    got = distir.search(model=str(path), cluster="dgx-a100", batch=8, top=1, store=None, dtype="f32")
    assert got.dtype == "f32"
    # its weights declare no placements (t = 1 only): 16 GPUs cannot share a batch of 8, said why
    code, _, err = run("search", "--model", str(path), "--cluster", "dgx-a100:2", "--batch", "8")
    assert code == 2 and "no weight of the model is tensor-parallel" in err
