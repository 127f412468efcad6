"""Which additive masks make the exporter's decomposed attention the fused causal one
(``distir.frontends.onnx_import.attention.causal_mask``); the rewrite itself is tested on an
exported GPT-2 in test_onnx_import.py."""

from __future__ import annotations

import numpy as np
import pytest

from distir.frontends.onnx_import.attention import causal_mask


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
