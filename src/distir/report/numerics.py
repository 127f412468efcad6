"""``--dtype auto`` and ``--precision auto``: the numerics the trainers run, one rule for
``simulate``, ``search`` and ``export``.

Training runs mixed precision (fp32 master weights and optimizer state) in the GPUs' fast half
format: bf16 where every GPU of the cluster computes bf16 faster than f32, else f16 where every
one computes f16 faster, else (a CPU profile without a faster half) f32, pure. Inference runs
pure. A DistIR file computes in its own dtype (its types): ``auto`` is that one (an ONNX file
imports in the dtype asked, so ``auto`` is the trainers'). A dtype given with ``--precision
auto`` keeps it: f32 is pure, a half format mixed (for training).
"""

from __future__ import annotations

from typing import NamedTuple

from distir.frontends.files import is_model_file, own_dtype
from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir.types import DType

DTYPES = ("auto", "f32", "bf16", "f16")
PRECISIONS = ("auto", "mixed", "pure", "fp8", "fp8-delayed")


class NumericsError(ValueError):
    """A dtype and precision that do not go together (``--precision mixed`` in f32)."""


class Numerics(NamedTuple):
    dtype: str  # f32, bf16 or f16
    precision: str  # pure, mixed, fp8 or fp8-delayed


def fast_half(cluster: str | Cluster) -> str:
    """bf16 where every GPU of ``cluster`` computes it faster than f32, else f16 where every one
    computes f16 faster, else f32."""
    nodes = (parse_cluster(cluster) if isinstance(cluster, str) else cluster).nodes
    for half in (DType.bf16, DType.f16):
        if all(n.device.peak_flops(half) > n.device.peak_flops(DType.f32) for n in nodes):
            return str(half.value)
    return str(DType.f32.value)


def slow_half_warnings(dtype: str, cluster: str | Cluster) -> list[str]:
    """A warning per GPU kind of ``cluster`` that computes the half format ``dtype`` no faster
    than f32 (bf16 on a V100 or a T4: no bf16 tensor cores), empty for f32 or where every GPU
    has it fast. PyTorch runs bf16 there all the same, emulated in fp32 arithmetic, so the
    simulation runs it at the GPU's bf16 peak (its fp32 one): a bound the emulation does not
    reach (``docs/hardware.md``)."""
    if dtype == "f32":
        return []
    half = DType(dtype)
    nodes = (parse_cluster(cluster) if isinstance(cluster, str) else cluster).nodes
    out: list[str] = []
    for dev in {n.device.name: n.device for n in nodes}.values():
        rate, fp32 = dev.peak_flops(half), dev.peak_flops(DType.f32)
        if rate > fp32:
            continue
        other = DType.f16 if half is DType.bf16 else DType.bf16
        faster = dev.peak_flops(other)
        hint = f"; {other.value} runs at {faster / 1e12:g} TFLOP/s" if faster > fp32 else ""
        out.append(
            f"{dev.name} computes {dtype} no faster than fp32: it is simulated at the fp32 peak "
            f"({fp32 / 1e12:g} TFLOP/s), a bound for {dtype} emulated in fp32 arithmetic, as PyTorch "
            f"runs it on GPUs without {dtype} tensor cores{hint}"
        )
    return out


def check_choices(dtype: str, precision: str, flag: str = "--") -> None:
    """``NumericsError`` unless ``dtype`` is one of ``DTYPES`` and ``precision`` of ``PRECISIONS``,
    naming them as options (``flag`` "--") or as the Python API's arguments (``flag`` "")."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise NumericsError(f"{flag}dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {dtype!r}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise NumericsError(
            f"{flag}precision must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, got {precision!r}"
        )


def exact_inference_error(precision: object, train: bool, flag: str = "--") -> str:
    """Why the search (and ``distir.simulate``, its exact simulation) cannot take ``precision``
    in inference, or "": they simulate inference in pure precision, the forward in the dtype, so a
    ``mixed`` or float8 precision given would be ignored (``distir simulate --model --infer``
    builds it: fp32 weights cast at each use). ``flag``: "--" for options, "" for arguments."""
    if train or precision in ("auto", "pure"):
        return ""
    given = f"--precision {precision}" if flag else f"precision={precision!r}"
    mode = "--infer" if flag else "train=False"
    return (
        f"{mode} searches and simulates the forward in the dtype (pure precision): {given} would be "
        "ignored; drop it (distir simulate --model M --infer builds it: fp32 weights cast at each use)"
    )


def resolve_numerics(model: str, dtype: str, precision: str, train: bool, cluster: str | Cluster) -> Numerics:
    """``dtype`` and ``precision`` with ``auto`` resolved (module docstring); float8 precisions
    compute in bf16. Raises the cluster's ``HardwareError``, a model file's ``ModelError`` and
    ``NumericsError``."""
    check_choices(dtype, precision)
    if dtype == "auto" and is_model_file(model) and (own := own_dtype(model)) is not None:
        dtype = own.value
    if dtype == "auto":
        dtype = "bf16" if precision.startswith("fp8") else fast_half(cluster)
    if precision == "auto":
        precision = "mixed" if train and dtype != "f32" else "pure"
    if precision == "mixed" and dtype == "f32":
        raise NumericsError("--precision mixed computes in a half format: give --dtype bf16 or f16 (or auto)")
    return Numerics(dtype, precision)
