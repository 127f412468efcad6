"""``distir search``: the JSON contract, the store (rerun = no new simulation), outputs, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.parallel.strategy import parse_strategy
from distir.search.rerank import RESULT_KEYS, ExactJob, evaluate

MODEL = "mlp:layers=4,hidden=256"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default stores and reports go under the test's directory, never the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _search(tmp_path: Path, *extra: str) -> dict[str, object]:
    args = ["search", "--model", MODEL, "--cluster", "dgx-a100", "--batch", "64", "--top", "3"]
    store = [] if "--fresh" in extra else ["--store", str(tmp_path / "s.sqlite")]  # --fresh takes none
    args += ["--workers", "1", *store, "--json", *extra]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out: dict[str, object] = json.loads(res.stdout)
    return out


@pytest.mark.slow
def test_json_contract_ranked_best_first_and_consistent(tmp_path: Path) -> None:
    out = _search(tmp_path, "--csv", str(tmp_path / "r.csv"))
    results = out["results"]
    assert isinstance(results, list) and len(results) >= 3
    for r in results:
        assert set(RESULT_KEYS) <= set(r)
        s = parse_strategy(r["strategy"])
        assert (s.d, s.t, s.p, s.k) == (r["d"], r["t"], r["p"], r["k"])
        assert s.devices == 8
        assert r["throughput"] == pytest.approx(64 / r["step_time_s"])
    fitting = [r for r in results if r["fits"]]
    assert [r["throughput"] for r in fitting] == sorted((r["throughput"] for r in fitting), reverse=True)
    assert results[: len(fitting)] == fitting  # what fits comes first
    # the winner's figures are what an independent simulation of its strategy gives
    assert (out["dtype"], out["precision"]) == ("bf16", "mixed")  # the trainers' default on A100s
    job = ExactJob(MODEL, "dgx-a100", 64, dtype="bf16", precision="mixed")
    again = evaluate(job, results[0]["strategy"])
    assert again["step_time_s"] == pytest.approx(results[0]["step_time_s"])
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in results]
    assert Path(str(out["plot"])).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Path(str(out["html"])).read_text()
    assert all(r["strategy"] in page for r in results)


@pytest.mark.slow
def test_rerun_takes_every_result_from_the_store(tmp_path: Path) -> None:
    first = _search(tmp_path)
    second = _search(tmp_path)
    assert first["cached"] == 0 and first["from_store"] is False
    assert second["cached"] == second["simulated"] == first["simulated"]
    assert second["from_store"] is True and second["timings_s"] == first["timings_s"] | {
        "render_s": second["timings_s"]["render_s"]  # type: ignore[index]
    }
    assert second["results"] == first["results"]
    fresh = _search(tmp_path, "--fresh")
    assert fresh["cached"] == 0 and fresh["results"] == first["results"]
    # without a store, the reports still go to the cache directory, not the working directory
    assert Path(str(fresh["plot"])).is_relative_to(tmp_path / "cache")


@pytest.mark.slow
def test_table_keeps_each_strategy_on_one_line_in_a_narrow_pipe(tmp_path: Path) -> None:
    """Piped output (80 columns by default) still prints every strategy string whole."""
    out = _search(tmp_path)
    args = ["search", "--model", MODEL, "--cluster", "dgx-a100", "--batch", "64", "--top", "3"]
    res = runner.invoke(
        app, [*args, "--workers", "1", "--store", str(tmp_path / "s.sqlite")], env={"COLUMNS": "80"}
    )
    assert res.exit_code == 0, res.output
    results = out["results"]
    assert isinstance(results, list)
    for r in results:
        assert r["strategy"] in res.stdout, (r["strategy"], res.stdout)


def test_pins_hold_and_explain_names_the_pure_strategies(tmp_path: Path) -> None:
    out = _search(tmp_path, "--tp", "2", "--schedule", "1f1b", "--explain")
    for r in out["results"][:3]:  # type: ignore[index]
        assert r["t"] == 2 or r["strategy"].startswith(("d8.t1.p1", "d1.t8.p1", "d1.t1.p8"))
    text = "\n".join(out["explain"])  # type: ignore[arg-type]
    assert text.startswith("winner ")
    assert "pure data" in text or "best pure data" in text
    # with t pinned to 2 no pure strategy is in the space, and the comparison says why
    assert "pure tensor parallel: not searched: --tp 2 is pinned" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt2-xxl"], "unknown model"),
        (["--cluster", "dgx-b300"], "unknown preset"),
        (["--tp", "3"], "--tp 3"),
        (["--executor", "slurm"], "--executor must be one of"),
        (["--optimizer", "lion"], "--optimizer must be sgd or adam"),
    ],
)
def test_bad_input_is_one_clear_message(tmp_path: Path, args: list[str], message: str) -> None:
    base = ["search", "--model", MODEL, "--cluster", "dgx-a100", "--batch", "64", "--fresh"]
    res = runner.invoke(app, [*base, *args])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("first", "second"), [("--csv", "--html"), ("--store", "--csv"), ("--export-out", "--plot")]
)
def test_two_outputs_naming_one_file_are_refused_before_the_search(
    tmp_path: Path, first: str, second: str
) -> None:
    """The later write would replace the earlier (a CSV over the user's result store) silently."""
    mine = tmp_path / "mine"
    mine.write_text("the user's")
    export = ["--export", "deepspeed"] if "--export-out" in (first, second) else []
    args = ["search", "--model", MODEL, "--cluster", "dgx-a100", "--batch", "64", "--workers", "1"]
    res = runner.invoke(app, [*args, *export, first, str(mine), second, str(mine)])
    assert res.exit_code == 2 and "name the same file" in res.output and first in res.output
    assert mine.read_text() == "the user's" and len(res.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_views_of_one_search_keep_their_own_report_files(tmp_path: Path) -> None:
    plain = _search(tmp_path)
    files = {k: Path(str(plain[k])).read_bytes() for k in ("plot", "html")}
    pinned = _search(tmp_path, "--tp", "2")
    assert plain["plot"] != pinned["plot"] and plain["html"] != pinned["html"]
    # the pinned search wrote its own files and left the unpinned one's as they were
    assert all(Path(str(plain[k])).read_bytes() == files[k] for k in files)
    assert Path(str(pinned["html"])).read_bytes() != files["html"]
    again = _search(tmp_path)
    assert again["plot"] == plain["plot"]


def test_tp_comm_overlap_reaches_the_exact_simulations(tmp_path: Path) -> None:
    """``--tp-comm-overlap``: the JSON says so and its winner's step time is the exact simulation
    with the overlap (a plan with sequence parallelism here: its collectives pair with GEMMs)."""
    gpt = "gpt:layers=2,hidden=512,heads=8,seq=256,vocab=1024"
    args = ["search", "--model", gpt, "--cluster", "dgx-a100", "--batch", "16", "--top", "1", "--tp", "4"]
    args += ["--pp", "1", "--dp", "2", "--max-microbatches", "1", "--workers", "1", "--fresh", "--json"]
    res = runner.invoke(app, [*args, "--tp-comm-overlap"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["tp_comm_overlap"] is True
    best = out["results"][0]
    assert parse_strategy(best["strategy"]).sp
    job = ExactJob(gpt, "dgx-a100", 16, dtype="bf16", precision="mixed", tp_comm_overlap=True)
    assert evaluate(job, best["strategy"])["step_time_s"] == pytest.approx(best["step_time_s"])
    plain = evaluate(ExactJob(gpt, "dgx-a100", 16, dtype="bf16", precision="mixed"), best["strategy"])
    assert plain["step_time_s"] > best["step_time_s"]
