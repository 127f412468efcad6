"""The rotary-embedding pattern's table check (``patterns._freqs``) on tables computed as Hugging
Face computes them: angles in float32, so long tables carry rounding the check must allow."""

from __future__ import annotations

import numpy as np
import pytest

from distir.frontends.torch_import.patterns import _freqs


def _tables(n: int, d: int, theta: float, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(1, n, 1, d) cos and sin tables as LlamaRotaryEmbedding makes them: inverse frequencies,
    positions and their product in float32 (times ``scale``, an attention scaling)."""
    inv = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float32) / d)).astype(np.float32)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]  # float32 product
    ang = np.concatenate([ang, ang], -1)
    cos = (np.cos(ang) * scale).astype(np.float32).reshape(1, n, 1, d)
    sin = (np.sin(ang) * scale).astype(np.float32).reshape(1, n, 1, d)
    return cos, sin


@pytest.mark.parametrize("n", [8, 8192, 131072])
def test_float32_tables_of_any_length_give_their_frequencies(n: int) -> None:
    """At 131,072 positions a float32 angle near 86,900 (head dim 64's second frequency) is
    rounded by up to 0.004, twice the short tables' tolerance."""
    d = 64
    cos, sin = _tables(n, d, 500000.0)
    got = _freqs(cos, sin, (2, n, 4, d))
    assert got is not None
    freqs, axis = got
    inv = 1.0 / 500000.0 ** (np.arange(0, d, 2) / d)
    assert axis == 1 and np.allclose(freqs, inv, rtol=1e-6)


def test_a_scaled_table_is_not_a_rotation() -> None:
    """YaRN-style attention scaling multiplies the tables: left to the op-by-op path."""
    cos, sin = _tables(131072, 64, 500000.0, scale=1.1)
    assert _freqs(cos, sin, (2, 131072, 4, 64)) is None


def test_the_check_holds_a_few_rows_at_a_time() -> None:
    """A long table is checked in blocks of CHECK_ROWS rows, in float64 only there: at a million
    positions, whole-table float64 copies and temporaries ran an 8 GB process out of memory."""
    import tracemalloc

    n, d = 131072, 64
    cos, sin = _tables(n, d, 500000.0)
    tracemalloc.start()
    try:
        got = _freqs(cos, sin, (2, n, 4, d))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got is not None
    assert peak < n * d * 8 // 2, peak  # under half of one float64 copy of a table


def _op_counts(model_string: str) -> dict[str, int]:
    from collections import Counter

    from distir.frontends.zoo import build_model

    model = build_model(model_string, batch=2)
    return Counter(op.name for f in model.module.functions for op in f.ops())


def test_gpt2_gelu_new_written_out_imports_as_one_gelu_tanh() -> None:
    """HF's NewGELUActivation (gelu_new: seven ATen ops on Python scalars) is one GeluTanh per
    block: no Tanh, Pow or scalar-filled tensor left (the imported model's numerics equal torch's:
    tests/frontends/test_torch_import_numeric.py)."""
    pytest.importorskip("transformers")
    from pathlib import Path

    ops = _op_counts(f"hf:{Path(__file__).parent / 'configs' / 'gpt2-tiny.json'}")
    assert ops["GeluTanh"] == 1  # in the one block function both blocks call
    assert ops["Tanh"] == ops["Pow"] == ops["FillLike"] == 0
