"""Which additive masks make the exporter's decomposed attention the fused causal one
(``distir.frontends.onnx_import.attention.causal_mask``); the rewrite itself is tested on an
exported GPT-2 in test_onnx_import.py."""

from __future__ import annotations

import numpy as np
import pytest

from distir.frontends.onnx_import.attention import causal_mask, causal_window


def _causal(s: int, fill: float) -> np.ndarray:
    return np.triu(np.full((s, s), fill), 1)


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min, -1e9])
def test_the_causal_mask_with_any_minus_infinity(fill: float) -> None:
    assert causal_mask(_causal(8, fill), 8)
    assert causal_mask(np.broadcast_to(_causal(8, fill), (2, 1, 8, 8)), 8)


def test_other_masks_are_not_causal() -> None:
    m = _causal(8, -np.inf)
    padded = m.copy()
    padded[:, 6:] = -np.inf  # the last two keys padded away
    window = m.copy()
    window[np.tril_indices(8, -3)] = -np.inf  # a sliding window of 3
    assert not causal_mask(padded, 8)
    assert not causal_mask(window, 8)
    assert not causal_mask(np.stack([m, padded]), 8)  # differs by batch
    assert not causal_mask(m, 4)  # another length
    assert not causal_mask(np.triu(np.full((8, 8), -1.0), 1), 8)  # a bias, not a mask


def _reference(m: np.ndarray, s: int) -> bool:
    """The definition at once: the whole (…, s, s) compared with the upper triangle."""
    if m.ndim < 2 or m.shape[-2:] != (s, s):
        return False
    rows = m.reshape(-1, s, s)
    above = np.triu(np.ones((s, s), dtype=bool), 1)
    return bool(np.all(rows[:, ~above] == 0) and np.all(rows[:, above] <= -1e4) and np.all(rows == rows[:1]))


@pytest.mark.parametrize("at", [(0, 1), (255, 256), (256, 0), (599, 598), (400, 599)])
def test_a_long_mask_is_checked_in_every_block_of_rows(at: tuple[int, int]) -> None:
    """A mask longer than the rows checked at once: one wrong entry in any block, or one batch
    entry differing there, is found, as by the definition checked all at once."""
    s = 600
    m = _causal(s, -np.inf).astype(np.float32)
    assert causal_mask(m, s) and _reference(m, s)
    for bad in (m.copy(), np.stack([m, m])):
        flat = bad.reshape(-1, s, s)
        i, j = at
        flat[-1, i, j] = -np.inf if j <= i else 0.0  # the wrong side of the diagonal
        assert causal_mask(bad, s) is _reference(bad, s) is False


def test_a_causal_band_is_a_window() -> None:
    """Hugging Face's sliding window (key j seen by query i when i − W < j ≤ i) gives W; a band
    as long as the sequence is the plain causal mask; a band that is not causal, none."""
    s = 8
    band = _causal(s, -np.inf)
    band[np.tril_indices(s, -3)] = -np.inf  # i − 3 < j ≤ i
    assert causal_window(band, s) == 3
    assert causal_window(np.broadcast_to(band, (2, 1, s, s)), s) == 3
    assert causal_window(_causal(s, -np.inf), s) == 0
    wide = band.copy()
    wide[5, 2] = 0.0  # one query sees a key outside the band
    assert causal_window(wide, s) is None
    symmetric = np.where(np.abs(np.subtract.outer(np.arange(s), np.arange(s))) < 3, 0.0, -np.inf)
    assert causal_window(symmetric, s) is None  # it sees later keys
