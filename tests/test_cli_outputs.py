"""Output paths of the commands other than ``search`` (issue 22): checked before any work (one
line, exit 2), written atomically (``distir.files``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from distir.cli import main

TINY = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
SIMULATE = ["simulate", "--model", TINY, "--strategy", "d2.t1.p1.k1", "--batch", "8"]


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    return int(done.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (SIMULATE, "--trace"),
        (
            ["export", "--to", "torchtitan", "--model", TINY, "--strategy", "d2.t1.p1.k1", "--batch", "8"],
            "--out",
        ),
        (["calibrate", "--quick"], "--out"),
        (["calibrate", "--quick", "--out", "ok.toml"], "--raw"),
    ],
)
@pytest.mark.parametrize("kind", ["directory", "under-a-file"])
def test_a_bad_output_path_is_one_line_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    option: str,
    kind: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    path = tmp_path if kind == "directory" else tmp_path / "a-file" / "out"
    code, err = cli([*argv, option, str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(option) and "directory" in err
    assert sorted(os.listdir(tmp_path)) == ["a-file"]  # nothing measured, nothing written


def test_the_trace_replaces_a_symlink_atomically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    trace = tmp_path / "t.json"
    trace.symlink_to(victim)
    code, err = cli([*SIMULATE, "--trace", str(trace)], capsys)
    assert code == 0, err
    assert victim.read_text() == "precious" and not trace.is_symlink()
    assert "traceEvents" in json.loads(trace.read_text())
    assert sorted(os.listdir(tmp_path)) == ["t.json", "victim"]


def test_calibrates_profile_and_raw_measurements_naming_one_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before anything is measured: the raw measurements would replace the profile silently."""
    monkeypatch.chdir(tmp_path)
    code, err = cli(["calibrate", "--quick", "--out", "p.toml", "--raw", "./p.toml"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "name the same file" in err
    assert os.listdir(tmp_path) == []


def test_an_output_naming_the_models_own_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model m.distir --trace m.distir`` replaced the user's model with its trace (a program
    FILE was protected, a model file not); the same for a Hugging Face config and every output."""
    from distir.frontends.zoo.registry import build_model
    from distir.ir.printer import print_module

    model = tmp_path / "m.distir"
    text = print_module(build_model(TINY, batch=8).module)
    model.write_text(text)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    config = hf_dir / "config.json"  # a copy: a failing check must not touch the repository's
    config.write_bytes(
        (Path(__file__).resolve().parent / "frontends" / "configs" / "llama-tiny.json").read_bytes()
    )
    before = config.read_bytes()
    cases = [
        ["simulate", "--model", str(model), "--strategy", "d1", "--batch", "8", "--trace", str(model)],
        ["search", "--model", str(model), "--batch", "8", "--cluster", "dgx-a100:1", "--csv", str(model)],
        ["export", "--to", "deepspeed", "--model", f"hf:{config}", "--strategy", "d1", "--batch", "2",
         "--out", str(config)],
        ["export", "--to", "deepspeed", "--model", f"hf:{hf_dir}:seq=8", "--strategy", "d1",
         "--batch", "2", "--out", str(config)],
    ]  # fmt: skip
    for argv in cases:
        code, err = cli(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "the file --model reads" in err, err
    assert model.read_text() == text and config.read_bytes() == before


def test_no_output_overwrites_the_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output naming the ``--cluster`` file, however spelled, is refused before any work, as
    one naming the model's file is: the user's cluster file is never replaced by a trace, a CSV,
    a plot, a page, a store or a configuration."""
    cluster = tmp_path / "c.toml"
    cluster.write_text('[types.a]\npreset = "h100"\n\n[[nodes]]\ntype = "a"\ncount = 1\n')
    before = cluster.read_bytes()
    dotted = str(tmp_path / "." / "c.toml")
    on = ["--cluster", str(cluster)]
    export = ["export", "--to", "megatron", "--model", TINY, "--strategy", "d2", "--batch", "8", *on]
    cases = [
        [*SIMULATE, *on, "--trace", dotted],
        ["simulate", str(Path(__file__).parents[1] / "examples" / "fig2_mlp_pipeline.distir"), *on,
         "--trace", str(cluster)],
        *(["search", "--model", TINY, "--batch", "8", *on, option, dotted]
          for option in ("--csv", "--plot", "--html", "--store")),
        ["search", "--model", TINY, "--batch", "8", *on, "--export", "megatron", "--export-out", dotted],
        [*export, "--out", dotted],
        ["validate", "--model", TINY, *on, "--plot", str(cluster)],
    ]  # fmt: skip
    for argv in cases:
        code, err = cli(argv, capsys)
        one_line = len(err.strip().splitlines()) == 1
        assert code == 2 and one_line and "the file --cluster reads" in err, (argv, err)
    assert cluster.read_bytes() == before
