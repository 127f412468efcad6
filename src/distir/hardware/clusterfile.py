"""Cluster files: a cluster described in TOML, validated key by key.

Units are in the key names; the loader converts them to SI (FLOP/s, B/s, bytes, s)::

    name = "amp-hetero"              # optional; default: the file name without .toml

    [types.p3]                       # a node type; its key is used by [[nodes]]
    preset = "p3.8xlarge"            # start from a preset (`distir clusters` lists them) ...
    intra_bandwidth_gb_s = 40        # ... and override any field below

    [types.t4]                       # or define every field inline
    gpu = "T4-16GB"                  # device name (equal names must mean equal figures)
    devices_per_node = 4
    fp32_tflops = 8.1                # dense peaks in TFLOP/s (1e12 FLOP/s)
    fp16_tflops = 65
    tf32_tflops = 8.1                # optional, default fp32 (no TF32 path)
    bf16_tflops = 8.1                # optional, default fp32 (no BF16 path)
    fp64_tflops = 0.25               # optional, default fp32 / 2
    memory_bandwidth_gb_s = 320      # device memory bandwidth, GB/s (1e9 B/s)
    memory_gib = 16                  # device memory, GiB (2^30 B)
    launch_overhead_us = 5           # optional, default 5 (µs per kernel)
    intra_bandwidth_gb_s = 15.75     # GPU↔GPU inside the node, per GPU per direction, GB/s
    intra_latency_us = 8             # µs
    inter_bandwidth_gb_s = 6.25      # node ↔ network, aggregate per node per direction, GB/s
    inter_latency_us = 30            # µs
    nics = 1                         # optional, default 1 (a preset's own): network interfaces
                                     #   sharing inter_bandwidth_gb_s, GPUs spread over them
                                     #   (8 on a DGX: a GPU's group crosses on its own NIC)
    node_name = "g4dn.12xlarge"      # optional, default: the type's key
    source = "https://..."           # optional: where the figures come from
    sm_count = 40                    # optional: GEMM efficiency curve (distir.hardware.gemm):
    matmul_efficiency = 0.7          #   SMs, the published fraction of the dense peak at
    matmul_anchor = [8192, 8192, 8192]  #   the shape matmul_anchor (default 8192^3),
    matmul_fp32_efficiency = 0.8     #   the same for fp32 (default matmul_efficiency),
    matmul_source = "..."            #   and its source; without sm_count and
                                     #   matmul_efficiency: a flat fraction of peak
    matmul_anchor_is_max = true      #   optional: the anchor is the best point of a sweep
                                     #   over shapes; no shape runs faster (default false)
    fp8_tflops = 1979                # optional: dense FP8 tensor-core peak (default: none, so
                                     #   --precision fp8 is refused; a preset's own)
    fp8_matmul_efficiency = 0.709    # optional: float8 products' GEMM curve (sm_count and the
    fp8_matmul_anchor = [1024, 9216, 14336]  # comm SMs of the curve above), as matmul_*
    fp8_matmul_anchor_is_max = true  #   (default: the curve above)
    fp8_matmul_source = "..."
    comm_sm_count = 2                # optional: SMs a communication kernel holds while it runs
    comm_sm_source = "..."           #   (NCCL channels), taken from the compute beside it
                                     #   (default 0: none; distir.sim.interference)
    matmul_persistent = true         # optional: the GEMM kernels launch one CTA per SM, so
    matmul_persistent_source = "..." #   beside those SMs they run in two waves (default false)
    cuda_context_mib = 512           # optional: memory held besides tensors (defaults:
    workspace_mib = 64               #   distir.hardware.presets.CUDA_RUNTIME): CUDA context,
    comm_buffers_mib = 512           #   library workspaces, NCCL buffers (MiB) and the
    allocator_fragmentation = 0.05   #   allocator's reserve as a fraction of the peak,
    runtime_memory_source = "..."    #   with their source

    [types.t4.families.elementwise]  # optional, per op cost class (OpDef.cost_class; by
    flop_efficiency = 0.4            #   `distir calibrate`): measured fraction of the dense
    memory_efficiency = 0.8          #   peak and of the memory bandwidth, and the per-op
    launch_us = 4                    #   fixed cost, replacing the cost model's defaults

    [types.t4.attention.fa2]         # optional, per fused-attention kernel (fa2, cudnn,
                                     #   fa-triton; an array of tables: one per head_dim):
    peak_tflops = 989.5              #   its published TFLOP/s by sequence length on a GPU
    head_dim = 128                   #   of this dense 16-bit peak, at this head dimension,
    forward = [[512, 309], [8192, 370]]  # forward and backward, causal and not
    forward_causal = [[512, 191], [8192, 333]]  # (backward_causal optional: derived);
    backward = [[512, 214], [8192, 318]]        # distir.hardware.attention
    source = "..."

    [types.t4.power]                 # optional: the GPU runs at another power limit than its
    limit_w = 500                    #   GEMM and attention figures were measured at
    reference_w = 700                #   (reference_w): its compute runs at
    curve = [[400, 1501], [500, 1731], [700, 1969]]  # rate(limit_w) / rate(reference_w) of
    source = "..."                   #   them; curve: a published (W, sustained rate) series

    [types.t4.host]                  # optional: the node's host, where an offloaded optimizer
    name = "2x EPYC"                 #   runs (HostSpec): its CPUs' fp32 peak, their memory's
    cores = 96                       #   bandwidth and size, one GPU's PCIe link to it (per
    tflops = 7.5                     #   direction), the fractions a pass and a copy reach
    memory_bandwidth_gb_s = 409.6    #   (default 0.8 each); a preset's host is kept unless
    memory_gib = 1900                #   given
    pcie_gb_s = 31.5
    pcie_latency_us = 10
    source = "..."

    [types.t4.collectives.allreduce] # optional, per collective (allreduce, allgather,
    bandwidth_gb_s = 12              #   reducescatter, broadcast, reduce, scatter, gather,
    latency_us = 9                   #   alltoall): the measured link (B, α) of its alpha-beta
                                     #   formula inside the node, instead of intra_* (NCCL's
                                     #   bus bandwidth, nccl-tests' busbw)
    [types.t4.busbw_curves.allreduce]  # optional, per collective (allreduce, allgather,
                                     #   reducescatter, broadcast, reduce): its measured bus
    points = [[32768, 1.3], [1073741824, 229]]  # bandwidth by message size inside the node
    ranks = 8                        #   ([bytes, GB/s], nccl-tests' size and busbw columns;
    source = "..."                   #   two or more, sizes increasing) on `ranks` GPUs; capped
                                     #   at the collective's link (distir.sim.collectives);
                                     #   points = [] removes a preset's curves; an array of
                                     #   tables gives curves on several group sizes (a group
                                     #   reads the one measured on the nearest size)
    # in [types.t4] itself (optional):
    #   network_efficiency = 0.96    # fraction of the NICs' line rate NCCL reaches (default 1)
    #   collectives_source = "..."   # where the collectives and network_efficiency come from

    [[nodes]]                        # nodes in order; GPUs are numbered node by node
    type = "p3"                      # a key of [types], or a preset name
    count = 3                        # optional, default 1

    [inter_node]                     # optional: the link between any two nodes
    bandwidth_gb_s = 1.25            # (default: the slower of the two nodes' inter links)
    latency_us = 50

    bandwidth_matrix_gb_s = [[...]]  # optional: full GPU×GPU matrices, overriding every
    latency_matrix_us = [[...]]      # pairwise link (the diagonal is ignored)

A preset type overrides any of these keys one by one (the rest are the preset's). A preset
type whose device figures are overridden gets the device name ``"<preset gpu> [<key>]"``
unless ``gpu`` is given, so that different figures never share a name. A type that gives the
node another link inside it (``intra_bandwidth_gb_s`` / ``intra_latency_us`` differing from the
preset's) drops the preset's per-collective links (``collectives``): that link then serves
every collective but those the type's own ``collectives`` tables name. A preset's measured
curve (``busbw_curves``) is dropped when the type gives its collective another link inside the
node (``collectives.<name>``, or ``intra_*``), so the figures the type gives hold at every
size, and so is one measured on more GPUs than the type's ``devices_per_node``; the type's own
``busbw_curves`` tables apply over that.

Every problem is a ``ClusterError`` naming the file, the line:column where it can be found, the
key path (``types.t4.fp32_tflops``, ``nodes[1].count``) and expected vs actual.

This module reads the format into a ``ClusterDescription`` and knows nothing of ``Cluster``:
``distir.hardware.cluster`` makes clusters from descriptions (``cluster_from_toml``,
``load_cluster_file``) and from spec strings naming a file.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from distir.hardware.presets import CUDA_RUNTIME, GIB, GIGA, MIB, PRESETS, TERA, us
from distir.hardware.specs import (
    CURVE_COLLECTIVES,
    AttentionProfile,
    BusBandwidthCurve,
    ClusterError,
    DeviceSpec,
    FamilyRates,
    GemmProfile,
    HardwareError,
    HostSpec,
    LinkSpec,
    Matrix,
    NodeSpec,
    PowerProfile,
    RuntimeMemory,
)
from distir.limits import MAX_DEVICES, TOML_MAX_DIGITS, TOML_MAX_NESTING, exceeds, over

Path_ = tuple[str | int, ...]


def _tera(x: float) -> float:
    return x * TERA


def _giga(x: float) -> float:
    return x * GIGA


def _gib(x: float) -> float:
    return x * GIB


# The figures a cluster file may give, by the unit its key names: far outside what any GPU,
# link or host has, so a figure written in another unit (FLOP/s for TFLOP/s, bytes for GiB, B/s
# for GB/s, ns for µs past 10 s) is an error naming the key, not a cluster that simulates in
# 10^-300 s or overflows converting memory to bytes. unit → (least, most); 0 where zero_ok allows.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "TFLOP/s": (1e-6, 1e5),  # 1 MFLOP/s … 100 PFLOP/s (an H100's FP8 peak is 1,979)
    "GB/s": (1e-6, 1e5),  # 1 kB/s … 100 TB/s (HBM3e: 8 TB/s)
    "GiB": (2.0**-20, 2.0**20),  # 1 KiB … 1 PiB of device memory
    "MiB": (2.0**-10, 2.0**30),  # 1 KiB … 1 PiB of runtime memory
    "µs": (1e-6, 1e7),  # 1 ps … 10 s
    "W": (1e-3, 1e5),  # 1 mW … 100 kW
}


def plausible_range(what: str) -> tuple[float, float] | None:
    """The (least, most) of ``PLAUSIBLE`` for a figure described as ``what`` (its unit last, as
    ``"device memory, GiB"`` or ``"µs per op"`` give it), else None (a fraction, a count)."""
    return PLAUSIBLE.get(what.split(", ")[-1].split(" ")[0])


# key → (what, conversion to SI, required when there is no preset)
_NUMERIC: dict[str, tuple[str, Callable[[float], float], bool]] = {
    "fp32_tflops": ("dense fp32 peak, TFLOP/s", _tera, True),
    "tf32_tflops": ("dense tf32 peak, TFLOP/s", _tera, False),
    "fp16_tflops": ("dense fp16 peak, TFLOP/s", _tera, True),
    "bf16_tflops": ("dense bf16 peak, TFLOP/s", _tera, False),
    "fp64_tflops": ("dense fp64 peak, TFLOP/s", _tera, False),
    "memory_bandwidth_gb_s": ("device memory bandwidth, GB/s", _giga, True),
    "memory_gib": ("device memory, GiB", _gib, True),
    "launch_overhead_us": ("kernel launch overhead, µs", us, False),
    "intra_bandwidth_gb_s": ("intra-node bandwidth per GPU per direction, GB/s", _giga, True),
    "intra_latency_us": ("intra-node latency, µs", us, True),
    "inter_bandwidth_gb_s": ("network bandwidth per node per direction, GB/s", _giga, True),
    "inter_latency_us": ("network latency, µs", us, True),
}
_LATENCIES = ("intra_latency_us", "inter_latency_us", "launch_overhead_us")
_DEVICE_FIELDS = {
    "fp32_tflops": "fp32",
    "tf32_tflops": "tf32",
    "fp16_tflops": "fp16",
    "bf16_tflops": "bf16",
    "fp64_tflops": "fp64",
    "memory_bandwidth_gb_s": "memory_bandwidth",
    "launch_overhead_us": "launch_overhead_s",
}
_GEMM_KEYS = (
    "sm_count",
    "matmul_efficiency",
    "matmul_fp32_efficiency",
    "matmul_anchor",
    "matmul_source",
    "matmul_anchor_is_max",
    "comm_sm_count",
    "comm_sm_source",
    "matmul_persistent",
    "matmul_persistent_source",
)
_FP8_GEMM_KEYS = (
    "fp8_matmul_efficiency",
    "fp8_matmul_anchor",
    "fp8_matmul_anchor_is_max",
    "fp8_matmul_source",
)
_RUNTIME_MIB = {
    "cuda_context_mib": "context_bytes",
    "workspace_mib": "workspace_bytes",
    "comm_buffers_mib": "comm_bytes",
}
_RUNTIME_KEYS = (*_RUNTIME_MIB, "allocator_fragmentation", "runtime_memory_source")
_FAMILY_KEYS = ("flop_efficiency", "memory_efficiency", "launch_us")
_COLLECTIVE_KEYS = ("bandwidth_gb_s", "latency_us")
_CURVE_KEYS = ("points", "ranks", "source")
_ATTENTION_CURVES = ("forward", "forward_causal", "backward", "backward_causal")
_ATTENTION_KEYS = ("peak_tflops", "head_dim", *_ATTENTION_CURVES, "source")
_POWER_KEYS = ("limit_w", "reference_w", "curve", "source")
# a node type's ``host`` table (``HostSpec``: where an offloaded optimizer runs)
_HOST_NUMBERS: dict[str, tuple[str, Callable[[float], float]]] = {
    "tflops": ("the host CPUs' fp32 peak, TFLOP/s", _tera),
    "memory_bandwidth_gb_s": ("the host memory's bandwidth, GB/s", _giga),
    "memory_gib": ("the host memory, GiB", _gib),
    "pcie_gb_s": ("one GPU's PCIe link to the host, GB/s per direction", _giga),
    "pcie_latency_us": ("the PCIe link's latency, µs", us),
    "memory_efficiency": ("the fraction of the memory bandwidth a pass reaches", float),
    "pcie_efficiency": ("the fraction of the link a copy reaches", float),
}
_HOST_KEYS = ("name", "cores", *_HOST_NUMBERS, "source")
COLLECTIVE_NAMES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "scatter",
    "gather",
    "alltoall",
)
"""The collectives a node type's ``collectives`` table may name (``distir.sim.collectives``)."""
_TYPE_KEYS = (
    "preset",
    "gpu",
    "devices_per_node",
    *_NUMERIC,
    "nics",
    "node_name",
    "source",
    *_GEMM_KEYS,
    "fp8_tflops",
    *_FP8_GEMM_KEYS,
    *_RUNTIME_KEYS,
    "families",
    "collectives",
    "network_efficiency",
    "collectives_source",
    "busbw_curves",
    "attention",
    "power",
    "host",
)
_TOP_KEYS = ("name", "types", "nodes", "inter_node", "bandwidth_matrix_gb_s", "latency_matrix_us")


def _fmt(path: Path_) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            q = p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else f'"{p}"'
            out += q if not out else f".{q}"
    return out


def _got(v: object) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, str):
        return f'"{v}" (a string)'
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return f"{v} (a {type(v).__name__})"


_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'[^\']*\'')
_KEY = r"(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')"
_KEYLINE = re.compile(rf"^(\s*)({_KEY}(?:\s*\.\s*{_KEY})*)\s*=")


def _dotted(s: str) -> tuple[str, ...]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[^.]+", s)
    return tuple(p.strip().strip("\"'") for p in parts if p.strip())


def _index_positions(text: str) -> dict[Path_, tuple[int, int]]:
    """Best-effort line:column of every table header and key (first occurrence)."""
    pos: dict[Path_, tuple[int, int]] = {}
    header: Path_ = ()
    aot: dict[Path_, int] = {}
    depth = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        code = _STRINGS.sub('""', raw).split("#", 1)[0]
        if depth > 0:
            depth += code.count("[") - code.count("]")
            continue
        stripped = code.strip()
        col = len(raw) - len(raw.lstrip()) + 1
        if stripped.startswith("[["):
            name = _dotted(raw.strip()[2:].split("]]", 1)[0])
            i = aot.get(name, 0)
            aot[name] = i + 1
            header = (*name, i)
            pos.setdefault(header, (lineno, col))
        elif stripped.startswith("["):
            header = _dotted(raw.strip()[1:].split("]", 1)[0])
            pos.setdefault(header, (lineno, col))
        else:
            m = _KEYLINE.match(raw)
            if m:
                pos.setdefault((*header, *_dotted(m.group(2))), (lineno, col))
                value = code.split("=", 1)[1] if "=" in code else ""
                depth = max(0, value.count("[") - value.count("]"))
    return pos


_NUMBER_RUN = re.compile(rf"[0-9_]{{{TOML_MAX_DIGITS + 1},}}")


def _precheck(text: str, file: str) -> None:
    """Refuse, before ``tomllib`` sees it, what would make it recurse past Python's limit (arrays
    or inline tables nested deeper than ``TOML_MAX_NESTING``) or convert a number of thousands of
    digits (``TOML_MAX_DIGITS``): a ClusterError with the line, as any other TOML error."""
    for lineno, raw in enumerate(text.splitlines(), 1):
        code = _STRINGS.sub('""', raw).split("#", 1)[0]
        m = _NUMBER_RUN.search(code)
        if m is not None:
            raise ClusterError(
                f"a number of more than {TOML_MAX_DIGITS} digits (no figure of a cluster has that many)",
                source=file,
                line=lineno,
                col=m.start() + 1,
            )
    depth = 0
    code = _STRINGS.sub('""', text)
    for lineno, line in enumerate(code.splitlines(), 1):
        for col, ch in enumerate(line.split("#", 1)[0], 1):
            if ch in "[{":
                depth += 1
                if depth > TOML_MAX_NESTING:
                    raise ClusterError(
                        f"arrays or tables nested deeper than {TOML_MAX_NESTING} levels",
                        source=file,
                        line=lineno,
                        col=col,
                    )
            elif ch in "]}":
                depth = max(0, depth - 1)


def _preset_links(base: NodeSpec, vals: Mapping[str, float]) -> tuple[tuple[str, LinkSpec], ...]:
    """The preset's per-collective links inside the node (``NodeSpec.collectives``) a preset type
    keeps: none when the type gives the node another intra-node link (``intra_*``), whose figure
    then holds for every collective (the type's own ``collectives`` tables over it): the preset's
    links are measured on the preset's fabric, as its curves are."""
    intra = LinkSpec(
        vals.get("intra_bandwidth_gb_s", base.intra.bandwidth),
        vals.get("intra_latency_us", base.intra.latency_s),
    )
    return base.collectives if intra == base.intra else ()


def _kept_curves(
    base: NodeSpec,
    collectives: tuple[tuple[str, LinkSpec], ...],
    vals: Mapping[str, float],
    devices: int | None = None,
) -> tuple[tuple[str, BusBandwidthCurve], ...]:
    """The preset's curves a preset type keeps: those of the collectives whose link inside the
    node (``NodeSpec.intra_for``: its ``collectives`` entry, else the intra-node link) the type
    leaves as the preset has it, measured on no more GPUs than the type's node has (``devices``,
    its ``devices_per_node`` if given). A curve measured on the preset's fabric would otherwise
    override the type's own figures below the curve's largest size. The type's own
    ``busbw_curves`` are laid over these."""
    intra = LinkSpec(
        vals.get("intra_bandwidth_gb_s", base.intra.bandwidth),
        vals.get("intra_latency_us", base.intra.latency_s),
    )
    links = dict(collectives)
    return tuple(
        (n, c)
        for n, c in base.busbw_curves
        if links.get(n, intra) == base.intra_for(n) and (devices is None or c.ranks <= devices)
    )


class ClusterDescription(NamedTuple):
    """What a cluster file says, each key validated: ``distir.hardware.cluster.cluster_of`` makes
    the cluster (and checks what concerns the whole of it); ``file`` names the file in errors."""

    name: str
    nodes: tuple[NodeSpec, ...]
    inter_node: LinkSpec | None
    bandwidth_matrix: Matrix | None
    latency_matrix: Matrix | None
    file: str


class _Loader:
    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self._pos: dict[Path_, tuple[int, int]] | None = None

    def fail(self, path: Path_, message: str) -> NoReturn:
        if self._pos is None:
            self._pos = _index_positions(self.text)
        line = col = None
        for k in range(len(path), 0, -1):
            hit = self._pos.get(path[:k])
            if hit is not None:
                line, col = hit
                break
        raise ClusterError(message, source=self.file, key=_fmt(path) or None, line=line, col=col)

    def table(self, v: object, path: Path_, keys: Sequence[str]) -> dict[str, Any]:
        if not isinstance(v, dict):
            self.fail(path, f"expected a table, got {_got(v)}")
        for k in v:
            if k not in keys:
                close = difflib.get_close_matches(k, keys, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                self.fail((*path, k), f"unknown key; {hint}(known keys: {', '.join(keys)})")
        return v

    def string(self, v: object, path: Path_, *, empty_ok: bool = False) -> str:
        if not isinstance(v, str):
            self.fail(path, f"expected a string, got {_got(v)}")
        if not empty_ok and not v.strip():
            self.fail(path, f"expected a non-empty string, got {_got(v)}")
        return v

    def number(
        self, v: object, path: Path_, what: str, *, zero_ok: bool = False, inf_ok: bool = False
    ) -> float:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)
        if ok:
            assert isinstance(v, int | float)
            ok = (v >= 0 if zero_ok else v > 0) and (inf_ok or math.isfinite(v))
        if not ok:
            kind = "a non-negative" if zero_ok else "a positive"
            self.fail(path, f"expected {kind} number ({what}), got {_got(v)}")
        x = float(v)  # type: ignore[arg-type]
        span = plausible_range(what)
        if span is not None and math.isfinite(x) and x != 0 and not span[0] <= x <= span[1]:
            self.fail(
                path,
                f"{x:g} is outside what any GPU or link has ({what}: {span[0]:g} to {span[1]:g}); "
                "check the unit in the key's name",
            )
        return x

    def positive_int(self, v: object, path: Path_, what: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            self.fail(path, f"expected a positive integer ({what}), got {_got(v)}")
        return v

    def device_count(self, v: object, path: Path_, what: str) -> int:
        """A positive integer that counts GPUs or nodes: at most ``MAX_DEVICES``."""
        n = self.positive_int(v, path, what)
        if exceeds(n, MAX_DEVICES):
            self.fail(path, over(what, n, MAX_DEVICES))
        return n

    # -- node types ---------------------------------------------------------------------------

    def node_type(self, key: str, raw: object) -> NodeSpec:
        path: Path_ = ("types", key)
        t = self.table(raw, path, _TYPE_KEYS)
        vals: dict[str, float] = {}
        for k, (what, to_si, _) in _NUMERIC.items():
            if k in t:
                vals[k] = to_si(self.number(t[k], (*path, k), what, zero_ok=k in _LATENCIES))
        base: NodeSpec | None = None
        if "preset" in t:
            name = self.string(t["preset"], (*path, "preset"))
            base = PRESETS.get(name)
            if base is None:
                self.fail((*path, "preset"), self._unknown_preset(name))
        else:
            for k in ("gpu", "devices_per_node"):
                if k not in t:
                    self.fail((*path, k), "missing required key (no preset to take it from)")
            for k, (what, _, required) in _NUMERIC.items():
                if required and k not in vals:
                    self.fail((*path, k), f"missing required key ({what}; no preset to take it from)")
        gpu = self.string(t["gpu"], (*path, "gpu")) if "gpu" in t else None
        dpn = (
            self.device_count(t["devices_per_node"], (*path, "devices_per_node"), "GPUs per node")
            if "devices_per_node" in t
            else None
        )
        nics = base.nics if base is not None else 1
        if "nics" in t:
            nics = self.device_count(t["nics"], (*path, "nics"), "network interfaces per node")
        node_name = key if base is None else base.name
        if "node_name" in t:
            node_name = self.string(t["node_name"], (*path, "node_name"))
        source = base.source if base else ""
        if "source" in t:
            source = self.string(t["source"], (*path, "source"), empty_ok=True)
        dev_over: dict[str, Any] = {_DEVICE_FIELDS[k]: v for k, v in vals.items() if k in _DEVICE_FIELDS}
        if "memory_gib" in vals:
            dev_over["memory_bytes"] = round(vals["memory_gib"])
        gemm = self.gemm_profile(t, path, base.device.gemm if base else None)
        runtime = self.runtime_memory(t, path, base.device.runtime if base else CUDA_RUNTIME)
        if base is not None and gemm != base.device.gemm:
            dev_over["gemm"] = gemm
        fp8, gemm_fp8 = self.fp8(t, path, base.device if base else None, gemm)
        if base is not None and (fp8, gemm_fp8) != (base.device.fp8, base.device.gemm_fp8):
            dev_over |= {"fp8": fp8, "gemm_fp8": gemm_fp8}
        if base is not None and runtime != base.device.runtime:
            dev_over["runtime"] = runtime
        families = self.families(t, path, base.device.families if base else ())
        if base is not None and families != base.device.families:
            dev_over["families"] = families
        collectives = self.collectives(t, path, _preset_links(base, vals) if base else ())
        curves = self.busbw_curves(t, path, _kept_curves(base, collectives, vals, dpn) if base else ())
        net = (collectives, nics, *self.network(t, path, base), curves, self.host(t, path, base))
        attention = self.attention(t, path, base.device.attention if base else ())
        if base is not None and attention != base.device.attention:
            dev_over["attention"] = attention
        power = self.power(t, path, base.device.power if base else None)
        if base is not None and power != base.device.power:
            dev_over["power"] = power
        try:
            if base is None:
                fp32 = vals["fp32_tflops"]
                assert gpu is not None and dpn is not None
                device = DeviceSpec(
                    name=gpu,
                    fp32=fp32,
                    tf32=vals.get("tf32_tflops", fp32),
                    fp16=vals["fp16_tflops"],
                    bf16=vals.get("bf16_tflops", fp32),
                    fp64=vals.get("fp64_tflops"),
                    memory_bandwidth=vals["memory_bandwidth_gb_s"],
                    memory_bytes=round(vals["memory_gib"]),
                    launch_overhead_s=vals.get("launch_overhead_us", us(5)),
                    gemm=gemm,
                    runtime=runtime,
                    families=families,
                    attention=attention,
                    power=power,
                    fp8=fp8,
                    gemm_fp8=gemm_fp8,
                )
                intra = LinkSpec(vals["intra_bandwidth_gb_s"], vals["intra_latency_us"])
                inter = LinkSpec(vals["inter_bandwidth_gb_s"], vals["inter_latency_us"])
                return NodeSpec(node_name, device, dpn, intra, inter, source, *net)
            device = base.device
            if dev_over or gpu is not None:
                name = gpu if gpu is not None else f"{device.name} [{key}]"
                device = replace(device, name=name, **dev_over)
            intra = LinkSpec(
                vals.get("intra_bandwidth_gb_s", base.intra.bandwidth),
                vals.get("intra_latency_us", base.intra.latency_s),
            )
            inter = LinkSpec(
                vals.get("inter_bandwidth_gb_s", base.inter.bandwidth),
                vals.get("inter_latency_us", base.inter.latency_s),
            )
            dpn = dpn or base.devices_per_node
            return NodeSpec(node_name, device, dpn, intra, inter, source, *net)
        except HardwareError as e:
            self.fail(path, str(e))

    def fp8(
        self, t: dict[str, Any], path: Path_, base: DeviceSpec | None, gemm: GemmProfile | None
    ) -> tuple[float | None, GemmProfile | None]:
        """The type's FP8 peak and float8 GEMM profile: ``base``'s with the type's ``fp8_*`` keys
        over them; a new profile takes its SMs and communication SMs from ``gemm``."""
        peak = base.fp8 if base is not None else None
        if "fp8_tflops" in t:
            peak = _tera(self.number(t["fp8_tflops"], (*path, "fp8_tflops"), "dense fp8 peak, TFLOP/s"))
        profile = base.gemm_fp8 if base is not None else None
        given = [k for k in _FP8_GEMM_KEYS if k in t]
        if not given:
            return peak, profile
        if peak is None or (profile is None and (gemm is None or "fp8_matmul_efficiency" not in t)):
            self.fail(
                (*path, given[0]),
                "the float8 GEMM curve needs fp8_tflops, fp8_matmul_efficiency and the curve's "
                "sm_count and matmul_efficiency",
            )
        start = profile if profile is not None else gemm
        assert start is not None
        if profile is None:  # the bf16 curve's SMs and communication SMs, its own point
            start = replace(start, fp32_fraction=None, anchor=(8192, 8192, 8192), anchor_is_max=False)
            start = replace(start, source=f"{self.file}: {_fmt(path)}")
        return peak, self.gemm_profile(t, path, start, prefix="fp8_")

    def gemm_profile(
        self, t: dict[str, Any], path: Path_, base: GemmProfile | None, prefix: str = ""
    ) -> GemmProfile | None:
        """The type's GEMM profile: ``base`` with the type's ``matmul_*``/``sm_count`` keys over
        it; without a base, both ``sm_count`` and ``matmul_efficiency`` or neither (None).
        ``prefix``: the keys read are ``prefix`` + those (``fp8_matmul_efficiency``)."""
        if prefix:
            t = {k.removeprefix(prefix): v for k, v in t.items() if k.startswith(prefix)}
        path_ = path

        def at(key: str) -> Path_:
            return (*path_, prefix + key)

        given = [k for k in _GEMM_KEYS if k in t]
        if not given:
            return base
        if base is None:
            for k in ("sm_count", "matmul_efficiency"):
                if k not in t:
                    self.fail(
                        at(k),
                        "missing key: the GEMM curve needs sm_count and matmul_efficiency "
                        f"(got {', '.join(given)})",
                    )
        over: dict[str, Any] = {}
        if "sm_count" in t:
            over["sms"] = self.positive_int(t["sm_count"], at("sm_count"), "streaming multiprocessors")
        for key, field_ in (("matmul_efficiency", "fraction"), ("matmul_fp32_efficiency", "fp32_fraction")):
            if key in t:
                x = self.number(t[key], at(key), "a fraction of the dense peak")
                if x > 1:
                    self.fail(at(key), f"expected a fraction of the dense peak in (0, 1], got {_got(t[key])}")
                over[field_] = x
        if "matmul_anchor" in t:
            a = t["matmul_anchor"]
            if not (
                isinstance(a, list)
                and len(a) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in a)
            ):
                self.fail(at("matmul_anchor"), f"expected [M, N, K], three positive integers, got {_got(a)}")
            over["anchor"] = tuple(a)
        for key, field_ in (("matmul_anchor_is_max", "anchor_is_max"), ("matmul_persistent", "persistent")):
            if key in t:
                if not isinstance(t[key], bool):
                    self.fail(at(key), f"expected true or false, got {_got(t[key])}")
                over[field_] = t[key]
        for key, field_ in (
            ("matmul_source", "source"),
            ("comm_sm_source", "comm_source"),
            ("matmul_persistent_source", "persistent_source"),
        ):
            if key in t:
                over[field_] = self.string(t[key], at(key), empty_ok=True)
        if "comm_sm_count" in t:
            c = t["comm_sm_count"]
            sms = over.get("sms", base.sms if base is not None else 0)
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < sms:
                self.fail(
                    at("comm_sm_count"),
                    f"expected an integer in [0, sm_count={sms}) (the SMs a communication kernel "
                    f"holds), got {_got(c)}",
                )
            over["comm_sms"] = c
        if base is None:
            over.setdefault("anchor", (8192, 8192, 8192))
            over.setdefault("source", f"{self.file}: {_fmt(path)}")
            return GemmProfile(**over)
        return replace(base, **over)

    def families(
        self, t: dict[str, Any], path: Path_, base: tuple[tuple[str, FamilyRates], ...]
    ) -> tuple[tuple[str, FamilyRates], ...]:
        """``base`` with the type's ``families`` tables over it (a family given replaces)."""
        if "families" not in t:
            return base
        fpath: Path_ = (*path, "families")
        raw = self.table(t["families"], fpath, list(t["families"]) if isinstance(t["families"], dict) else ())
        out = dict(base)
        for fam, entry in raw.items():
            epath: Path_ = (*fpath, fam)
            e = self.table(entry, epath, _FAMILY_KEYS)
            for k in _FAMILY_KEYS:
                if k not in e:
                    self.fail((*epath, k), f"missing required key (one of {', '.join(_FAMILY_KEYS)})")
            effs = []
            for k in ("flop_efficiency", "memory_efficiency"):
                x = self.number(e[k], (*epath, k), "a fraction")
                if x > 1:
                    self.fail((*epath, k), f"expected a fraction in (0, 1], got {_got(e[k])}")
                effs.append(x)
            launch = us(self.number(e["launch_us"], (*epath, "launch_us"), "µs per op", zero_ok=True))
            out[fam] = FamilyRates(effs[0], effs[1], launch)
        return tuple(out.items())

    def attention(
        self, t: dict[str, Any], path: Path_, base: tuple[AttentionProfile, ...]
    ) -> tuple[AttentionProfile, ...]:
        """``base`` with the type's ``attention`` tables over it: a kernel's table (or array of
        tables, one per head dimension) replaces every profile ``base`` has of that kernel."""
        if "attention" not in t:
            return base
        apath: Path_ = (*path, "attention")
        raw = self.table(
            t["attention"], apath, list(t["attention"]) if isinstance(t["attention"], dict) else ()
        )
        given: list[AttentionProfile] = []
        for kernel, entry in raw.items():
            entries = entry if isinstance(entry, list) and entry else [entry]
            for i, e in enumerate(entries):
                epath: Path_ = (*apath, kernel) if len(entries) == 1 else (*apath, kernel, i)
                given.append(self.attention_profile(kernel, e, epath))
        keys = [(a.kernel, a.head_dim) for a in given]
        for kernel, head_dim in keys:
            if keys.count((kernel, head_dim)) > 1:
                self.fail((*apath, kernel), f"head_dim {head_dim} given twice")
        return tuple(a for a in base if a.kernel not in raw) + tuple(given)

    def attention_profile(self, kernel: str, entry: object, epath: Path_) -> AttentionProfile:
        """One ``[types.X.attention.KERNEL]`` table."""
        e = self.table(entry, epath, _ATTENTION_KEYS)
        for k in ("peak_tflops", "head_dim", "forward", "forward_causal", "backward"):
            if k not in e:
                self.fail((*epath, k), "missing required key")
        curves = {k: self.seq_points(e[k], (*epath, k)) for k in _ATTENTION_CURVES if k in e}
        source = f"{self.file}: {_fmt(epath)}"
        if "source" in e:
            source = self.string(e["source"], (*epath, "source"), empty_ok=True)
        try:
            return AttentionProfile(
                kernel=kernel,
                peak_tflops=self.number(e["peak_tflops"], (*epath, "peak_tflops"), "TFLOP/s"),
                head_dim=self.positive_int(e["head_dim"], (*epath, "head_dim"), "the head dimension"),
                source=source,
                **curves,
            )
        except HardwareError as err:
            self.fail(epath, str(err))

    def power(self, t: dict[str, Any], path: Path_, base: PowerProfile | None) -> PowerProfile | None:
        """``base`` with the type's ``power`` table over it (without a base: limit_w,
        reference_w and curve required)."""
        if "power" not in t:
            return base
        ppath: Path_ = (*path, "power")
        e = self.table(t["power"], ppath, _POWER_KEYS)
        if base is None:
            for k in ("limit_w", "reference_w", "curve"):
                if k not in e:
                    self.fail((*ppath, k), "missing required key")
        over: dict[str, Any] = {
            k: self.number(e[k], (*ppath, k), "a power limit, W")
            for k in ("limit_w", "reference_w")
            if k in e
        }
        if "curve" in e:
            over["curve"] = self.power_points(e["curve"], (*ppath, "curve"))
        if "source" in e:
            over["source"] = self.string(e["source"], (*ppath, "source"))
        try:
            if base is None:
                return PowerProfile(**({"source": f"{self.file}: {_fmt(ppath)}"} | over))
            return replace(base, **over)
        except HardwareError as err:
            self.fail(ppath, str(err))

    def host(self, t: dict[str, Any], path: Path_, node: NodeSpec | None) -> HostSpec | None:
        """The host of ``node`` (a preset; None: none) with the type's ``host`` table over it
        (without a host to take: every key but the efficiencies and the source required)."""
        base = node.host if node is not None else None
        if "host" not in t:
            return base
        hpath: Path_ = (*path, "host")
        e = self.table(t["host"], hpath, _HOST_KEYS)
        if base is None:
            for k in (
                "name",
                "cores",
                "tflops",
                "memory_bandwidth_gb_s",
                "memory_gib",
                "pcie_gb_s",
                "pcie_latency_us",
            ):
                if k not in e:
                    self.fail((*hpath, k), "missing required key")
        over: dict[str, Any] = {}
        for k, (what, to_si) in _HOST_NUMBERS.items():
            if k in e:
                over[k] = to_si(self.number(e[k], (*hpath, k), what, zero_ok=k == "pcie_latency_us"))
        fields: dict[str, Any] = {}
        if "name" in e:
            fields["name"] = self.string(e["name"], (*hpath, "name"))
        if "cores" in e:
            fields["cores"] = self.positive_int(e["cores"], (*hpath, "cores"), "CPU cores")
        if "source" in e:
            fields["source"] = self.string(e["source"], (*hpath, "source"), empty_ok=True)
        for k, f in (
            ("tflops", "flops"),
            ("memory_bandwidth_gb_s", "memory_bandwidth"),
            ("memory_gib", "memory"),
        ):
            if k in over:
                fields[f] = over[k]
        for k in ("memory_efficiency", "pcie_efficiency"):
            if k in over:
                fields[k] = over[k]
        old = base.pcie if base is not None else None
        if "pcie_gb_s" in over or "pcie_latency_us" in over:
            bw = over.get("pcie_gb_s", old.bandwidth if old else 0.0)
            lat = over.get("pcie_latency_us", old.latency_s if old else 0.0)
            try:
                fields["pcie"] = LinkSpec(bw, lat)
            except HardwareError as err:
                self.fail(hpath, str(err))
        try:
            if base is None:
                return HostSpec(**({"source": f"{self.file}: {_fmt(hpath)}"} | fields))
            return replace(base, **fields)
        except HardwareError as err:
            self.fail(hpath, str(err))

    def power_points(self, x: object, path: Path_) -> tuple[tuple[float, float], ...]:
        """``[[W, rate], ...]``: two or more points of positive numbers."""
        ok = isinstance(x, list) and len(x) >= 2
        for e in x if isinstance(x, list) else ():
            ok = ok and isinstance(e, list) and len(e) == 2
            ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in e)
        if not ok:
            self.fail(
                path, f"expected [[power limit W, sustained rate], ...], two or more, positive, got {_got(x)}"
            )
        assert isinstance(x, list)
        return tuple((float(a), float(b)) for a, b in x)

    def seq_points(self, x: object, path: Path_) -> tuple[tuple[int, float], ...]:
        """``[[sequence length, TFLOP/s], ...]`` sorted by length."""
        ok = isinstance(x, list) and len(x) >= 1
        for e in x if isinstance(x, list) else ():
            ok = ok and isinstance(e, list) and len(e) == 2 and isinstance(e[0], int)
            ok = ok and not isinstance(e[0], bool) and e[0] >= 1
            ok = ok and isinstance(e[1], int | float) and not isinstance(e[1], bool) and e[1] > 0
        if not ok:
            self.fail(path, f"expected [[sequence length, TFLOP/s], ...], positive numbers, got {_got(x)}")
        assert isinstance(x, list)
        pts = tuple((int(a), float(b)) for a, b in x)
        if [p[0] for p in pts] != sorted({p[0] for p in pts}):
            self.fail(path, "expected the points sorted by sequence length, each length once")
        return pts

    def collectives(
        self, t: dict[str, Any], path: Path_, base: tuple[tuple[str, LinkSpec], ...]
    ) -> tuple[tuple[str, LinkSpec], ...]:
        """``base`` with the type's ``collectives`` tables over it (a collective given replaces)."""
        if "collectives" not in t:
            return base
        cpath: Path_ = (*path, "collectives")
        raw = self.table(t["collectives"], cpath, COLLECTIVE_NAMES)
        out = dict(base)
        for name, entry in raw.items():
            epath: Path_ = (*cpath, name)
            e = self.table(entry, epath, _COLLECTIVE_KEYS)
            for k in _COLLECTIVE_KEYS:
                if k not in e:
                    self.fail((*epath, k), "missing required key (bandwidth_gb_s and latency_us)")
            bw = self.number(e["bandwidth_gb_s"], (*epath, "bandwidth_gb_s"), "GB/s")
            lat = self.number(e["latency_us"], (*epath, "latency_us"), "µs", zero_ok=True)
            out[name] = LinkSpec(bw * GIGA, us(lat))
        return tuple(out.items())

    def busbw_curves(
        self, t: dict[str, Any], path: Path_, base: tuple[tuple[str, BusBandwidthCurve], ...]
    ) -> tuple[tuple[str, BusBandwidthCurve], ...]:
        """``base`` with the type's ``busbw_curves`` tables over it: a collective's table (or
        array of tables, one per group size measured) replaces every curve ``base`` has of that
        collective; ``points = []`` removes them."""
        if "busbw_curves" not in t:
            return base
        cpath: Path_ = (*path, "busbw_curves")
        raw = self.table(t["busbw_curves"], cpath, COLLECTIVE_NAMES)
        given: list[tuple[str, BusBandwidthCurve]] = []
        for name, entry in raw.items():
            many = isinstance(entry, list)
            if many and not entry:
                self.fail((*cpath, name), "expected a table or an array of tables, got an empty array")
            if name not in CURVE_COLLECTIVES:
                where: Path_ = (*cpath, name, 0) if many else (*cpath, name)
                self.fail(where, f"{name} reads no curve (curves: {', '.join(CURVE_COLLECTIVES)})")
            for i, e in enumerate(entry if many else [entry]):
                epath: Path_ = (*cpath, name, i) if many else (*cpath, name)
                curve = self.busbw_curve(e, epath)
                if curve is not None:
                    if any(n == name and c.ranks == curve.ranks for n, c in given):
                        self.fail((*epath, "ranks"), f"a second {name} curve on {curve.ranks} GPUs")
                    given.append((name, curve))
        return tuple((n, c) for n, c in base if n not in raw) + tuple(given)

    def busbw_curve(self, entry: object, epath: Path_) -> BusBandwidthCurve | None:
        """One ``[types.X.busbw_curves.NAME]`` table (None: ``points = []``, no curve)."""
        e = self.table(entry, epath, _CURVE_KEYS)
        if "points" not in e:
            self.fail((*epath, "points"), "missing required key ([[bytes, GB/s], ...])")
        source = self.string(e.get("source", ""), (*epath, "source"), empty_ok=True)
        if e["points"] == []:
            return None
        if "ranks" not in e:
            self.fail((*epath, "ranks"), "missing required key (the GPUs the curve was measured on)")
        ranks = self.positive_int(e["ranks"], (*epath, "ranks"), "GPUs measured, at least 2")
        if ranks < 2:
            self.fail((*epath, "ranks"), f"expected at least 2 GPUs, got {ranks}")
        points = self.size_points(e["points"], (*epath, "points"))
        try:
            return BusBandwidthCurve(points, ranks, source)
        except HardwareError as err:
            self.fail((*epath, "points"), str(err))

    def size_points(self, x: object, path: Path_) -> tuple[tuple[int, float], ...]:
        """``[[bytes, GB/s], ...]``: two or more, positive (sorted by size: ``BusBandwidthCurve``
        checks); returned in bytes and B/s."""
        ok = isinstance(x, list) and len(x) >= 2
        for e in x if isinstance(x, list) else ():
            ok = ok and isinstance(e, list) and len(e) == 2 and isinstance(e[0], int)
            ok = ok and not isinstance(e[0], bool) and e[0] >= 1
            ok = ok and isinstance(e[1], int | float) and not isinstance(e[1], bool)
            ok = ok and math.isfinite(e[1]) and e[1] > 0
        if not ok:
            self.fail(path, f"expected [[bytes, GB/s], ...], two or more, positive, got {_got(x)}")
        assert isinstance(x, list)
        return tuple((int(a), float(b) * GIGA) for a, b in x)

    def network(self, t: dict[str, Any], path: Path_, base: NodeSpec | None) -> tuple[float, str]:
        """``network_efficiency`` (a fraction in (0, 1]) and ``collectives_source``: the type's,
        else the preset's, else 1 and none."""
        eff = base.network_efficiency if base else 1.0
        src = base.collectives_source if base else ""
        if "network_efficiency" in t:
            epath: Path_ = (*path, "network_efficiency")
            eff = self.number(t["network_efficiency"], epath, "fraction of the NICs' line rate")
            if eff > 1:
                self.fail(
                    epath,
                    f"expected a fraction of the line rate in (0, 1], got {_got(t['network_efficiency'])}",
                )
        if "collectives_source" in t:
            src = self.string(t["collectives_source"], (*path, "collectives_source"), empty_ok=True)
        return eff, src

    def runtime_memory(self, t: dict[str, Any], path: Path_, base: RuntimeMemory) -> RuntimeMemory:
        """``base`` with the type's runtime-memory keys over it."""
        over: dict[str, Any] = {}
        for key, field_ in _RUNTIME_MIB.items():
            if key in t:
                over[field_] = round(self.number(t[key], (*path, key), "MiB", zero_ok=True) * MIB)
        if "allocator_fragmentation" in t:
            x = self.number(
                t["allocator_fragmentation"],
                (*path, "allocator_fragmentation"),
                "a fraction of the peak",
                zero_ok=True,
            )
            if x >= 1:
                self.fail(
                    (*path, "allocator_fragmentation"),
                    f"expected a fraction in [0, 1), got {_got(t['allocator_fragmentation'])}",
                )
            over["fragmentation"] = x
        if "runtime_memory_source" in t:
            over["source"] = self.string(
                t["runtime_memory_source"], (*path, "runtime_memory_source"), empty_ok=True
            )
        return replace(base, **over) if over else base

    def _unknown_preset(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(PRESETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown preset {name!r}{hint} (known presets: {', '.join(PRESETS)})"

    # -- the whole file -------------------------------------------------------------------------

    def matrix(
        self, v: object, key: str, n: int, what: str, to_si: Callable[[float], float], latency: bool
    ) -> Matrix:
        path: Path_ = (key,)
        if not isinstance(v, list) or len(v) != n:
            got = f"{len(v)} rows" if isinstance(v, list) else _got(v)
            self.fail(path, f"expected an array of {n} rows (one per GPU), got {got}")
        rows = []
        for i, row in enumerate(v):
            if not isinstance(row, list) or len(row) != n:
                got = f"{len(row)} entries" if isinstance(row, list) else _got(row)
                self.fail((key, i), f"expected an array of {n} numbers, got {got}")
            rows.append(
                tuple(
                    to_si(self.number(x, (key, i, j), what, zero_ok=latency or i == j, inf_ok=i == j))
                    for j, x in enumerate(row)
                )
            )
        return tuple(rows)

    def load(self) -> ClusterDescription:
        self.text = self.text.removeprefix("\ufeff")  # a UTF-8 byte order mark is no content
        _precheck(self.text, self.file)
        try:
            doc = tomllib.loads(self.text)
        except (RecursionError, ValueError) as e:  # beyond _precheck: never a traceback
            if not isinstance(e, tomllib.TOMLDecodeError):
                raise ClusterError(
                    f"invalid TOML: {type(e).__name__}: {str(e)[:200]}", source=self.file
                ) from None
            msg = str(e)
            m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
            line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
            msg = msg[: m.start()] if m else msg
            raise ClusterError(f"invalid TOML: {msg}", source=self.file, line=line, col=col) from None
        top = self.table(doc, (), _TOP_KEYS)
        name = self.string(top["name"], ("name",)) if "name" in top else Path(self.file).stem
        raw_types = top.get("types", {})
        if not isinstance(raw_types, dict):
            self.fail(("types",), f"expected a table of node types, got {_got(raw_types)}")
        types = {k: self.node_type(k, v) for k, v in raw_types.items()}
        self._check_device_names(types)
        if "nodes" not in top:
            self.fail(("nodes",), "missing required key (an array of [[nodes]] tables with type and count)")
        raw_nodes = top["nodes"]
        if not isinstance(raw_nodes, list) or not raw_nodes:
            self.fail(("nodes",), f"expected a non-empty array of [[nodes]] tables, got {_got(raw_nodes)}")
        nodes: list[NodeSpec] = []
        total = 0  # GPUs so far, bounded before the node list grows
        for i, entry in enumerate(raw_nodes):
            ent = self.table(entry, ("nodes", i), ("type", "count"))
            if "type" not in ent:
                self.fail(("nodes", i, "type"), "missing required key (a key of [types] or a preset name)")
            tname = self.string(ent["type"], ("nodes", i, "type"))
            node = types.get(tname) or PRESETS.get(tname)
            if node is None:
                defined = ", ".join(types) or "none"
                self.fail(
                    ("nodes", i, "type"),
                    f"unknown node type {tname!r} (types defined here: {defined}; "
                    f"presets: {', '.join(PRESETS)})",
                )
            count = self.device_count(ent.get("count", 1), ("nodes", i, "count"), "number of nodes")
            total += count * node.devices_per_node
            if exceeds(total, MAX_DEVICES):
                self.fail(("nodes", i, "count"), over("the cluster's GPU count", total, MAX_DEVICES))
            nodes.extend([node] * count)
        inter = None
        if "inter_node" in top:
            t = self.table(top["inter_node"], ("inter_node",), ("bandwidth_gb_s", "latency_us"))
            for k in ("bandwidth_gb_s", "latency_us"):
                if k not in t:
                    self.fail(("inter_node", k), "missing required key")
            bw = self.number(t["bandwidth_gb_s"], ("inter_node", "bandwidth_gb_s"), "GB/s")
            lat = self.number(t["latency_us"], ("inter_node", "latency_us"), "µs", zero_ok=True)
            inter = LinkSpec(bw * GIGA, us(lat))
        n = sum(node.devices_per_node for node in nodes)
        bwm = latm = None
        if "bandwidth_matrix_gb_s" in top:
            bwm = self.matrix(top["bandwidth_matrix_gb_s"], "bandwidth_matrix_gb_s", n, "GB/s", _giga, False)
        if "latency_matrix_us" in top:
            latm = self.matrix(top["latency_matrix_us"], "latency_matrix_us", n, "µs", us, True)
        return ClusterDescription(name, tuple(nodes), inter, bwm, latm, self.file)

    def _check_device_names(self, types: Mapping[str, NodeSpec]) -> None:
        seen: dict[str, tuple[str, DeviceSpec]] = {}
        for key, node in types.items():
            d = node.device
            other = seen.setdefault(d.name, (key, d))
            if other[1] != d:
                self.fail(
                    ("types", key, "gpu"),
                    f"device name {d.name!r} is also used by types.{other[0]} with different figures; "
                    "equal names must mean equal devices (give this one another name)",
                )


def read_cluster_toml(text: str, file: str = "<cluster>") -> ClusterDescription:
    """Parse and validate a cluster file's text, key by key; ``file`` names it in errors."""
    return _Loader(text, file).load()


def read_cluster_file(path: Path) -> ClusterDescription:
    """Read a cluster file and parse it (errors name the file, line:column and key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterError("no such file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterError(f"cannot read: {e}", source=str(path)) from None
    return read_cluster_toml(text, str(path))
