"""Review of session 8's recent changes (helper review): the exact simulation's chunk-time program
order (``search/chunk_times.py``, ``distribute(chunk_times=...)``, ``rerank.evaluate``, ``distir
simulate --model``), the store re-render of a finished search (``search/final.py``,
``run._stored_output``), ``Space.why_not`` behind ``--explain`` and ``shares.add_shares`` in the
search flow. Tests pin behaviour verified here that no other test covered, and the bugs this
review found, since fixed: a zero chunk time (now a StrategyError), a corrupt or non-object stored
output (now a StoreError), a result stored meanwhile by another process running the same search
(now taken, not fatal), and pins that ``Space.why_not`` did not explain."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.frontends.zoo.registry import build_model, parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.distribute import distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.search import run
from distir.search.chunk_times import chunk_times
from distir.search.profile import Profiler
from distir.search.rerank import ExactJob, evaluate
from distir.search.run import SearchRequest, search
from distir.search.space import Pins, Space
from distir.search.store import ResultStore, search_key

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"  # 4 blocks (+ embedding, head, loss)
NODE = "p3.8xlarge:1"  # 4 V100s
MIXED = "p3.8xlarge:1+g4dn.12xlarge:1"  # 4 V100s then 4 T4s
runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _simulate(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, ["simulate", "--model", GPT, *args])
    return r.exit_code, r.stdout, r.stderr


def _search_cli(tmp_path: Path, cluster: str, *extra: str) -> tuple[int, str, str]:
    args = ["search", "--model", GPT, "--cluster", cluster, "--workers", "1"]
    args += ["--store", str(tmp_path / "s.sqlite"), "--json", *extra]
    r = runner.invoke(app, args)
    return r.exit_code, r.stdout, r.stderr


# -- 1. chunk times: distir simulate --model is the search's exact evaluation ------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cluster", "strategy", "batch", "train"),
    [
        (NODE, "d1.t1.p2.k4.interleaved.v2", 8, True),  # p·v = 4 chunks, chunk c on stage c % 2
        (MIXED, "d2.t2.p2.k2.1f1b.@4-5-6-7-0-1-2-3", 8, True),  # stage 0 on the T4s
        (MIXED, "d1.t4.p2.k2.zb1.@4-5-6-7-0-1-2-3", 8, True),
        (MIXED, "d2.t1.p1.k1.1f1b.b2-1", 6, True),  # batch shares
        (NODE, "d1.t2.p2.k2.1f1b.z1.rfull", 8, True),  # recomputation (ZeRO is a no-op at d = 1)
        (NODE, "d2.t1.p1.k2.1f1b", 12, True),  # 3 samples per replica and microbatch
        (NODE, "d1.t2.p2.k2.1f1b", 8, False),  # inference: no loss layer, no backward
        (NODE, "d1.t1.p2.k4.interleaved.v2", 8, False),
    ],
)
def test_cli_simulate_model_is_the_search_s_exact_result(
    cluster: str, strategy: str, batch: int, train: bool
) -> None:
    code, out, err = _simulate(
        "--strategy", strategy, "--cluster", cluster, "--batch", str(batch), "--dtype", "f32", "--json",
        *([] if train else ["--infer"]),
    )  # fmt: skip
    assert code == 0, err
    got = json.loads(out)["step_time_s"]
    assert got == evaluate(ExactJob(GPT, cluster, batch, train=train), strategy)["step_time_s"]


def test_cli_simulate_model_in_bf16_is_the_search_s_exact_result() -> None:
    code, out, err = _simulate(
        "--strategy", "d2.t1.p2.k2.zb1", "--cluster", NODE, "--batch", "8", "--dtype", "bf16",
        "--precision", "pure", "--json",
    )  # fmt: skip
    assert code == 0, err
    exact = evaluate(ExactJob(GPT, NODE, 8, dtype="bf16"), "d2.t1.p2.k2.zb1")
    assert json.loads(out)["step_time_s"] == exact["step_time_s"]


def test_chunk_times_of_interleaved_placed_chunks_use_their_stage_s_first_tp_group() -> None:
    """Chunk c of p·v runs on stage c % p; with a placement, stage j's first TP group is the GPUs
    playing program devices j·d·t .. j·d·t + t − 1."""
    s = parse_strategy("d2.t2.p2.k2.interleaved.v2.@6-7-4-5-2-3-0-1")  # stage 0 on T4s, 1 on V100s
    model = build_model(GPT, 8)
    cl = parse_cluster(MIXED)
    fwd, bwd = chunk_times(model, parse_model_string(GPT), cl, DType.f32, True, s)
    assert len(fwd) == len(bwd) == 4
    prof = Profiler(parse_model_string(GPT), cl, DType.f32, True)
    stage_gpus = [[6, 7], [2, 3]]
    # one block per chunk: the embedding with the first, head and loss with the last
    bounds = [0, 2, 3, 4, 7]
    for c in range(4):
        layers = prof.layers(2, 2, stage_gpus[c % 2], "none")
        r = range(bounds[c], bounds[c + 1])
        assert fwd[c] == pytest.approx(sum(layers[i].fwd_s for i in r), rel=1e-12)
        assert bwd[c] == pytest.approx(sum(layers[i].bwd_s for i in r), rel=1e-12)


@pytest.mark.parametrize("times", [([0.0, 1.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, 0.0])], ids=["fwd0", "bwd1"])
def test_zero_chunk_times_give_a_program_or_a_strategy_error(times: tuple[list[float], list[float]]) -> None:
    model = build_model("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16", 4)
    with contextlib.suppress(StrategyError):
        distribute(model, parse_strategy("d1.t1.p2.k2.1f1b"), chunk_times=times)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "d1.t1.p2.k2.1f1b", "--cluster", "p3.8xlarge:0"], "node count of 'p3.8xlarge'"),
        (["--strategy", "d1.t1.p2.k2.1f1b", "--cluster", "nosuchgpu:1"], "nosuchgpu"),
        (["--strategy", "d2.t4.p1.k1.1f1b", "--cluster", NODE], "needs 8 GPUs"),
        (["--strategy", "d1.t1.p2.k2.1f1b.L2-3", "--cluster", NODE, "--infer"], "covers 5 blocks, not 4"),
        (["--strategy", "d2.t1.p1.k1.1f1b.b2-1", "--cluster", MIXED, "--batch", "4"], "batch shares 2-1"),
        (
            ["--strategy", "d1.t1.p2.k2.1f1b", "--cluster", NODE, "--dtype", "f32", "--precision", "mixed"],
            "mixed",
        ),
    ],
)
def test_cli_simulate_model_errors_stay_clean_with_a_cluster(args: list[str], message: str) -> None:
    """An invalid cluster, one too small, or a strategy the model cannot take: exit 2 and one
    message, though the chunk times are now computed on the cluster before ``distribute``."""
    code, out, err = _simulate(*args, "--json")
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and out == ""


def test_cli_simulate_mixed_precision_with_chunk_times() -> None:
    code, out, err = _simulate(
        "--strategy", "d1.t1.p2.k4.interleaved.v2", "--cluster", MIXED, "--batch", "8",
        "--precision", "mixed", "--dtype", "bf16", "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["precision"] == "mixed" and data["step_time_s"] > 0


# -- 2. a finished search re-renders from the store -------------------------------------------------


@pytest.mark.slow
def test_rerender_with_share_strategies_and_top_1_gives_the_same_outputs(tmp_path: Path) -> None:
    """On a V100 + T4 node, with pipelines pinned off, the share proposal wins with --top 1 (its
    exact figures are ``evaluate``'s); the rerun re-renders it: same JSON results and screen
    figures, identical CSV, a PNG plot."""
    runs = []
    for name in ("a", "b"):
        code, out, err = _search_cli(
            tmp_path, MIXED, "--batch", "48", "--pp", "1", "--top", "1",
            "--csv", str(tmp_path / f"{name}.csv"), "--plot", str(tmp_path / f"{name}.png"),
        )  # fmt: skip
        assert code == 0, err
        runs.append(json.loads(out))
    first, second = runs
    assert (first["from_store"], second["from_store"]) == (False, True)
    win = first["results"][0]["strategy"]
    assert parse_strategy(win).shares is not None and len(first["results"]) == 1
    # the search weighs precisions too (auto): evaluate the winner's (mixed f16 here, since fused
    # chains absorb mixed precision's casts)
    row = first["results"][0]
    exact = evaluate(ExactJob(GPT, MIXED, 48, dtype=row["dtype"], precision=row["precision"]), win)
    assert first["results"][0]["step_time_s"] == exact["step_time_s"]
    for key in ("results", "screened", "screen_top", "layer_profiles", "simulated"):
        assert second[key] == first[key], key
    assert second["cached"] == 1
    # the proposals count among the screened strategies (98757ad) and survive the store
    assert any(parse_strategy(e["strategy"]).shares for e in second["screen_top"])
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert f",{win}," in (tmp_path / "b.csv").read_text()
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _finish_then_corrupt(tmp_path: Path, final_text: str) -> None:
    code, _, err = _search_cli(tmp_path, NODE, "--batch", "8", "--top", "1")
    assert code == 0, err
    con = sqlite3.connect(tmp_path / "s.sqlite")
    with con:
        con.execute("UPDATE searches SET final = ?", (final_text,))
    con.close()


@pytest.mark.slow
def test_corrupt_stored_output_is_a_clean_store_error(tmp_path: Path) -> None:
    _finish_then_corrupt(tmp_path, "not json {")
    code, _, err = _search_cli(tmp_path, NODE, "--batch", "8", "--top", "1")
    assert code == 2 and "s.sqlite" in err


@pytest.mark.slow
def test_stored_output_that_is_not_an_object_is_a_clean_store_error(tmp_path: Path) -> None:
    _finish_then_corrupt(tmp_path, "[1, 2]")
    code, _, err = _search_cli(tmp_path, NODE, "--batch", "8", "--top", "1")
    assert code == 2 and "s.sqlite" in err


@pytest.mark.slow
def test_stored_output_of_another_view_written_by_another_process_is_replaced(tmp_path: Path) -> None:
    """Another process finishes the same search with another view in between: this one screens
    again (its exact results reused) and then re-renders its own."""
    req = SearchRequest(model=GPT, cluster=NODE, batch=8, top=2, store=tmp_path / "s.sqlite")
    first = search(req)
    search(SearchRequest(model=GPT, cluster=NODE, batch=8, top=1, store=tmp_path / "s.sqlite"))
    again = search(req)
    assert not again.from_store and again.results == first.results
    assert again.n_cached == len(first.results)
    assert search(req).from_store


@pytest.mark.slow
def test_a_search_racing_another_process_on_the_same_store_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    req = SearchRequest(model=GPT, cluster=NODE, batch=8, top=2, store=tmp_path / "s.sqlite")
    exact = evaluate

    def other_process_got_there_first(job: ExactJob, strategy: str) -> dict[str, Any]:
        result = exact(job, strategy)
        with ResultStore(tmp_path / "s.sqlite", search_key(req.key_parts()), req.key_parts()) as other:
            other.put(strategy, result)
        return result

    monkeypatch.setattr(run, "evaluate", other_process_got_there_first)
    assert search(req).results


# -- 3. Space.why_not and --explain ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pins", "shape", "why"),
    [
        (Pins(dp=2), (4, 1, 1), "--dp 2 is pinned"),
        (Pins(tp=2), (1, 4, 1), "--tp 2 is pinned"),
        (Pins(pp=2), (1, 1, 4), "--pp 2 is pinned"),
        (Pins(dp=4), (1, 1, 4), "--dp 4 is pinned"),
    ],
)
def test_why_not_names_the_pin(pins: Pins, shape: tuple[int, int, int], why: str) -> None:
    assert Space(4, 8, 5, (1, 2, 4), pins=pins).why_not(*shape) == why


def test_why_not_counts_the_blocks_for_inference_too() -> None:
    space = run.build_space(
        SearchRequest(model=GPT, cluster=MIXED, batch=8, train=False), parse_cluster(MIXED)
    )
    assert space.why_not(1, 1, 8) == "the model has 4 blocks, fewer than 8 stages"
    assert space.n_layers == 4 and space.why_not(1, 1, 4) == "d·t·p = 4, not the cluster's 8 devices"


@pytest.mark.slow
def test_explain_compares_pure_tensor_parallelism_where_it_is_searched(tmp_path: Path) -> None:
    """One 4-GPU node, 4 heads: t = 4 is searched, so --explain compares with pure T (simulated
    with --explain though outside --top 1), for inference too."""
    for mode in ("--train", "--infer"):
        code, out, err = _search_cli(tmp_path, NODE, "--batch", "8", "--top", "1", "--explain", mode)
        assert code == 0, err
        data = json.loads(out)
        text = "\n".join(data["explain"])
        assert "not searched" not in text, text
        # pure T, with or without sequence parallelism (both are searched with t > 1)
        assert re.search(r"d1\.t4(\.sp)?\.p1", text) and "pure tensor" in text
        assert any(re.match(r"d1\.t4(\.sp)?\.p1\.", r["strategy"]) for r in data["results"])


@pytest.mark.parametrize(
    ("space", "shape"),
    [
        (Space(4, 8, 5, (1, 2, 4), pins=Pins(schedule="zb1")), (4, 1, 1)),
        (Space(4, 8, 5, (1, 2, 4), pins=Pins(k=4)), (4, 1, 1)),
        (Space(4, 8, 4, (1, 2, 4), train=False, pins=Pins(schedule="gpipe")), (1, 1, 4)),
    ],
    ids=["schedule-pin", "k-pin", "inference-schedule"],
)
def test_why_not_is_none_only_for_shapes_with_strategies(space: Space, shape: tuple[int, int, int]) -> None:
    has = any((s.d, s.t, s.p) == shape for s in space.bases())
    assert (space.why_not(*shape) is None) == has


@pytest.mark.slow
def test_explain_names_a_schedule_pin_that_leaves_pure_data_parallelism_out(tmp_path: Path) -> None:
    code, out, err = _search_cli(
        tmp_path, NODE, "--batch", "8", "--top", "1", "--explain", "--schedule", "zb1"
    )
    assert code == 0, err
    text = "\n".join(json.loads(out)["explain"])
    assert "pure data parallel: not searched" in text
    assert "no such strategy was simulated" not in text, text


# -- 4. add_shares in the search flow ------------------------------------------------------------------


@pytest.mark.slow
def test_shares_proposals_skip_zero(tmp_path: Path) -> None:
    """With ZeRO pinned nothing takes shares (distribute refuses ZeRO with shares); the exact
    results of the heterogeneous search all simulate."""
    code, out, err = _search_cli(tmp_path, MIXED, "--batch", "48", "--pp", "1", "--zero", "1", "--top", "2")
    assert code == 0, err
    data = json.loads(out)
    assert all(parse_strategy(e["strategy"]).shares is None for e in data["screen_top"])
    assert all("error" not in r for r in data["results"])
    code, _, err = _simulate("--strategy", "d2.t4.p1.k1.1f1b.z1.b2-1", "--cluster", MIXED, "--batch", "48")
    assert code == 2 and "Traceback" not in err


@pytest.mark.parametrize("extra", [[], ["--trainer", "megatron", "--dtype", "bf16"], ["--infer"]])
def test_search_prints_the_command_that_simulates_its_winner(tmp_path: Path, extra: list[str]) -> None:
    """The text report ends with the ``distir simulate`` line of the winner, with the search's
    numerics and switches: run, it gives the step time the search reports."""
    import shlex

    cluster = "dgx-a100" if "--trainer" in extra else NODE
    base = ["search", "--model", GPT, "--cluster", cluster, "--batch", "8", "--workers", "1", "--top", "2"]
    r = runner.invoke(app, [*base, "--store", str(tmp_path / "s.sqlite"), *extra])
    assert r.exit_code == 0, r.stderr
    prefix = "the winner, simulated alone: "
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith(prefix)]
    words = shlex.split(line.removeprefix(prefix))
    assert words[:2] == ["distir", "simulate"]
    best = json.loads(
        runner.invoke(app, [*base, "--store", str(tmp_path / "s.sqlite"), *extra, "--json"]).stdout
    )
    got = runner.invoke(app, [*words[1:], "--json"])
    assert got.exit_code == 0, got.stderr
    assert json.loads(got.stdout)["step_time_s"] == best["results"][0]["step_time_s"]


def test_when_every_exact_simulation_fails_the_advice_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """No exact result to advise on: the search says every simulation failed and the first error,
    not that nothing fits (the failed rows have no memory figure)."""

    def fail(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise StrategyError("boom")

    monkeypatch.setattr(run, "evaluate_seeded", fail)
    req = run.SearchRequest(model="mlp:layers=2,hidden=64", cluster="dgx-a100:1", batch=8, top=2, workers=1)
    out = run.search(req)
    assert out.results and all("error" in r for r in out.results)
    assert len(out.advice) == 1 and out.advice[0].startswith("every exact simulation failed; the first, ")
    assert "StrategyError: boom" in out.advice[0]
