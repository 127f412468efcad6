"""The Pareto PNG: written on ordinary and degenerate inputs (empty, one result, nothing fits,
non-finite figures, ``$`` in names), atomically; its memory axis (log scale, the fitting region a
readable share of it, results beyond it counted); labels that never overlap; the legend off the
axes."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

import pytest

from distir.report.pareto_axes import FIT_SHARE, fit_share, memory_window
from distir.report.pareto_png import pareto_figure, write_png
from distir.search.pareto import GIB
from search.test_pareto import random_results, result  # tests/ is on sys.path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 0 and img.shape[1] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    ["random", "empty", "single", "all_oom", "non_finite", "mixed_capacity", "dollars", "zero_memory"],
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
        "zero_memory": [result("none", 0, 10), result("some", 3, 20)],
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


def spread(rng: random.Random, n_fit: int, n_oom: int, worst_gib: float) -> list[dict[str, Any]]:
    """Fitting results from 0.5 GiB to the 80 GiB capacity, out-of-memory ones up to ``worst_gib``
    (pure data parallelism of a large model needs many times a device's memory)."""
    fit = [result(f"f{i}", math.exp(rng.uniform(math.log(0.5), math.log(79))), rng.uniform(10, 900))
           for i in range(n_fit)]  # fmt: skip
    oom = [result(f"o{i}", math.exp(rng.uniform(math.log(81), math.log(worst_gib))), rng.uniform(10, 900))
           for i in range(n_oom)]  # fmt: skip
    return fit + oom


def share_of_fitting(xlim: tuple[float, float], fit_hi_gib: float) -> float:
    """The share of a log axis from its left end to ``fit_hi_gib`` (the oracle: the axis limits)."""
    lo, hi = xlim
    return (math.log(fit_hi_gib) - math.log(lo)) / (math.log(hi) - math.log(lo))


@pytest.mark.parametrize("worst_gib", [90.0, 2_000.0, 1e6])
def test_fitting_plans_take_a_readable_share_of_the_memory_axis(worst_gib: float) -> None:
    results = spread(random.Random(int(worst_gib)), 40, 40, worst_gib)
    ax = pareto_figure(results, "t").axes[0]
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_xlim()
    assert share_of_fitting((lo, hi), 80.0) >= 0.4
    fitting = [r["peak_memory_bytes"] / GIB for r in results if r["fits"]]
    assert lo <= min(fitting) and max(fitting) <= hi and hi > 80.0  # all that fits, and the line
    beyond = sum(r["peak_memory_bytes"] / GIB > hi for r in results)
    notes = [t.get_text() for t in ax.texts]
    if beyond:
        assert any(t.startswith(f"{beyond} results need more than") for t in notes), notes
    else:
        assert not any("need more than" in t for t in notes)


def test_memory_window_share_holds_on_random_results() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randrange(1, 30)
        results = [
            result(
                f"s{i}", math.exp(rng.uniform(-3, 12)), rng.uniform(1, 100), cap_gib=rng.choice([16, 40, 80])
            )
            for i in range(n)
        ]
        w = memory_window(results)
        assert w is not None and w.lo < w.hi
        mems = [r["peak_memory_bytes"] for r in results]
        assert w.lo <= min(mems)
        assert w.beyond == sum(m > w.hi for m in mems)
        if any(r["fits"] for r in results):
            assert fit_share(w) >= FIT_SHARE - 1e-9
            assert all(r["peak_memory_bytes"] <= w.hi for r in results if r["fits"])
        else:
            assert w.beyond == 0  # nothing fits: how far over capacity is the news, all shown


def test_front_labels_never_overlap_and_stay_inside() -> None:
    # a long front of long names, crowded together: many labels compete for the same space
    results = [
        result(f"d{i}.t1.p8.k{2 * i}.1f1b.L" + "-".join(["7"] * 8), 1 + i * 0.3, 10 + 5 * i)
        for i in range(40)
    ]
    fig = pareto_figure(results, "t")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("d")]
    assert len(boxes) >= 5
    inside = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert inside.x0 <= a.x0 and a.x1 <= inside.x1 and inside.y0 <= a.y0 and a.y1 <= inside.y1
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    legend = fig.legends[0].get_window_extent(renderer)
    assert not legend.overlaps(inside)  # below the axes, on no point
