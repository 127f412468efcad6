"""The screen's memory estimate against the exact simulation, search by search: for each exactly
simulated plan, the screen's tensor peak over the exact tensor peak (the exact peak less the
runtime memory the screen subtracts from the capacity instead). Prints figures; asserts nothing
(``tests/search/test_screen_memory.py`` and ``tests/search/test_precision.py`` hold the bounds).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_screen_memory.py
"""

from __future__ import annotations

import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.search.run import SearchRequest, search
from distir.search.space import Pins

GPT_SMALL = "gpt:layers=8,hidden=512,heads=8,seq=512,vocab=4096"
SEARCHES = [
    ("Llama 3 8B, 1 × H100 node, batch 1024", dict(model="llama3-8b", cluster="h100", batch=1024), None),
    ("Llama 3 8B, ZB-H1 pinned", dict(model="llama3-8b", cluster="h100", batch=1024), "zb1"),
    ("GPT 8 × 512, DGX-A100, ZB-H1 pinned", dict(model=GPT_SMALL, cluster="dgx-a100", batch=64), "zb1"),
    ("GPT 8 × 512, DGX-A100, 1F1B pinned", dict(model=GPT_SMALL, cluster="dgx-a100", batch=64), "1f1b"),
    ("GPT 8 × 512, DGX-A100, GPipe pinned", dict(model=GPT_SMALL, cluster="dgx-a100", batch=64), "gpipe"),
]


def main() -> None:
    every: list[float] = []
    for title, job, schedule in SEARCHES:
        req = SearchRequest(
            dtype="bf16", precision="mixed", top=8, workers=2, pins=Pins(schedule=schedule), **job
        )  # type: ignore[arg-type]
        out = search(req)
        screened = {str(e.strategy): e.peak_memory_bytes for e in out.screened}
        runtime = out.cluster.device_spec(0).runtime
        print(f"{title}:")
        for r in out.results:
            tensors = runtime.tensor_capacity(r["peak_memory_bytes"])
            ratio = screened[r["strategy"]] / tensors
            every.append(ratio)
            print(
                f"  {r['strategy']:42s} screen {screened[r['strategy']] / 2**30:8.2f} GiB  "
                f"exact {tensors / 2**30:8.2f} GiB  {ratio:.3f}  fits {r['fits']}"
            )
    errs = [abs(x - 1) for x in every]
    print(
        f"screen / exact over {len(every)} plans: median |error| {100 * statistics.median(errs):.1f}%, "
        f"range {min(every):.3f}-{max(every):.3f}, under by more than 15%: "
        f"{sum(1 for x in every if x < 0.85)}"
    )


if __name__ == "__main__":
    main()
