"""The fused attention ops and Rope (``distir.ops.attention``): the references against independent
numpy oracles (loops over batch and heads; complex rotations), AttentionGrad against finite
differences in float64, the FLOP counts against FlashAttention-2's formulas, the typed errors,
and every sharding strategy (batch, heads, pending sums) against the sequential result."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from ops_examples import T, f32, f64
from test_new_ops_sharding import Case, check

from distir.ir.types import DType
from distir.ir.values import Attrs
from distir.ops import REGISTRY, OpTypeError
from distir.ops.attention import AttentionDropoutError, ring_order

ATT, GRAD, ROPE = REGISTRY["Attention"], REGISTRY["AttentionGrad"], REGISTRY["Rope"]


def run(op: str, args: list[np.ndarray], **attrs: object) -> tuple[np.ndarray, ...]:
    d = REGISTRY[op]
    assert d.reference is not None
    return tuple(np.asarray(x) for x in d.reference(args, Attrs(attrs)))


def naive_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """One (batch, head) at a time: softmax(scale · q_h k_gᵀ) v_g, g = h // (h / h_kv)."""
    b, s, h, _ = q.shape
    group = h // k.shape[2]
    out, lse = np.zeros_like(q), np.zeros((b, h, s))
    for n in range(b):
        for i in range(h):
            g = i // group
            sc = q[n, :, i, :] @ k[n, :, g, :].T * scale
            for r in range(s):
                if causal:
                    sc[r, r + 1 :] = -np.inf
                lse[n, i, r] = math.log(sum(math.exp(x) for x in sc[r] if x > -np.inf))
            p = np.exp(sc - lse[n, i][:, None])
            out[n, :, i, :] = p @ v[n, :, g, :]
    return out, lse


def qkv(rng: np.random.Generator, b: int, s: int, h: int, hkv: int, d: int) -> list[np.ndarray]:
    return [rng.standard_normal((b, s, x, d)) for x in (h, hkv, hkv)]


SHAPES = [(2, 5, 4, 4, 3), (2, 5, 4, 2, 3), (1, 6, 6, 1, 4), (3, 1, 2, 2, 2)]  # MHA, GQA, MQA, S=1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_attention_equals_the_explicit_softmax_attention(shape: tuple[int, ...], causal: bool) -> None:
    q, k, v = qkv(np.random.default_rng(1), *shape)
    out, lse = run("Attention", [q, k, v], causal=causal)
    want_out, want_lse = naive_attention(q, k, v, causal, 1 / math.sqrt(shape[4]))
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    out, _ = run("Attention", [q, k, v], causal=causal, scale=0.25)
    np.testing.assert_allclose(out, naive_attention(q, k, v, causal, 0.25)[0], rtol=1e-12, atol=1e-12)


def test_attention_is_stable_for_large_scores() -> None:
    q, k, v = qkv(np.random.default_rng(2), 1, 4, 2, 2, 2)
    out, lse = run("Attention", [q * 1e3, k * 1e3, v], causal=True)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))


def _numeric(f: object, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        g[i] = (f(up) - f(down)) / (2 * h)  # type: ignore[operator]
    return g


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_attention_grad_matches_finite_differences(shape: tuple[int, ...], causal: bool) -> None:
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, *shape)
    out, lse = run("Attention", [q, k, v], causal=causal, scale=0.6)
    dout = rng.standard_normal(out.shape)
    grads = run("AttentionGrad", [dout, q, k, v, out, lse], causal=causal, scale=0.6)
    args = {"q": q, "k": k, "v": v}
    for j, name in enumerate(("q", "k", "v")):

        def objective(x: np.ndarray, name: str = name) -> float:
            a = {**args, name: x}
            return float(
                np.sum(dout * run("Attention", [a["q"], a["k"], a["v"]], causal=causal, scale=0.6)[0])
            )

        np.testing.assert_allclose(
            grads[j], _numeric(objective, args[name]), rtol=1e-6, atol=1e-8, err_msg=name
        )


def test_flops_are_flash_attention_2s() -> None:
    b, s, h, hkv, d = 2, 128, 8, 2, 64
    q, kv = T(f32, b, s, h, d), T(f32, b, s, hkv, d)
    outs = ATT.infer_types([q, kv, kv], Attrs({}), [None] * 3)
    fwd = 4 * b * h * s * s * d
    assert ATT.flops([q, kv, kv], outs, Attrs({})) == fwd
    assert ATT.flops([q, kv, kv], outs, Attrs({"causal": True})) == fwd / 2
    gins = [q, q, kv, kv, q, outs[1]]
    gouts = GRAD.infer_types(gins, Attrs({}), [None] * 6)
    assert GRAD.flops(gins, gouts, Attrs({})) == 2.5 * fwd
    assert GRAD.flops(gins, gouts, Attrs({"causal": True})) == 2.5 * fwd / 2
    # memory: what it reads and writes is O(B·S·h·d), never S×S
    moved = ATT.bytes_read([q, kv, kv], outs, Attrs({})) + ATT.bytes_written([q, kv, kv], outs, Attrs({}))
    assert moved == 4 * (2 * b * s * h * d + 2 * b * s * hkv * d + b * h * s)


def test_lse_is_f32_or_wider() -> None:
    for dtype, want in ((DType.bf16, DType.f32), (DType.f16, DType.f32), (f32, f32), (f64, f64)):
        x = T(dtype, 2, 3, 2, 4)
        out, lse = ATT.infer_types([x, x, x], Attrs({}), [None] * 3)
        assert out.dtype == dtype and lse.dtype == want and lse.shape == (2, 2, 3)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("types", "attrs", "fragment"),
    [
        (
            [T(f32, 2, 3, 4, 2), T(f32, 2, 3, 3, 2), T(f32, 2, 3, 3, 2)],
            {},
            "kv heads 3 must divide query heads 4",
        ),
        ([T(f32, 2, 3, 4), T(f32, 2, 3, 4), T(f32, 2, 3, 4)], {}, "q must be (batch, seq, heads, head_dim)"),
        ([T(f32, 2, 3, 4, 2), T(f32, 2, 5, 4, 2), T(f32, 2, 5, 4, 2)], {}, "does not fit q"),
        ([T(f32, 2, 3, 4, 2), T(f32, 2, 3, 2, 2), T(f32, 2, 3, 1, 2)], {}, "v of shape"),
        ([T(f32, 2, 3, 4, 2), T(f64, 2, 3, 4, 2), T(f32, 2, 3, 4, 2)], {}, "dtype"),
        ([T(f32, 2, 3, 4, 2)] * 3, {"dropout": 1.0}, "dropout=1.0 must be in [0, 1)"),
    ],
)
def test_attention_rejects_bad_input(types: list, attrs: dict, fragment: str) -> None:
    with pytest.raises(OpTypeError) as e:
        ATT.infer_types(types, Attrs(attrs), [None] * 3)
    assert fragment in str(e.value)


def test_dropout_is_typed_but_the_reference_refuses_it() -> None:
    x = T(f32, 1, 2, 2, 2)
    assert len(ATT.infer_types([x, x, x], Attrs({"dropout": 0.1}), [None] * 3)) == 2
    q = np.ones((1, 2, 2, 2), dtype=np.float32)
    with pytest.raises(AttentionDropoutError, match="cannot run dropout > 0"):
        run("Attention", [q, q, q], dropout=0.1)


def test_rope_rejects_an_odd_head_dim() -> None:
    with pytest.raises(OpTypeError, match="even head_dim"):
        ROPE.infer_types([T(f32, 1, 2, 2, 3)], Attrs({}), [None])
    with pytest.raises(OpTypeError, match="offset=-1 must be a position"):
        ROPE.infer_types([T(f32, 1, 2, 2, 4)], Attrs({"offset": -1}), [None])


# -- Rope -------------------------------------------------------------------------------------
def complex_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Meta's ``apply_rotary_emb``: consecutive pairs as complex numbers times
    exp(i · s · theta^(-2j/d))."""
    _, s, _, d = x.shape
    z = x[..., 0::2] + 1j * x[..., 1::2]
    freqs = theta ** (-np.arange(0, d, 2) / d)
    z = z * np.exp(1j * np.arange(s)[:, None, None] * freqs[None, None, :])
    y = np.empty_like(x)
    y[..., 0::2], y[..., 1::2] = z.real, z.imag
    return y


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 3.0])
def test_rope_is_the_complex_rotation_and_inverts(theta: float) -> None:
    x = np.random.default_rng(4).standard_normal((2, 7, 3, 8))
    (y,) = run("Rope", [x], theta=theta)
    np.testing.assert_allclose(y, complex_rope(x, theta), rtol=1e-12, atol=1e-12)
    (back,) = run("Rope", [y], theta=theta, inverse=True)
    np.testing.assert_allclose(back, x, rtol=1e-12, atol=1e-12)
    # a rotation: norms of pairs are kept; position 0 is unchanged
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_array_equal(y[:, 0], x[:, 0])


def test_rope_makes_scores_depend_on_relative_position() -> None:
    """q_m·k_n after RoPE depends on m - n only: shifting both positions keeps the score."""
    rng = np.random.default_rng(5)
    qv, kv = rng.standard_normal(8), rng.standard_normal(8)
    x = np.zeros((1, 6, 2, 8))
    x[0, :, 0], x[0, :, 1] = qv, kv
    (y,) = run("Rope", [x], theta=100.0)
    assert y[0, 3, 0] @ y[0, 1, 1] == pytest.approx(y[0, 5, 0] @ y[0, 3, 1], rel=1e-12)


def test_rope_grad_matches_finite_differences() -> None:
    rng = np.random.default_rng(6)
    x, dy = rng.standard_normal((1, 4, 2, 4)), rng.standard_normal((1, 4, 2, 4))
    (dx,) = run("Rope", [dy], theta=50.0, inverse=True)  # what Rope's gradient rule emits
    want = _numeric(lambda v: float(np.sum(dy * run("Rope", [v], theta=50.0)[0])), x)
    np.testing.assert_allclose(dx, want, rtol=1e-7, atol=1e-9)


def rotate_half_rope(x: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Hugging Face's form: ``x·cos + rotate_half(x)·sin`` with the angles repeated over both
    halves and ``rotate_half(x) = (-x[d/2:], x[:d/2])``."""
    s, h = x.shape[1], x.shape[3] // 2
    ang = np.arange(s)[:, None] * freqs[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[None, :, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[None, :, None, :]
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def test_rope_halves_with_explicit_freqs_is_rotate_half() -> None:
    x = np.random.default_rng(8).standard_normal((2, 5, 3, 6))
    freqs = np.array([1.0, 0.3, 0.002])
    (y,) = run("Rope", [x], halves=True, freqs=tuple(freqs))
    np.testing.assert_allclose(y, rotate_half_rope(x, freqs), rtol=1e-12, atol=1e-12)
    (back,) = run("Rope", [y], halves=True, freqs=tuple(freqs), inverse=True)
    np.testing.assert_allclose(back, x, rtol=1e-12, atol=1e-12)


def test_rope_freqs_default_to_theta_powers() -> None:
    x = np.random.default_rng(9).standard_normal((1, 4, 2, 8))
    freqs = tuple(float(f) for f in 100.0 ** (-np.arange(0, 8, 2) / 8))
    np.testing.assert_allclose(run("Rope", [x], freqs=freqs)[0], run("Rope", [x], theta=100.0)[0], rtol=1e-12)


def test_rope_rejects_freqs_of_the_wrong_length() -> None:
    with pytest.raises(OpTypeError, match="frequencies"):
        ROPE.infer_types([T(f32, 1, 2, 2, 4)], Attrs({"freqs": (1.0,)}), [None])


# -- sharding ---------------------------------------------------------------------------------
def _grad_inputs(rng: np.random.Generator, shape: tuple[int, ...], causal: bool) -> tuple[np.ndarray, ...]:
    q, k, v = qkv(rng, *shape)
    out, lse = run("Attention", [q, k, v], causal=causal)
    return (rng.standard_normal(out.shape), q, k, v, out, lse)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("shape", [(4, 3, 4, 2, 2), (3, 4, 6, 3, 2), (2, 3, 4, 4, 2), (5, 2, 8, 1, 2)])
def test_every_attention_strategy_is_sound(shape: tuple[int, ...], n: int) -> None:
    rng = np.random.default_rng(7)
    for causal in (False, True):
        check(Case("Attention", tuple(qkv(rng, *shape)), {"causal": causal}), n, 11)
        check(Case("AttentionGrad", _grad_inputs(rng, shape, causal), {"causal": causal}), n, 12)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_rope_strategy_is_sound(n: int) -> None:
    x = np.random.default_rng(8).standard_normal((3, 5, 4, 6))
    assert check(Case("Rope", (x,), {"theta": 10.0}), n, 13) == 4  # R, batch, heads, pending sum


def _offered(op: str, shapes: list[tuple[int, ...]], n: int) -> set[str]:
    d = REGISTRY[op]
    ins = [T(f64, *s) for s in shapes]
    outs = d.infer_types(ins, Attrs({}), [None] * len(ins))
    return {str(s) for s in d.strategies(ins, outs, Attrs({}), n)}


def test_heads_are_split_only_in_whole_gqa_groups() -> None:
    heads = "(S(2), S(2), S(2)) -> (S(2), S(1))"
    assert heads in _offered("Attention", [(2, 3, 8, 4), (2, 3, 2, 4), (2, 3, 2, 4)], 2)  # 4 + 4 | 1 + 1
    assert heads not in _offered("Attention", [(2, 3, 8, 4), (2, 3, 2, 4), (2, 3, 2, 4)], 4)  # kv 1,1,0,0
    assert heads not in _offered("Attention", [(2, 3, 6, 4), (2, 3, 3, 4), (2, 3, 3, 4)], 2)  # 3 | 2 + 1
    assert heads in _offered("Attention", [(2, 3, 6, 4), (2, 3, 3, 4), (2, 3, 3, 4)], 3)
    assert "(S(0), S(0), S(0)) -> (S(0), S(0))" in _offered("Attention", [(2, 3, 6, 4)] * 3, 4)
    # the sequence and head_dim stay whole: a piece does not know its positions
    assert not any(
        "S(1)" in s.split("->")[0] or "S(3)" in s for s in _offered("Attention", [(2, 4, 4, 4)] * 3, 2)
    )
    assert not any("S(1)" in s or "S(3)" in s for s in _offered("Rope", [(2, 4, 4, 4)], 2))


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_attention_merge_of_two_key_sets_is_attention_over_both(shape: tuple[int, ...]) -> None:
    """Attention of q over keys [0, j) merged with attention over [j, S) is attention over all S
    (the naive per-head softmax as the oracle)."""
    q, k, v = qkv(np.random.default_rng(3), *shape)
    j = shape[1] // 2
    o1, l1 = run("Attention", [q, k[:, :j], v[:, :j]])
    o2, l2 = run("Attention", [q, k[:, j:], v[:, j:]])
    out, lse = run("AttentionMerge", [o1, l1, o2, l2])
    want_out, want_lse = naive_attention(q, k, v, False, 1 / math.sqrt(shape[4]))
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


def test_attention_merge_with_an_empty_part_keeps_the_other() -> None:
    rng = np.random.default_rng(4)
    o, lse = rng.standard_normal((1, 3, 2, 2)), rng.standard_normal((1, 2, 3))
    empty = np.full_like(lse, -np.inf)
    out, got = run("AttentionMerge", [o, lse, np.zeros_like(o), empty])
    np.testing.assert_allclose(out, o, rtol=1e-15)
    np.testing.assert_allclose(got, lse, rtol=1e-15)
    out, got = run("AttentionMerge", [o, empty, o, empty])
    assert np.all(out == 0.0) and np.all(got == -np.inf)


@pytest.mark.parametrize("n", [2, 3])
def test_every_attention_merge_strategy_is_sound(n: int) -> None:
    rng = np.random.default_rng(9)
    o1, o2 = rng.standard_normal((3, 4, 4, 2)), rng.standard_normal((3, 4, 4, 2))
    l1, l2 = rng.standard_normal((3, 4, 4)), rng.standard_normal((3, 4, 4))
    assert check(Case("AttentionMerge", (o1, l1, o2, l2), {}), n, 14) == 4  # R, batch, seq, heads


def test_rope_of_a_chunk_with_its_offset_is_that_chunk_of_the_whole() -> None:
    """Context parallelism rotates a rank's chunks at their global positions."""
    x = np.random.default_rng(10).standard_normal((2, 12, 3, 4))
    whole = run("Rope", [x], theta=100.0)[0]
    for lo, hi in ((0, 3), (3, 6), (9, 12)):
        np.testing.assert_allclose(
            run("Rope", [x[:, lo:hi]], theta=100.0, offset=lo)[0], whole[:, lo:hi], rtol=1e-13
        )
        back = run("Rope", [whole[:, lo:hi]], theta=100.0, offset=lo, inverse=True)[0]
        np.testing.assert_allclose(back, x[:, lo:hi], rtol=1e-12, atol=1e-13)


def _ring_offered(op: str, n: int, ring: int) -> set[str]:
    """The strategies of ``op`` with positions on (B, S=8, h=4, d=2) over an axis of ``n``."""
    d = REGISTRY[op]
    q = T(f64, 2, 8, 4, 2)
    lse = T(DType.f64, 2, 4, 8)
    pos = T(DType.i64, 2, 8)
    ins = [q, q, q, pos, pos] if op == "Attention" else [q, q, q, q, q, lse, pos, pos]
    attrs = Attrs({"causal": True, "ring": ring})
    outs = d.infer_types(ins, attrs, [None] * len(ins))
    return {str(s) for s in d.strategies(ins, outs, attrs, n)}


def test_the_ring_strategy_splits_everything_along_the_sequence_only_over_its_ranks() -> None:
    """``ring`` = c: K/V (and positions) split along the sequence like the queries, offered on an
    axis of exactly c devices (the ring the lowering builds); dK/dV come back split, not pending."""
    fwd = "(S(1), S(1), S(1), S(1), S(1)) -> (S(1), S(2))"
    bwd = "(S(1), S(1), S(1), S(1), S(1), S(2), S(1), S(1)) -> (S(1), S(1), S(1))"
    assert fwd in _ring_offered("Attention", 4, 4)
    assert bwd in _ring_offered("AttentionGrad", 4, 4)
    assert fwd not in _ring_offered("Attention", 2, 4)
    assert bwd not in _ring_offered("AttentionGrad", 2, 4)
    assert fwd not in _ring_offered("Attention", 4, 1)  # no ring: the gathered K/V only
    assert "(S(1), R, R, S(1), R) -> (S(1), S(2))" in _ring_offered("Attention", 4, 4)


def test_the_ring_needs_positions_in_its_load_balanced_order() -> None:
    """The reference keeps the ``ring`` attribute's promise (the lowering decides which blocks
    are masked from it): positions in ``ring_order`` run, others are refused; the result is the
    same as without the attribute."""
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 1, 8, 2, 2, 4)
    good = np.broadcast_to(ring_order(8, 2), (1, 8)).copy()
    assert good[0].tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    with_ring = run("Attention", [q, k, v, good, good], causal=True, ring=2)
    plain = run("Attention", [q, k, v, good, good], causal=True)
    np.testing.assert_array_equal(with_ring[0], plain[0])
    ordered = np.arange(8)[None]
    with pytest.raises(ValueError, match="load-balanced order"):
        run("Attention", [q, k, v, ordered, ordered], causal=True, ring=2)


def test_a_ring_without_positions_is_refused() -> None:
    q = T(f64, 1, 8, 2, 4)
    with pytest.raises(OpTypeError, match="ring=2 needs"):
        ATT.infer_types([q, q, q], Attrs({"ring": 2}), [None] * 3)


SLOPES = (0.5, 0.25, 0.125, 0.0625)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_adds_slope_times_distance_to_every_score(causal: bool) -> None:
    """ALiBi: query i's score of key j raised by its head's slope · (j − i), before the softmax;
    the naive oracle adds it to q·kᵀ (a bias a row's constant shift does not change: BLOOM's
    slope · j is the same attention)."""
    b, s, h, d = 2, 5, 4, 3
    q, k, v = qkv(np.random.default_rng(4), b, s, h, 2, d)
    out, _ = run("Attention", [q, k, v], causal=causal, scale=0.5, alibi=SLOPES)
    group = h // 2
    want = np.zeros_like(q)
    for n in range(b):
        for i in range(h):
            sc = q[n, :, i, :] @ k[n, :, i // group, :].T * 0.5 + SLOPES[i] * np.arange(s)[None, :]
            if causal:
                sc = np.where(np.triu(np.ones((s, s), dtype=bool), 1), -np.inf, sc)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            want[n, :, i, :] = (p / p.sum(-1, keepdims=True)) @ v[n, :, i // group, :]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_every_alibi_strategy_is_sound(n: int) -> None:
    """Split on the heads, each piece gets its own heads' slopes (``localize``)."""
    rng = np.random.default_rng(8)
    attrs = {"causal": True, "alibi": SLOPES}
    check(Case("Attention", tuple(qkv(rng, 2, 3, 4, 4, 2)), attrs), n, 13)
    q, k, v = qkv(rng, 2, 3, 4, 4, 2)
    out, lse = run("Attention", [q, k, v], **attrs)
    check(Case("AttentionGrad", (rng.standard_normal(out.shape), q, k, v, out, lse), attrs), n, 14)


def test_alibi_needs_a_slope_per_query_head() -> None:
    with pytest.raises(OpTypeError, match="alibi lists 3 slopes for 4 query heads"):
        ATT.infer_types([T(f32, 2, 3, 4, 2)] * 3, Attrs({"alibi": (1.0, 0.5, 0.25)}), [None] * 3)


def test_a_sliding_window_hides_keys_at_or_beyond_it() -> None:
    """``window`` w: query i sees keys i − w < j ≤ i; the naive oracle masks the rest."""
    b, s, h, d, w = 2, 6, 4, 3, 3
    q, k, v = qkv(np.random.default_rng(6), b, s, h, 2, d)
    out, _ = run("Attention", [q, k, v], causal=True, scale=0.5, window=w)
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    hidden = (j > i) | (j <= i - w)
    want = np.zeros_like(q)
    for n in range(b):
        for hh in range(h):
            sc = np.where(hidden, -np.inf, q[n, :, hh, :] @ k[n, :, hh // 2, :].T * 0.5)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            want[n, :, hh, :] = (p / p.sum(-1, keepdims=True)) @ v[n, :, hh // 2, :]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_a_window_counts_the_pairs_it_keeps() -> None:
    """FLOPs: the causal count times the share of the causal pairs the window keeps; a window
    spanning the sequence is causal attention."""
    from distir.ops.attention import window_share

    q = T(f32, 2, 8, 4, 16)
    causal = ATT.flops([q, q, q], [q], Attrs({"causal": True}))
    assert ATT.flops([q, q, q], [q], Attrs({"causal": True, "window": 8})) == causal
    kept = 3 * 4 / 2 + (8 - 3) * 3  # rows 0..2 see 1..3 keys, the other 5 rows 3 each
    assert window_share(8, 3) == kept / (8 * 9 / 2)
    assert ATT.flops([q, q, q], [q], Attrs({"causal": True, "window": 3})) == pytest.approx(
        causal * kept / 36
    )


def test_a_window_needs_causal_attention_without_positions() -> None:
    q = T(f32, 2, 3, 4, 2)
    with pytest.raises(OpTypeError, match="window=2 needs"):
        ATT.infer_types([q] * 3, Attrs({"window": 2}), [None] * 3)


def test_softcap_caps_the_scaled_scores_before_the_mask() -> None:
    """``softcap`` c: query i's score of key j is c·tanh(scale·q·k / c), then masked."""
    b, s, h, d, cap = 2, 5, 4, 3, 0.7
    q, k, v = qkv(np.random.default_rng(9), b, s, h, 2, d)
    out, _ = run("Attention", [q, k, v], causal=True, scale=0.5, softcap=cap)
    want = np.zeros_like(q)
    for n in range(b):
        for hh in range(h):
            sc = cap * np.tanh(q[n, :, hh, :] @ k[n, :, hh // 2, :].T * 0.5 / cap)
            sc = np.where(np.triu(np.ones((s, s), dtype=bool), 1), -np.inf, sc)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            want[n, :, hh, :] = (p / p.sum(-1, keepdims=True)) @ v[n, :, hh // 2, :]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "attrs",
    [
        {"causal": True, "alibi": SLOPES},  # ALiBi's slopes
        {"causal": True, "window": 2},  # a sliding window
        {"causal": True, "softcap": 0.5, "window": 3},  # capped scores, in a window
    ],
)
def test_masked_attention_grads_match_finite_differences(attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 1, 4, 4, 2, 2)
    out, lse = run("Attention", [q, k, v], **attrs)
    dout = rng.standard_normal(out.shape)
    grads = run("AttentionGrad", [dout, q, k, v, out, lse], **attrs)
    args = {"q": q, "k": k, "v": v}
    for j, name in enumerate(("q", "k", "v")):

        def objective(x: np.ndarray, name: str = name) -> float:
            a = {**args, name: x}
            return float(np.sum(dout * run("Attention", [a["q"], a["k"], a["v"]], **attrs)[0]))

        np.testing.assert_allclose(grads[j], _numeric(objective, args[name]), rtol=1e-6, atol=1e-8)
