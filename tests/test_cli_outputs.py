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
