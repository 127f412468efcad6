"""Gather's ``padding`` (``nn.Embedding``'s ``padding_idx``): the forward is unchanged, the
gradient's padding row stays zero, in the whole table and in the piece of a sharded one that
holds it."""

from __future__ import annotations

import numpy as np

from distir.ir.values import Attrs
from distir.ops import REGISTRY

GATHER, GRAD = REGISTRY["Gather"], REGISTRY["GatherGrad"]


def test_padding_leaves_the_forward_alone_and_zeroes_its_row_of_the_gradient() -> None:
    table = np.arange(15, dtype=np.float64).reshape(5, 3)
    ids = np.array([[0, 1], [1, 4]])
    (plain,) = GATHER.reference([table, ids], Attrs({}))  # type: ignore[misc]
    (padded,) = GATHER.reference([table, ids], Attrs({"padding": 1}))  # type: ignore[misc]
    np.testing.assert_array_equal(plain, padded)
    dy = np.ones((2, 2, 3))
    (g,) = GRAD.reference([dy, ids], Attrs({"size": 5}))  # type: ignore[misc]
    (gp,) = GRAD.reference([dy, ids], Attrs({"size": 5, "padding": 1}))  # type: ignore[misc]
    assert g[1].sum() == 6 and not gp[1].any()
    np.testing.assert_array_equal(np.delete(g, 1, 0), np.delete(gp, 1, 0))


def test_a_piece_of_the_table_zeroes_the_padding_row_only_where_it_holds_it() -> None:
    ids, dy = np.array([2, 3, 5]), np.ones((3, 2))
    (holds,) = GRAD.reference([dy, ids], Attrs({"size": 2, "rows": (2, 6), "padding": 3}))  # type: ignore[misc]
    (other,) = GRAD.reference([dy, ids], Attrs({"size": 2, "rows": (4, 6), "padding": 3}))  # type: ignore[misc]
    np.testing.assert_array_equal(holds, [[1, 1], [0, 0]])  # rows 2, 3: row 3 is the padding
    np.testing.assert_array_equal(other, [[0, 0], [1, 1]])  # rows 4, 5: the padding is elsewhere
