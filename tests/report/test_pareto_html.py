"""The interactive Pareto page: the data it embeds round-trips, hostile names stay inert, the
template ships as package data, and — in headless Chromium, when installed — the page renders
without a console error, draws every result and survives zoom, pan, filtering and sorting."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from distir.report.pareto_axes import memory_window
from distir.report.pareto_html import page_data, script_json, template, write_html
from distir.search.pareto import GIB, best_fitting, pareto_front
from search.test_pareto import random_results, result  # tests/ is on sys.path

DATA_BLOCK = re.compile(r'<script type="application/json" id="distir-data">(.*?)</script>', re.S)


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
    w = memory_window(results)
    assert w is not None and (data["window"]["lo"], data["window"]["hi"]) == (w.lo, w.hi)
    assert "GPT-2 on 2×8 A100" in page
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)


def test_page_data_carries_the_filter_fields() -> None:
    r = result("d2.t1.p1.k1.1f1b", 10, 100) | {"schedule": "1f1b", "zero": 2, "recompute": "full"}
    row = page_data([r, result("x", 20, 50)])["rows"]
    assert (row[0]["schedule"], row[0]["zero"], row[0]["recompute"]) == ("1f1b", 2, "full")
    assert (row[1]["schedule"], row[1]["zero"], row[1]["recompute"]) == (None, None, None)


def test_page_files_ship_as_package_data() -> None:
    assert "__DATA__" in template("pareto_page.html") and "__JS__" in template("pareto_page.html")
    assert 'id="chart"' in template("pareto_body.html")
    assert "#chart" in template("pareto_page.css")
    js = template("pareto_page.js")
    assert "distir-data" in js and "</script" not in js.lower()


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


# --- in a browser ------------------------------------------------------------------------------

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium on PATH (./dev test installs it with apt-get when root)"
)

# Run after the page's own script: zoom, pan, toggle a filter, sort, show all, go back; then
# write what the page shows into the DOM for --dump-dom to read.
EXERCISE = """<script>
(function () {
  const svg = document.getElementById("chart");
  const count = () => svg.querySelectorAll(".pt").length;
  const before = count();
  const box = svg.getBoundingClientRect();
  const at = { clientX: box.left + box.width / 2, clientY: box.top + box.height / 2, bubbles: true };
  svg.dispatchEvent(new WheelEvent("wheel", { ...at, deltaY: -300, cancelable: true }));
  svg.dispatchEvent(new PointerEvent("pointerdown", { ...at, pointerId: 1 }));
  svg.dispatchEvent(new PointerEvent("pointermove", { ...at, clientX: at.clientX + 60, pointerId: 1 }));
  svg.dispatchEvent(new PointerEvent("pointerup", { ...at, pointerId: 1 }));
  const oom = [...document.querySelectorAll("#filters input")]
    .find((b) => b.parentNode.textContent.includes("out of memory"));
  oom.checked = false;
  oom.dispatchEvent(new Event("change"));
  document.getElementById("all").click();
  const filtered = count();
  const hiddenRows = document.querySelectorAll("#results tbody tr[hidden]").length;
  document.querySelector("#results th").click();
  document.getElementById("logx").click();
  document.getElementById("reset").click();
  const out = document.createElement("pre");
  out.id = "exercise";
  out.textContent = JSON.stringify({ before, filtered, hiddenRows,
    labels: svg.querySelectorAll(".flabel").length,
    rows: document.querySelectorAll("#results tbody tr").length });
  document.body.appendChild(out);
})();
</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--enable-logging=stderr", "--v=0", "--window-size=1000,1300", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _console(stderr: str) -> list[str]:
    """Chromium's console lines (every message, and uncaught exceptions) from its log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _page_results() -> list[dict[str, Any]]:
    rng = random.Random(2)
    results = [*random_results(rng, 40), result("huge", 5000, 20, source="screen")]
    for r in results:
        r |= {"schedule": rng.choice(["1f1b", "zb1"]), "zero": rng.choice([0, 1, 3]), "recompute": "none"}
    return results


@pytest.mark.slow
@needs_chromium
def test_page_renders_in_chromium_without_console_error(tmp_path: Path) -> None:
    results = _page_results()
    page = write_html(results, tmp_path / "front.html", "in a browser")
    shot = tmp_path / "front.png"
    run = _chromium(f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert _console(run.stderr) == []
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] > 500 and img.std() > 0.05  # drawn, not a blank page
    dom = _chromium("--dump-dom", page.as_uri())
    assert _console(dom.stderr) == []
    placeable = sum(
        1 for r in results if math.isfinite(r["peak_memory_bytes"]) and math.isfinite(r["throughput"])
    )
    # every result is a point (the best one also a star), every result a table row
    assert dom.stdout.count('class="pt ') == placeable + (best_fitting(results) is not None)
    assert dom.stdout.count("<tr") == len(results) + 1


@needs_chromium
def test_page_zoom_pan_filter_and_sort_raise_nothing(tmp_path: Path) -> None:
    results = _page_results()
    page = write_html(results, tmp_path / "front.html", "exercised")
    text = page.read_text(encoding="utf-8").replace("</body>", EXERCISE + "\n</body>")
    page.write_text(text, encoding="utf-8")
    dom = _chromium("--dump-dom", page.as_uri())
    assert _console(dom.stderr) == []
    found = re.search(r'<pre id="exercise">(.*?)</pre>', dom.stdout)
    assert found, dom.stdout[-2000:]
    got = json.loads(found[1].replace("&quot;", '"'))
    n_oom = sum(not r["fits"] for r in results)
    assert n_oom > 0 and got["hiddenRows"] == n_oom
    assert got["filtered"] < got["before"]
    assert got["rows"] == len(results) and got["labels"] >= 1
