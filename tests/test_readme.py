"""The README's Python snippets run as written (the quick start's ``distir.search`` example)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_a_python_example() -> None:
    assert python_blocks(), "the README shows the Python API"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip(), "the example prints its answer"
