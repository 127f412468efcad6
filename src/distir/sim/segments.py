"""PyTorch's CUDA caching allocator, block by block: the segments it reserves for a sequence of
allocations and frees.

The rules are ``c10/cuda/CUDACachingAllocator.cpp``'s with its default configuration
(``PYTORCH_CUDA_ALLOC_CONF`` unset: no ``max_split_size_mb``, no ``roundup_power2_divisions``, no
``expandable_segments``, no garbage-collection threshold):

- a request is rounded up to a multiple of 512 B (``round_size``, ``kMinBlockSize``);
- requests of at most 1 MiB (``kSmallSize``) come from the small pool, the rest from the large
  pool; each pool's cached blocks are searched for the smallest free block of the request's own
  stream at least as large (``get_free_block``: ``blocks.lower_bound`` over blocks ordered by
  stream, size and address);
- with none, a new segment is reserved with ``cudaMalloc`` (``alloc_block``) of 2 MiB for a
  small request (``kSmallBuffer``), 20 MiB for a request under 10 MiB (``kLargeBuffer``,
  ``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``;
  ``get_allocation_size``);
- the block handed out is the front of the block found; the rest is split off as a free block
  when it is at least 512 B (small pool) or more than 1 MiB (large pool; ``should_split``);
- a freed block merges with its free neighbours in the same segment (``free_block``,
  ``try_merge_blocks``) and stays cached: segments are never returned to CUDA unless an
  allocation fails (then every wholly free segment is, ``release_cached_blocks``) or
  ``torch.cuda.empty_cache()`` is called, so the reserved bytes only grow.

So a freed block serves a later request only when it is as large and on the same stream; a large
freed block that a larger request cannot use stays reserved beside the new segment. Not modelled:
the release on a failed allocation (the reserved figure here is the one without a capacity),
the events that delay reusing a block another stream still reads (``record_stream``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort

BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests below it get a kLargeBuffer segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are the request rounded up to it


def round_size(nbytes: float) -> int:
    """A request's block size: ``nbytes`` rounded up to 512 B, at least 512 B."""
    return max(BLOCK, math.ceil(nbytes / BLOCK) * BLOCK)


def segment_size(size: int) -> int:
    """The segment ``cudaMalloc`` reserves for a block of ``size`` bytes that no cached block
    serves (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return math.ceil(size / ROUND_LARGE) * ROUND_LARGE


class Block:
    """A block of a segment: its address and size, whether it is free, its neighbours in the
    segment (mutable: blocks split and merge)."""

    __slots__ = ("addr", "free", "next", "prev", "size", "small", "stream")

    def __init__(self, stream: str, small: bool, addr: int, size: int) -> None:
        self.stream, self.small, self.addr, self.size = stream, small, addr, size
        self.free = False
        self.prev: Block | None = None
        self.next: Block | None = None


class CachingAllocator:
    """One GPU's caching allocator: ``malloc`` and ``free`` blocks; ``reserved`` is the bytes of
    its segments (``reserved_bytes.all.current``, here also the peak: nothing is released),
    ``by_stream`` the same per stream."""

    def __init__(self) -> None:
        # (stream, small pool) -> its free blocks as (size, address, block), sorted
        self.cached: dict[tuple[str, bool], list[tuple[int, int, Block]]] = {}
        self.reserved = 0
        self.by_stream: dict[str, int] = {}
        self._top = 0  # the next segment's address

    def malloc(self, stream: str, nbytes: float) -> Block:
        """A block for a request of ``nbytes`` on ``stream``: the smallest cached one of the
        stream's pool that fits, split, or a new segment."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self.cached.setdefault((stream, small), [])
        i = bisect_left(free, (size, -1))  # the smallest cached block at least as large
        block = free.pop(i)[2] if i < len(free) else self._segment(stream, small, segment_size(size))
        rest = block.size - size
        if rest >= BLOCK if small else rest > SMALL_SIZE:  # should_split
            tail = Block(stream, small, block.addr + size, rest)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._cache(tail)
        block.free = False
        return block

    def free(self, block: Block) -> None:
        """Return ``block`` to its pool, merged with its free neighbours."""
        free = self.cached[block.stream, block.small]
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            free.pop(bisect_left(free, (prev.size, prev.addr)))
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        if nxt is not None and nxt.free:
            free.pop(bisect_left(free, (nxt.size, nxt.addr)))
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._cache(block)

    def _cache(self, block: Block) -> None:
        block.free = True
        insort(self.cached[block.stream, block.small], (block.size, block.addr, block))

    def _segment(self, stream: str, small: bool, size: int) -> Block:
        """A new segment of ``size`` bytes on ``stream``, as one block."""
        block = Block(stream, small, self._top, size)
        self._top += size
        self.reserved += size
        self.by_stream[stream] = self.by_stream.get(stream, 0) + size
        return block
