"""Importing big models: time and peak memory, and the imported Llama-3-8B against the zoo's.

1. A 1.5B GPT-2 (the gpt2-xl config) and Llama-3-8B (its released config) imported from their
   Hugging Face configs under fake tensors (``hf:``), each in a fresh process: wall time
   (imports of torch and transformers included) and peak RSS. Targets: < 30 s, < 2 GB.
2. ``distir simulate`` of the imported Llama-3-8B and of the zoo's ``llama3-8b`` with the same
   strategy on ``--cluster h100``: both step times (target: within 5%).
3. With ``--search``: ``distir search`` of both at ``--batch 1024`` (end to end; slow), the best
   strategy's step time of each.

    .venv/bin/python bench/bench_import.py [--strategy d1.t8.p1.k4] [--batch 32] [--search]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "frontends" / "configs"
MODELS = {"gpt2-xl (1.5B)": CONFIGS / "gpt2-xl.json", "llama3-8b": CONFIGS / "llama3-8b.json"}

CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from distir.frontends.zoo import build_model
m = build_model(sys.argv[1], batch=8)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - t, "rss_mb": rss, "params": m.num_params,
                  "flops_per_sample": m.flops_per_sample, "layers": len(m.layers)}))
"""


def import_in_fresh_process(spec: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, spec], capture_output=True, text=True, env=env, check=True
    )
    got: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    got["wall_s"] = time.perf_counter() - t
    return got


def cli_json(*args: str) -> dict[str, Any]:
    from typer.testing import CliRunner

    from distir.cli import app

    r = CliRunner().invoke(app, [*args, "--json"])
    if r.exit_code != 0:
        raise SystemExit(f"distir {' '.join(args)}: {r.stderr or r.stdout}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", default="d1.t8.p1.k4")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--search", action="store_true", help="also run distir search on both (slow)")
    args = ap.parse_args()
    print("import (fresh process, torch/transformers imports included):")
    for label, path in MODELS.items():
        r = import_in_fresh_process(f"hf:{path}")
        ok = "ok" if r["wall_s"] < 30 and r["rss_mb"] < 2048 else "OVER TARGET"
        print(
            f"  {label:16s} {r['wall_s']:6.1f} s  peak RSS {r['rss_mb']:7.0f} MB  "
            f"{r['params'] / 1e9:.3f}B params  {r['flops_per_sample'] / 1e12:.2f} TFLOP/sample  [{ok}]"
        )
    sys.path.insert(0, str(ROOT / "src"))
    common = [
        "--strategy",
        args.strategy,
        "--cluster",
        "h100",
        "--batch",
        str(args.batch),
        "--dtype",
        args.dtype,
    ]
    zoo = cli_json("simulate", "--model", "llama3-8b", *common)
    imp = cli_json("simulate", "--model", f"hf:{MODELS['llama3-8b']}", *common)
    z = float(zoo["step_time_s"])
    print(f"simulate {args.strategy} batch {args.batch} {zoo['dtype']} {zoo['precision']} on h100:")
    for label, got in (("zoo llama3-8b    ", zoo), ("hf:llama3-8b.json", imp)):
        peak = max(got["peak_memory_bytes"].values()) / 2**30
        vs = f"  ({100 * (float(got['step_time_s']) - z) / z:+.2f}% vs zoo)" if got is imp else ""
        print(f"  {label}  step {float(got['step_time_s']):.4f} s  peak {peak:.2f} GiB  ops {got['ops']}{vs}")
    if args.search:
        for label, model in (
            ("zoo llama3-8b", "llama3-8b"),
            ("hf:llama3-8b.json", f"hf:{MODELS['llama3-8b']}"),
        ):
            t = time.perf_counter()
            out = cli_json(
                "search", "--model", model, "--cluster", "h100", "--batch", "1024", "--dtype", args.dtype
            )
            best = out.get("best") or {}
            print(
                f"search {label}: best {best.get('strategy')} step {best.get('step_time_s')} s "
                f"({time.perf_counter() - t:.0f} s)"
            )


if __name__ == "__main__":
    main()
