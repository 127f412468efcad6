"""What one accelerator, one link and one node type can do: the constants of the cost model.

All figures are in SI units: FLOP/s, bytes/s, bytes and seconds. Peaks are *dense* (no 2:4
sparsity). A bandwidth is per direction; "infinite" bandwidth (``math.inf``) is allowed only for
the degenerate link of a device to itself.

Invariants (checked on construction, so an ill-formed spec cannot exist):
- a ``DeviceSpec`` has a non-empty name, positive finite FLOP/s for every precision, a positive
  finite memory bandwidth, a positive integer memory size and a non-negative launch overhead;
- a ``LinkSpec`` has a positive bandwidth (possibly ``inf``) and a finite non-negative latency;
- a ``NodeSpec`` has a non-empty name, a ``DeviceSpec``, at least one device and two links;
- a ``GemmProfile`` has a positive SM count, fractions in (0, 1] and a positive anchor shape;
- a ``RuntimeMemory`` has non-negative byte counts and a fragmentation fraction in [0, 1);
- a ``FamilyRates`` has efficiencies in (0, 1] and a finite non-negative launch time; a
  device's ``families`` and a node's ``collectives`` name each family / collective once;
- a ``NodeSpec``'s ``network_efficiency`` is in (0, 1]; its ``busbw_curves`` name each
  (collective, ranks) once, each collective one of ``CURVE_COLLECTIVES``;
- a ``BusBandwidthCurve`` has two or more (size, bandwidth) points, sizes increasing, all
  positive;
- a ``PowerProfile`` has at least two (power, rate) points, powers increasing, all positive, and
  its two limits within the measured powers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from distir.ir.types import DType


class HardwareError(ValueError):
    """Base of the hardware layer's errors (bad specs, bad cluster descriptions)."""


class HostError(HardwareError):
    """Work on a GPU's host (an offloaded optimizer) on a node type that describes no host."""


class SpecError(HardwareError):
    """A hardware spec was constructed with an invalid field (names the spec and the field)."""


Matrix = tuple[tuple[float, ...], ...]


class ClusterError(HardwareError):
    """A cluster description is wrong. Names where (``source``: a file or the spec string, with
    ``line``/``col`` when known), which key (``key``, e.g. ``nodes[1].count``) and the problem."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        key: str | None = None,
        line: int | None = None,
        col: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.key = key
        self.line = line
        self.col = col

    def __str__(self) -> str:
        parts = []
        if self.source is not None:
            loc = self.source
            if self.line is not None:
                loc += f":{self.line}:{self.col if self.col is not None else 1}"
            parts.append(loc)
        if self.key:
            parts.append(self.key)
        parts.append(self.message)
        return ": ".join(parts)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _positive(owner: str, field: str, x: object, *, allow_inf: bool = False) -> None:
    if not _is_number(x):
        raise SpecError(f"{owner}: {field} must be a number, got {x!r}")
    assert isinstance(x, int | float)
    if math.isnan(x) or x <= 0 or (math.isinf(x) and not allow_inf):
        what = "a positive number" if allow_inf else "a positive finite number"
        raise SpecError(f"{owner}: {field} must be {what}, got {x!r}")


def _non_negative(owner: str, field: str, x: object) -> None:
    if not _is_number(x):
        raise SpecError(f"{owner}: {field} must be a number, got {x!r}")
    assert isinstance(x, int | float)
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{owner}: {field} must be a finite non-negative number, got {x!r}")


def _name(owner: str, x: object) -> None:
    if not isinstance(x, str) or not x.strip():
        raise SpecError(f"{owner}: name must be a non-empty string, got {x!r}")


@dataclass(frozen=True, slots=True)
class GemmProfile:
    """How fast one GPU kind runs matrix products, for ``distir.hardware.gemm``.

    ``sms``: streaming multiprocessors (the size of a wave of tiles). ``fraction``: the fraction
    of the dense tensor-core peak (fp16/bf16/tf32) a published GEMM benchmark reached at the
    shape ``anchor`` (M, N, K); ``fp32_fraction`` the same for fp32 on the CUDA cores (None:
    ``fraction``). ``source`` names the benchmark. The efficiency curve passes through the
    anchor point (see ``distir.hardware.gemm``).

    ``comm_sms``: the SMs a communication kernel (NCCL's: one CTA per channel, each holding an SM
    to itself) occupies while it runs beside the compute, taken from the compute for that time
    (``comm_share``; 0: communication takes nothing from the compute, as a calibrated or CPU
    profile has it); ``comm_source`` names where the channel count comes from.

    ``anchor_is_max``: the anchor is the best point of a sweep over shapes (a "maximum achievable
    matmul FLOPS" benchmark), so no shape runs faster than ``fraction``: the curve is capped
    there (False: the curve may rise above the anchor towards its ceiling).

    ``persistent``: the GPU's library GEMM kernels are persistent — they launch one CTA per SM
    (at most), each working through a fixed list of output tiles — so beside a communication
    kernel holding ``comm_sms`` SMs the CTAs that find no free SM run as a second wave, after
    the first, instead of the GEMM slowing by ``comm_share`` (``distir.sim.interference``);
    ``persistent_source`` names where that comes from."""

    sms: int
    fraction: float
    anchor: tuple[int, int, int]
    source: str
    fp32_fraction: float | None = None
    comm_sms: int = 0
    comm_source: str = ""
    anchor_is_max: bool = False
    persistent: bool = False
    persistent_source: str = ""

    def __post_init__(self) -> None:
        owner = "gemm profile"
        if not isinstance(self.sms, int) or isinstance(self.sms, bool) or self.sms < 1:
            raise SpecError(f"{owner}: sms must be a positive int, got {self.sms!r}")
        for f in ("fraction", "fp32_fraction"):
            x = getattr(self, f)
            if x is None and f == "fp32_fraction":
                continue
            _positive(owner, f, x)
            if x > 1:
                raise SpecError(f"{owner}: {f} must be at most 1 (a fraction of the peak), got {x!r}")
        a = self.anchor
        if not (isinstance(a, tuple) and len(a) == 3 and all(isinstance(x, int) and x >= 1 for x in a)):
            raise SpecError(f"{owner}: anchor must be three positive ints (M, N, K), got {a!r}")
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")
        c = self.comm_sms
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < self.sms:
            raise SpecError(f"{owner}: comm_sms must be an int in [0, sms={self.sms}), got {c!r}")
        if not isinstance(self.comm_source, str):
            raise SpecError(f"{owner}: comm_source must be a string, got {self.comm_source!r}")
        if not isinstance(self.anchor_is_max, bool):
            raise SpecError(f"{owner}: anchor_is_max must be a bool, got {self.anchor_is_max!r}")
        if not isinstance(self.persistent, bool):
            raise SpecError(f"{owner}: persistent must be a bool, got {self.persistent!r}")
        if not isinstance(self.persistent_source, str):
            raise SpecError(f"{owner}: persistent_source must be a string, got {self.persistent_source!r}")

    @property
    def comm_share(self) -> float:
        """The fraction of the SMs a resident communication kernel holds: a compute kernel beside
        it runs at ``1 - comm_share`` of its speed (``distir.sim.interference``)."""
        return self.comm_sms / self.sms

    @property
    def gemm_waves(self) -> int:
        """The waves a persistent GEMM of one CTA per SM runs in beside a communication kernel
        holding ``comm_sms`` SMs: ⌈sms / (sms − comm_sms)⌉ (1 without persistent kernels, or
        with no SMs held)."""
        if not self.persistent:
            return 1
        return -(-self.sms // (self.sms - self.comm_sms))

    def overlap_share(self, gemm_share: float | None = None) -> float:
        """The share of the compute a resident communication kernel takes: ``comm_share``;
        with persistent GEMM kernels and ``gemm_share`` (the fraction of the compute's kernel
        time in GEMMs) known, ``1 - 1 / (w·gemm_share + (1 - gemm_share) / (1 - comm_share))``,
        ``w = gemm_waves``: the GEMMs take ``w`` times as long, the rest ``1 / (1 -
        comm_share)`` (``distir.sim.interference``)."""
        s = self.comm_share
        if not self.persistent or gemm_share is None or s == 0.0:
            return s
        if not 0.0 <= gemm_share <= 1.0:
            raise SpecError(f"the GEMMs' share of the compute must be in [0, 1], got {gemm_share!r}")
        return 1.0 - 1.0 / (self.gemm_waves * gemm_share + (1.0 - gemm_share) / (1.0 - s))


SeqPoints = tuple[tuple[int, float], ...]
"""Published (sequence length, TFLOP/s) points of one attention pass, sorted by length."""


def _seq_points(owner: str, field: str, pts: object) -> None:
    ok = isinstance(pts, tuple) and len(pts) >= 1
    for e in pts if isinstance(pts, tuple) else ():
        ok = ok and isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], int) and e[0] >= 1
        ok = ok and _is_number(e[1]) and e[1] > 0
    if not ok:
        raise SpecError(f"{owner}: {field} must be (sequence length, TFLOP/s) pairs, got {pts!r}")
    assert isinstance(pts, tuple)
    if [e[0] for e in pts] != sorted({e[0] for e in pts}):
        raise SpecError(f"{owner}: {field} must be sorted by sequence length, each length once")


@dataclass(frozen=True, slots=True)
class AttentionProfile:
    """How fast one fused-attention kernel (``kernel``: ``fa2``, ``cudnn``, ...) runs on one GPU
    kind, for ``distir.hardware.attention``: its published TFLOP/s by sequence length for the
    forward and backward pass, causal and not (``backward_causal`` None: derived), at head
    dimension ``head_dim`` (a GPU may hold one profile per published head dimension), on a GPU
    of dense 16-bit peak ``peak_tflops`` (the benchmark's GPU; the cost model applies the same
    fraction of peak to the device it costs). ``source`` names the benchmark."""

    kernel: str
    peak_tflops: float
    head_dim: int
    forward: SeqPoints
    forward_causal: SeqPoints
    backward: SeqPoints
    source: str
    backward_causal: SeqPoints | None = None

    def __post_init__(self) -> None:
        owner = f"attention profile {self.kernel!r}"
        _name(owner, self.kernel)
        _positive(owner, "peak_tflops", self.peak_tflops)
        if not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise SpecError(f"{owner}: head_dim must be a positive int, got {self.head_dim!r}")
        for f in ("forward", "forward_causal", "backward", "backward_causal"):
            x = getattr(self, f)
            if x is not None or f != "backward_causal":
                _seq_points(owner, f, x)
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")


@dataclass(frozen=True, slots=True)
class RuntimeMemory:
    """Device memory a training process holds besides its tensors (all default 0: none).

    ``context_bytes``: the CUDA context (kernels, driver state); ``workspace_bytes``: library
    workspaces (cuBLAS/cuBLASLt/cuDNN); ``comm_bytes``: communication buffers (NCCL);
    ``fragmentation``: what the caching allocator reserves beyond the live tensors, as a
    fraction of their peak. ``source`` says where the figures come from."""

    context_bytes: int = 0
    workspace_bytes: int = 0
    comm_bytes: int = 0
    fragmentation: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        owner = "runtime memory"
        for f in ("context_bytes", "workspace_bytes", "comm_bytes"):
            x = getattr(self, f)
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise SpecError(f"{owner}: {f} must be a non-negative int (bytes), got {x!r}")
        _non_negative(owner, "fragmentation", self.fragmentation)
        if self.fragmentation >= 1:
            raise SpecError(
                f"{owner}: fragmentation must be below 1 (a fraction), got {self.fragmentation!r}"
            )
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")

    @property
    def fixed_bytes(self) -> int:
        """Context, workspaces and communication buffers together."""
        return self.context_bytes + self.workspace_bytes + self.comm_bytes

    def overhead(self, peak_tensor_bytes: float) -> float:
        """Bytes held besides tensors when the live tensors peak at ``peak_tensor_bytes``."""
        return self.fixed_bytes + self.fragmentation * peak_tensor_bytes

    def tensor_capacity(self, capacity: float) -> float:
        """The largest tensor peak that fits in ``capacity`` bytes with this overhead."""
        return max(0.0, capacity - self.fixed_bytes) / (1 + self.fragmentation)


@dataclass(frozen=True, slots=True)
class FamilyRates:
    """How fast the ops of one cost class (``OpDef.cost_class``; the table calls it a family) ran
    on one device, as measured by ``distir
    calibrate``: an op of the family takes ``launch_s + max(FLOPs / (peak × flop),
    bytes / (memory_bandwidth × memory))`` (the roofline of ``distir.sim.cost`` with the
    family's own efficiencies and fixed cost). ``flop``: the fraction of the device's dense peak
    for the op's dtype; ``memory``: the fraction of ``memory_bandwidth``; ``launch_s``: the
    per-op fixed cost, replacing the device's ``launch_overhead_s`` for this family."""

    flop: float
    memory: float
    launch_s: float

    def __post_init__(self) -> None:
        owner = "family rates"
        for f in ("flop", "memory"):
            x = getattr(self, f)
            _positive(owner, f, x)
            if x > 1:
                raise SpecError(f"{owner}: {f} must be at most 1 (a fraction), got {x!r}")
        _non_negative(owner, "launch_s", self.launch_s)


PowerPoints = tuple[tuple[float, float], ...]
"""Published (power limit in W, sustained compute rate) points of one GPU kind, sorted by power."""


@dataclass(frozen=True, slots=True)
class PowerProfile:
    """How a GPU's compute rate follows its power limit (``DeviceSpec.compute_fraction``).

    ``curve``: a published measurement's (power limit in W, sustained rate) points on this kind
    of GPU, sorted by power, the rate in any one unit (an SM clock in MHz, a throughput).
    ``limit_w``: the limit this GPU runs at; ``reference_w``: the limit at which the device's
    GEMM and attention figures were measured. The GPU computes at ``rate(limit_w) /
    rate(reference_w)`` of those figures, ``rate`` linear between the points; both limits lie
    within the measured powers (no extrapolation). ``source`` names the measurement."""

    limit_w: float
    reference_w: float
    curve: PowerPoints
    source: str

    def __post_init__(self) -> None:
        owner = "power profile"
        pts = self.curve
        ok = isinstance(pts, tuple) and len(pts) >= 2
        for e in pts if isinstance(pts, tuple) else ():
            ok = ok and isinstance(e, tuple) and len(e) == 2 and all(_is_number(x) for x in e)
            ok = ok and all(math.isfinite(x) and x > 0 for x in e)
        if not ok:
            raise SpecError(
                f"{owner}: curve must be two or more (W, rate) pairs of positive numbers, got {pts!r}"
            )
        watts = [w for w, _ in pts]
        if any(b <= a for a, b in itertools.pairwise(watts)):
            raise SpecError(f"{owner}: curve must be sorted by power, each power once, got {watts}")
        for f in ("limit_w", "reference_w"):
            x = getattr(self, f)
            _positive(owner, f, x)
            if not watts[0] <= x <= watts[-1]:
                raise SpecError(
                    f"{owner}: {f} must lie within the measured powers "
                    f"[{watts[0]:g}, {watts[-1]:g}] W, got {x!r}"
                )
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")

    def rate(self, watts: float) -> float:
        """The sustained rate at power limit ``watts``: linear between the measured points."""
        for (w0, r0), (w1, r1) in itertools.pairwise(self.curve):
            if w0 <= watts <= w1:
                return r0 + (watts - w0) / (w1 - w0) * (r1 - r0)
        raise ValueError(f"{watts} W lies outside the measured powers")

    @property
    def compute_fraction(self) -> float:
        """The rate at ``limit_w`` over the rate at ``reference_w``."""
        return self.rate(self.limit_w) / self.rate(self.reference_w)


def _named_once(owner: str, field: str, entries: object, kind: type) -> None:
    """``entries`` is a tuple of (name, ``kind``) pairs, each name once."""
    if not isinstance(entries, tuple):
        raise SpecError(f"{owner}: {field} must be a tuple of (name, {kind.__name__}) pairs")
    seen: set[str] = set()
    for e in entries:
        if not (isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], kind)):
            raise SpecError(f"{owner}: {field} entries must be (name, {kind.__name__}) pairs, got {e!r}")
        if e[0] in seen:
            raise SpecError(f"{owner}: {field} names {e[0]!r} twice")
        seen.add(e[0])


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator (or a CPU standing in for one).

    ``fp32``/``tf32``/``fp16``/``bf16``/``fp64`` are dense peak FLOP/s; a precision the device
    has no fast path for carries the figure of the path it falls back to (e.g. ``tf32 = fp32`` on
    a V100). ``fp64 = None`` means "half of ``fp32``". ``memory_bandwidth`` is the device memory
    (HBM/GDDR/DRAM) bandwidth in B/s, ``memory_bytes`` its capacity in bytes and
    ``launch_overhead_s`` the fixed cost of starting one kernel. ``name`` identifies the spec: two
    different specs in one cluster must not share a name (it is the simulator's cache key).
    ``gemm`` describes its matrix-product throughput by shape (None: the cost model's flat
    fraction of peak) and ``runtime`` the memory a process holds besides its tensors.
    ``families``: measured rates per op cost class (``OpDef.cost_class``; ``distir calibrate``),
    as (class name, rates) pairs; an op of a class listed there is costed with its rates instead
    of the cost model's defaults.
    ``attention``: published speeds of fused-attention kernels on this GPU, one per kernel.
    ``power``: how its compute rate follows its power limit, when it runs at another limit than
    its GEMM and attention figures were measured at (None: at the same one).
    ``fp8``: dense peak FLOP/s of its FP8 tensor cores (float8 operands, E4M3 or E5M2; None: the
    GPU has none, and a program multiplying float8 tensors cannot run on it); ``gemm_fp8``: how
    fast float8 products run by shape (None: ``gemm``'s curve, at ``gemm``'s fraction).
    """

    name: str
    fp32: float
    tf32: float
    fp16: float
    bf16: float
    memory_bandwidth: float
    memory_bytes: int
    launch_overhead_s: float
    fp64: float | None = None
    gemm: GemmProfile | None = None
    runtime: RuntimeMemory = RuntimeMemory()
    families: tuple[tuple[str, FamilyRates], ...] = ()
    attention: tuple[AttentionProfile, ...] = ()
    power: PowerProfile | None = None
    fp8: float | None = None
    gemm_fp8: GemmProfile | None = None

    def __post_init__(self) -> None:
        _name("device spec", self.name)
        owner = f"device spec {self.name!r}"
        for f in ("fp32", "tf32", "fp16", "bf16", "memory_bandwidth"):
            _positive(owner, f, getattr(self, f))
        if self.fp64 is not None:
            _positive(owner, "fp64", self.fp64)
        if self.fp8 is not None:
            _positive(owner, "fp8", self.fp8)
        if self.gemm_fp8 is not None and (self.fp8 is None or not isinstance(self.gemm_fp8, GemmProfile)):
            raise SpecError(
                f"{owner}: gemm_fp8 must be a GemmProfile beside an fp8 peak, got {self.gemm_fp8!r}"
            )
        if not isinstance(self.memory_bytes, int) or isinstance(self.memory_bytes, bool):
            raise SpecError(f"{owner}: memory_bytes must be an int, got {self.memory_bytes!r}")
        _positive(owner, "memory_bytes", self.memory_bytes)
        _non_negative(owner, "launch_overhead_s", self.launch_overhead_s)
        if self.gemm is not None and not isinstance(self.gemm, GemmProfile):
            raise SpecError(f"{owner}: gemm must be a GemmProfile or None, got {self.gemm!r}")
        if not isinstance(self.runtime, RuntimeMemory):
            raise SpecError(f"{owner}: runtime must be a RuntimeMemory, got {self.runtime!r}")
        _named_once(owner, "families", self.families, FamilyRates)
        kernels = [a.kernel for a in self.attention if isinstance(a, AttentionProfile)]
        if not isinstance(self.attention, tuple) or len(kernels) != len(self.attention):
            raise SpecError(f"{owner}: attention must be a tuple of AttentionProfile")
        keys = [(a.kernel, a.head_dim) for a in self.attention]
        if len(set(keys)) != len(keys):
            raise SpecError(f"{owner}: attention names a kernel at one head dimension twice: {keys}")
        if self.power is not None and not isinstance(self.power, PowerProfile):
            raise SpecError(f"{owner}: power must be a PowerProfile or None, got {self.power!r}")

    @property
    def compute_fraction(self) -> float:
        """The fraction of its GEMM and attention figures' compute rate this GPU sustains at its
        power limit (``power``; 1 without one)."""
        return 1.0 if self.power is None else self.power.compute_fraction

    def attention_profile(self, kernel: str, head_dim: int | None = None) -> AttentionProfile | None:
        """The published profile of attention kernel ``kernel`` on this GPU (None: none): of its
        profiles (one per published head dimension), the one nearest ``head_dim``, the larger
        head dimension on a tie (None: the first listed)."""
        found = [a for a in self.attention if a.kernel == kernel]
        if not found or head_dim is None:
            return found[0] if found else None
        return min(found, key=lambda a: (abs(a.head_dim - head_dim), -a.head_dim))

    def family_rates(self, family: str) -> FamilyRates | None:
        """The measured rates of the ops of cost class ``family`` (None: not calibrated)."""
        for name, rates in self.families:
            if name == family:
                return rates
        return None

    def gemm_profile(self, dtype: DType) -> GemmProfile | None:
        """The GEMM profile of products in ``dtype``: ``gemm_fp8`` for float8 (``gemm`` without
        one), else ``gemm``."""
        if dtype.is_float8 and self.gemm_fp8 is not None:
            return self.gemm_fp8
        return self.gemm

    @property
    def tensor_capacity(self) -> float:
        """Bytes of device memory left for tensors once ``runtime`` memory is held."""
        return self.runtime.tensor_capacity(self.memory_bytes)

    def peak_flops(self, dtype: DType, allow_tf32: bool = False) -> float:
        """Dense peak FLOP/s for arithmetic in ``dtype``.

        f32 uses ``tf32`` when ``allow_tf32`` (tensor-core matmuls with TF32 inputs), else
        ``fp32``; f16 → ``fp16``; bf16 → ``bf16``; f64 → ``fp64`` (``fp32 / 2`` if unknown);
        integer and bool arithmetic → ``fp32`` (the regular ALUs); float8 → ``fp8`` (a
        ``SpecError`` when the device has no FP8 tensor cores).
        """
        if dtype.is_float8:
            if self.fp8 is None:
                raise SpecError(f"device {self.name}: no FP8 tensor cores (its spec has no fp8 peak)")
            return self.fp8
        if dtype is DType.f32:
            return self.tf32 if allow_tf32 else self.fp32
        if dtype is DType.f16:
            return self.fp16
        if dtype is DType.bf16:
            return self.bf16
        if dtype is DType.f64:
            return self.fp64 if self.fp64 is not None else self.fp32 / 2
        return self.fp32


CURVE_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
"""The collectives whose time inside a node reads a measured bus bandwidth curve
(``NodeSpec.busbw_curves``; ``distir.sim.collectives``): scatter, gather and all-to-all read none."""

SizePoints = tuple[tuple[int, float], ...]
"""Measured (message size in bytes, bus bandwidth in B/s) points of one collective, sorted by size."""


@dataclass(frozen=True, slots=True)
class BusBandwidthCurve:
    """A collective's measured bus bandwidth by message size on ``ranks`` GPUs of one node
    (nccl-tests' busbw column against its size column: the size is the collective's ``nbytes``
    as ``distir.sim.collectives`` defines it), for the sizes below which NCCL does not reach its
    peak (protocol, channel and latency effects together: each point is a measured time; how
    other group sizes use it: ``distir.sim.collectives``).

    ``points``: (bytes, B/s) pairs, sizes increasing. Each point is a measured time, size over
    bus bandwidth, and ``bandwidth(M)`` interpolates that time linearly in the size between two
    points (the alpha-beta form inside each segment), so the time never falls between two
    points unless the sweep itself measured the larger size faster (NCCL switching protocol or
    algorithm there). Above the largest it stays the largest's bandwidth (the collective's link
    caps it, so the time keeps growing with the size past the sweep's end); below the smallest
    the time stays the smallest message's (the bandwidth falls in proportion to the size).
    ``source`` names the run."""

    points: SizePoints
    ranks: int
    source: str

    def __post_init__(self) -> None:
        owner = "bus bandwidth curve"
        r = self.ranks
        if not isinstance(r, int) or isinstance(r, bool) or r < 2:
            raise SpecError(f"{owner}: ranks must be an int of at least 2 (the GPUs measured), got {r!r}")
        pts = self.points
        ok = isinstance(pts, tuple) and len(pts) >= 2
        for e in pts if isinstance(pts, tuple) else ():
            ok = ok and isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], int)
            ok = ok and not isinstance(e[0], bool) and e[0] >= 1 and _is_number(e[1])
            ok = ok and math.isfinite(e[1]) and e[1] > 0
        if not ok:
            raise SpecError(
                f"{owner}: points must be two or more (bytes, B/s) pairs of positive numbers, got {pts!r}"
            )
        sizes = [e[0] for e in pts]
        if any(b <= a for a, b in itertools.pairwise(sizes)):
            raise SpecError(f"{owner}: points must be sorted by size, each size once, got {sizes}")
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")

    def bandwidth(self, nbytes: float) -> float:
        """The bus bandwidth (B/s) of a message of ``nbytes`` (> 0) bytes."""
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1] * nbytes / pts[0][0]
        for (s0, b0), (s1, b1) in itertools.pairwise(pts):
            if nbytes <= s1:
                w = (nbytes - s0) / (s1 - s0)
                return nbytes / (s0 / b0 + w * (s1 / b1 - s0 / b0))
        return pts[-1][1]


def _curves_once(owner: str, curves: object, devices: int) -> None:
    """``curves`` is a tuple of (name, ``BusBandwidthCurve``) pairs, each name one of
    ``CURVE_COLLECTIVES``, each (name, ranks) once, each measured on at most the node's
    ``devices`` GPUs (a curve serves groups inside one node)."""
    if not isinstance(curves, tuple):
        raise SpecError(f"{owner}: busbw_curves must be a tuple of (name, BusBandwidthCurve) pairs")
    seen: set[tuple[str, int]] = set()
    for e in curves:
        pair = isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str)
        if not (pair and isinstance(e[1], BusBandwidthCurve)):
            raise SpecError(
                f"{owner}: busbw_curves entries must be (name, BusBandwidthCurve) pairs, got {e!r}"
            )
        name, curve = e
        if name not in CURVE_COLLECTIVES:
            raise SpecError(
                f"{owner}: busbw_curves names {name!r}, which reads no curve "
                f"(curves: {', '.join(CURVE_COLLECTIVES)})"
            )
        if curve.ranks > devices:
            raise SpecError(
                f"{owner}: its {name} curve was measured on {curve.ranks} GPUs, more than its {devices}"
            )
        if (name, curve.ranks) in seen:
            raise SpecError(f"{owner}: busbw_curves has two {name} curves on {curve.ranks} GPUs")
        seen.add((name, curve.ranks))


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A point-to-point link: ``bandwidth`` in B/s per direction, ``latency_s`` per message.

    Sending M bytes takes ``latency_s + M / bandwidth`` (the alpha-beta model).
    """

    bandwidth: float
    latency_s: float

    def __post_init__(self) -> None:
        _positive("link", "bandwidth", self.bandwidth, allow_inf=True)
        _non_negative("link", "latency_s", self.latency_s)

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link: latency plus bytes over bandwidth."""
        return self.latency_s + nbytes / self.bandwidth

    def slower(self, other: LinkSpec) -> LinkSpec:
        """The component-wise worse of two links: the lower bandwidth and the higher latency."""
        return LinkSpec(min(self.bandwidth, other.bandwidth), max(self.latency_s, other.latency_s))


@dataclass(frozen=True, slots=True)
class HostSpec:
    """A node's host: its CPUs, their memory and each GPU's link to it (ZeRO-Offload's side).

    ``flops``: the CPUs' fp32 peak together (cores × clock × FLOPs a cycle); ``memory_bandwidth``
    their memory's peak (channels × rate), of which a memory-bound pass reaches
    ``memory_efficiency``; ``memory`` the host memory in bytes. ``pcie``: one GPU's link to the
    host, per direction (its line rate), of which a copy reaches ``pcie_efficiency``. The node's
    GPUs share the CPUs and their memory: each rank's host work runs at ``1/devices_per_node``
    of them (every rank takes its optimizer step at once). ``source`` says where each figure
    comes from."""

    name: str
    cores: int
    flops: float
    memory_bandwidth: float
    memory: float
    pcie: LinkSpec
    memory_efficiency: float = 0.8
    pcie_efficiency: float = 0.8
    source: str = ""

    def __post_init__(self) -> None:
        _name("host spec", self.name)
        owner = f"host spec {self.name!r}"
        if not isinstance(self.cores, int) or isinstance(self.cores, bool) or self.cores < 1:
            raise SpecError(f"{owner}: cores must be a positive int, got {self.cores!r}")
        for f in ("flops", "memory_bandwidth", "memory", "memory_efficiency", "pcie_efficiency"):
            _positive(owner, f, getattr(self, f))
        for f in ("memory_efficiency", "pcie_efficiency"):
            if getattr(self, f) > 1:
                raise SpecError(f"{owner}: {f} must be at most 1 (a fraction), got {getattr(self, f)!r}")
        if not isinstance(self.pcie, LinkSpec):
            raise SpecError(f"{owner}: pcie must be a LinkSpec, got {self.pcie!r}")
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")

    def copy_time(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` between one GPU and the host (either way)."""
        return self.pcie.latency_s + nbytes / (self.pcie.bandwidth * self.pcie_efficiency)

    def compute_time(self, flops: float, nbytes: float, share: int) -> float:
        """Seconds of a pass of ``flops`` FLOPs and ``nbytes`` bytes on ``1/share`` of the
        host (roofline: the larger of the two)."""
        t_flops = flops * share / self.flops
        t_mem = nbytes * share / (self.memory_bandwidth * self.memory_efficiency)
        return max(t_flops, t_mem)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One machine type: ``devices_per_node`` identical devices and two kinds of link.

    ``intra`` is the GPU↔GPU link inside the node, per GPU per direction (e.g. one GPU's NVLink
    bandwidth into an NVSwitch). ``inter`` is the node's network: its *aggregate* bandwidth to
    other nodes per direction (all NICs together) and the network latency. ``source`` says where
    the figures come from (a URL, or "estimate"). ``collectives``: measured links per
    collective (``distir calibrate``), as (name, link) pairs with names from
    ``distir.sim.collectives.COLLECTIVES``: the (B, α) that make that collective's alpha-beta
    formula match its measured times; inside the node a listed collective uses its link instead
    of ``intra`` (``intra`` stays the point-to-point link).

    ``nics``: how many network interfaces ``inter``'s bandwidth is split over, each with
    ``inter.bandwidth / nics``, the node's GPUs spread over them evenly. A GPU reaches the
    network through its own interfaces only (a DGX's "rail-optimized" network: one 400 Gb/s
    ConnectX-7 next to each H100, NCCL sending a GPU's traffic through the NIC nearest it), so
    a group with g GPUs on the node reaches ``network_share(g)`` of ``inter``
    (``distir.sim.collectives``). Default 1: one interface every GPU of the node shares.

    ``network_efficiency``: the fraction of ``inter``'s line rate that NCCL's traffic reaches
    through the node's interfaces (a published per-NIC bus bandwidth over the NIC's rate; 1:
    the line rate, as a calibrated profile or a node without a published figure has it);
    ``Cluster.network_link`` applies it to every transfer that crosses the network.
    ``collectives_source`` says where ``collectives`` and ``network_efficiency`` come from
    (empty: measured by ``distir calibrate``, or none given).

    ``busbw_curves``: measured bus bandwidth by message size per collective inside the node
    (name, ``BusBandwidthCurve``, names from ``CURVE_COLLECTIVES``; a collective may have curves
    measured on several group sizes, NCCL choosing another algorithm on each: ``curve_for``): a
    collective listed there, on a group inside one node, takes at least the time its curve
    gives, at most ``intra_for``'s bandwidth (``distir.sim.collectives``); the others keep the
    alpha-beta formula alone.

    ``host``: the node's CPUs, host memory and GPU↔host links (``HostSpec``), where an offloaded
    optimizer runs (``distribute(offload_optimizer=True)``); None: not described, and a program
    that puts work on the host is refused on it.
    """

    name: str
    device: DeviceSpec
    devices_per_node: int
    intra: LinkSpec
    inter: LinkSpec
    source: str = ""
    collectives: tuple[tuple[str, LinkSpec], ...] = ()
    nics: int = 1
    network_efficiency: float = 1.0
    collectives_source: str = ""
    busbw_curves: tuple[tuple[str, BusBandwidthCurve], ...] = ()
    host: HostSpec | None = None

    def __post_init__(self) -> None:
        _name("node spec", self.name)
        owner = f"node spec {self.name!r}"
        if not isinstance(self.device, DeviceSpec):
            raise SpecError(f"{owner}: device must be a DeviceSpec, got {self.device!r}")
        n = self.devices_per_node
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpecError(f"{owner}: devices_per_node must be a positive int, got {n!r}")
        for f in ("intra", "inter"):
            if not isinstance(getattr(self, f), LinkSpec):
                raise SpecError(f"{owner}: {f} must be a LinkSpec, got {getattr(self, f)!r}")
        if not isinstance(self.source, str):
            raise SpecError(f"{owner}: source must be a string, got {self.source!r}")
        _named_once(owner, "collectives", self.collectives, LinkSpec)
        if not isinstance(self.nics, int) or isinstance(self.nics, bool) or self.nics < 1:
            raise SpecError(f"{owner}: nics must be a positive int, got {self.nics!r}")
        _positive(owner, "network_efficiency", self.network_efficiency)
        if self.network_efficiency > 1:
            raise SpecError(
                f"{owner}: network_efficiency must be at most 1 (a fraction of the line rate), "
                f"got {self.network_efficiency!r}"
            )
        if not isinstance(self.collectives_source, str):
            raise SpecError(f"{owner}: collectives_source must be a string, got {self.collectives_source!r}")
        _curves_once(owner, self.busbw_curves, n)
        if self.host is not None and not isinstance(self.host, HostSpec):
            raise SpecError(f"{owner}: host must be a HostSpec or None, got {self.host!r}")

    def network_share(self, gpus: int) -> float:
        """The fraction of ``inter``'s bandwidth that ``gpus`` of this node's GPUs reach
        together: each GPU reaches max(1, nics / devices_per_node) interfaces of the ``nics``
        (several GPUs share one when there are fewer interfaces than GPUs), so g GPUs reach
        min(1, g / min(nics, devices_per_node)). 1 for a single interface."""
        rails = min(self.nics, self.devices_per_node)
        return min(1.0, gpus / rails)

    def curve_for(self, collective: str, ranks: int) -> BusBandwidthCurve | None:
        """The measured bus bandwidth by size of ``collective`` on ``ranks`` GPUs inside this
        node (None: none): the curve measured on the group size nearest ``ranks``, the larger of
        two as near (NCCL picks its algorithm by group size: on an H100 node it rings at 2 and 4
        GPUs and reduces in the NVSwitch, NVLS, at 6 and 8)."""
        best: BusBandwidthCurve | None = None
        for name, curve in self.busbw_curves:
            if name == collective and (
                best is None
                or abs(curve.ranks - ranks) < abs(best.ranks - ranks)
                or (abs(curve.ranks - ranks) == abs(best.ranks - ranks) and curve.ranks > best.ranks)
            ):
                best = curve
        return best

    def intra_for(self, collective: str) -> LinkSpec:
        """The link ``collective`` runs on inside this node: its measured link, else ``intra``."""
        for name, link in self.collectives:
            if name == collective:
                return link
        return self.intra
