"""Mapping program devices onto the cluster: each program device is a *slot* — a stream of a GPU.

By default the program's devices, in id order, take GPUs 0, 1, 2, ... (compute stream). An explicit
map (``d0=0,d1=1,d8=0:comm``) may put several program devices on one GPU as separate streams: the
DistIR paper's way of modelling communication/computation overlap. Streams of one GPU share its
memory and transfer between each other for free.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from distir.ir.types import Device


class DeviceMapError(ValueError):
    pass


@dataclass(frozen=True, slots=True, order=True)
class Slot:
    gpu: int
    stream: str = "compute"

    def __str__(self) -> str:
        return f"gpu{self.gpu}" if self.stream == "compute" else f"gpu{self.gpu}:{self.stream}"


_ITEM = re.compile(r"\s*d([0-9]{1,9})\s*=\s*([0-9]{1,9})(?::([A-Za-z_][A-Za-z0-9_]*))?\s*", re.ASCII)
# the streams ``distir simulate --device-map`` accepts (``DeviceMap.parse(streams=STREAMS)``):
# compute, comm (the DistIR paper's communication stream), comm<N>, and the streams distir's own
# transforms use (``parallel.distribute.STREAMS``, ``parallel.context.RING_STREAMS``; a test keeps
# this list in step with them), so a typo on the command line is an error
STREAMS = (
    "compute",
    "comm",
    "fwd_send",
    "bwd_send",
    "fwd_recv",
    "bwd_recv",
    "dp_reduce",
    "dp_gather",
    "cp_send",
    "cp_recv",
    "host",
)
# a GPU's host (``distribute(offload_optimizer=True)``): program devices mapped there hold their
# values in the node's host memory, run their ops on its CPUs (``CostModel.host_time``) and reach
# the GPU's other streams over its PCIe link (``host_copy_time``)
HOST_STREAM = "host"
_COMM_N = re.compile(r"comm[0-9]+", re.ASCII)


@dataclass(frozen=True, slots=True)
class DeviceMap:
    """Program device -> slot. ``slots`` lists the distinct slots; ``index`` numbers them."""

    mapping: Mapping[Device, Slot]
    _slots: tuple[Slot, ...] = field(init=False, repr=False, compare=False)  # ``slots``, once

    def __post_init__(self) -> None:
        # asked for by every simulation of the map (a search's probes share one map)
        order = sorted(set(self.mapping.values()), key=lambda s: (s.gpu, s.stream != "compute", s.stream))
        object.__setattr__(self, "_slots", tuple(order))

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Distinct slots, by GPU, the compute stream first."""
        return self._slots

    def gpu(self, d: Device) -> int:
        return self.mapping[d].gpu

    def blocking(self) -> DeviceMap:
        """This map with every program device on its GPU's compute stream: the GPUs of a trainer
        whose kernel launches are synchronous (``CUDA_LAUNCH_BLOCKING=1``, which disables the
        asynchronicity of kernel launches: CUDA C++ Programming Guide, "Concurrent Execution
        between Host and Device"; PyTorch's "CUDA semantics", "Asynchronous execution": it
        forces synchronous computation). Each launch returns once its kernel has run, so a host
        thread issues its next kernel, on whichever stream, only then: no two kernels of a GPU
        overlap, and they run in the order the program issues them (a collective or send on a
        communication stream included). The host's own time between them is the cost model's
        (``RooflineCostModel.host_s``)."""
        return DeviceMap({d: Slot(s.gpu) for d, s in self.mapping.items()})

    @staticmethod
    def default(devices: Iterable[Device], num_gpus: int) -> DeviceMap:
        devs = sorted(set(devices))
        if len(devs) > num_gpus:
            raise DeviceMapError(
                f"the program uses {len(devs)} devices ({', '.join(map(str, devs))}) but the cluster "
                f"has {num_gpus} GPUs; use a larger cluster or an explicit --device-map"
            )
        return DeviceMap({d: Slot(i) for i, d in enumerate(devs)})

    @staticmethod
    def parse(
        text: str, devices: Iterable[Device], num_gpus: int, streams: Collection[str] | None = None
    ) -> DeviceMap:
        """``d0=0,d1=1,d8=0:comm``: every program device must be mapped, GPUs must exist; with
        ``streams``, only those stream names (and ``comm<N>``) are accepted."""
        mapping: dict[Device, Slot] = {}
        for item in text.split(","):
            m = _ITEM.fullmatch(item)
            if m is None:
                raise DeviceMapError(f"device map entry {item.strip()!r} is not like d3=1 or d8=0:comm")
            d, gpu = Device(int(m.group(1))), int(m.group(2))
            stream = m.group(3) or "compute"
            if streams is not None and stream not in streams and not _COMM_N.fullmatch(stream):
                raise DeviceMapError(
                    f"device map entry {item.strip()!r}: unknown stream {stream!r}; streams: "
                    f"{', '.join(streams)}, comm<N>"
                )
            if gpu >= num_gpus:
                raise DeviceMapError(
                    f"device map entry {item.strip()!r}: the cluster has GPUs 0..{num_gpus - 1}"
                )
            if d in mapping:
                raise DeviceMapError(f"device map maps {d} twice")
            mapping[d] = Slot(gpu, stream)
        missing = sorted(set(devices) - set(mapping))
        if missing:
            raise DeviceMapError(f"device map does not place {', '.join(map(str, missing))}")
        seen: dict[Slot, Device] = {}
        for d, s in mapping.items():
            if s in seen:
                raise DeviceMapError(f"{seen[s]} and {d} are both mapped to {s}; use different streams")
            seen[s] = d
        return DeviceMap(mapping)
