"""Float8 training's ops: ``Float8Cast`` (dynamic tensorwise scaling) and MatMul of float8
operands — their rounding against the float8 grids enumerated here, their costs in closed form
(the cast two memory-bound passes, the product at the GPU's FP8 rate) and the backward."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ops_examples import T, f32

from distir.hardware.cluster import parse_cluster
from distir.hardware.gemm import GemmShape, gemm_efficiency
from distir.hardware.presets import PRESETS
from distir.hardware.specs import SpecError
from distir.ir.types import DType, TensorType
from distir.ir.values import Attrs
from distir.ops import REGISTRY, OpTypeError
from distir.ops.float8 import FP8_MAX
from distir.sim.cost import RooflineCostModel

E4M3, E5M2, BF16 = DType.f8e4m3, DType.f8e5m2, DType.bf16
CAST, MATMUL = REGISTRY["Float8Cast"], REGISTRY["MatMul"]


def _grid(mantissa: int, min_exp: int, top: float) -> np.ndarray:
    """Every finite value of a float8 format, from its definition: the subnormals k·2^(min_exp −
    mantissa), then (1 + m/2^mantissa)·2^e for every exponent up to the largest finite value."""
    step = 2.0 ** (min_exp - mantissa)
    subnormal = [k * step for k in range(2**mantissa)]
    normal = [(1 + m / 2**mantissa) * 2.0**e for e in range(min_exp, 16) for m in range(2**mantissa)]
    pos = np.array(sorted({*subnormal, *(v for v in normal if v <= top)}))
    return np.concatenate([-pos[::-1], pos])


GRIDS = {E4M3: _grid(3, -6, 448.0), E5M2: _grid(2, -14, 57344.0)}


def _cast(x: np.ndarray, to: DType) -> np.ndarray:
    (y,) = CAST.reference([x], Attrs({"to": to}))
    return np.asarray(y)


def test_the_enumerated_grids_have_the_formats_largest_values() -> None:
    assert GRIDS[E4M3].max() == FP8_MAX[E4M3] == 448.0
    assert GRIDS[E5M2].max() == FP8_MAX[E5M2] == 57344.0
    # 256 codes less the NaNs (E4M3fn: 2; E5M2: 6) and infinities (E5M2: 2), -0 equal to 0
    assert (len(set(GRIDS[E4M3])), len(set(GRIDS[E5M2]))) == (253, 247)


@pytest.mark.parametrize("to", [E4M3, E5M2])
def test_float8_cast_rounds_scaled_values_to_the_nearest_grid_point(to: DType) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(400) * np.exp(rng.uniform(-8, 3, 400))).astype(np.float32)
    y = _cast(x, to)
    scale = np.float32(FP8_MAX[to]) / np.float32(np.max(np.abs(x)))
    scaled = x.astype(np.float64) * np.float64(scale)
    grid = GRIDS[to]
    nearest = grid[np.argmin(np.abs(scaled[:, None] - grid[None, :]), axis=1)]
    np.testing.assert_allclose(y * np.float64(scale), nearest, rtol=1e-6, atol=1e-30)
    assert np.max(np.abs(y)) == pytest.approx(np.max(np.abs(x)), rel=1e-6)  # the amax maps to FP8_MAX


def test_float8_cast_of_zeros_is_zeros() -> None:
    assert not np.any(_cast(np.zeros((2, 3), np.float32), E4M3))


def test_float8_cast_types_and_refusals() -> None:
    (t,) = CAST.infer_types([T(BF16, 4, 8)], Attrs({"to": E4M3}), [None])
    assert t == T(E4M3, 4, 8) and t.nbytes == 32
    with pytest.raises(OpTypeError, match="casts to f8e4m3 or f8e5m2"):
        CAST.infer_types([T(BF16, 4)], Attrs({"to": BF16}), [None])
    with pytest.raises(OpTypeError, match="scales a bf16, f16 or f32 tensor"):
        CAST.infer_types([T(E4M3, 4)], Attrs({"to": E5M2}), [None])


def test_float8_cast_costs_its_passes_and_both_layouts() -> None:
    """Dynamic scaling reads X twice (amax, cast), delayed scaling once; both write the float8
    tensor in both layouts (one byte per element each)."""
    ins, outs = [T(BF16, 64, 128)], [T(E4M3, 64, 128)]
    n = 64 * 128
    dynamic, delayed = Attrs({"to": E4M3}), Attrs({"to": E4M3, "scaling": "delayed"})
    assert CAST.bytes_read(ins, outs, dynamic) == 2 * 2 * n
    assert CAST.bytes_read(ins, outs, delayed) == 2 * n
    assert CAST.bytes_written(ins, outs, dynamic) == CAST.bytes_written(ins, outs, delayed) == 2 * n
    assert CAST.flops(ins, outs, dynamic) == 2 * n
    np.testing.assert_array_equal(
        CAST.reference([np.arange(6, dtype=np.float32)], delayed)[0],
        CAST.reference([np.arange(6, dtype=np.float32)], dynamic)[0],
    )


def test_a_cast_run_again_writes_one_layout_and_reads_once_with_its_saved_amax() -> None:
    """A cast the backward runs again writes one layout in each pass; with the forward's amax
    saved (``scaling=saved``) it reads X once, to the same values; TE's casts keep both layouts."""
    from distir.ops.float8 import one_layout, recomputed

    ins, outs = [T(BF16, 64, 128)], [T(E4M3, 64, 128)]
    n = 64 * 128
    dynamic, delayed = Attrs({"to": E4M3}), Attrs({"to": E4M3, "scaling": "delayed"})
    fwd, again = one_layout(dynamic), recomputed(dynamic, amax_saved=True)
    assert (CAST.bytes_read(ins, outs, fwd), CAST.bytes_written(ins, outs, fwd)) == (2 * 2 * n, n)
    assert (CAST.bytes_read(ins, outs, again), CAST.bytes_written(ins, outs, again)) == (2 * n, n)
    full = recomputed(dynamic, amax_saved=False)  # full checkpointing: the amax taken again
    assert (CAST.bytes_read(ins, outs, full), CAST.bytes_written(ins, outs, full)) == (2 * 2 * n, n)
    assert one_layout(delayed) == recomputed(delayed, amax_saved=True) == delayed
    x = np.linspace(-3, 5, 12, dtype=np.float32)
    np.testing.assert_array_equal(CAST.reference([x], again)[0], CAST.reference([x], dynamic)[0])


@pytest.mark.parametrize(("scaling", "per_element"), [("dynamic", 2 * 2 + 2), ("delayed", 2 + 2)])
def test_float8_cast_is_a_memory_bound_kernel_on_h100(scaling: str, per_element: int) -> None:
    """launch + its bytes per element over 80% of the HBM bandwidth."""
    cl = parse_cluster("h100")
    spec = cl.device_spec(0)
    n = 8192 * 4096
    attrs = Attrs({"to": E4M3, "scaling": scaling})
    ins, outs = [T(BF16, 8192, 4096)], [T(E4M3, 8192, 4096)]
    got = RooflineCostModel(cl).compute_time(CAST, ins, outs, attrs, 0)
    want = spec.launch_overhead_s + per_element * n / (spec.memory_bandwidth * 0.8)
    assert got == pytest.approx(want, rel=1e-12)


def test_matmul_of_float8_operands_is_bf16_and_reads_one_byte_per_element() -> None:
    a, b = T(E4M3, 16, 32), T(E4M3, 32, 8)
    (y,) = MATMUL.infer_types([a, b], Attrs(), [None, None])
    assert y == T(BF16, 16, 8)
    (y,) = MATMUL.infer_types([T(E5M2, 32, 16), b], Attrs({"transA": 1}), [None, None])
    assert y == T(BF16, 16, 8)
    assert MATMUL.bytes_read([a, b], [y], Attrs()) == 16 * 32 + 32 * 8
    assert MATMUL.flops([a, b], [y], Attrs()) == 2 * 16 * 8 * 32
    with pytest.raises(OpTypeError, match="needs both operands float8"):
        MATMUL.infer_types([a, T(BF16, 32, 8)], Attrs(), [None, None])


def test_float8_matmul_runs_at_the_published_fp8_rate_on_h100() -> None:
    """At the MAMF table's best FP8 shape the product runs at its 1402.6 TFLOP/s; elsewhere at
    the FP8 curve's fraction of the 1979 TFLOP/s peak, where bf16 runs at its own."""
    cl = parse_cluster("h100")
    spec = cl.device_spec(0)
    cost = RooflineCostModel(cl)
    m, n, k = 1024, 9216, 14336
    ins, outs = [T(E4M3, m, k), T(E4M3, k, n)], [T(BF16, m, n)]
    got = cost.compute_time(MATMUL, ins, outs, Attrs(), 0)
    assert got == pytest.approx(spec.launch_overhead_s + 2 * m * n * k / 1402.6e12, rel=1e-9)
    shape = (4096, 4096, 8192)
    m, n, k = shape
    f8 = cost.compute_time(MATMUL, [T(E4M3, m, k), T(E4M3, k, n)], [T(BF16, m, n)], Attrs(), 0)
    bf = cost.compute_time(MATMUL, [T(BF16, m, k), T(BF16, k, n)], [T(BF16, m, n)], Attrs(), 0)
    assert spec.gemm_fp8 is not None and spec.gemm is not None
    eff8 = gemm_efficiency(spec.gemm_fp8, GemmShape(1, m, n, k))
    eff16 = gemm_efficiency(spec.gemm, GemmShape(1, m, n, k))
    assert f8 == pytest.approx(spec.launch_overhead_s + 2 * m * n * k / (1979e12 * eff8), rel=1e-9)
    assert bf == pytest.approx(spec.launch_overhead_s + 2 * m * n * k / (989.5e12 * eff16), rel=1e-9)
    assert 1.6 < (bf - spec.launch_overhead_s) / (f8 - spec.launch_overhead_s) < 2.0


def test_a_gpu_without_fp8_tensor_cores_has_no_fp8_peak() -> None:
    a100 = PRESETS["dgx-a100"].device
    assert a100.fp8 is None
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        a100.peak_flops(E4M3)
    assert PRESETS["h100"].device.peak_flops(E5M2) == 1979e12


class _Ctx:
    """A minimal gradient context: records the ops a rule emits."""

    def __init__(self, types: dict[str, TensorType]) -> None:
        self.types, self.emitted = types, []  # type: ignore[var-annotated]

    def op(self, name: str, *inputs: object, n_out: int | None = None, **attrs: object) -> tuple[str, ...]:
        self.emitted.append((name, inputs, attrs))
        return (f"%{len(self.emitted)}",)

    def primal(self, v: str) -> str:
        return v

    def type(self, v: str) -> TensorType:
        return self.types[v]


@pytest.mark.parametrize("scaling", ["dynamic", "delayed"])
def test_float8_matmul_backward_casts_the_gradient_to_e5m2_and_multiplies_in_float8(scaling: str) -> None:
    """torchao's tensorwise recipe: grad_output to E5M2 once; dgrad = dY8·W8ᵀ and wgrad =
    X8ᵀ·dY8 read the saved float8 input and weight."""
    from distir.ir.ops import Op
    from distir.ir.values import Value

    x, w, y = Value("x8"), Value("w8"), Value("y")
    op = Op("MatMul", (x, w), (y,), Attrs({"grad_scaling": scaling}))
    ctx = _Ctx({x: T(E4M3, 4, 6), w: T(E4M3, 6, 8), y: T(BF16, 4, 8)})  # type: ignore[dict-item]
    dx, dw = MATMUL.grad(ctx, op, ["dy"])
    names = [e[0] for e in ctx.emitted]
    assert names == ["Float8Cast", "MatMul", "MatMul"]
    how = {} if scaling == "dynamic" else {"scaling": scaling}
    assert ctx.emitted[0][1] == ("dy",) and ctx.emitted[0][2] == {"to": E5M2, **how}
    dy8 = "%1"
    assert ctx.emitted[1][1] == (dy8, w) and ctx.emitted[1][2] == {"transB": 1}
    assert ctx.emitted[2][1] == (x, dy8) and ctx.emitted[2][2] == {"transA": 1}
    assert (dx, dw) == ("%2", "%3")  # the products' results are the gradients


@pytest.mark.parametrize(("a", "b"), list(itertools.product([E4M3, E5M2], repeat=2)))
def test_every_pair_of_float8_operands_multiplies(a: DType, b: DType) -> None:
    (y,) = MATMUL.infer_types([T(a, 2, 3), T(b, 3, 4)], Attrs(), [None, None])
    assert y == T(BF16, 2, 4)
    assert not T(f32, 1).dtype.is_float8
