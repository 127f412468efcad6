"""``distir import SOURCE``: the imported program and its summary.

``SOURCE`` is a model string (``hf:PATH``, ``package.module:factory``, or any zoo string) or a
path: a ``config.json`` file or a directory holding one reads as ``hf:PATH``. The summary counts
the ops by type over the whole step (a layer function's ops once per call), the parameters, the
forward FLOPs per sample (the registry's counts), the layer functions (calls, weights per
call, the module paths of their calls) and the weights tensor parallelism shards (by name
pattern, ``torch_import.placements``; none: t > 1 would only replicate the model).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from distir.frontends.zoo.model import Model
from distir.ir.dtensor import Shard
from distir.ir.ops import Op


def source_string(source: str) -> str:
    """A path to a config (file or directory) → ``hf:PATH``; anything else is a model string."""
    p = Path(source).expanduser()
    if not source.startswith("hf:") and (p.is_dir() or (p.is_file() and p.suffix == ".json")):
        return f"hf:{source}"
    return source


def summary(model: Model) -> dict[str, Any]:
    """The figures ``distir import`` prints (module docstring)."""
    module = model.module
    ops: Counter[str] = Counter()
    for call in model.layers:
        ops.update(i.name for i in module[call.callee].body if isinstance(i, Op))
    paths = list(model.config.get("layer_paths", ()))  # type: ignore[call-overload]
    functions: dict[str, dict[str, Any]] = {}
    for k, call in enumerate(model.layers):
        f = functions.setdefault(call.callee, {"calls": 0, "weights": len(call.inputs) - 1, "paths": []})
        f["calls"] += 1
        if k < len(paths):
            f["paths"].append(paths[k])
    return {
        "model": model.name,
        "params": model.num_params,
        "flops_per_sample": model.flops_per_sample,
        "batch": model.batch,
        "layers": len(model.layers),
        "pre": model.pre,
        "post": model.post,
        "tied": list(model.tied),
        "tp_sharded": [w.name for w in model.weights if isinstance(w.tp, Shard)],
        "weights": len(model.weights),
        "transmitted": list(model.transmitted),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "functions": functions,
    }


def _tp_line(sharded: list[str], weights: int) -> str:
    """Which weights tensor parallelism splits (by their module's name), or that it splits none."""
    if not sharded:
        return (
            f"tensor-parallel weights: none of {weights} matches a placement pattern, so t > 1 would "
            "replicate the model (the search keeps t = 1; --tp-layout auto finds placements)"
        )
    kinds = sorted({n.rsplit(".", 2)[-2] if n.count(".") else n for n in sharded})
    return (
        f"tensor-parallel weights: {len(sharded)} of {weights} sharded ({', '.join(kinds)}); "
        "the rest replicated"
    )


def render(info: dict[str, Any]) -> str:
    from distir.frontends.zoo.registry import human_count, human_flops

    lines = [
        f"model {info['model']}: {human_count(info['params'])} parameters, "
        f"{human_flops(info['flops_per_sample'])} forward per sample, {info['layers']} layer calls "
        f"({info['pre']} before the blocks, {info['post']} after)"
    ]
    for name, f in info["functions"].items():
        where = ""
        if f["paths"]:
            shown = f["paths"] if len(f["paths"]) <= 3 else [f["paths"][0], "...", f["paths"][-1]]
            where = f" — {', '.join(shown)}"
        lines.append(
            f"  @{name}: {f['calls']} call(s), {f['weights']} argument(s) after the activation{where}"
        )
    lines.append("ops: " + ", ".join(f"{k} {v}" for k, v in info["ops"].items()))
    lines.append(_tp_line(info["tp_sharded"], info["weights"]))
    if info["tied"]:
        sent = set(info.get("transmitted", ()))
        lines.append(
            "tied weights: " + ", ".join(f"{n} (transmitted)" if n in sent else n for n in info["tied"])
        )
    return "\n".join(lines)
