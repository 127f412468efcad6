"""Built-in node types, with figures from public spec sheets (the URL is in ``NodeSpec.source``).

Conventions:
- FLOP/s are dense peaks (NVIDIA's "with sparsity" tensor-core figures halved). A precision a
  device has no fast path for carries the figure of its fallback: V100 and T4 have no TF32 or
  BF16 tensor cores, so ``tf32 = bf16 = fp32`` there.
- Memory sizes are the marketed "GB" taken as GiB (a "32 GB" V100 has 32 GiB of HBM2).
- ``intra`` bandwidth is one GPU's NVLink/NVSwitch (or PCIe) bandwidth per direction, i.e. half
  the marketed bidirectional figure; ``inter`` is the node's aggregate network bandwidth per
  direction (all NICs), Gb/s divided by 8, and ``nics`` the number of those NICs, one per GPU
  or GPU pair on the DGX systems (rail-optimized: each GPU sends through the NIC beside it).
- **Collectives** (``NodeSpec.collectives``, ``network_efficiency``): on the DGX A100 and H100
  presets each ring collective runs inside the node at NCCL's published bus bandwidth (nccl-tests'
  busbw: below the NVLink line rate, as NCCL's SM copies reach about 80% of it; above it for
  all-reduce with NVLink SHARP on H100), and across nodes at the published fraction of the NICs'
  line rate; the sources are in ``collectives_source``. ``intra`` and ``inter`` stay the sheets'.
- **Estimates** (not on any sheet): every latency (NVLink/NVSwitch 3 µs, PCIe 8 µs, InfiniBand
  5 µs, AWS Ethernet 30-50 µs; the 3 µs matches NCCL's measured small-message times on a DGX
  A100, see ``collectives_source``), every kernel launch overhead (5 µs on GPUs), the p3.8xlarge
  intra-node bandwidth (see there), T4 fp64, and all of ``local``. A calibration profile
  (``distir calibrate``) replaces them with fitted values.
- **Matrix-product efficiency** (``GemmProfile``, the curve of ``distir.hardware.gemm``): SM
  counts from NVIDIA's architecture whitepapers; each GPU's published GEMM benchmark point
  (fraction of the dense peak at a shape) is named in its profile's ``source``.
- **Runtime memory** (``RuntimeMemory``, ``CUDA_RUNTIME``): what a PyTorch training process
  holds on a GPU besides tensors; its figures and their sources are listed there.

``node_record`` / ``clusters_json`` / ``render_clusters_table`` describe node types in the units
of the TOML cluster format (TFLOP/s, GB/s, GiB, µs), so a JSON row reads like a TOML node type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from distir.hardware.specs import (
    AttentionProfile,
    BusBandwidthCurve,
    DeviceSpec,
    GemmProfile,
    HostSpec,
    LinkSpec,
    NodeSpec,
    PowerProfile,
    RuntimeMemory,
    SeqPoints,
)
from distir.ir.types import DType

if TYPE_CHECKING:
    from rich.table import Table

    from distir.hardware.cluster import Cluster

TERA = 1e12
GIGA = 1e9
GIB = 1 << 30
MIB = 1 << 20

CUDA_RUNTIME = RuntimeMemory(
    context_bytes=512 * MIB,
    workspace_bytes=64 * MIB,
    comm_bytes=512 * MIB,
    fragmentation=0.05,
    source="CUDA context 512 MiB: estimate between the ~720 MiB measured on first CUDA use "
    "(https://discuss.pytorch.org/t/what-is-the-reason-for-pytorchs-gpu-memory-floor/73021) and the "
    "smaller context of CUDA lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2); "
    "workspaces 64 MiB: cuBLAS's per-stream workspace (PyTorch CUBLAS_WORKSPACE_CONFIG, up to "
    "4096 KiB x 8 = 32 MiB on Hopper, https://docs.pytorch.org/docs/stable/notes/randomness.html) plus "
    "cuBLASLt/cuDNN; NCCL 512 MiB: estimate from NCCL_BUFFSIZE (4 MiB per channel and peer, send and "
    "receive, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) over a few "
    "communicators of up to 16 channels; allocator 5% of the peak: estimate of the caching allocator's "
    "reserved-but-unallocated memory (https://docs.pytorch.org/docs/stable/notes/cuda.html#memory-management)",
)
"""What a PyTorch training process holds on a GPU besides its tensors (the presets' default)."""

# the MAMF table at a fixed commit (mamf-finder v2: 30 s of warm-up before measuring, random
# inputs, so the clocks are those a GPU holds under sustained matmul load)
_MAMF = (
    "https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/compute/"
    "accelerator/README.md#maximum-achievable-matmul-flops-comparison-table"
)
_XLA_TABLE = (
    "https://github.com/openxla/xla/blob/e97611c4c41c1f2dd331aca646792089f7f86b66/xla/service/gpu/"
    "model/matmul_interpolator_data.h"
)
# SMs NCCL's kernels hold while a collective runs: one CTA per channel, each alone on its SM
# (NCCL's maintainer: "NCCL CTAs won't share an SM with compute kernels", and NCCL launches the
# fewest channels that reach the links' speed), https://github.com/NVIDIA/nccl/issues/689
_NCCL_SM = "one CTA per NCCL channel, alone on its SM (https://github.com/NVIDIA/nccl/issues/689)"
_V100_GEMM = GemmProfile(
    sms=80,
    fraction=83 / 125,
    fp32_fraction=(83 / 7) / 15.7,
    anchor=(8192, 8192, 8192),
    source="Markidis et al. 2018, 'NVIDIA Tensor Core Programmability, Performance & Precision' "
    "(IPDPSW, arXiv:1803.04014): cuBLAS GEMM on V100 up to 83 TFLOP/s mixed precision (of 125), "
    "7x its fp32 SGEMM; anchor: large square (8192^3, estimate of the paper's largest sizes)",
    comm_sms=6,
    comm_source=f"{_NCCL_SM}; 6 channels: NCCL's ring graph of a 4-GPU NVLink V100 server "
    "(https://github.com/NVIDIA/nccl/issues/713); estimate for an NVSwitch DGX-2, no published channel "
    "count found (NCCL's search, src/graph/search.cc, gives 3 rings at 40 GB/s over its 6 NVLinks, "
    "doubled by ncclTopoDupChannels)",
)
_A100_GEMM = GemmProfile(
    sms=108,
    fraction=271.2 / 312,
    anchor=(1024, 10240, 5120),
    source=f"MAMF table (bf16 torch.matmul, mamf-finder v2, torch 2.6.0+cu126): A100 SXM 271.2 of 312 "
    f"TFLOP/s at 1024x10240x5120, the best of its sweep over shapes, {_MAMF}",
    anchor_is_max=True,
    comm_sms=24,
    comm_source=f"{_NCCL_SM}; 24 channels on an 8-GPU NVSwitch A100 node (NCCL_DEBUG log 'Channel 23/24', "
    "https://github.com/NVIDIA/nccl-tests/issues/100)",
)
_PERSISTENT_GEMM = (
    "persistent: cuBLAS's Hopper GEMM kernels launch one CTA per SM (132 on an H100), each working "
    "through its own tiles, so beside NCCL's CTAs the rest run as a second wave: in FSDP training on "
    "H100 the matmuls 'take 2x as long to complete when they are overlapped with a NCCL kernel' "
    "(https://github.com/pytorch/pytorch/issues/143988); this 'wave quantization can double the latency "
    "of the matmul kernels' (PyTorch's opt-in sm_carveout, https://github.com/pytorch/pytorch/pull/147966, "
    "whose text also says earlier GPUs hid a tile's start and end with several CTAs per SM); CUTLASS's "
    "Hopper tile schedulers are static, 'Statically-scheduled persistent kernels will run 2x slower when "
    "wave quantization occurs' (https://github.com/NVIDIA/cutlass/issues/2471); an Nsight trace of a "
    "132-CTA GEMM beside a 24-CTA ncclAllGather on an H100: its time nearly doubles, 80% to 47% of peak "
    "(https://forums.developer.nvidia.com/t/compute-communication-overlap-causes-severe-gemm-performance-"
    "degradation-because-of-tail-effect/337991)"
)
_H100_GEMM = GemmProfile(
    sms=132,
    fraction=794.5 / 989,
    anchor=(2048, 2048, 13312),
    source=f"MAMF table (bf16 torch.matmul, mamf-finder v2, torch 2.7.0+cu126): H100 SXM 794.5 of 989 "
    f"TFLOP/s at 2048x2048x13312, the best of its sweep over shapes, {_MAMF}; shape constants fitted "
    f"to XLA's measured H100 table of 375 bf16 GEMMs ({_XLA_TABLE}; bench/fit_gemm.py)",
    anchor_is_max=True,
    comm_sms=24,
    comm_source=f"{_NCCL_SM}; 24 CTAs: an FSDP-style ncclAllGather on an H100 SXM measured with Nsight "
    "Systems (https://forums.developer.nvidia.com/t/compute-communication-overlap-causes-severe-gemm-"
    "performance-degradation-because-of-tail-effect/337991)",
    persistent=True,
    persistent_source=_PERSISTENT_GEMM,
)
_H100_GEMM_FP8 = replace(
    _H100_GEMM,
    fraction=1402.6 / 1979,
    anchor=(1024, 9216, 14336),
    source=f"MAMF table, FP8 (float8_e4m3fn inputs, mamf-finder v2, torch 2.7.0+cu126): H100 SXM 1402.6 "
    f"of 1979 TFLOP/s at 1024x9216x14336, the best of its sweep over shapes, {_MAMF}; the bf16 "
    "curve's shape constants (no measured table of float8 GEMMs by shape found)",
)
_T4_GEMM = GemmProfile(
    sms=40,
    fraction=0.75,
    anchor=(8192, 8192, 8192),
    source="estimate: no published T4 GEMM benchmark found; the former flat 75% at a large square GEMM",
    comm_sms=2,
    comm_source=f"{_NCCL_SM}; 2 on a PCIe system with one NIC (NCCL's maintainer, ibid.)",
)


_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
_FA3_PAPER = (
    "Shah et al. 2024, 'FlashAttention-3' (arXiv:2407.08608), Fig. 5 (forward, head dim 128, "
    "with and without causal mask) and Fig. 6 (backward, head dim 128, no mask), H100 80GB SXM5"
)


def _points(tflops: tuple[float, ...]) -> SeqPoints:
    return tuple(zip(_SEQS, tflops, strict=True))


_H100_FA2 = AttentionProfile(
    kernel="fa2",
    peak_tflops=989.5,
    head_dim=128,
    forward=_points((309, 350, 362, 368, 370, 370)),
    forward_causal=_points((191, 260, 298, 319, 333, 335)),
    backward=_points((214, 260, 291, 310, 318, 322)),
    source=f"FlashAttention-2 (flash-attn, PyTorch SDPA's flash backend): {_FA3_PAPER}",
)
_H100_CUDNN = AttentionProfile(
    kernel="cudnn",
    peak_tflops=989.5,
    head_dim=128,
    forward=_points((497, 574, 617, 609, 600, 595)),
    forward_causal=_points((315, 410, 484, 518, 529, 539)),
    backward=_points((305, 408, 465, 499, 518, 516)),
    source="cuDNN fused attention (Transformer Engine's FusedAttention, PyTorch SDPA's cuDNN "
    f"backend): {_FA3_PAPER}",
)


def _scaled(
    profile: AttentionProfile, peak_tflops: float, forward: float, backward: float, source: str
) -> AttentionProfile:
    """``profile``'s curves rescaled so their long-sequence, unmasked speeds are ``forward`` and
    ``backward`` of ``peak_tflops``: the same kernel's shape on another GPU whose benchmark
    states only those plateaus."""

    def scale(pts: SeqPoints, plateau: float, top: float) -> SeqPoints:
        return tuple((s, t * plateau * peak_tflops / top) for s, t in pts)

    fwd_top, bwd_top = profile.forward[-1][1], profile.backward[-1][1]
    return AttentionProfile(
        kernel=profile.kernel,
        peak_tflops=peak_tflops,
        head_dim=profile.head_dim,
        forward=scale(profile.forward, forward, fwd_top),
        forward_causal=scale(profile.forward_causal, forward, fwd_top),
        backward=scale(profile.backward, backward, bwd_top),
        source=source,
    )


_A100_FA2 = _scaled(
    _H100_FA2,
    312.0,
    0.73,
    0.63,
    "FlashAttention-2 on A100: Dao 2023, 'FlashAttention-2' (arXiv:2307.08691), §4.1: up to 73% of "
    "the theoretical peak in the forward pass and 63% in the backward; by sequence length and mask "
    "the shape of the same kernel's H100 curves (estimate), " + _FA3_PAPER,
)


_FA2_FIG4 = (
    "Dao 2023, 'FlashAttention-2' (arXiv:2307.08691), Fig. 4 (A100 80GB SXM4) and Fig. 7 (H100 80GB "
    "SXM5, no Hopper instructions), as flash-attention's README 'Performance' prints them "
    "(assets/flash2_a100_fwd_bwd_benchmark.png, assets/flash2_h100_fwd_bwd_benchmark.png, "
    "Dao-AILab/flash-attention 4f285b35), bars 'FlashAttention': forward + backward, with and "
    "without causal mask"
)
_TRITON_FA_SOURCE = (
    "FlashAttention in Triton (flash-attn's flash_attn/flash_attn_triton.py; llm-foundry's copy "
    "llmfoundry/models/layers/flash_attn_triton.py, its attn_impl: triton), which publishes no TFLOP/s "
    "of its own: its author states its forward + backward 'slightly slower than CUDA forward + "
    "backward' (the FlashAttention CUDA kernel, v1; flash_attn_triton.py's docstring) and llm-foundry "
    "'slightly faster than flash' (v1; TUTORIAL.md at v0.3.0), so it runs at FlashAttention v1's "
    "published speed: " + _FA2_FIG4 + "; forward and backward both at the forward + backward "
    "figure (the split is not published)"
)


def _fwd_bwd(
    peak_tflops: float, head_dim: int, full: tuple[float, ...], causal: tuple[float, ...]
) -> AttentionProfile:
    """FlashAttention in Triton from a forward + backward benchmark only: both passes at its
    speed, so a forward with its backward takes the published time."""
    return AttentionProfile(
        kernel="fa-triton",
        peak_tflops=peak_tflops,
        head_dim=head_dim,
        forward=_points(full),
        forward_causal=_points(causal),
        backward=_points(full),
        backward_causal=_points(causal),
        source=_TRITON_FA_SOURCE + f" (head dimension {head_dim})",
    )


# FlashAttention v1's bars, without and with causal mask, 512 ... 16k tokens.
_A100_FA_TRITON = (
    _fwd_bwd(312.0, 64, (91, 92, 104, 108, 110, 110), (58, 70, 77, 87, 92, 97)),
    _fwd_bwd(312.0, 128, (76, 72, 76, 80, 82, 83), (55, 62, 69, 76, 80, 83)),
)
# On H100 the kernel runs as compiled for Ampere: llm-foundry's triton-pre-mlir (Triton's pre-MLIR
# backend through LLVM 11, which does not know sm_90: TUTORIAL.md at v0.3.0) emits mma.sync, not
# Hopper's wgmma/TMA, as FlashAttention v1's CUDA kernel does; the same figure's H100 bars.
_H100_FA_TRITON = (
    _fwd_bwd(989.5, 64, (157, 159, 161, 161, 166, 168), (104, 123, 136, 138, 149, 156)),
    _fwd_bwd(989.5, 128, (127, 127, 128, 131, 137, 139), (98, 109, 108, 126, 135, 137)),
)


def us(x: float) -> float:
    """Microseconds to seconds (a division, so that 5 µs is exactly ``5e-06``)."""
    return x / 1e6


def _gpu(
    name: str,
    fp32: float,
    tf32: float,
    fp16: float,
    bf16: float,
    fp64: float,
    hbm_gb_s: float,
    mem_gib: int,
    gemm: GemmProfile,
    launch_us: float = 5.0,
    attention: tuple[AttentionProfile, ...] = (),
    fp8: float | None = None,
    gemm_fp8: GemmProfile | None = None,
) -> DeviceSpec:
    """A DeviceSpec from sheet units: TFLOP/s, GB/s, GiB, µs."""
    return DeviceSpec(
        name=name,
        fp32=fp32 * TERA,
        tf32=tf32 * TERA,
        fp16=fp16 * TERA,
        bf16=bf16 * TERA,
        fp64=fp64 * TERA,
        memory_bandwidth=hbm_gb_s * GIGA,
        memory_bytes=mem_gib * GIB,
        launch_overhead_s=us(launch_us),
        gemm=gemm,
        runtime=CUDA_RUNTIME,
        attention=attention,
        fp8=None if fp8 is None else fp8 * TERA,
        gemm_fp8=gemm_fp8,
    )


def _link(gb_s: float, latency_us: float) -> LinkSpec:
    return LinkSpec(gb_s * GIGA, us(latency_us))


V100_SXM3_32GB = _gpu("V100-SXM3-32GB", 15.7, 15.7, 125.0, 15.7, 7.8, 900.0, 32, _V100_GEMM)
V100_SXM2_16GB = _gpu("V100-SXM2-16GB", 15.7, 15.7, 125.0, 15.7, 7.8, 900.0, 16, _V100_GEMM)
A100_SXM_80GB = _gpu(
    "A100-SXM-80GB",
    19.5,
    156.0,
    312.0,
    312.0,
    9.7,
    2039.0,
    80,
    _A100_GEMM,
    attention=(_A100_FA2, *_A100_FA_TRITON),
)
H100_SXM_80GB = _gpu(
    "H100-SXM-80GB",
    67.0,
    494.5,
    989.5,
    989.5,
    34.0,
    3350.0,
    80,
    _H100_GEMM,
    attention=(_H100_FA2, _H100_CUDNN, *_H100_FA_TRITON),
    fp8=1979.0,  # the sheet's 3,958 TFLOP/s FP8 with sparsity, halved
    gemm_fp8=_H100_GEMM_FP8,
)
# T4 fp64 is 1/32 of fp32 (not on the sheet; estimate).
T4_16GB = _gpu("T4-16GB", 8.1, 8.1, 65.0, 8.1, 0.25, 320.0, 16, _T4_GEMM)

# NCCL's achieved bus bandwidth (nccl-tests' busbw: the per-GPU link rate at which the
# collective's ring formula gives the measured time), the collectives' (B, α) inside a node
# (NodeSpec.collectives), and the fraction of a NIC's line rate NCCL reaches across nodes.
_ML_ENG_NET = (
    "https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/network/README.md"
)
_NCCL_TUNING = (
    "https://github.com/NVIDIA/nccl/blob/5067397c2676d5aed50042fc39e5c8ee96eb0027/src/graph/tuning.cc"
)
_LATENCY_NOTE = (
    "latency 3 us a ring step: an 8-GPU DGX A100 all_reduce_perf takes 43.8 us at 32 KiB, 14 steps "
    f"of 3.1 us ({_ML_ENG_NET}, 'Real network throughput'); NCCL's own model charges 3.4 us a ring "
    f"step on NVLink with its Simple protocol ({_NCCL_TUNING}, hwLatencies)"
)
_A100_NCCL = (
    "NCCL on DGX A100: inside the node every ring collective at 230 GB/s of NVLink3's 300: NCCL's "
    "maintainer, 'each NVLink has a line rate of 25GB/s ... ~20GB/s effective bandwidth with a 128B "
    "payload size [SM copies] ... some other bottlenecks on the GPUs limits it to ~230GB/s' "
    "(https://github.com/NVIDIA/nccl-tests/issues/149); measured: all_reduce_perf on 8 A100, busbw "
    f"234.89 GB/s at 16 GiB ({_ML_ENG_NET}, 'Real network throughput'); {_LATENCY_NOTE}. Across "
    "nodes 96% of each 200 Gb/s HDR NIC: 'On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards "
    "and we measure 192GB/s AllReduce BusBW' (NCCL team, https://github.com/NVIDIA/nccl/issues/812), "
    "i.e. 24 of 25 GB/s a NIC, 'what we see ourselves in general on perfect setups' "
    "(https://github.com/NVIDIA/nccl-tests/issues/160)"
)
_H100_NCCL = (
    "NCCL on DGX H100 (NVLink4 via NVSwitch3, 450 GB/s line rate): NCCL's maintainer, 'With the "
    "protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can "
    "observe as BusBw when running non-allreduce operations' and all-reduce, on NVLink SHARP by "
    "default, 'On 8 GPUs, you should reach a peak busBw of ~480GB/s' "
    "(https://github.com/NVIDIA/nccl-tests/issues/212; the same 370 and 480 on NVIDIA's GTC 2025 "
    "session S72583, https://www.nvidia.com/en-us/on-demand/session/gtc25-s72583/, as reproduced in "
    f"{_ML_ENG_NET}, 'SHARP'): all_reduce 480, broadcast and reduce 370; measured reduce_scatter 360 and "
    "all_gather 350 GB/s (nccl-tests on H100, https://github.com/NVIDIA/nccl/issues/1281; 362.9 and "
    f"361.4 on 8 H200 of the same NVLink4 fabric at 16 GiB, {_ML_ENG_NET}); NVLS serves groups of more "
    f"than 4 GPUs only (a smaller all-reduce rings: its measured curve on 4 GPUs); {_LATENCY_NOTE}. Across "
    "nodes 94% of each 400 Gb/s NDR NIC: 'For NDR @ 400Gbps you should see "
    "46-48GB/s per NIC' (NCCL team, https://github.com/NVIDIA/nccl-tests/issues/290; 'up to "
    "48-49GB/s per NIC', https://github.com/NVIDIA/nccl-tests/issues/267): 47 of 50 GB/s"
)


# Measured bus bandwidth by message size from 32 KiB in powers of two: all-reduce on one 8-GPU
# node to 16 GiB (ml-engineering's network chapter at a fixed commit, 'Real network
# throughput'); all-gather and reduce-scatter on 4 H100s of an 8-GPU NVSwitch node to 8 GiB
# (nccl-tests, out-of-place busbw).
_ALLREDUCE_SIZES = tuple(1 << k for k in range(15, 35))
_H100_4GPU_SIZES = tuple(1 << k for k in range(15, 34))
_A100_ALLREDUCE_BUSBW = (
    1.31, 2.45, 4.43, 7.47, 11.41, 18.00, 36.18, 72.33, 109.93, 106.16,
    138.49, 171.54, 176.92, 194.07, 222.72, 229.04, 231.41, 233.88, 234.61, 234.89,
)  # fmt: skip
_H200_ALLREDUCE_BUSBW = (
    1.44, 2.93, 5.73, 11.74, 23.94, 39.93, 64.53, 107.16, 155.53, 219.89,
    275.84, 346.51, 401.93, 436.15, 450.29, 463.58, 469.17, 473.10, 477.45, 482.26,
)  # fmt: skip
_H100_4GPU_ALLREDUCE_BUSBW = (
    1.92, 3.75, 7.15, 14.20, 27.44, 58.18, 100.59, 144.94, 200.12, 246.47,
    285.66, 308.92, 325.89, 340.82, 348.36, 357.03, 361.00, 363.25, 366.37,
)  # fmt: skip
_H100_ALLGATHER_BUSBW = (
    1.30, 2.47, 4.64, 8.73, 18.44, 35.00, 69.65, 81.09, 110.23, 186.64,
    229.34, 258.16, 287.39, 305.51, 317.53, 325.27, 334.16, 339.82, 343.92,
)  # fmt: skip
_H100_REDUCESCATTER_BUSBW = (
    1.11, 2.13, 4.08, 7.85, 15.06, 30.28, 60.80, 87.50, 146.69, 201.26,
    237.97, 266.04, 289.74, 303.62, 316.60, 330.17, 339.70, 341.21, 350.34,
)  # fmt: skip
_A100_CURVE_SOURCE = (
    f"all-reduce by size: nccl-tests all_reduce_perf -b 32k -e 16G -f 2 -g 8 on one 8-GPU A100 node, "
    f"busbw column ({_ML_ENG_NET}, 'Real network throughput', the first table)"
)
_H100_CURVE_SOURCE = (
    "all-reduce by size: all_reduce_bench.py (torch.distributed, blocking calls timed with CUDA "
    "events; NVLink SHARP from 2 MiB, ring LL below, as NCCL's log reports there) on one 8x H200 node, "
    f"the same NVLink4 / NVSwitch3 fabric as a DGX H100, busbw column ({_ML_ENG_NET}, 'Real network "
    "throughput', the second table); no published 8-GPU H100 all-reduce sweep found"
)
_H100_4GPU_RUN = (
    "nccl-tests 2.18.3 (NCCL 2.29.2) -b 8 -e 8G -f 2 -g 4 on 4 H100 80GB SXM5 of an NVSwitch node, "
    "out-of-place busbw column, 32 KiB to 8 GiB (https://github.com/waynehacking8/nccl-collectives-bench/"
    "blob/f9883f88eb4337d3a2c515089b04a587cf104c83/results/{}.txt, the run its README's results table "
    "reports)"
)


def _curve(sizes: tuple[int, ...], sweep: tuple[float, ...], ranks: int, source: str) -> BusBandwidthCurve:
    """A bus bandwidth curve on ``ranks`` GPUs from GB/s figures at ``sizes``."""
    return BusBandwidthCurve(tuple((m, b * GIGA) for m, b in zip(sizes, sweep, strict=True)), ranks, source)


_A100_CURVES = (("allreduce", _curve(_ALLREDUCE_SIZES, _A100_ALLREDUCE_BUSBW, 8, _A100_CURVE_SOURCE)),)
_H100_CURVES = (
    ("allreduce", _curve(_ALLREDUCE_SIZES, _H200_ALLREDUCE_BUSBW, 8, _H100_CURVE_SOURCE)),
    (
        "allreduce",
        _curve(
            _H100_4GPU_SIZES,
            _H100_4GPU_ALLREDUCE_BUSBW,
            4,
            "all-reduce by size on 4 GPUs (NCCL rings there; NVLS from 6 GPUs: the repository's "
            "results/scaling_attributed/report.md at 38c093e): " + _H100_4GPU_RUN.format("all_reduce"),
        ),
    ),
    (
        "allgather",
        _curve(
            _H100_4GPU_SIZES,
            _H100_ALLGATHER_BUSBW,
            4,
            "all-gather by size: " + _H100_4GPU_RUN.format("all_gather"),
        ),
    ),
    (
        "reducescatter",
        _curve(
            _H100_4GPU_SIZES,
            _H100_REDUCESCATTER_BUSBW,
            4,
            "reduce-scatter by size: " + _H100_4GPU_RUN.format("reduce_scatter"),
        ),
    ),
)


def _nccl(**gb_s: float) -> tuple[tuple[str, LinkSpec], ...]:
    """Per-collective links inside a node: NCCL's published bus bandwidth (GB/s), 3 µs a step."""
    return tuple((k, _link(v, 3.0)) for k, v in gb_s.items())


_V100_SHEET = (
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
)

# The host of an Azure NDm A100 v4 VM: 96 AMD EPYC 7V12 (Rome) cores and 1,900 GiB (Azure's
# NDm A100 v4 page); 2 sockets of Rome's 8 DDR4-3200 channels, 204.8 GB/s each (AMD's EPYC 7002
# specifications); Zen 2's two 256-bit FMA pipes, 32 fp32 FLOPs a cycle, at the 7V12's 2.45 GHz
# base clock; each GPU on a PCIe 4.0 x16 link, 16 GT/s × 16 lanes at 128b/130b = 31.5 GB/s per
# direction (the PCIe 4.0 base specification). The fractions a memory-bound pass and a pinned copy
# reach (80% each) and the link latency (10 µs) are estimates.
_NDM_HOST = HostSpec(
    name="2x AMD EPYC 7V12 (96 cores)",
    cores=96,
    flops=96 * 2.45e9 * 32,
    memory_bandwidth=2 * 204.8 * GIGA,
    memory=1900 * GIB,
    pcie=LinkSpec(16e9 * 16 * 128 / 130 / 8, us(10)),
    memory_efficiency=0.8,
    pcie_efficiency=0.8,
    source="https://learn.microsoft.com/en-us/azure/virtual-machines/ndm-a100-v4-series (96 AMD EPYC 7V12 "
    "cores, 1900 GiB) ; https://www.amd.com/en/products/processors/server/epyc/7002-series.html (8 DDR4-3200 "
    "channels a socket, 204.8 GB/s) ; PCIe 4.0 x16: 31.5 GB/s per direction ; 80% of memory and link "
    "bandwidth and 10 us latency: estimates",
)

_PRESETS: dict[str, NodeSpec] = {
    # DGX-2 (the DistIR paper's machine): 16 V100 on NVSwitch, each GPU 6 NVLink2 links of
    # 25 GB/s per direction = 150 GB/s/dir (300 GB/s bidirectional); 8 × 100 Gb/s EDR IB.
    "dgx2-v100": NodeSpec(
        name="dgx2-v100",
        device=V100_SXM3_32GB,
        devices_per_node=16,
        intra=_link(150.0, 3.0),
        inter=_link(8 * 100 / 8, 5.0),
        nics=8,
        source=f"https://www.nvidia.com/en-us/data-center/dgx-2/ ; {_V100_SHEET}",
    ),
    # DGX A100: NVLink3 600 GB/s bidirectional per GPU via NVSwitch; 8 × 200 Gb/s HDR IB.
    "dgx-a100": NodeSpec(
        name="dgx-a100",
        device=A100_SXM_80GB,
        devices_per_node=8,
        intra=_link(300.0, 3.0),
        inter=_link(8 * 200 / 8, 5.0),
        nics=8,
        source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf ; "
        "https://www.nvidia.com/en-us/data-center/dgx-a100/",
        collectives=_nccl(allreduce=230, allgather=230, reducescatter=230, broadcast=230, reduce=230),
        network_efficiency=24 / 25,
        collectives_source=_A100_NCCL,
        busbw_curves=_A100_CURVES,
    ),
    # DGX H100: NVLink4 900 GB/s bidirectional per GPU via NVSwitch; 8 × 400 Gb/s NDR IB.
    # Tensor peaks are the sheet's sparse figures halved (TF32 989 → 494.5, BF16 1979 → 989.5,
    # FP8 3958 → 1979).
    "h100": NodeSpec(
        name="h100",
        device=H100_SXM_80GB,
        devices_per_node=8,
        intra=_link(450.0, 3.0),
        inter=_link(8 * 400 / 8, 5.0),
        nics=8,
        source="https://www.nvidia.com/en-us/data-center/h100/ ; "
        "https://www.nvidia.com/en-us/data-center/dgx-h100/",
        collectives=_nccl(allreduce=480, allgather=350, reducescatter=360, broadcast=370, reduce=370),
        network_efficiency=47 / 50,
        collectives_source=_H100_NCCL,
        busbw_curves=_H100_CURVES,
    ),
    # p3.8xlarge: 4 V100-SXM2-16GB on half of a DGX-1-style hybrid cube-mesh: a GPU pair shares
    # 1 or 2 NVLink2 links of 25 GB/s/dir; 50 GB/s is an estimate for a ring. 10 Gb/s network.
    "p3.8xlarge": NodeSpec(
        name="p3.8xlarge",
        device=V100_SXM2_16GB,
        devices_per_node=4,
        intra=_link(50.0, 3.0),
        inter=_link(10 / 8, 50.0),
        source=f"https://aws.amazon.com/ec2/instance-types/p3/ ; {_V100_SHEET}",
    ),
    # g4dn.12xlarge: 4 T4 on PCIe Gen3 x16 (15.75 GB/s/dir, no NVLink); 50 Gb/s network.
    "g4dn.12xlarge": NodeSpec(
        name="g4dn.12xlarge",
        device=T4_16GB,
        devices_per_node=4,
        intra=_link(15.75, 8.0),
        inter=_link(50 / 8, 30.0),
        source="https://aws.amazon.com/ec2/instance-types/g4/ ; "
        "https://www.nvidia.com/en-us/data-center/tesla-t4/",
    ),
    # This machine's CPU as one device. Placeholder figures of a modest multicore CPU; loopback
    # "links" for a second local process; a 10 Gb/s network between machines.
    "local": NodeSpec(
        name="local",
        device=DeviceSpec(
            name="cpu (uncalibrated)",
            fp32=100 * GIGA,
            tf32=100 * GIGA,
            fp16=100 * GIGA,
            bf16=100 * GIGA,
            fp64=50 * GIGA,
            memory_bandwidth=20 * GIGA,
            memory_bytes=16 * GIB,
            launch_overhead_s=us(2),
        ),
        devices_per_node=1,
        intra=_link(5.0, 20.0),
        inter=_link(10 / 8, 50.0),
        source="uncalibrated placeholder; `distir calibrate` will fill it",
    ),
}


# Azure NDm A100 v4 (the DeepSpeed-on-Azure post's VMs): the DGX A100's 8 A100 80GB on NVSwitch
# with a 200 Gb/s HDR link per GPU, and its host (``_NDM_HOST``), where ZeRO-Offload runs its
# optimizer
_PRESETS["ndm-a100-v4"] = replace(
    _PRESETS["dgx-a100"],
    name="ndm-a100-v4",
    source="https://learn.microsoft.com/en-us/azure/virtual-machines/ndm-a100-v4-series ; "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    host=_NDM_HOST,
)

PRESETS: Mapping[str, NodeSpec] = MappingProxyType(_PRESETS)
"""Built-in node types by preset name (read-only)."""


def node_record(key: str, node: NodeSpec) -> dict[str, Any]:
    """One node type as plain data in the TOML format's units (TFLOP/s, GB/s, GiB, µs)."""
    d = node.device
    rec: dict[str, Any] = {
        "preset": key,
        "gpu": d.name,
        "devices_per_node": node.devices_per_node,
        "fp32_tflops": d.fp32 / TERA,
        "tf32_tflops": d.tf32 / TERA,
        "fp16_tflops": d.fp16 / TERA,
        "bf16_tflops": d.bf16 / TERA,
        "fp64_tflops": d.peak_flops(DType.f64) / TERA,
        "memory_bandwidth_gb_s": d.memory_bandwidth / GIGA,
        "memory_gib": d.memory_bytes / GIB,
        "launch_overhead_us": d.launch_overhead_s * 1e6,
        "intra_bandwidth_gb_s": node.intra.bandwidth / GIGA,
        "intra_latency_us": node.intra.latency_s * 1e6,
        "inter_bandwidth_gb_s": node.inter.bandwidth / GIGA,
        "inter_latency_us": node.inter.latency_s * 1e6,
        "nics": node.nics,
        "source": node.source,
    }
    # the GEMM and runtime figures unrounded: a row read back as a TOML node type is the preset
    return (
        {k: round(v, 6) if isinstance(v, float) else v for k, v in rec.items()}
        | _gemm_record(d)
        | _fp8_record(d)
        | _runtime_record(d)
        | _calibrated_record(node)
        | _host_record(node)
    )


def _host_record(node: NodeSpec) -> dict[str, Any]:
    """The node's host (``HostSpec``) as a table in the TOML format's units (none without one)."""
    h = node.host
    if h is None:
        return {}
    return {
        "host": {
            "name": h.name,
            "cores": h.cores,
            "tflops": h.flops / TERA,
            "memory_bandwidth_gb_s": h.memory_bandwidth / GIGA,
            "memory_efficiency": h.memory_efficiency,
            "memory_gib": h.memory / GIB,
            "pcie_gb_s": h.pcie.bandwidth / GIGA,
            "pcie_latency_us": h.pcie.latency_s * 1e6,
            "pcie_efficiency": h.pcie_efficiency,
            "source": h.source,
        }
    }


def _host_note(rec: dict[str, Any]) -> str:
    """The caption line of a node type's host (none without one)."""
    h = rec.get("host")
    if h is None:
        return ""
    return (
        f"\n    host (ZeRO-Offload's optimizer): {h['name']}, {h['tflops']:.2f} fp32 TFLOP/s, memory "
        f"{h['memory_bandwidth_gb_s']:g} GB/s at {100 * h['memory_efficiency']:.0f}%, "
        f"{h['memory_gib']:g} GiB; "
        f"each GPU's PCIe link {h['pcie_gb_s']:.1f} GB/s per direction at {100 * h['pcie_efficiency']:.0f}%, "
        f"{h['pcie_latency_us']:g} us: {h['source']}"
    )


def _fp8_record(d: DeviceSpec) -> dict[str, Any]:
    """The FP8 peak and float8 GEMM curve in TOML keys (none without an FP8 peak)."""
    if d.fp8 is None:
        return {}
    rec: dict[str, Any] = {"fp8_tflops": round(d.fp8 / TERA, 6)}
    g = d.gemm_fp8
    if g is not None:
        rec |= {"fp8_matmul_efficiency": g.fraction, "fp8_matmul_anchor": list(g.anchor)}
        rec |= {"fp8_matmul_anchor_is_max": g.anchor_is_max, "fp8_matmul_source": g.source}
    return rec


def _gemm_record(d: DeviceSpec) -> dict[str, Any]:
    """The matrix-product profile in TOML keys (none without a profile)."""
    g = d.gemm
    if g is None:
        return {}
    rec: dict[str, Any] = {"sm_count": g.sms, "matmul_efficiency": g.fraction}
    if g.fp32_fraction is not None:
        rec["matmul_fp32_efficiency"] = g.fp32_fraction
    rec |= {"matmul_anchor": list(g.anchor), "matmul_source": g.source}
    if g.anchor_is_max:
        rec["matmul_anchor_is_max"] = True
    if g.comm_sms:
        rec |= {"comm_sm_count": g.comm_sms, "comm_sm_source": g.comm_source}
    if g.persistent:
        rec |= {"matmul_persistent": True, "matmul_persistent_source": g.persistent_source}
    return rec


def _runtime_record(d: DeviceSpec) -> dict[str, Any]:
    r = d.runtime
    return {
        "cuda_context_mib": r.context_bytes / MIB,
        "workspace_mib": r.workspace_bytes / MIB,
        "comm_buffers_mib": r.comm_bytes / MIB,
        "allocator_fragmentation": r.fragmentation,
        "runtime_memory_source": r.source,
    }


def _attention_record(a: AttentionProfile) -> dict[str, Any]:
    rec: dict[str, Any] = {"peak_tflops": a.peak_tflops, "head_dim": a.head_dim}
    for k in ("forward", "forward_causal", "backward", "backward_causal"):
        pts = getattr(a, k)
        if pts is not None:
            rec[k] = [[s, t] for s, t in pts]
    return rec | {"source": a.source}


def _calibrated_record(node: NodeSpec) -> dict[str, Any]:
    """Measured rates per op family, fused-attention profiles and links per collective, as TOML
    tables (none if absent)."""
    rec: dict[str, Any] = {}
    if node.device.families:
        rec["families"] = {
            k: {"flop_efficiency": r.flop, "memory_efficiency": r.memory, "launch_us": r.launch_s * 1e6}
            for k, r in node.device.families
        }
    if node.device.attention:
        by_kernel: dict[str, list[dict[str, Any]]] = {}
        for a in node.device.attention:
            by_kernel.setdefault(a.kernel, []).append(_attention_record(a))
        # one table per kernel, an array of tables where it is published at several head dims
        rec["attention"] = {k: v[0] if len(v) == 1 else v for k, v in by_kernel.items()}
    if (p := node.device.power) is not None:
        curve = [[w, r] for w, r in p.curve]
        rec["power"] = {
            "limit_w": p.limit_w,
            "reference_w": p.reference_w,
            "curve": curve,
            "source": p.source,
        }
    if node.collectives:
        rec["collectives"] = {
            k: {"bandwidth_gb_s": ln.bandwidth / GIGA, "latency_us": ln.latency_s * 1e6}
            for k, ln in node.collectives
        }
    if node.busbw_curves:
        by_name: dict[str, list[dict[str, Any]]] = {}
        for k, c in node.busbw_curves:
            by_name.setdefault(k, []).append(
                {"points": [[m, b / GIGA] for m, b in c.points], "ranks": c.ranks, "source": c.source}
            )
        # one table per collective, an array of tables where it is measured on several group sizes
        rec["busbw_curves"] = {k: v[0] if len(v) == 1 else v for k, v in by_name.items()}
    if node.network_efficiency != 1.0:
        rec["network_efficiency"] = node.network_efficiency
    if node.collectives_source:
        rec["collectives_source"] = node.collectives_source
    return rec


def _curves_note(rec: dict[str, Any]) -> str:
    """The caption lines of a node type's measured bus bandwidth curves (none without one)."""
    out = ""
    for k, entry in rec.get("busbw_curves", {}).items():
        for c in entry if isinstance(entry, list) else [entry]:
            (m0, b0), (m1, b1) = c["points"][0], c["points"][-1]
            out += (
                f"\n    {k} bus bandwidth by size on {c['ranks']} GPUs ({len(c['points'])} points, "
                f"{b0:g} GB/s at {m0} B to {b1:g} at {m1} B, capped at the figure above): {c['source']}"
            )
    return out


def _collectives_note(rec: dict[str, Any]) -> str:
    """The caption line of a node type's published collective figures (none without a source)."""
    src = rec.get("collectives_source")
    if not src:
        return _curves_note(rec)
    links = ", ".join(f"{k} {v['bandwidth_gb_s']:g}" for k, v in rec.get("collectives", {}).items())
    eff = rec.get("network_efficiency", 1.0)
    return (
        f"\n    collectives (GB/s inside the node): {links or 'intra'}; network at {100 * eff:.0f}% of the "
        f"NICs' rate: {src}"
    ) + _curves_note(rec)


def clusters_json(cluster: Cluster | None = None) -> dict[str, Any]:
    """``{"clusters": [node_record(...) for every preset]}``, for ``distir clusters --json``;
    with ``cluster``, its distinct node types instead (keyed by node name)."""
    if cluster is None:
        return {"clusters": [node_record(k, n) for k, n in PRESETS.items()]}
    kinds = dict.fromkeys(cluster.nodes)
    return {"clusters": [node_record(n.name, n) for n in kinds]}


_FLAT = "flat fraction of peak (no GEMM profile)"
_MODEL_NOTES = (
    "GEMM curve: its shape constants (REUSE_HALF, K_OVERHEAD) are fitted to XLA's measured H100 "
    f"bf16 table of 375 GEMMs ({_XLA_TABLE}; bench/fit_gemm.py), and serve every GPU.\n"
    "Memory-bound kernels: 80% of the HBM bandwidth (the cost model's memory_efficiency, an estimate "
    "within published figures: Liger-Kernel's Triton norm kernels reach 66-85% forward on A100 and "
    "H100, bench/bench_memory_kernels.py; torchao's roofline takes 92% for Triton pointwise kernels "
    "on H100, torchao/testing/training/roofline_utils.py); "
    "under --kernels eager, PyTorch's own LayerNorm/RMSNorm kernels at the fractions Liger-Kernel's "
    "benchmarks measured (forward 52%/54%, backward 35%/18%; OpDef.eager_memory).\n"
    "Estimates (no published figure): link latencies (NVLink/NVSwitch 3 us, PCIe 8 us, InfiniBand "
    "5 us, cloud Ethernet 30-50 us) and the per-kernel launch time (5 us; the smallest GEMM of XLA's "
    "H100 table, 256^3, takes 5.0 us of kernel time)."
)


def _power_note(rec: dict[str, Any]) -> str:
    """The caption line of a node type's power limit (none without one)."""
    p = rec.get("power")
    if p is None:
        return ""
    prof = PowerProfile(p["limit_w"], p["reference_w"], tuple((w, r) for w, r in p["curve"]), p["source"])
    return (
        f"\n    power: {p['limit_w']:g} W of the {p['reference_w']:g} W its GEMM and attention figures "
        f"were measured at: {100 * prof.compute_fraction:.1f}% of their compute rate: {p['source']}"
    )


def render_clusters_table(cluster: Cluster | None = None) -> Table:
    """The presets (or ``cluster``'s node types) as a rich table, for ``distir clusters``."""
    from rich.table import Table

    cols = [
        ("preset", "preset"),
        ("GPU", "gpu"),
        ("GPUs", "devices_per_node"),
        ("fp32", "fp32_tflops"),
        ("tf32", "tf32_tflops"),
        ("fp16", "fp16_tflops"),
        ("bf16", "bf16_tflops"),
        ("HBM", "memory_bandwidth_gb_s"),
        ("mem", "memory_gib"),
        ("intra", "intra_bandwidth_gb_s"),
        ("inter", "inter_bandwidth_gb_s"),
        ("GEMM", "matmul_efficiency"),
        ("runtime", "cuda_context_mib"),
        ("source", "source"),
    ]
    recs = clusters_json(cluster)["clusters"]
    notes = "\n".join(
        f"[{i}] {r['source'].replace(' ; ', ' ')}\n    GEMM: {r.get('matmul_source', _FLAT)}"
        + (
            f"\n    comm SMs: {r['comm_sm_count']} of {r['sm_count']}: {r['comm_sm_source']}"
            if "comm_sm_count" in r
            else ""
        )
        + (f"\n    GEMM kernels: {r['matmul_persistent_source']}" if r.get("matmul_persistent") else "")
        + "".join(
            f"\n    attention ({k}): {(a[0] if isinstance(a, list) else a)['source']}"
            for k, a in r.get("attention", {}).items()
        )
        + _power_note(r)
        + _collectives_note(r)
        + _host_note(r)
        for i, r in enumerate(recs, 1)
    )
    runtime_sources = dict.fromkeys(r["runtime_memory_source"] for r in recs if r["runtime_memory_source"])
    title = "cluster presets: NAME or NAME:NODES, joined with + (e.g. p3.8xlarge:3+g4dn.12xlarge:1)"
    if cluster is not None:
        title = f"node types of {cluster.name}: {cluster.describe()}"
    calibrated = [
        f"[{i}] measured: families {', '.join(r.get('families', {})) or 'none'}; "
        f"collectives {', '.join(r.get('collectives', {})) or 'none'}"
        for i, r in enumerate(recs, 1)
        if "families" in r or ("collectives" in r and not r.get("collectives_source"))
    ]
    if calibrated:
        notes += "\n" + "\n".join(calibrated)
    table = Table(
        title=title,
        caption="GPUs per node; fp32..bf16: dense peak TFLOP/s; HBM: memory bandwidth, GB/s; mem: GiB; "
        "intra: GPU↔GPU in a node, per GPU, GB/s; inter: network, per node, GB/s (per direction); "
        "GEMM: fraction of the dense peak a published GEMM benchmark reached (the efficiency curve of "
        "distir.hardware.gemm passes through it; smaller or skinny products run below it); comm SMs: the "
        "SMs a communication kernel holds while it runs, taken from the compute beside it; GEMM kernels: "
        "persistent ones (one CTA per SM) run beside a communication kernel in two waves; runtime: "
        "memory held besides tensors, MiB (CUDA context + workspaces + NCCL buffers) + the allocator's "
        f"share of the peak. Sources:\n{notes}\nRuntime memory: {' / '.join(runtime_sources)}\n"
        + _MODEL_NOTES,
        caption_justify="left",
    )
    for header, key in cols:
        numeric = key not in ("preset", "gpu", "source")
        table.add_column(header, justify="right" if numeric else "left")
    for i, rec in enumerate(recs, 1):
        cells = [f"{rec[k]:g}" if isinstance(rec.get(k), float) else str(rec.get(k)) for _, k in cols]
        eff = rec.get("matmul_efficiency")
        cells[-3] = f"{100 * eff:.0f}%" if eff is not None else "flat"
        fixed = rec["cuda_context_mib"] + rec["workspace_mib"] + rec["comm_buffers_mib"]
        frag = rec["allocator_fragmentation"]
        cells[-2] = f"{fixed:g}+{100 * frag:g}%" if fixed or frag else "0"
        cells[-1] = f"[{i}]"
        table.add_row(*cells)
    return table
