"""``distir import`` and the import model strings wherever ``--model`` is taken: the program and
its summary (ops by type, parameters, FLOPs per sample, layer functions), ``hf:`` configs (a
file, a directory), ``package.module:factory``, and ``simulate`` of an imported model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner

from distir.cli import app
from distir.frontends.zoo import build_model

CONFIGS = Path(__file__).parent / "configs"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.slow
def test_import_json_summary_of_a_hf_config() -> None:
    code, out, _ = run("import", str(CONFIGS / "llama-tiny.json"), "--json")
    assert code == 0
    data = json.loads(out)
    model = build_model(f"hf:{CONFIGS / 'llama-tiny.json'}", batch=1)
    assert data["params"] == model.num_params
    # embedding 32·16, per block: 2 norms of 16, q 16·16, k and v 16·8, o 16·16, 3 MLP 16·24; norm, head
    assert data["params"] == 32 * 16 + 2 * (2 * 16 + 2 * 256 + 2 * 128 + 3 * 16 * 24) + 16 + 16 * 32
    assert data["flops_per_sample"] == model.flops_per_sample > 0
    assert data["functions"]["block"]["calls"] == 2
    assert data["functions"]["block"]["paths"] == ["model.layers.0", "model.layers.1"]
    assert data["ops"]["Attention"] == 2 and data["ops"]["Rope"] == 4 and data["ops"]["RMSNormalization"] == 5
    assert "func @block(" in data["program"]


@pytest.mark.slow
def test_import_prints_the_program_and_the_layer_functions(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "gpt2-tiny.json", tmp_path / "config.json")
    code, out, _ = run("import", str(tmp_path))  # a directory holding config.json
    assert code == 0
    assert "func @forward(" in out and "@block: 2 call(s)" in out and "transformer.h.0" in out
    assert "tied weights: lm_head.weight" in out


def test_factory_model_string_in_import_and_simulate() -> None:
    spec = "tests.frontends.torch_models:mlp"
    code, out, _ = run("import", spec, "--json")
    assert code == 0 and json.loads(out)["functions"]["block"]["calls"] == 3
    code, out, _ = run("simulate", "--model", spec, "--strategy", "d2.t1.p1.k1", "--batch", "4", "--json")
    assert code == 0 and json.loads(out)["step_time_s"] > 0


@pytest.mark.slow
def test_simulate_an_imported_model_with_tensor_parallelism() -> None:
    spec = f"hf:{CONFIGS / 'gpt2-tiny.json'}"
    code, out, err = run("simulate", "--model", spec, "--strategy", "d1.t2.p2.k2", "--batch", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0


def test_factory_in_a_top_level_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``module:factory`` with an undotted module (a ``models.py`` of the user's) is an import
    string when the module is not a zoo name."""
    (tmp_path / "user_models_for_distir.py").write_text(
        "import torch\n"
        "def make():\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))\n"
        "    return net, (torch.zeros(2, 3),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_model("user_models_for_distir:make", batch=4)
    # nn.Sequential's numbered children are the blocks; the two Linear layers share a function
    assert [c.callee for c in model.layers] == ["block_0", "block_1", "block_0", "loss"]
    assert (model.pre, model.post) == (0, 1)
    assert model.num_params == 3 * 4 + 4 + 4 * 2 + 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["d2.t1.p1.k1", "d1.t2.p1.k1"])
def test_mixtral_imports_and_simulates(strategy: str) -> None:
    """A Mixtral-like config (2 layers, 4 experts, top-2): one MoE op per block; it simulates
    data- and tensor-parallel."""
    config = str(CONFIGS / "mixtral-tiny.json")
    code, out, _ = run("import", config, "--json")
    data = json.loads(out)
    assert code == 0 and data["ops"]["MoE"] == 2 and data["functions"]["block"]["calls"] == 2
    # per block: router 4·16, experts' gate_up 4·48·16 and down 4·16·24 besides attention and norms
    assert (
        data["params"]
        == 32 * 16 + 2 * (2 * 16 + 2 * 256 + 2 * 128 + 4 * 16 + 4 * 48 * 16 + 4 * 16 * 24) + 16 + 16 * 32
    )
    code, out, _ = run(
        "simulate", "--model", f"hf:{config}", "--strategy", strategy, "--batch", "4", "--json"
    )
    assert code == 0 and json.loads(out)["step_time_s"] > 0


def test_import_says_which_weights_tensor_parallelism_shards() -> None:
    """The placements come from weight names: the summary says which matched, or that none did
    (then t > 1 would only replicate the model)."""
    code, out, _ = run("import", "tests.frontends.torch_models:mlp")
    assert code == 0 and "tensor-parallel weights: none of 15 matches a placement pattern" in out
    code, out, _ = run("import", str(CONFIGS / "llama-tiny.json"), "--json")
    data = json.loads(out)
    assert code == 0 and "model.layers.0.self_attn.q_proj.weight" in data["tp_sharded"]
    assert "model.norm.weight" not in data["tp_sharded"] and data["weights"] == 21
