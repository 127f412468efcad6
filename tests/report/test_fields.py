"""Every part of a strategy as its own field (``distir.report.fields``), in the search's JSON and
CSV (``docs/json.md``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.report.fields import SCHEMA, STRATEGY_FIELDS, chunk_blocks, fields_for, strategy_fields

GPT = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128"


def test_every_part_is_a_field() -> None:
    s = parse_strategy("d2.t2.sp.p2.k4.interleaved.v2.rsel.L2-3-4-3.b1-3.@7-6-5-4-3-2-1-0")
    f = fields_for("gpt2-117m", s, 64)
    assert list(f) == list(STRATEGY_FIELDS)
    assert (f["d"], f["t"], f["p"], f["k"], f["v"]) == (2, 2, 2, 4, 2)
    assert (f["schedule"], f["sp"], f["zero"], f["recompute"]) == ("interleaved", True, 0, "selective")
    assert f["microbatch_size"] == 64 // (2 * 4)
    assert (f["partition"], f["layers_per_chunk"]) == ("explicit", [2, 3, 4, 3])
    assert f["placement"] == [7, 6, 5, 4, 3, 2, 1, 0] and f["shares"] == [1, 3]


def test_defaults_are_spelled_out() -> None:
    f = fields_for("gpt2-117m", parse_strategy("d4.t1.p3.k6.1f1b"), 48)
    assert f["layers_per_chunk"] == [4, 4, 4] and f["partition"] == "uniform"
    assert f["placement"] == list(range(12)) and f["shares"] == [1, 1, 1, 1] and f["v"] == 1


def test_a_split_the_model_cannot_take_is_an_error_or_null() -> None:
    s = parse_strategy("d1.t1.p2.k2.1f1b.L1-1")
    with pytest.raises(StrategyError):
        chunk_blocks("gpt2-117m", s)
    assert strategy_fields(s, 8, None)["layers_per_chunk"] is None


@pytest.mark.slow
def test_search_json_and_csv_carry_the_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "r.csv"
    args = [
        "search",
        "--model",
        GPT,
        "--cluster",
        "dgx-a100",
        "--batch",
        "16",
        "--top",
        "3",
        "--workers",
        "1",
    ]
    res = CliRunner().invoke(app, [*args, "--fresh", "--json", "--csv", str(path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["schema"] == SCHEMA
    for row in [*out["results"], *out["screen_top"]]:
        assert set(STRATEGY_FIELDS) <= set(row)
        s = parse_strategy(row["strategy"])
        assert row["microbatch_size"] == 16 // (s.d * s.k) and len(row["layers_per_chunk"]) == s.p * s.v
    rows = list(csv.DictReader(path.open()))
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in out["results"]]
    for r, j in zip(rows, out["results"], strict=True):
        assert r["layers_per_chunk"] == "-".join(map(str, j["layers_per_chunk"]))
        assert r["placement"] == "-".join(map(str, j["placement"])) and r["v"] == str(j["v"])
