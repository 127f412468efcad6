"""Where the long-sequence rows' steps go (issue 16): GPU 0's simulated step split into fused
attention and the rest, and the attention time the published step leaves if the rest is as
simulated. Diagnostic only: it changes nothing.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/bench_long_sequence.py [--only N]

The rows are the records with a sequence of 16,384 tokens or more and no pipeline (NeMo's
long-sequence Llama 2 7B table, ``nemo-long-*``, and torchtitan's Llama 3.1 8B context-parallel
rows; a pipelined row's step holds its bubbles besides GPU 0's kernels), built and simulated as
``validate_published`` does. Per row, in ms per step: the simulated step, the
published one (the step that gives the published figure), GPU 0's fused-attention kernels
(``Attention*`` ops, the ring's steps included) and everything else on its compute stream, and
``implied`` = (published − rest) / attention: how much longer than simulated the attention would
have to run for the published step, were the rest exact. A constant ``implied`` over rows whose
context-parallel degree differs points at the attention kernels, not at the ring around them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts are not a package

import bench_megatron_attribution as attribution
import validate_published as vp

MIN_SEQ = 16_384


class Split(NamedTuple):
    """A row's simulated and published steps and GPU 0's compute-stream time (seconds)."""

    step: float
    published: float
    attention: float
    rest: float

    @property
    def implied(self) -> float:
        """The attention's factor that the published step leaves (module docstring)."""
        return (self.published - self.rest) / self.attention


def split(run: Any) -> Split:
    """``run``'s simulated step on GPU 0, attention against the rest of its compute stream (the
    attribution bench's walk of GPU 0's op trace)."""
    sp = attribution.split(run)
    rest = sum(sp.per[c] for c in attribution.CLASSES if c != "attention")
    return Split(sp.step, sp.published, sp.per["attention"], rest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="a run name or prefix*")
    a = ap.parse_args(argv)
    runs = [
        r
        for r in vp.load_runs(vp.DATA)
        if r.model.seq >= MIN_SEQ and r.strategy.pp == 1 and not vp.unsupported(r)
    ]
    if a.only:
        runs = [r for r in runs if any(vp._named(r, p) for p in a.only)]
    head = f"{'step':>9s} {'publ.':>9s} {'attention':>10s} {'rest':>9s} {'implied':>8s}"
    print(f"{'run':34s} {'strategy':30s} {head}   (ms per step, GPU 0)")
    for r in runs:
        sp = split(r)
        st = vp.strategy_of(r.strategy)
        print(
            f"{r.name:34s} {st!s:30s} {1e3 * sp.step:9.0f} {1e3 * sp.published:9.0f} "
            f"{1e3 * sp.attention:10.0f} {1e3 * sp.rest:9.0f} {sp.implied:7.2f}×",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
