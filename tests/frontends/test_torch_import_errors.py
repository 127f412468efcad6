"""What the importer refuses, and how: every unsupported op listed with its count and source
location (never a partial import), a module torch.export cannot trace, a config that is not a
model, a missing file, a mixture-of-experts block that is not Mixtral's, a bad factory — each one typed error
(a ``ModelError``), and one line with exit status 2 from the command line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner

from distir.cli import app
from distir.frontends.torch_import import SourceError, StructureError, TraceError, UnsupportedOpsError
from distir.frontends.zoo import build_model
from distir.frontends.zoo.model import ModelError

CONFIGS = Path(__file__).parent / "configs"
FACTORIES = "tests.frontends.torch_models"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_every_unsupported_op_is_listed_with_count_and_location() -> None:
    with pytest.raises(UnsupportedOpsError) as info:
        build_model(f"{FACTORIES}:unsupported", batch=2)
    assert set(info.value.ops) == {"aten.cumsum", "aten.erf"}
    assert len(info.value.ops["aten.cumsum"]) == 2 and len(info.value.ops["aten.erf"]) == 1
    message = str(info.value)
    assert "aten.cumsum ×2" in message and "aten.erf ×1" in message
    assert "torch_models.py" in info.value.ops["aten.erf"][0]


def test_an_unsupported_op_of_a_torch_module_is_placed_in_the_users_code() -> None:
    """nn.Conv1d's op is made in torch's conv.py: the location is the line of the user's code that
    called the module, and the module's path."""
    with pytest.raises(UnsupportedOpsError) as info:
        build_model(f"{FACTORIES}:conv", batch=2)
    (where,) = info.value.ops["aten.conv1d"]
    assert "torch_models.py" in where and where.endswith("module conv") and "conv.py" not in where


def test_a_second_input_the_model_uses_is_named_with_its_line() -> None:
    words = r"input attention_mask is used by the model \(at .*torch_models.py.*\); only its first input"
    with pytest.raises(StructureError, match=words):
        build_model(f"{FACTORIES}:with_mask", batch=2)


def test_a_module_that_cannot_be_traced() -> None:
    with pytest.raises(TraceError, match=r"cannot trace .*\(at .*torch_models.py:\d+: if x.sum\(\) > 0:\)"):
        build_model(f"{FACTORIES}:data_dependent", batch=2)


def test_an_untraceable_module_is_one_line_on_stderr() -> None:
    """torch.export prints the partial graph and logs warnings on the process's stderr (its
    handlers hold the real stream, which the CLI runner does not capture): a subprocess sees them."""
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "distir.cli", "import", f"{FACTORIES}:data_dependent"],
        capture_output=True, text=True, env=env, cwd=root, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot trace" in r.stderr and "torch_models.py:" in r.stderr


def test_example_inputs_with_a_batch_of_one() -> None:
    """torch.export specializes a dim of size 1, so the batch cannot be symbolic: said before tracing."""
    with pytest.raises(TraceError, match=r"example input 0 has dim 0 \(the batch\) of 1; .* at least 2"):
        build_model(f"{FACTORIES}:batch_of_one", batch=2)


@pytest.mark.parametrize(
    ("source", "error", "words"),
    [
        (f"hf:{CONFIGS / 'not-a-model.json'}", SourceError, "not a model config"),
        (f"hf:{CONFIGS / 'missing.json'}", SourceError, "no such file"),
        (f"hf:{CONFIGS}", SourceError, "no such file"),  # a directory without config.json
        # a MoE block with DeepSeek's shared experts: Mixtral's and Qwen2-MoE's blocks only
        (f"hf:{CONFIGS / 'deepseek-v3-tiny.json'}", StructureError, "it also has: shared_experts"),
        (f"{FACTORIES}:not_a_module", SourceError, "not an nn.Module"),
        (f"{FACTORIES}:nothing_here", SourceError, "no function nothing_here"),
        ("tests.frontends.no_such_module:f", SourceError, "cannot import"),
    ],
)
def test_bad_sources_are_one_typed_error(source: str, error: type[ModelError], words: str) -> None:
    with pytest.raises(error, match=words):
        build_model(source, batch=2)
    code, out, err = run("import", source)
    assert code == 2 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("suffix", "words"),
    [
        (":seq=0", "seq='0'; expected a positive integer"),  # not the config's 8,192 positions
        (":seq=abc", "seq='abc'; expected a positive integer"),
        (":sq=4", "unknown option 'sq' after the config path"),
    ],
)
def test_a_bad_hf_suffix_is_named(suffix: str, words: str) -> None:
    source = f"hf:{CONFIGS / 'llama3-8b.json'}{suffix}"
    with pytest.raises(SourceError, match=re.escape(words)):
        build_model(source, batch=2)
    code, out, err = run("import", source)
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


def test_a_learned_position_table_bounds_the_sequence_rotary_positions_do_not() -> None:
    """GPT-2's learned table has n_positions rows: a longer sequence is one line (it was an
    internal reshape error's traceback); Llama's rotary positions are computed for any position,
    so it runs past max_position_embeddings (a long-context experiment)."""
    words = "seq=32 is above the config's context of 8 positions"
    source = f"hf:{CONFIGS / 'gpt2-tiny.json'}:seq=32"
    with pytest.raises(SourceError, match=re.escape(words)):
        build_model(source, batch=2)
    code, out, err = run("import", source)
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1
    model = build_model(f"hf:{CONFIGS / 'llama-tiny.json'}:seq=32", batch=2)  # max_position 8
    assert model.inputs[0].type.shape == (2, 32)


def test_a_family_rotary_by_default_runs_past_its_context(tmp_path: Path) -> None:
    """A Llama config that leaves ``rope_theta`` to transformers' default is rotary all the same
    (it was refused as if its positions were a learned table's rows)."""
    raw = json.loads((CONFIGS / "llama-tiny.json").read_text())
    del raw["rope_theta"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(raw))
    model = build_model(f"hf:{cfg}:seq=32", batch=2)  # max_position_embeddings 8
    assert model.inputs[0].type.shape == (2, 32)


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ({"num_hidden_layers": 100_000}, "num_hidden_layers = 100,000 is above distir's bound of 1,024"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0; a model needs at least one block"),
        ({"vocab_size": 10**12}, "vocab_size = 1,000,000,000,000 is above distir's bound of 16,777,216"),
        ({"intermediate_size": 2**30}, "intermediate_size = 1,073,741,824 is above"),
    ],
)
def test_a_config_beyond_the_size_bounds_is_refused_before_transformers_builds_it(
    sizes: dict[str, int], words: str, tmp_path: Path
) -> None:
    """100,000 layers traced for minutes and a vocabulary of 10^12 tried to allocate 64 TB: a
    config's layers and widths are bounded as a model string's are, naming the key."""
    config = {"model_type": "llama", "vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 8}  # fmt: skip
    config |= sizes
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    with pytest.raises(SourceError, match=re.escape(words)) as info:
        build_model(f"hf:{tmp_path}", batch=2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "no-such-type"}, "not a transformers model config (Unrecognized model"),
        # a field of the wrong type: huggingface_hub's strict dataclasses raise their own error class
        ({"model_type": "gpt2", "n_layer": "x"}, "field 'n_layer': Field 'n_layer' expected int"),
        ({"model_type": "t5", "n_positions": 64}, "no causal LM from this config (ValueError: Unrecognized"),
        # transformers' constructor asserting on a value (a padding id outside the vocabulary)
        ({"model_type": "llama", "vocab_size": 10, "pad_token_id": 20, "hidden_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8},
         "builds no causal LM from this config (AssertionError"),
    ],
)  # fmt: skip
def test_a_config_transformers_refuses_is_one_short_line(
    config: dict[str, object], words: str, tmp_path: Path
) -> None:
    """transformers' reason in one line of bounded length (its own lists every known type)."""
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    with pytest.raises(SourceError, match=re.escape(words)) as info:
        build_model(f"hf:{tmp_path}", batch=2)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("body", "attr", "words"),
    [
        ("def f():\n    raise RuntimeError('no checkpoint at /data/ckpt')\n", "f", "f() raised RuntimeError"),
        ("import math\nraise ValueError('bad setting')\n", "f", "importing usermod raised ValueError"),
        ("def f(:\n    pass\n", "f", "importing usermod raised SyntaxError"),
        # sys.exit in the user's code is their error too, not distir's exit status (it was 3, silent)
        ("import sys\ndef f():\n    sys.exit(3)\n", "f", "f() raised SystemExit: 3"),
        ("import sys\nsys.exit('no model')\n", "f", "importing usermod raised SystemExit: no model"),
    ],
)
def test_a_factory_or_module_that_raises_is_one_line(
    body: str, attr: str, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's code failing (at import or in the factory) is their error, named with its file
    and line: one line, exit 2, never a traceback."""
    (tmp_path / "usermod.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "usermod", raising=False)
    with pytest.raises(SourceError, match=re.escape(words)):
        build_model(f"usermod:{attr}", batch=2)
    monkeypatch.delitem(__import__("sys").modules, "usermod", raising=False)
    code, out, err = run("simulate", "--model", f"usermod:{attr}", "--strategy", "d1", "--batch", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert words in err and "usermod.py:" in err


def test_a_model_whose_forward_exits_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sys.exit`` in a module's forward, under torch.export, is a trace error, exit 2 (the
    process exited with the model's status, saying nothing)."""
    body = (
        "import sys\nimport torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        sys.exit(5)\n\ndef f():\n    return M(), (torch.zeros(2, 4),)\n"
    )
    (tmp_path / "usermod.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "usermod", raising=False)
    with pytest.raises(TraceError, match=re.escape("cannot trace usermod:f: SystemExit: 5")):
        build_model("usermod:f", batch=2)
    monkeypatch.delitem(__import__("sys").modules, "usermod", raising=False)
    code, out, err = run("import", "usermod:f")
    assert code == 2 and out == "" and "SystemExit: 5" in err and len(err.strip().splitlines()) == 1


def test_a_factory_that_raises_names_its_error() -> None:
    words = r"raises\(\) raised RuntimeError: no checkpoint at /data/ckpt \(.*torch_models.py:\d+\)"
    with pytest.raises(SourceError, match=words):
        build_model(f"{FACTORIES}:raises", batch=2)


def test_unsupported_ops_exit_2_on_one_line() -> None:
    code, _, err = run("import", f"{FACTORIES}:unsupported")
    assert code == 2 and "unsupported ops (2)" in err and len(err.strip().splitlines()) == 1


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if transformers were not installed
    path = tmp_path / "config.json"
    path.write_text((CONFIGS / "gpt2-tiny.json").read_text())
    with pytest.raises(SourceError, match=r"needs transformers: .*distir\[hf\]"):
        build_model(f"hf:{path}", batch=2)


def test_a_constant_above_the_bound_is_one_line_naming_it() -> None:
    """A 1,049,600-element table would be written into the program as a literal (seconds and
    hundreds of MB per million elements): refused, naming the node and the user's line."""
    code, out, err = run("import", f"{FACTORIES}:big_table")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "1,049,600 elements, above the 1,048,576" in err and "torch_models.py" in err


def test_a_factory_built_on_the_meta_device_imports() -> None:
    """A large model built under ``torch.device("meta")`` (parameters and example inputs without
    storage) imports: only shapes are read. A buffer made there has no values for the import:
    one line naming it, never a traceback."""
    model = build_model(f"{FACTORIES}:on_meta", batch=2)
    assert model.num_params == 5 * 8 + 8 + 8 * 3 + 3
    with pytest.raises(StructureError, match=r"buffer scale is on the meta device"):
        build_model(f"{FACTORIES}:buffer_on_meta", batch=2)
    code, out, err = run("import", f"{FACTORIES}:buffer_on_meta")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("sizes", "rotated"),
    [
        ({"model_type": "llama", "hidden_size": 2, "num_attention_heads": 2}, "rotates 1 of its 1"),
        ({"model_type": "gpt_neox", "hidden_size": 8, "num_attention_heads": 2, "rotary_pct": 0.25},
         "rotates 1 of its 4"),
    ],
)  # fmt: skip
def test_an_odd_number_of_rotated_channels_is_refused(
    sizes: dict[str, object], rotated: str, tmp_path: Path
) -> None:
    """Rotary positions turn channel pairs: a head rotating an odd number of channels was an
    Attention shape error in the middle of `simulate` (transformers broadcast its one channel
    against two cosines); it is one line naming the sizes. An even number imports."""
    base = {"vocab_size": 8, "num_hidden_layers": 1, "intermediate_size": 8, "max_position_embeddings": 8}
    (tmp_path / "config.json").write_text(__import__("json").dumps(base | sizes))
    with pytest.raises(SourceError, match=re.escape(rotated)) as info:
        build_model(f"hf:{tmp_path}", batch=2)
    assert "\n" not in str(info.value) and "rotary positions turn pairs of channels" in str(info.value)
    even = base | sizes | {"hidden_size": 8, "num_attention_heads": 2}
    (tmp_path / "config.json").write_text(__import__("json").dumps(even | {"rotary_pct": 0.5}))
    assert build_model(f"hf:{tmp_path}", batch=2).num_params > 0
