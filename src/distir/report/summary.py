"""Summaries of values and programs, as plain data (for ``--json``) and as rich tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.table import Table

from distir.ir.function import Module
from distir.ir.printer import Namer
from distir.ir.types import TupleType
from distir.ir.values import Value


def value_summary(name: str, v: Any) -> dict[str, Any]:
    """Name, dtype, shape and statistics of one numpy value (tuples summarized per element)."""
    if isinstance(v, tuple):
        return {"name": name, "tuple": [value_summary(f"{name}[{i}]", x) for i, x in enumerate(v)]}
    a = np.asarray(v)
    f = a.astype(np.float64)
    return {
        "name": name,
        "dtype": str(a.dtype),
        "shape": list(a.shape),
        "mean": float(f.mean()) if a.size else None,
        "std": float(f.std()) if a.size else None,
        "min": float(f.min()) if a.size else None,
        "max": float(f.max()) if a.size else None,
        "sum": float(f.sum()),
    }


def output_names(values: Sequence[Value]) -> list[str]:
    namer = Namer()
    return ["%" + namer(v) for v in values]


def outputs_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("output", "dtype", "shape", "mean", "std", "min", "max", "sum"):
        t.add_column(col, justify="left" if col in ("output", "dtype", "shape") else "right")

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.6g}"

    def add(r: dict[str, Any]) -> None:
        if "tuple" in r:
            for e in r["tuple"]:
                add(e)
            return
        t.add_row(
            r["name"],
            r["dtype"],
            str(tuple(r["shape"])),
            fmt(r["mean"]),
            fmt(r["std"]),
            fmt(r["min"]),
            fmt(r["max"]),
            fmt(r["sum"]),
        )

    for r in rows:
        add(r)
    return t


def module_stats(m: Module) -> dict[str, Any]:
    n_ops = sum(len(f.body) for f in m.functions)
    return {
        "functions": [f.name for f in m.functions],
        "entry": m.entry.name,
        "instructions": n_ops,
        "parameters": [str(p.type) for p in m.entry.params if not isinstance(p.type, TupleType)],
    }
