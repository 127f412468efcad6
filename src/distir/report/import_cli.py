"""``distir import SOURCE``: the imported program and its summary.

``SOURCE`` is a model string (``hf:PATH``, ``package.module:factory``, or any zoo string) or a
path: a ``config.json`` file or a directory holding one reads as ``hf:PATH``. The summary counts
the ops by type over the whole step (a layer function's ops once per call), the parameters, the
forward FLOPs per sample (the registry's counts) and the layer functions (calls, weights per
call, the module paths of their calls).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from distir.frontends.zoo.model import Model
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
        "transmitted": list(model.transmitted),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "functions": functions,
    }


def render(info: dict[str, Any]) -> str:
    from distir.frontends.zoo.registry import human_count

    lines = [
        f"model {info['model']}: {human_count(info['params'])} parameters, "
        f"{human_count(info['flops_per_sample'])}FLOP forward per sample, {info['layers']} layer calls "
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
    if info["tied"]:
        sent = set(info.get("transmitted", ()))
        lines.append(
            "tied weights: " + ", ".join(f"{n} (transmitted)" if n in sent else n for n in info["tied"])
        )
    return "\n".join(lines)
