"""Compute slowed by the communication kernels running beside it on the same GPU.

A collective on a communication stream does not run beside the compute for free. NCCL runs it as
a kernel with one CTA per channel, and each of those CTAs holds an SM to itself while the
collective runs ("NCCL CTAs won't share an SM with compute kernels", NCCL's maintainer,
https://github.com/NVIDIA/nccl/issues/689). A GEMM or any other kernel launched beside it gets
the remaining SMs, so it runs at ``1 - s`` of its speed, with ``s = comm_sms / sms``, the GPU's
``GemmProfile.comm_share`` (24 channels of an H100's 132 SMs: 18%; of an A100's 108: 22%).
Measured compute slowdowns under overlap are of that size: 18.9% on average, at most 40%, over
GPT and Llama training kernels on A100 and H100 (Lee et al. 2025, "Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114).
The memory bandwidth NCCL also takes (it stores what arrives and reads it back,
https://github.com/NVIDIA/nccl/issues/1428) is not modelled; memory-bound kernels beside a
collective slow down more than this.

**Persistent GEMM kernels** (``GemmProfile.persistent``: cuBLAS on Hopper). A GEMM kernel that
launches one CTA per SM, each working through a fixed list of output tiles, cannot shrink to the
SMs left beside a communication kernel: the CTAs that find no free SM wait for the first ones to
finish and run as a second wave, so the GEMM takes ``w`` times as long, ``w = ⌈sms / (sms −
comm_sms)⌉`` waves (2 on an H100 beside NCCL's 24 CTAs; ``GemmProfile.gemm_waves``), not
``1 / (1 - s)``. Measured: an H100 GEMM of 132 CTAs beside a 24-CTA ``ncclAllGather`` nearly
doubles its time; FSDP training's matmuls on H100 "take 2x as long" overlapped with NCCL
(``persistent_source`` of the H100 profile). So the rate depends on the compute's mix: with a
fraction ``f`` of its kernel time in such GEMMs (``RooflineCostModel.gemm_share``; the rest runs
at ``1 - s``), a unit of work takes ``w f + (1 - f) / (1 - s)`` beside a collective, and the share
lost is ``1 - 1 / (w f + (1 - f) / (1 - s))`` (``GemmProfile.overlap_share``): ``s`` with no GEMMs, ``1 -
1/w`` (a half) with nothing else. Not modelled: a GEMM of fewer tiles than the free SMs (one wave
either way) and a collective that ends mid-GEMM (the second wave starts then); the rates are the
whole window's, as below.

**The rate model, in max-plus form.** While a communication kernel of ``c`` seconds runs, a
compute stream that is busy throughout it gets ``(1 - s) c`` seconds of work done instead of
``c``: it ends ``s c`` later. The simulator charges exactly that, as a *stall*: when a
collective is placed on a communication stream, the compute stream of each GPU it runs on
advances by ``s c`` (``OpRecord.stall``; busy time, since the compute's kernels take that much
longer). This is the rate model whenever the compute stream has work during the whole
collective, or waits for it to end: a compute of ``g`` seconds beside a collective of ``c`` that
the next op waits for ends at ``max(g + s c, c)`` from their common start, both ways (``g +
s c`` when the compute outlasts the collective, which is the rate model's ``c + (g - (1 - s) c)``;
else the wait hides it). It overcharges a compute stream that idles during part of the
collective and does not wait for it afterwards. Being a constant added to a clock, a stall is
max-plus linear: call summaries, units of identical ranks and every fast path carry it exactly.

A collective charges nothing when it runs on the compute stream itself (the GPU then runs one
kernel at a time), when it takes no time, or when its GPU has no compute stream in the program.
Point-to-point transfers (``Send``, ``MeshSend``) are not charged: NCCL runs them on few
channels (``NCCL_NCHANNELS_PER_NET_PEER``, 2 by default). A cost model without
``interference(gpu)`` (or with a GPU whose profile holds no ``comm_sms``, as calibrated and CPU
profiles do) charges nothing; ``RooflineCostModel(comm_interference=False)`` turns it off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from distir.sim.cost import CostModel
from distir.sim.devices import Slot
from distir.sim.records import CallSummary, OpRecord

COMPUTE = "compute"  # the stream compute kernels run on (``distir.sim.devices.Slot``)


def share(model: CostModel, gpu: int) -> float:
    """The fraction of ``gpu``'s compute a communication kernel beside it takes (0: none)."""
    fn = getattr(model, "interference", None)
    return float(fn(gpu)) if fn is not None else 0.0


class _Clocks(Protocol):
    """What ``stall`` needs of ``distir.sim.units.Units``."""

    streams: tuple[Slot, ...]
    units: list[tuple[int, ...]] | None
    cost: CostModel

    def compute_clocks(self) -> dict[int, int]: ...


def stall(clocks: _Clocks, devs: Sequence[int], seconds: float) -> tuple[tuple[int, float], ...]:
    """The stall of a collective of ``seconds`` on the clocks ``devs`` (slots, or units of a
    DTensor program): per compute clock of a GPU it runs on (not among ``devs``), the seconds it
    adds to that clock (module docstring). Empty when nothing is charged."""
    if seconds <= 0.0:
        return ()
    streams, units = clocks.streams, clocks.units
    of_gpu = clocks.compute_clocks()
    out: dict[int, float] = {}
    mine = set(devs)
    for d in devs:
        slot = streams[d if units is None else units[d][0]]  # a unit: one stream, one GPU class
        if slot.stream == COMPUTE:
            continue
        c = of_gpu.get(slot.gpu)
        if c is None or c in mine or c in out:
            continue
        s = share(clocks.cost, slot.gpu)
        if s > 0.0:
            out[c] = s * seconds
    return tuple(sorted(out.items()))


def compute_clocks(streams: Sequence[Slot], units: Sequence[tuple[int, ...]] | None) -> dict[int, int]:
    """GPU -> the clock of its compute stream: its slot, or the unit holding it (the GPUs of a
    unit have their compute streams in one unit: ``Units._finish``)."""
    unit_of = {r: u for u, members in enumerate(units) for r in members} if units is not None else None
    return {
        slot.gpu: (r if unit_of is None else unit_of[r])
        for r, slot in enumerate(streams)
        if slot.stream == COMPUTE
    }


def stall_column(records: Iterable[OpRecord | CallSummary]) -> list[tuple[tuple[int, float], ...]] | None:
    """Per record, its stall (a call summary: none), or None when no record stalls a clock."""
    col = [r.stall if type(r) is OpRecord else () for r in records]
    return col if any(col) else None


def apply_stall(stall_: Sequence[tuple[int, float]], clock: list[float], busy: list[float]) -> None:
    """Advance each stalled compute clock (and its busy time) by its seconds."""
    for j, x in stall_:
        clock[j] += x
        busy[j] += x


__all__ = ["COMPUTE", "apply_stall", "compute_clocks", "share", "stall", "stall_column"]
