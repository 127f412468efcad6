"""The search's results on ``bench_search.py``'s searches, saved or compared: a speed change to the
search must leave them identical (issue 17). Asserts nothing; prints what differs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_search_results.py save FILE [case ...]
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_search_results.py check FILE [case ...]

Cases: ``amp0``, ``amp1``, ``amp2`` (AMP's three experiments), ``gpt3`` (GPT-3 175B on 1024
A100s), ``llama405`` (Llama 3 405B on 16,384 H100s; slow), ``memory0`` ... ``memory10`` (the
searches of ``bench_screen_memory.py``, exact re-ranking of the winner only); default all but
``llama405`` and the memory ones. Per
search it records the number screened, every screened estimate in rank order (the strategy and
every figure of ``Estimate``, so the top-24 lists too), and the exact results (the winner first)
without their timings. ``check`` compares value for value (floats exactly) and prints the first
differences of each search, or ``identical``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

from bench_screen_memory import CASES as MEMORY_CASES  # noqa: E402
from bench_search import amp_request, gpt3_request, llama405_request  # noqa: E402
from distir.search.final import estimates_plain  # noqa: E402
from distir.search.run import SearchRequest, search  # noqa: E402


def _memory_request(i: int) -> SearchRequest:
    """``bench_screen_memory.py``'s search ``i``, its exact phase cut to the winner (the screened
    estimates, the top 24 among them, do not depend on it)."""
    c = MEMORY_CASES[i]
    return SearchRequest(
        model=c.model, cluster=c.cluster, batch=c.batch, dtype=c.dtype, precision=c.precision,
        top=1, workers=2, pins=c.pins,
    )  # fmt: skip


CASES: dict[str, Callable[[], SearchRequest]] = {
    "amp0": lambda: amp_request(0),
    "amp1": lambda: amp_request(1),
    "amp2": lambda: amp_request(2),
    "gpt3": gpt3_request,
    "llama405": llama405_request,
    **{f"memory{i}": functools.partial(_memory_request, i) for i in range(len(MEMORY_CASES))},
}
DEFAULT = ("amp0", "amp1", "amp2", "gpt3")


def record(req: SearchRequest) -> dict[str, Any]:
    """What the search decides (module docstring), as JSON values."""
    out = search(req)
    plain: dict[str, Any] = json.loads(
        json.dumps(
            {
                "n_screened": out.n_screened,
                "screened": estimates_plain(out.screened),
                "results": out.results,
            }
        )
    )
    return plain


def differences(a: object, b: object, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (floats compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{where}: length {len(a)} != {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += differences(x, y, f"{where}[{i}]")
        return out
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} != {b!r}"]


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="save or check the search's results (module docstring)")
    ap.add_argument("mode", choices=("save", "check"))
    ap.add_argument("path", help="the JSON file of saved results")
    ap.add_argument("names", nargs="*", metavar="case", help=", ".join(CASES))
    args = ap.parse_args()
    mode, path, names = args.mode, args.path, args.names or list(DEFAULT)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case {', '.join(unknown)} (cases: {', '.join(CASES)})")
    if mode == "check" and not os.path.exists(path):
        ap.error(f"{path}: no saved results (run `save {path}` first)")
    if mode == "save":
        saved = {}
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
        for name in names:
            saved[name] = record(CASES[name]())
            print(f"{name}: saved", flush=True)
        with open(path, "w") as f:
            json.dump(saved, f)
        return
    with open(path) as f:
        saved = json.load(f)
    for name in names:
        diff = differences(saved[name], record(CASES[name]()))
        print(f"{name}: " + ("identical" if not diff else f"{len(diff)} differences"), flush=True)
        for line in diff[:10]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
