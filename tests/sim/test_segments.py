"""PyTorch's caching allocator block by block (``distir.sim.segments``): segment sizes, best fit
on the request's own stream, splitting and merging, and the reserved bytes only growing."""

from __future__ import annotations

from distir.sim.segments import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    round_size,
    segment_size,
)

MIB = 1 << 20
GIB = 1 << 30


def test_requests_round_to_512_and_segments_follow_get_allocation_size() -> None:
    assert [round_size(x) for x in (0, 1, 512, 513)] == [512, 512, 512, 1024]
    assert segment_size(512) == segment_size(MIB) == SMALL_BUFFER == 2 * MIB
    assert segment_size(MIB + 512) == segment_size(10 * MIB - 512) == LARGE_BUFFER == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(10 * MIB + 512) == 12 * MIB  # kRoundLarge: up to 2 MiB


def test_small_requests_share_a_small_segment_and_medium_ones_a_20_mib_one() -> None:
    a = CachingAllocator()
    for _ in range(4):
        a.malloc("s", 1000)
    assert a.reserved == 2 * MIB
    for _ in range(6):  # 6 × 3 MiB = 18 MiB of one 20 MiB segment (the rest, 2 MiB, split off)
        a.malloc("s", 3 * MIB)
    assert a.reserved == 22 * MIB
    a.malloc("s", 3 * MIB)  # 2 MiB left: too small, a new 20 MiB segment
    assert a.reserved == 42 * MIB


def test_a_freed_block_serves_only_its_stream_and_requests_it_is_large_enough_for() -> None:
    a = CachingAllocator()
    x = a.malloc("compute", 4 * GIB)
    a.free(x)
    a.malloc("comm", 1 * GIB)  # another stream: its own segment
    assert a.by_stream == {"compute": 4 * GIB, "comm": 1 * GIB}
    a.malloc("compute", 8 * GIB)  # the cached 4 GiB block is too small: it stays reserved beside
    assert a.by_stream["compute"] == 12 * GIB
    a.malloc("compute", 3 * GIB)  # best fit: the cached 4 GiB block, split
    assert a.reserved == 13 * GIB


def test_freed_neighbours_merge_and_the_reserved_bytes_never_shrink() -> None:
    a = CachingAllocator()
    whole = a.malloc("s", 64 * MIB)
    a.free(whole)
    parts = [a.malloc("s", 16 * MIB) for _ in range(4)]  # the one segment, split four ways
    assert a.reserved == 64 * MIB
    a.free(parts[1])
    a.free(parts[2])  # merged with parts[1]: one 32 MiB block
    a.malloc("s", 32 * MIB)
    assert a.reserved == 64 * MIB
    for p in (parts[0], parts[3]):
        a.free(p)
    assert a.reserved == 64 * MIB  # cached, not released
