"""Device placement: which devices each instruction of a function runs on.

An op runs on the union of the devices of its inputs and results (a Send on its source and
destination, a collective on its group, a local op on its one device — the op registry rejects
a local op whose inputs sit on different devices, naming them). A call runs on the union of the
devices of everything its callee runs, at that call site's argument types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distir.interp.loop import interpret
from distir.interp.shapes import Mixed, TypeDomain, entry_args, type_of
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr
from distir.ir.types import Device, Type, devices_of
from distir.ir.values import Value


def _union(types: Sequence[Type], into: dict[Device, None]) -> None:
    for t in types:
        for d in devices_of(t):
            into[d] = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Devices per instruction of ``function`` and the type of every value there."""

    function: Function
    devices: Mapping[Instr, tuple[Device, ...]]
    types: Mapping[Value, Type]
    all_devices: tuple[Device, ...]


class _Placer:
    def __init__(self, module: Module, domain: TypeDomain) -> None:
        self.module = module
        self.domain = domain
        self.cache: dict[tuple[str, tuple[Type, ...]], tuple[Device, ...]] = {}

    def instr_devices(self, fn: Function, env: Mapping[Value, Mixed]) -> dict[Instr, tuple[Device, ...]]:
        out: dict[Instr, tuple[Device, ...]] = {}
        for instr in fn.body:
            devs: dict[Device, None] = {}
            if isinstance(instr, Call):
                for d in self.call_devices(instr, [env[v] for v in instr.inputs]):
                    devs[d] = None
            _union([type_of(env[v]) for v in (*instr.inputs, *instr.outputs)], devs)
            out[instr] = tuple(sorted(devs))
        return out

    def call_devices(self, call: Call, args: Sequence[Mixed]) -> tuple[Device, ...]:
        callee = self.module[call.callee]
        key = (callee.name, tuple(type_of(a) for a in args))
        hit = self.cache.get(key)
        if hit is None:
            _, env = interpret(self.module, callee, list(args), self.domain)
            devs: dict[Device, None] = {}
            for ds in self.instr_devices(callee, env).values():
                for d in ds:
                    devs[d] = None
            hit = self.cache[key] = tuple(sorted(devs))
        return hit


def placement(
    module: Module, fn: Function | None = None, concrete: Mapping[str, Any] | None = None
) -> Placement:
    """Place every instruction of ``fn`` (default: the entry), typed from its parameters."""
    fn = fn if fn is not None else module.entry
    domain = TypeDomain()
    _, env = interpret(module, fn, entry_args(fn, concrete), domain)
    devices = _Placer(module, domain).instr_devices(fn, env)
    every: dict[Device, None] = {}
    _union([type_of(env[p]) for p in fn.params], every)
    for ds in devices.values():
        for d in ds:
            every[d] = None
    return Placement(fn, devices, {v: type_of(x) for v, x in env.items()}, tuple(sorted(every)))
