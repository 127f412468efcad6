"""Per-rank projection: from one global program, one program per device.

Rank ``r``'s program holds the entry's parameters that live on ``r``, the instructions that touch
``r`` in program order, and the results that live on ``r``. Communication ops are split into their
local parts by their registry ``project`` rule (Send → ``rank.Send`` on the source and
``rank.Recv`` on the destination; a collective → ``rank.<Collective>`` on every member). Calls
whose callee runs on one device stay calls (the callee is copied into that rank's module);
calls spanning devices are inlined first, repeatedly, so every remaining instruction is either
local to one device or a communication op. Every value of a projected entry is typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distir.interp.placement import Placement, placement
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import ValueMap, copy_instr, inline_calls
from distir.ir.types import Device, devices_of
from distir.ir.values import Value
from distir.ops.registry import REGISTRY, OpKind


class ProjectionError(ValueError):
    pass


def _spread_out(module: Module, concrete: Mapping[str, Any] | None) -> tuple[Module, Placement]:
    """Inline multi-device calls of the entry until none is left."""
    while True:
        pl = placement(module, concrete=concrete)
        multi = {
            c
            for c, ds in pl.devices.items()
            if isinstance(c, Call) and (len(ds) > 1 or _communicates(module, c.callee))
        }
        if not multi:
            return module, pl
        chosen: set[Call] = multi
        module = module.replace(inline_calls(module, should_inline=chosen.__contains__))


def _communicates(module: Module, name: str) -> bool:
    """Whether @name (or anything it calls) holds a communication op, which must be split."""
    fn = module[name]
    return any(REGISTRY[op.name].kind is OpKind.COMM for op in fn.ops()) or any(
        _communicates(module, c.callee) for c in fn.calls()
    )


def _reachable(module: Module, fn: Function) -> list[str]:
    seen: dict[str, None] = {}
    stack = [c.callee for c in fn.calls()]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen[name] = None
            stack.extend(c.callee for c in module[name].calls())
    return [f.name for f in module.functions if f.name in seen]


def project(module: Module, concrete: Mapping[str, Any] | None = None) -> dict[Device, Module]:
    """One module per device (see the module docstring), keyed by device in id order."""
    module, pl = _spread_out(module, concrete)
    entry = module.entry
    types = pl.types
    builders: dict[Device, FunctionBuilder] = {}
    vmaps: dict[Device, ValueMap] = {}
    for d in pl.all_devices:
        builders[d] = FunctionBuilder(entry.name)
        vmaps[d] = ValueMap(lambda v: Value(v.name, types.get(v, v.type)))
    for p in entry.params:
        if isinstance(types[p], DTensorType):
            raise ProjectionError(
                f"@{entry.name} is a sharded (DTensor) program; materialize it into per-device tensors "
                "first (distir shard ... --stage materialize)"
            )
        devs = devices_of(types[p])
        if len(devs) != 1:
            raise ProjectionError(
                f"parameter %{p.name} of @{entry.name} spans devices {', '.join(map(str, devs))}"
            )
        vmaps[devs[0]].bind(p, builders[devs[0]].param(p.name, types[p]))
    for instr in entry.body:
        devs = pl.devices[instr]
        if isinstance(instr, Op):
            opdef = REGISTRY[instr.name]
            if opdef.kind is OpKind.COMM:
                if opdef.project is None:  # pragma: no cover - every comm op registers one
                    raise ProjectionError(f"{instr.name} has no projection rule")
                pieces = opdef.project(
                    instr, [types[v] for v in instr.inputs], [types[v] for v in instr.outputs], lambda v: v
                )
                for dev, ops in pieces.items():
                    for op in ops:
                        builders[dev].append(copy_instr(op, vmaps[dev]))
                continue
        for dev in devs:
            builders[dev].append(copy_instr(instr, vmaps[dev]))
    for v in entry.outputs:
        if len(devices_of(types[v])) != 1:
            raise ProjectionError(
                f"result %{v.name} of @{entry.name} spans devices "
                f"{', '.join(map(str, devices_of(types[v])))}; return its parts separately"
            )
    result: dict[Device, Module] = {}
    for dev in pl.all_devices:
        outs = [v for v in entry.outputs if devices_of(types[v]) == (dev,)]
        fn = builders[dev].ret(*(vmaps[dev](v) for v in outs))
        callees = [module[n] for n in _reachable(module, fn)]
        result[dev] = Module((*callees, fn))
    return result


def outputs_by_rank(module: Module, concrete: Mapping[str, Any] | None = None) -> dict[Device, list[int]]:
    """For each device, the indices of the entry's outputs its projected program returns."""
    pl = placement(module, concrete=concrete)
    res: dict[Device, list[int]] = {d: [] for d in pl.all_devices}
    for i, v in enumerate(module.entry.outputs):
        devs = devices_of(pl.types[v])
        if len(devs) == 1:
            res[devs[0]].append(i)
    return res
