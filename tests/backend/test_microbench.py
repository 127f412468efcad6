"""How the compute microbenchmarks run an op as a training step does: operands cycled through a
pool larger than the core's private cache, results kept alive so each call writes fresh memory
(``distir.backend.microbench``). No timing is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distir.backend import microbench as mb
from distir.ir.values import Attrs


def _cache(root: Path, index: int, level: int, kind: str, size: str, shared: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")
    (d / "shared_cpu_list").write_text(f"{shared}\n")


def test_the_private_cache_is_the_largest_data_cache_no_other_cpu_shares(tmp_path: Path) -> None:
    """sysfs of a 2-core EPYC VM: L1d 32K, L1i 32K, L2 1024K on cpu 0 alone, L3 32M on 0-1."""
    _cache(tmp_path, 0, 1, "Data", "32K", "0")
    _cache(tmp_path, 1, 1, "Instruction", "32K", "0")
    _cache(tmp_path, 2, 2, "Unified", "1024K", "0")
    _cache(tmp_path, 3, 3, "Unified", "32768K", "0-1")
    assert mb.private_cache_bytes(tmp_path) == 1024 * 1024


def test_an_l2_shared_by_hyperthreads_is_not_private_and_sizes_in_m_read(tmp_path: Path) -> None:
    _cache(tmp_path, 0, 1, "Data", "48K", "0")
    _cache(tmp_path, 2, 2, "Unified", "2M", "0,8")  # shared with a sibling thread
    assert mb.private_cache_bytes(tmp_path) == 48 * 1024


def test_without_sysfs_the_private_cache_is_the_default(tmp_path: Path) -> None:
    assert mb.private_cache_bytes(tmp_path / "missing") == mb.DEFAULT_PRIVATE_CACHE


@pytest.mark.parametrize(
    ("nbytes", "pool", "copies"),
    [
        (1 << 20, 4 << 20, 4),  # 4 copies of 1 MiB span 4 MiB
        (3 << 20, 4 << 20, 2),  # ceil(4/3) = 2
        (16 << 20, 4 << 20, 2),  # larger than the pool: still 2, never the same buffers twice in a row
        (4, 4 << 20, mb.MAX_COPIES),  # tiny inputs: capped
        (1 << 20, 0, 1),  # pool 0: one warm set
    ],
)
def test_input_copies_span_the_pool(nbytes: int, pool: int, copies: int) -> None:
    assert mb.pool_copies(nbytes, pool) == copies


class _Result:
    """A stand-in tensor of ``n`` 4-byte elements."""

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 4


def test_each_call_takes_the_next_input_set_and_results_stay_alive_over_the_pool() -> None:
    seen: list[Any] = []

    def impl(ctx: Any, xs: Any, attrs: Attrs) -> tuple[_Result]:
        seen.append(xs)
        return (_Result(256),)  # 1 KiB per result

    sets = [["a"], ["b"], ["c"]]
    rot = mb.Rotation(impl, None, sets, Attrs({}), pool=3 * 1024)
    for _ in range(7):
        rot()
    assert [s[0] for s in seen] == ["b", "c", "a", "b", "c", "a", "b"]
    # the fewest latest results that span the pool: 3 of 1 KiB (without the oldest, 2 KiB < 3 KiB)
    assert rot.kept is not None and len(rot.kept) == 3


def test_a_warm_rotation_calls_on_its_one_set_and_keeps_no_result() -> None:
    seen: list[Any] = []

    def impl(ctx: Any, xs: Any, attrs: Attrs) -> tuple[_Result]:
        seen.append(xs[0])
        return (_Result(8),)

    rot = mb.Rotation(impl, None, [["a"]], Attrs({}), pool=0)
    rot()
    rot()
    assert seen == ["a", "a"]
    assert rot.kept is not None and not rot.kept
