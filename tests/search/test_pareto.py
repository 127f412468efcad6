"""Pareto front against a brute-force dominance check; the PNG and HTML writers on ordinary and
degenerate inputs (empty, one result, nothing fits, non-finite figures, hostile strategy names)."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from distir.search.pareto import (
    GIB,
    best_fitting,
    capacity_line,
    pareto_front,
    script_json,
    write_html,
    write_png,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DATA_BLOCK = re.compile(r'<script type="application/json" id="distir-data">(.*?)</script>', re.S)


def result(
    strategy: str,
    mem_gib: float,
    thr: float,
    *,
    cap_gib: float = 80.0,
    source: str = "simulated",
    fits: bool | None = None,
) -> dict[str, Any]:
    mem, cap = mem_gib * GIB, cap_gib * GIB
    return {
        "strategy": strategy,
        "d": 2,
        "t": 4,
        "p": 2,
        "k": 8,
        "step_time_s": 64.0 / thr if thr > 0 else math.inf,
        "throughput": thr,
        "mfu": 0.4,
        "peak_memory_bytes": mem,
        "capacity_bytes": cap,
        "fits": mem <= cap if fits is None else fits,
        "bubble_fraction": 0.125,
        "source": source,
    }


def random_results(rng: random.Random, n: int, *, grid: int = 0) -> list[dict[str, Any]]:
    """``grid`` > 0 draws from a few values only, so that ties in either axis (and exact
    duplicates) are common."""

    def draw(hi: float) -> float:
        return rng.randrange(grid) * hi / grid if grid else rng.uniform(0, hi)

    return [
        result(
            f"s{i}",
            draw(120.0),
            draw(5000.0),
            source=rng.choice(["simulated", "screen"]),
        )
        for i in range(n)
    ]


def brute_front(results: list[dict[str, Any]]) -> set[int]:
    """The definition, O(n²): NaN never on the front; j beats i if it dominates it, or ties it
    exactly and comes first."""
    pts = [(float(r["peak_memory_bytes"]), float(r["throughput"])) for r in results]
    out = set()
    for i, (m, t) in enumerate(pts):
        if math.isnan(m) or math.isnan(t):
            continue
        beaten = False
        for j, (mj, tj) in enumerate(pts):
            if j == i or math.isnan(mj) or math.isnan(tj):
                continue
            dominates = mj <= m and tj >= t and (mj < m or tj > t)
            if dominates or (mj == m and tj == t and j < i):
                beaten = True
                break
        if not beaten:
            out.add(i)
    return out


# --- pareto_front ----------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [0, 4, 12])
def test_front_matches_brute_force(grid: int) -> None:
    rng = random.Random(1234 + grid)
    for _ in range(60):
        results = random_results(rng, rng.randrange(0, 40), grid=grid)
        front = pareto_front(results)
        assert set(front) == brute_front(results)
        assert len(front) == len(set(front))
        mems = [results[i]["peak_memory_bytes"] for i in front]
        thrs = [results[i]["throughput"] for i in front]
        assert mems == sorted(mems)
        # on a front, more memory must buy strictly more throughput
        assert all(a < b for a, b in itertools.pairwise(thrs))


def test_front_with_non_finite_values_matches_brute_force() -> None:
    rng = random.Random(7)
    specials = [math.nan, math.inf, -math.inf, 0.0]
    for _ in range(60):
        results = random_results(rng, rng.randrange(1, 25), grid=6)
        for r in rng.sample(results, k=min(4, len(results))):
            key = rng.choice(["peak_memory_bytes", "throughput"])
            r[key] = rng.choice(specials)
        assert set(pareto_front(results)) == brute_front(results)


def test_front_exact_ties_keep_first() -> None:
    results = [
        result("a", 10, 100),
        result("b", 10, 100),  # exact tie with a: dropped
        result("c", 10, 90),  # same memory, less throughput: dominated
        result("d", 20, 100),  # more memory, same throughput: dominated
        result("e", 5, 50),
        result("f", 30, 200),
        result("g", 5, 50),  # exact tie with e: dropped
    ]
    assert pareto_front(results) == [4, 0, 5]


def test_front_nan_is_never_on_it() -> None:
    results = [result("a", 10, math.nan), result("b", math.nan, 10), result("c", 50, 1)]
    assert pareto_front(results) == [2]
    assert pareto_front(results[:2]) == []


def test_best_fitting_and_capacity() -> None:
    results = [
        result("oom", 100, 900),
        result("a", 10, 300),
        result("b", 20, 300),
        result("c", 30, math.nan),
        result("d", 40, math.inf),
    ]
    # first of the tie; the faster one does not fit; non-finite throughput never wins
    assert best_fitting(results) == 1
    assert best_fitting(results[2:]) == 0  # indices are into the slice
    assert best_fitting(results[3:]) is None
    assert best_fitting(results[:1]) is None
    assert best_fitting([]) is None
    assert capacity_line(results) == (80 * GIB, True)
    mixed = [
        result("a", 10, 3, cap_gib=40),
        result("b", 10, 3, cap_gib=80),
        result("c", 1, 1, cap_gib=math.inf),
    ]
    assert capacity_line(mixed) == (40 * GIB, False)
    assert capacity_line([]) is None


# --- PNG -------------------------------------------------------------------------------------


def check_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 0 and img.shape[1] > 0


@pytest.mark.parametrize(
    "case",
    ["random", "empty", "single", "all_oom", "non_finite", "mixed_capacity", "dollars"],
)
def test_write_png(tmp_path: Path, case: str) -> None:
    rng = random.Random(3)
    results = {
        "random": random_results(rng, 30),
        "empty": [],
        "single": [result("d1.t8.p1.k1.gpipe", 40, 1234.5)],
        "all_oom": [result(f"s{i}", 90 + i, 100 * i) for i in range(5)],
        "non_finite": [result("a", math.inf, 10), result("b", 5, math.nan), result("c", 7, 70)],
        "mixed_capacity": [result("a", 10, 3, cap_gib=40), result("b", 50, 9, cap_gib=80, source="screen")],
        # an unescaped pair of $ would be parsed as mathtext, a lone one can break rendering
        "dollars": [result("$x$", 10, 3), result("$", 20, 5), result(r"a\$b", 30, 8)],
    }[case]
    path = tmp_path / "front.png"
    assert write_png(results, path, f"test {case} $1") == path
    check_png(path)
    assert os.listdir(tmp_path) == ["front.png"]  # no temporary file left behind


def test_write_png_replaces_existing_file_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "front.png"
    path.write_bytes(b"old")
    path.chmod(0o640)
    write_png([result("a", 1, 2)], path, "t")
    check_png(path)
    assert path.stat().st_mode & 0o777 == 0o640


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a_directory"
    target.mkdir()
    with pytest.raises(OSError):
        write_png([result("a", 1, 2)], target, "t")  # cannot replace a directory by a file
    assert os.listdir(tmp_path) == ["a_directory"]
    assert os.listdir(target) == []


# --- HTML ------------------------------------------------------------------------------------


def embedded(page: str) -> Any:
    blocks = DATA_BLOCK.findall(page)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def test_write_html_round_trips_the_data(tmp_path: Path) -> None:
    results = random_results(random.Random(11), 25)
    path = tmp_path / "front.html"
    assert write_html(results, path, "GPT-2 on 2×8 A100") == path
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for r in results:
        assert r["strategy"] in page
    data = embedded(page)
    rows = data["rows"]
    assert len(rows) == len(results)
    assert [row["strategy"] for row in rows] == [r["strategy"] for r in results]
    for row, r in zip(rows, results, strict=True):
        assert row["throughput"] == r["throughput"]
        assert row["peak_memory_bytes"] == r["peak_memory_bytes"]
        assert row["fits"] == r["fits"]
        assert row["source"] == r["source"]
    assert {row["i"] for row in rows if row["front"]} == set(pareto_front(results))
    assert [row["i"] for row in rows if row["best"]] == [best_fitting(results)]
    assert data["capacity"] == {"bytes": 80 * GIB, "uniform": True}
    assert "GPT-2 on 2×8 A100" in page
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)


def test_write_html_hostile_strategy_name(tmp_path: Path) -> None:
    evil = "</script><script>alert(1)</script><!--"
    results = [result(evil, 10, 100), result("ok", 20, 200)]
    path = tmp_path / "front.html"
    write_html(results, path, "<b>title</b> __DATA__")
    page = path.read_text(encoding="utf-8")
    block = DATA_BLOCK.findall(page)[0]
    assert "</script" not in block.lower()
    assert "<!--" not in block
    assert embedded(page)["rows"][0]["strategy"] == evil
    # exactly the page's own two script blocks close
    assert page.lower().count("</script") == 2
    # the title is escaped, and a placeholder-looking title is not substituted
    assert "<b>title</b>" not in page
    assert "&lt;b&gt;title&lt;/b&gt; __DATA__" in page


def test_write_html_non_finite_is_null(tmp_path: Path) -> None:
    results = [result("inf_thr", 10, math.inf), result("nan_mem", math.nan, 3), result("ok", 5, 1)]
    results[2]["mfu"] = -math.inf
    path = tmp_path / "front.html"
    write_html(results, path, "t")
    page = path.read_text(encoding="utf-8")
    block = DATA_BLOCK.findall(page)[0]
    assert "Infinity" not in block and "NaN" not in block
    rows = json.loads(block)["rows"]
    assert rows[0]["throughput"] is None
    assert rows[1]["peak_memory_bytes"] is None
    assert rows[2]["mfu"] is None
    assert rows[2]["throughput"] == 1


@pytest.mark.parametrize("n", [0, 1])
def test_write_html_empty_and_single(tmp_path: Path, n: int) -> None:
    results = [result("d8.t1.p1.k1.1f1b", 12, 345)][:n]
    path = tmp_path / "front.html"
    write_html(results, path, "t")
    page = path.read_text(encoding="utf-8")
    assert len(embedded(page)["rows"]) == n
    assert ("no results" in page) == (n == 0)
    assert os.listdir(tmp_path) == ["front.html"]


def test_write_html_all_out_of_memory(tmp_path: Path) -> None:
    results = [result(f"s{i}", 90 + i, 100 * (i + 1)) for i in range(4)]
    path = tmp_path / "front.html"
    write_html(results, path, "t")
    page = path.read_text(encoding="utf-8")
    rows = embedded(page)["rows"]
    assert not any(r["best"] or r["fits"] for r in rows)
    assert sum(r["front"] for r in rows) == 4  # more memory, more throughput: all on the front
    assert "Nothing fits in memory." in page


def test_script_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        script_json({"x": math.nan})
    assert json.loads(script_json({"s": "a</b>&<!--"})) == {"s": "a</b>&<!--"}
