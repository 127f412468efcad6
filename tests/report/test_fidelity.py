"""Spearman's rho and the error statistics against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from distir.report.fidelity import errors, ranks, spearman


def test_spearman_without_ties_is_the_textbook_formula() -> None:
    """rho = 1 - 6 sum d^2 / (n (n^2 - 1)) when no value repeats."""
    rng = np.random.default_rng(0)
    x, y = rng.permutation(12).astype(float), rng.permutation(12).astype(float)
    d = x - y  # permutations of 0..11 are their own ranks minus 1
    n = len(x)
    assert spearman(x * 3.5 + 1, np.exp(y)) == pytest.approx(1 - 6 * np.sum(d**2) / (n * (n * n - 1)))


def test_spearman_monotone_and_reversed() -> None:
    x = [0.1, 0.5, 2.0, 3.0]
    assert spearman(x, [1, 4, 9, 100]) == pytest.approx(1.0)
    assert spearman(x, [9, 4, 1, 0]) == pytest.approx(-1.0)


def test_ties_share_the_mean_rank() -> None:
    assert list(ranks([5, 1, 5, 3])) == [3.5, 1.0, 3.5, 2.0]
    # with ties, rho is the Pearson correlation of the mean ranks
    x, y = [1, 2, 2, 3, 4], [2, 1, 3, 3, 5]
    rx, ry = np.array([1, 2.5, 2.5, 4, 5]), np.array([2, 1, 3.5, 3.5, 5])
    assert spearman(x, y) == pytest.approx(float(np.corrcoef(rx, ry)[0, 1]))


def test_errors_are_absolute_relative() -> None:
    e = errors([1.1, 0.5, 3.0], [1.0, 1.0, 3.0])
    assert e.median == pytest.approx(0.1) and e.max == pytest.approx(0.5)
    with pytest.raises(ValueError):
        errors([1.0], [0.0])
    with pytest.raises(ValueError):
        spearman([1.0], [2.0])
