"""What distir refuses before it starts work, and the one grammar for integers in user text.

Every size, count and degree a user writes (strategy strings, model strings, mesh specs, device
maps, cluster specs and files, placements, CLI options) is checked here against a documented
bound *before* a program, a cluster or a process pool is built, so no input runs for minutes,
eats gigabytes or ends in ``MemoryError``/``OverflowError``: it gets a one-line error that says
the size and the bound instead (``docs/limitations.md``, "Bounds").

Integers in user text are ASCII digits only (``DIGITS``): ``str.isdigit()`` accepts ``²`` (which
``int()`` refuses) and ``int()`` accepts ``٢`` (Arabic-Indic two) — neither is a number distir
reads. Every parser tests digits with ``is_digits``.

The bounds are far above every real training job (the largest published runs use ~16k–100k
GPUs, ~120 transformer blocks, global batches of a few thousand sequences) and far below what
would exhaust this process: they protect against typos and hostile inputs, not real plans.
"""

from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

DIGITS = re.compile(r"[0-9]+")


_HUGE_DIGITS = 40  # longer digit strings are read as 10**40: above every bound, reported so


def is_digits(text: str) -> bool:
    """``text`` is one or more ASCII digits (nothing else: no sign, space or Unicode digit)."""
    return DIGITS.fullmatch(text) is not None


def read_int(text: str) -> int | None:
    """The value of ASCII digits ``text``, else None. More than 40 digits read as ``10**40``
    (above every bound; never ``int()``'s 4,300-digit ValueError or a slow conversion)."""
    if not is_digits(text):
        return None
    return 10**_HUGE_DIGITS if len(text) > _HUGE_DIGITS else int(text)


class Bound(NamedTuple):
    """An upper bound on one kind of size: ``what`` it bounds, its ``max`` and ``why``."""

    what: str
    max: int
    why: str


MAX_DEVICES = Bound(
    "on devices",
    65_536,
    "GPUs of a cluster and devices of a strategy or mesh (4x the 16,384 GPUs of Llama 3 405B)",
)
MAX_DEGREE = Bound(
    "on a parallel degree",
    MAX_DEVICES.max,
    "each of d, t, p, c, k, v of a strategy and each mesh axis",
)
MAX_BATCH = Bound("samples per step", 2**24, "samples per step (16,777,216)")
MAX_LAYERS = Bound("on a model's layers", 1_024, "repeated blocks of a model string (8x Llama 3 405B's 126)")
MAX_DIM = Bound("on a model size", 2**24, "any other integer of a model string: widths, heads, vocab, seq")
MAX_ELEMENTS = Bound("elements in one tensor", 2**53, "elements of one tensor (exact in a float64)")
MAX_CONSTANT = Bound(
    "elements in an imported constant",
    2**20,
    "elements of one constant an imported model computes (a table written into the program as "
    "a literal: about 2 s and 200 MB at the bound)",
)
MAX_OPS = Bound(
    "estimated ops (raise it with --max-ops)",
    10_000_000,
    "estimated primitive ops of a distributed program, calls expanded (--max-ops; about 30 s and "
    "1 GiB of simulation)",
)
# the caching allocator's walk (``simulate --reserved``) replays every allocation with calls
# expanded, about 20x the simulation's time per op: it takes this share of ``--max-ops``
RESERVED_OPS_SHARE = 20
MAX_RESERVED_OPS = Bound(
    "ops for --reserved (raise it with --max-ops)",
    MAX_OPS.max // RESERVED_OPS_SHARE,
    "ops of a program the caching allocator's walk replays, calls expanded (--max-ops / 20; about "
    "100 µs and 1.6 KB an op: 50 s and 0.8 GB at the bound)",
)
MAX_TRACE_EVENTS = Bound(
    "on a trace's events (choose GPUs with --trace-gpus)",
    2_000_000,
    "slices and memory samples of one --trace, estimated after planning (about 0.5-1 GB of JSON; "
    "Perfetto's UI runs in about 2 GB of browser memory)",
)
MAX_EXEC_BYTES = Bound(
    "bytes (raise it with --max-gib)",
    2 * 2**30,
    "bytes the reference executor (distir exec) may hold at once (--max-gib 2)",
)
MAX_CALL_DEPTH = Bound("nested calls", 64, "functions calling functions, in a program")
MAX_EPISODES = Bound(
    "on Automap's episodes",
    100_000,
    "episodes of distir shard --auto (500x the default 200; its search tree grows with every one)",
)
MAX_STEPS = Bound(
    "on steps",
    100_000,
    "--steps of distir run and validate (every step's time is kept; a measurement takes tens)",
)
MAX_AUTOMAP_SECONDS = Bound("on Automap's seconds", 86_400, "--seconds of distir shard --auto (a day)")
# types and attribute lists nested in program text, and tuple types a program builds: one bound
# for the parser, the type constructor and the printer, so every printed program parses back
MAX_TYPE_NESTING = 64
MAX_RAY_WORKERS = Bound("Ray workers", 4_096, "Ray tasks in flight (--executor ray)")
TOML_MAX_NESTING = MAX_TYPE_NESTING  # arrays/inline tables in a cluster file
TOML_MAX_DIGITS = 30  # digits of one number in a cluster file (beyond any figure it holds)


def max_local_workers() -> int:
    """Worker processes of a local search: this machine's CPUs (more only slows it), at least 4
    (so a small CI box can still run a parallel search)."""
    return max(4, os.cpu_count() or 1)


def max_local_ranks() -> int:
    """Processes of a local ``distir run``/``calibrate``/``validate`` (one per rank, each with
    torch loaded): this machine's CPUs, at least 8 (a GPU node's GPUs)."""
    return max(8, os.cpu_count() or 1)


def exceeds(value: int, bound: Bound) -> bool:
    return value > bound.max


def over(what: str, value: int, bound: Bound) -> str:
    """The one-line message for ``value`` (of ``what``) above ``bound``."""
    size = f"{value:,}" if value < 10**_HUGE_DIGITS else f"a number of more than {_HUGE_DIGITS} digits"
    return f"{what} = {size} is above distir's bound of {bound.max:,} {bound.what} (docs/limitations.md)"


def too_many_elements(shape: tuple[int, ...]) -> bool:
    return math.prod(shape) > MAX_ELEMENTS.max
