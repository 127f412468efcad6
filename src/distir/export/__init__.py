"""Export a plan to the configuration of a trainer: ``export(plan, target)``.

Targets (one module each): ``torchtitan`` (a job TOML), ``megatron`` (Megatron-LM arguments),
``deepspeed`` (a config JSON), ``fsdp`` (a PyTorch file using FSDP2, TP and pipelining).
``distir.export.plan`` holds what they share: ``make_plan``, ``Plan``, ``Exported``,
``ExportError`` and the contract on what a target cannot express (an error naming the feature)
or expresses only approximately (the nearest configuration, with a warning).
"""

from __future__ import annotations

from collections.abc import Callable

from distir.export import deepspeed, fsdp, megatron, torchtitan
from distir.export.plan import Exported, ExportError, Plan, make_plan

TARGETS: dict[str, Callable[[Plan], Exported]] = {
    "torchtitan": torchtitan.export,
    "megatron": megatron.export,
    "deepspeed": deepspeed.export,
    "fsdp": fsdp.export,
}


def export(plan: Plan, target: str) -> Exported:
    """The configuration of ``target`` for ``plan`` (raises ``ExportError``)."""
    if target not in TARGETS:
        raise ExportError(f"--to must be one of {', '.join(TARGETS)}, got {target!r}")
    return TARGETS[target](plan)


__all__ = ["TARGETS", "ExportError", "Exported", "Plan", "export", "make_plan"]
