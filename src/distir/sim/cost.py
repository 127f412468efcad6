"""Cost models: how long one op takes on given GPUs.

``CostModel`` is the replaceable interface (a fitted or learned model can stand in). The default,
``RooflineCostModel``, costs

- a compute op by roofline from the registry's cost descriptors: ``launch + max(FLOPs / (peak ×
  efficiency), bytes / (memory bandwidth × efficiency))`` with the device's peak for the op's dtype;
  an op that moves no bytes and does no FLOPs (Shape, Reshape, tuples) launches no kernel and
  costs 0. The efficiency of a matrix product (an op with a ``gemm`` descriptor) follows the
  device's GEMM efficiency curve by shape and precision (``distir.hardware.gemm``; a device
  without a ``GemmProfile``, or ``gemm_curve=False``, takes the flat ``flop_efficiency`` of its
  cost class); a fused-attention op (an op with a ``flash`` descriptor) runs at the published
  speed of the trainer's attention kernel on that GPU (``attention_kernel``: ``fa2``,
  FlashAttention-2 as flash-attn and PyTorch's SDPA run it, ``cudnn`` or ``fa-triton``;
  ``distir.hardware.attention.KERNELS``), or its cost class's fraction where the GPU has no profile of
  that kernel (a calibrated class's measured rates come first); every other op takes the
  achievable fraction of peak of its cost class (``OpDef.cost_class``, which every op declares);
  each of these efficiencies is scaled by the device's ``compute_fraction``: the compute rate it
  sustains at its power limit, of the rate its figures were measured at (``PowerProfile``; 1
  without one; not a calibrated class's measured rates, measured at the limit already);
- an op that joins the kernel of the op before it (``distir.sim.fusion``; ``fuse=True``, the
  default) by ``fused_time``: no launch, and no memory traffic for the linked input (nor for the
  producer's write of it when nothing else uses it); with ``inductor`` (torch.compile's kernels)
  no op joins a GEMM, and an op Inductor runs as two kernels (``OpDef.inductor_split``) pays the
  second's launch and reads;
- a communication op by the alpha-beta model of its pattern (``distir.sim.collectives``) over the
  cluster's links, from the op's ``comm_cost`` descriptor;
- an op on a GPU's host (``distir.sim.devices.HOST_STREAM``: an offloaded optimizer's) by
  ``host_time``, the node's ``HostSpec`` roofline on the GPU's share of its CPUs and memory
  bandwidth, and a transfer between a GPU and its host by ``host_copy_time``, over the GPU's
  PCIe link (``host_time``, ``host_copy_time``: a model without them costs such work as the
  GPU's).

Every constant comes from the hardware description. A device calibrated by ``distir calibrate``
carries measured rates per cost class (``DeviceSpec.families``, keyed by the class's name): an
op of a listed class takes that class's launch time and FLOP and memory efficiencies instead of
the model's ``flop_efficiency``, ``memory_efficiency`` and the device's ``launch_overhead_s``; an
op calibrated on its own (listed by its name, ``distir calibrate`` step 4) takes its own rates (a
matrix product still follows the device's GEMM curve for its FLOPs; its class's memory
efficiency and launch time apply). An op of a calibrated class that does no work (a Reshape)
still costs its class's launch time: the measured cost of dispatching it, which eager execution
pays.

A model may also say which GPUs cost compute alike (``gpu_class``: equal classes give equal
``compute_time``); the simulator of DTensor programs uses it to cost an op once per class of
GPUs instead of once per GPU. A model without it is asked about every GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from distir.hardware.attention import attention_efficiency
from distir.hardware.cluster import Cluster
from distir.hardware.gemm import gemm_efficiency
from distir.hardware.specs import DeviceSpec, FamilyRates, HostError, HostSpec
from distir.ir.types import DType, TensorType, TupleType, Type
from distir.ir.values import Attrs
from distir.ops.registry import CommCost, CommPattern, CostClass, OpDef
from distir.sim import collectives as coll
from distir.sim import overlap
from distir.sim.fusion import FusedInput

# the kernels a trainer runs (``RooflineCostModel.of_kernels``)
KERNELS = ("fused", "inductor", "eager")
# how a trainer overlaps tensor-parallel collectives with GEMMs (``RooflineCostModel.tp_overlap_form``)
TP_OVERLAP_FORMS = ("te", "async")
# the host's time for one eager PyTorch op, beyond the launch the device's ``launch_overhead_s``
# charges (``RooflineCostModel.host_s`` under synchronous launches): "Overhead for torch functions
# when run on torch.Tensor objects is on the order of 2 μs" (pytorch/pytorch
# benchmarks/overrides_benchmark/README.md at 17dc58b; its bench.py times torch.add of two
# one-element CPU tensors, the best of 1000 runs of 1000 calls). A lower bound of an op's host
# time in training: no autograd recording, no CUDA launch, no caller's Python
EAGER_HOST_S = 2e-6

# by cost class (``OpDef.cost_class``); a class not listed takes ``default_flop_efficiency``
DEFAULT_FLOP_EFFICIENCY: Mapping[str, float] = {
    CostClass.LINALG: 0.75,
    CostClass.NN: 0.5,
    CostClass.LOSS: 0.5,
    CostClass.ELEMENTWISE: 0.5,
    CostClass.GRAD: 0.5,
    CostClass.OPTIM: 0.5,
    CostClass.REDUCE: 0.5,
}

_COLLECTIVE: Mapping[CommPattern, Callable[[Cluster, float, Sequence[int]], float]] = {
    CommPattern.ALLREDUCE: coll.allreduce_time,
    CommPattern.ALLGATHER: coll.allgather_time,
    CommPattern.REDUCESCATTER: coll.reducescatter_time,
    CommPattern.BROADCAST: coll.broadcast_time,
    CommPattern.REDUCE: coll.reduce_time,
    CommPattern.SCATTER: coll.scatter_time,
    CommPattern.GATHER: coll.gather_time,
    CommPattern.ALLTOALL: coll.alltoall_time,
}
# the collectives a measured bus bandwidth curve may serve (``distir.sim.collectives``): a
# coalesced part of one call runs without it, its bytes added at the link's bandwidth
_MEASURED: Mapping[CommPattern, Callable[..., float]] = {
    CommPattern.ALLREDUCE: coll.allreduce_time,
    CommPattern.ALLGATHER: coll.allgather_time,
    CommPattern.REDUCESCATTER: coll.reducescatter_time,
    CommPattern.BROADCAST: coll.broadcast_time,
    CommPattern.REDUCE: coll.reduce_time,
}


class CostModel(Protocol):
    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float: ...

    def comm_time(self, cost: CommCost, gpus: Sequence[int]) -> float: ...


def fuses(model: CostModel) -> bool:
    """Whether the model costs fused chains (it has ``fused_time`` and its ``fuse`` is on)."""
    return bool(getattr(model, "fuse", False)) and hasattr(model, "fused_time")


def epilogues(model: CostModel) -> bool:
    """Whether the model's fused chains may start at a GEMM (not for ``inductor`` kernels; True
    for a model without the field): ``distir.sim.fusion.fused_inputs``' ``epilogues``."""
    return not getattr(model, "inductor", False)


def host_time(
    model: CostModel, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
) -> float:
    """The model's time for a compute op on ``gpu``'s host (``distir.sim.devices.HOST_STREAM``):
    its ``host_time``, or ``compute_time`` for a model without one."""
    fn = getattr(model, "host_time", None)
    return (
        fn(opdef, ins, outs, attrs, gpu)
        if fn is not None
        else model.compute_time(opdef, ins, outs, attrs, gpu)
    )


def host_copy_time(model: CostModel, nbytes: float, src: int, dst: int) -> float:
    """The model's time to copy ``nbytes`` between GPU ``src`` and its host or back (``dst``, the
    same GPU): its ``host_copy_time``, or a point-to-point ``comm_time`` for a model without one."""
    fn = getattr(model, "host_copy_time", None)
    if fn is not None:
        return float(fn(nbytes, src))
    return model.comm_time(CommCost(CommPattern.P2P, nbytes, ()), (src, dst))


def gpu_class(model: CostModel, gpu: int) -> Hashable:
    """The model's class of ``gpu`` (GPUs of one class have equal compute costs), or the GPU
    itself for a model that does not group GPUs."""
    fn = getattr(model, "gpu_class", None)
    return fn(gpu) if fn is not None else ("gpu", gpu)


def op_dtype(ins: Sequence[Type], outs: Sequence[Type]) -> DType:
    """The dtype that decides an op's peak: its first tensor input's, else its first result's."""
    for t in (*ins, *outs):
        while isinstance(t, TupleType) and t.elements:
            t = t.elements[0]
        if isinstance(t, TensorType):
            return t.dtype
    return DType.f32


def _rates(spec: DeviceSpec, opdef: OpDef) -> FamilyRates | None:
    """The measured rates of ``opdef``: its own (a calibrated device lists an op it measured
    on its own by the op's name), else its cost class's, else None."""
    if not spec.families:
        return None
    return spec.family_rates(opdef.name) or spec.family_rates(opdef.cost_class)


@dataclass(frozen=True)
class RooflineCostModel:
    """The roofline model of the module docstring. ``gemm_curve``: matrix products follow the
    device's GEMM efficiency curve (False: the flat ``flop_efficiency["linalg"]``); ``fuse``:
    elementwise chains fuse as the trainers fuse them (False: every op is a kernel of its own);
    ``inductor``: the kernels are those torch.compile's Inductor generates in its default mode:
    the products extern cuBLAS calls that no chain joins (no GEMM epilogue; ``distir.sim.fusion``)
    and an op with an ``OpDef.inductor_split`` (the normalizations' backward) two kernels, the
    second launched and reading its ``reread`` inputs again; ``attention_kernel``: the
    fused-attention kernel the trainer runs (one of ``distir.hardware.attention.KERNELS``);
    ``tp_comm_overlap``: the trainer pipelines each tensor-parallel AllGather/ReduceScatter with
    the GEMM beside it (Megatron-LM's ``--tp-comm-overlap``; the planner applies it:
    ``distir.sim.overlap``), as ``tp_overlap_form`` says: ``te`` (Transformer Engine's
    userbuffers, as Megatron-LM runs them: pipelines in 4 chunks, its pipelined and bulk kernels
    holding 16 SMs) or ``async`` (PyTorch's async tensor parallelism: one chunk per rank, and
    only the all-gather → matmul and matmul → reduce-scatter pairs Inductor's pass fuses);
    ``comm_interference``: a collective on a communication stream slows the compute beside it
    by the SMs its kernel holds (``interference``; the planner applies it:
    ``distir.sim.interference``); ``eager``: the ops run as eager PyTorch's own kernels, so an op
    whose definition states its eager kernel's measured HBM fraction (``OpDef.eager_memory``:
    the normalization kernels) moves its bytes at that fraction instead of ``memory_efficiency``;
    ``gemm_share``: the fraction of the compute's kernel time spent in GEMMs beside a collective,
    which on a GPU with persistent GEMM kernels run in two waves there (``interference``; None:
    not known, every kernel slows by the SMs NCCL holds); ``ring_form``: the ring attention the
    trainer runs under context parallelism (``distir.parallel.context.RING_FORMS``): ``p2p``
    (Megatron-LM's, Transformer Engine's) or ``torch`` (PyTorch's ``context_parallel``, as
    torchtitan runs it; ``distir.sim.ring``); ``host_s``: the host's time for each kernel it
    launches (a compute op's kernel, a collective call, a send), charged in series with the
    kernel: where every launch is synchronous (``CUDA_LAUNCH_BLOCKING=1``) the host reaches the
    next op only once the kernel has run, so the GPU waits through the host's work between
    kernels (``distir.sim.devices.DeviceMap.blocking`` serialises the streams); 0 (the default)
    where the host runs ahead of the GPU and its time is hidden."""

    cluster: Cluster
    allow_tf32: bool = False
    flop_efficiency: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOP_EFFICIENCY))
    default_flop_efficiency: float = 0.5
    memory_efficiency: float = 0.8
    gemm_curve: bool = True
    fuse: bool = True
    inductor: bool = False
    attention_kernel: str = "fa2"
    tp_comm_overlap: bool = False
    tp_overlap_form: str = "te"
    comm_interference: bool = True
    eager: bool = False
    gemm_share: float | None = None
    ring_form: str = "p2p"
    host_s: float = 0.0

    @classmethod
    def of_kernels(
        cls,
        cluster: Cluster,
        kernels: str = "fused",
        attention_kernel: str = "fa2",
        tp_comm_overlap: bool = False,
        ring_form: str = "p2p",
    ) -> RooflineCostModel:
        """The model of a trainer's ``kernels`` (one of ``KERNELS``): ``fused`` (elementwise
        chains fused as the trainers fuse them, a GEMM's pointwise epilogue too), ``inductor``
        (as ``torch.compile`` runs them by default: the same chains but none joining a GEMM,
        and a normalization's backward in two kernels; ``inductor``) or ``eager`` (every op its
        own eager PyTorch kernel, ``eager``)."""
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        return cls(
            cluster,
            fuse=kernels != "eager",
            inductor=kernels == "inductor",
            eager=kernels == "eager",
            attention_kernel=attention_kernel,
            tp_comm_overlap=tp_comm_overlap,
            ring_form=ring_form,
        )

    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        flops = opdef.flops(ins, outs, attrs)
        nbytes = opdef.bytes_read(ins, outs, attrs) + opdef.bytes_written(ins, outs, attrs)
        spec = self.cluster.device_spec(gpu)
        rates = _rates(spec, opdef)
        if flops <= 0 and nbytes <= 0:
            return 0.0 if rates is None else rates.launch_s
        launch = self.host_s + (spec.launch_overhead_s if rates is None else rates.launch_s)
        split = self._inductor_split(opdef, ins)
        if split:
            nbytes += split
            launch *= 2
        return launch + self._roofline(spec, opdef, ins, outs, attrs, flops, nbytes)

    def _host(self, gpu: int) -> HostSpec:
        node = self.cluster.nodes[self.cluster.node_of(gpu)]
        if node.host is None:
            raise HostError(
                f"node type {node.name!r} describes no host (CPUs, host memory, PCIe links) for an "
                "offloaded optimizer; use a preset with one (ndm-a100-v4) or give the node type a host"
            )
        return node.host

    def host_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        """A compute op on ``gpu``'s host: its FLOPs and bytes (read and written) at the host's
        roofline, on the share of the node's CPUs and memory bandwidth one GPU's process gets
        (``HostSpec.compute_time``: every rank of the node runs its step at once); no kernel
        launch, no fusion (a CPU pass each)."""
        flops = opdef.flops(ins, outs, attrs)
        nbytes = opdef.bytes_read(ins, outs, attrs) + opdef.bytes_written(ins, outs, attrs)
        if flops <= 0 and nbytes <= 0:
            return 0.0
        share = self.cluster.nodes[self.cluster.node_of(gpu)].devices_per_node
        return self._host(gpu).compute_time(flops, nbytes, share)

    def host_copy_time(self, nbytes: float, gpu: int) -> float:
        """``nbytes`` copied between ``gpu`` and its host, either way, over its PCIe link."""
        return self._host(gpu).copy_time(nbytes)

    def _inductor_split(self, opdef: OpDef, ins: Sequence[Type]) -> int:
        """The bytes Inductor's second kernel for ``opdef`` reads again (``OpDef.inductor_split``),
        under ``inductor`` kernels; 0 where it runs one kernel."""
        split = opdef.inductor_split
        if not self.inductor or split is None:
            return 0
        return sum(ins[i].nbytes for i in split.reread if i < len(ins))

    def fused_time(
        self,
        opdef: OpDef,
        ins: Sequence[Type],
        outs: Sequence[Type],
        attrs: Attrs,
        gpu: int,
        link: FusedInput,
    ) -> float:
        """``compute_time`` of an op inside the kernel of the op before it: no launch; input
        ``link.arg`` comes from registers, and when it has no other use the producer's write
        of it is saved too (this op's write takes its place). The second kernel of an op
        Inductor splits (``inductor``) is launched and reads its inputs from memory."""
        flops = opdef.flops(ins, outs, attrs)
        nbytes = opdef.bytes_read(ins, outs, attrs) + opdef.bytes_written(ins, outs, attrs)
        if flops <= 0 and nbytes <= 0:
            return 0.0
        linked = ins[link.arg].nbytes if link.arg < len(ins) else 0
        nbytes = max(0.0, nbytes - linked * (2 if link.sole else 1))
        spec = self.cluster.device_spec(gpu)
        split = self._inductor_split(opdef, ins)
        if not split:
            return self._roofline(spec, opdef, ins, outs, attrs, flops, nbytes)
        # Inductor's second kernel is one of its own: launched, reading its inputs from memory
        rates = _rates(spec, opdef)
        launch = self.host_s + (spec.launch_overhead_s if rates is None else rates.launch_s)
        return launch + self._roofline(spec, opdef, ins, outs, attrs, flops, nbytes + split)

    def _roofline(
        self,
        spec: DeviceSpec,
        opdef: OpDef,
        ins: Sequence[Type],
        outs: Sequence[Type],
        attrs: Attrs,
        flops: float,
        nbytes: float,
    ) -> float:
        dtype = op_dtype(ins, outs)
        rates = _rates(spec, opdef)
        # the GPU's compute rate at its power limit, of its published figures' (measured rates
        # were measured at it already)
        clock = spec.compute_fraction
        gemm = spec.gemm_profile(dtype)  # float8 products: the GPU's FP8 profile
        if opdef.gemm is not None and self.gemm_curve and gemm is not None:
            tensor_core = dtype in (DType.f16, DType.bf16) or dtype.is_float8
            fp32 = not (tensor_core or (dtype is DType.f32 and self.allow_tf32))
            eff = clock * gemm_efficiency(gemm, opdef.gemm(ins, outs, attrs), fp32=fp32)
        elif rates is not None:
            eff = rates.flop
        elif opdef.flash is not None and (
            profile := spec.attention_profile(
                self.attention_kernel, (shape := opdef.flash(ins, outs, attrs)).head_dim
            )
        ):
            eff = clock * attention_efficiency(profile, shape)
        else:
            eff = clock * self.flop_efficiency.get(opdef.cost_class, self.default_flop_efficiency)
        mem_eff = self.memory_efficiency if rates is None else rates.memory
        if rates is None and self.eager and opdef.eager_memory is not None:
            mem_eff = opdef.eager_memory.memory
        t_flops = flops / (spec.peak_flops(dtype, self.allow_tf32) * eff) if flops > 0 else 0.0
        t_mem = nbytes / (spec.memory_bandwidth * mem_eff)
        return max(t_flops, t_mem)

    def gpu_class(self, gpu: int) -> Hashable:
        """GPUs of one device kind (``Cluster.kind_of``) compute alike."""
        return self.cluster.kind_of(gpu)

    def tp_overlap(self) -> overlap.Form:
        """The tensor-parallel overlap charged (``tp_overlap_form``, ``distir.sim.overlap``): TE's
        on GPU 0's SMs (its GEMM profile's; no SMs taken without a profile or with
        ``comm_interference`` off), or PyTorch's async tensor parallelism (``ASYNC_TP``)."""
        if self.tp_overlap_form not in TP_OVERLAP_FORMS:
            raise ValueError(
                f"tp_overlap_form must be one of {TP_OVERLAP_FORMS}, got {self.tp_overlap_form!r}"
            )
        if self.tp_overlap_form == "async":
            return overlap.ASYNC_TP
        g = self.cluster.device_spec(0).gemm
        te = overlap.te_form(g.sms if g is not None else 1)
        return te if g is not None and self.comm_interference else te._replace(share=0.0)

    def interference(self, gpu: int) -> float:
        """The fraction of ``gpu``'s compute a communication kernel running beside it takes: its
        GEMM profile's ``overlap_share`` at ``gemm_share`` (``comm_share`` unless its GEMM
        kernels are persistent and ``gemm_share`` is given; 0 without a profile, or with
        ``comm_interference`` off)."""
        g = self.cluster.device_spec(gpu).gemm
        return g.overlap_share(self.gemm_share) if g is not None and self.comm_interference else 0.0

    def comm_time(self, cost: CommCost, gpus: Sequence[int]) -> float:
        """The call's time by its pattern's model, plus ``host_s`` for its kernel: none for a
        hand-over between two streams of one GPU (no kernel), and a coalesced part pays none
        (``charged``: the call's first part launched it)."""
        t = self._comm_time(cost, gpus)
        local = cost.pattern is CommPattern.P2P and gpus[0] == gpus[-1]
        return t if local else t + self.host_s

    def _comm_time(self, cost: CommCost, gpus: Sequence[int]) -> float:
        if cost.pattern is CommPattern.P2P:
            return coll.send_time(self.cluster, cost.nbytes, gpus[0], gpus[-1])
        if cost.pattern in (CommPattern.SCATTER, CommPattern.GATHER) and cost.root is not None:
            root = gpus[list(cost.devices).index(cost.root)]
            fn = coll.scatter_time if cost.pattern is CommPattern.SCATTER else coll.gather_time
            return fn(self.cluster, cost.nbytes, gpus, root)
        if cost.coalesced and cost.pattern in _MEASURED:
            return _MEASURED[cost.pattern](self.cluster, cost.nbytes, gpus, measured=False)
        return _COLLECTIVE[cost.pattern](self.cluster, cost.nbytes, gpus)


def charged(model: CostModel, cost: CommCost, gpus: Sequence[int]) -> float:
    """``model``'s time for communication ``cost``; a ``coalesced`` part of one collective call
    costs its collective less the same collective of an empty message: its bytes, not the call's
    latency, which the call's first part pays (``distir.ops.dist``), and at the link's bus
    bandwidth, not a measured curve's at the part's own size (``CostModel.comm_time``)."""
    t = float(model.comm_time(cost, gpus))
    if cost.coalesced:
        t -= float(model.comm_time(replace(cost, nbytes=0.0, coalesced=False), gpus))
    return t


@dataclass(frozen=True)
class FixedCostModel:
    """Fixed costs, for reasoning about schedules by hand and for tests: an op that does any work
    (FLOPs or bytes written) costs ``compute`` seconds (``by_op`` overrides per op name); every
    communication costs ``comm`` seconds, except between streams of one GPU when ``free_local``;
    a collective on a communication stream slows the compute beside it by ``slowdown``
    (``distir.sim.interference``; 0: not at all)."""

    compute: float = 1.0
    comm: float = 0.5
    by_op: Mapping[str, float] = field(default_factory=dict)
    free_local: bool = False
    slowdown: float = 0.0

    def interference(self, gpu: int) -> float:
        return self.slowdown

    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        if opdef.flops(ins, outs, attrs) == 0 and opdef.bytes_written(ins, outs, attrs) == 0:
            return 0.0
        return self.by_op.get(opdef.name, self.compute)

    def gpu_class(self, gpu: int) -> Hashable:
        """Every GPU computes alike."""
        return 0

    def comm_time(self, cost: CommCost, gpus: Sequence[int]) -> float:
        if self.free_local and len(set(gpus)) == 1:
            return 0.0
        return self.comm
