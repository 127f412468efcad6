"""The HBM bandwidth normalization kernels reach on A100 and H100, from published benchmark data,
against the fractions the cost model uses (issue 16: compute efficiency from data).

    PYTHONPATH=src .venv/bin/python bench/bench_memory_kernels.py

Data: ``bench/data/norm_kernels_liger.csv``, Liger-Kernel's published benchmark timings of
``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm`` (PyTorch's eager kernels) and of Liger's Triton
kernels (source in the file's header). Each time is turned into a fraction of the GPU's HBM
bandwidth over the bytes distir's cost descriptors count for the op (the default: every input
read and every result written once): forward ``LayerNormalization``/``RMSNormalization`` reads
X and writes Y (2 × X's bytes), backward ``…Grad`` reads dY and X and writes dX (3 ×; the
per-channel scale and bias are negligible). A backward time not published on its own is the
full (forward + backward) time less the forward. The plateau is the median over hidden sizes of
4096 and more (smaller ones are dominated by fixed costs the cost model charges as launch time).

The cost model's fractions: ``RooflineCostModel.memory_efficiency`` (0.8) for every memory-bound
kernel, and an op's ``OpDef.eager_memory`` for a program run as eager PyTorch
(``RooflineCostModel(eager=True)``). Prints figures; asserts nothing.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import distir  # noqa: E402
from distir.hardware.presets import A100_SXM_80GB, H100_SXM_80GB  # noqa: E402
from distir.sim.cost import RooflineCostModel  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "norm_kernels_liger.csv"
HBM = {"A100": A100_SXM_80GB.memory_bandwidth, "H100": H100_SXM_80GB.memory_bandwidth}
ELEMENT = {"float32": 4, "bfloat16": 2}
PASSES = {"forward": 2, "backward": 3}
OPS = {
    "layer_norm": "LayerNormalization",
    "megatron_rms_norm": "RMSNormalization",
    "rms_norm": "RMSNormalization",
}


class Key(NamedTuple):
    kernel: str
    provider: str
    gpu: str
    rows: int
    hidden: int
    dtype: str


def load(path: Path = DATA) -> dict[Key, dict[str, float]]:
    """Seconds per pass (forward, backward, full) of each benchmark point."""
    out: dict[Key, dict[str, float]] = defaultdict(dict)
    with path.open() as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            k = Key(r["kernel"], r["provider"], r["gpu"], int(r["rows"]), int(r["hidden"]), r["dtype"])
            out[k][r["mode"]] = float(r["ms"]) * 1e-3
    return out


def fractions(data: dict[Key, dict[str, float]]) -> dict[tuple[str, str, str, str], list[tuple[int, float]]]:
    """(kernel, provider, gpu, pass) -> [(hidden, fraction of HBM bandwidth)]."""
    out: dict[tuple[str, str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for k, t in sorted(data.items()):
        times = dict(t)
        if "backward" not in times and {"full", "forward"} <= times.keys():
            times["backward"] = times["full"] - times["forward"]
        x_bytes = k.rows * k.hidden * ELEMENT[k.dtype]
        for p, passes in PASSES.items():
            if p in times and times[p] > 0:
                out[(k.kernel, k.provider, k.gpu, p)].append(
                    (k.hidden, passes * x_bytes / times[p] / HBM[k.gpu])
                )
    return out


def _model(kernel: str, p: str) -> str:
    op = distir.REGISTRY[OPS[kernel] + ("Grad" if p == "backward" else "")]
    default = RooflineCostModel.__dataclass_fields__["memory_efficiency"].default
    eager = f"{op.eager_memory.memory:.2f}" if op.eager_memory is not None else "-"
    return f"default {default:.2f}, eager {eager}"


def main() -> None:
    fr = fractions(load())
    print(f"{DATA.name}: fraction of HBM bandwidth by hidden size; plateau = median over hidden >= 4096\n")
    for (kernel, provider, gpu, p), pts in sorted(fr.items()):
        plateau = statistics.median(f for h, f in pts if h >= 4096)
        row = "  ".join(f"{h}:{100 * f:.0f}%" for h, f in pts)
        print(
            f"{kernel:18s} {provider:12s} {gpu} {p:8s} plateau {100 * plateau:3.0f}%  ({row})  "
            f"distir: {_model(kernel, p)}"
        )


if __name__ == "__main__":
    main()
