"""Dispatch calibration: what an op and a message cost inside ``distir run``'s rank loop, measured
directly.

The microbenchmarks (``distir.backend.microbench``, ``distir.backend.commbench``) time one op or
one collective repeated back to back on warm inputs. A training step run by the rank interpreter
(``distir.backend.worker``) pays more per op: the interpreter's bookkeeping (argument lookup,
shape checks, live-bytes tracking, progress) and an allocation and cold caches for every result,
since consecutive ops differ. A collective or send inside a step pays more too: it follows
compute rather than another collective, so the peer's communication thread must be woken, and
the rank interpreter dispatches it. This pass measures those costs with synthetic programs run
through the real worker loop, each a chain of ``n`` steps on small tensors (``shape``):

- ``ops``: one rank runs a chain cycling through ``CHAIN`` ops (elementwise, row-wise, a small
  matrix product), each reading the previous result. Its per-op overhead is the chain's time
  less the same ops' tight-loop times (``microbench.time_call``, timed here), over ``n``; on a
  CPU both on the rank thread's CPU time (the clock the microbenchmarks time ops on);
- ``allreduce``: two ranks each run ``n`` times [Gelu, AllReduce of its result]; the
  per-collective overhead is the time per iteration less one Gelu in the loop (its tight-loop
  time plus the per-op overhead) less the all-reduce's time on its fitted link;
- ``p2p``: a ping-pong, ``n`` times [Gelu on d0, send to d1, Gelu on d1, send back]; the
  per-send overhead likewise, over ``2n`` sends and Gelus;
- ``arrival`` (a check, not in the model): two ranks each run ``n`` times [``m`` Gelus in a
  chain, AllReduce], once both ranks computing (they enter each call together) and once only one
  of them, alternating (the other enters early and waits for it, asleep: its threads block, its
  CPU may go idle, and the late rank's data must wake it). The second's time per iteration less
  the first's is what a call costs more when a rank waits for its peer (``arrival_s``).

Each program runs ``steps`` times; its time is the fastest step after the first (a shared
machine only ever adds time). ``apply`` adds the per-op overhead to every launch time and the
per-message overheads to the link latencies: p2p's to the point-to-point latency, the
collective's to every collective's latency divided by that collective's latency coefficient at
the group size measured (2 ranks: an all-reduce's alpha-beta formula counts 2α there), so that a
2-rank collective pays it once per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from distir.hardware.profile import Calibration
from distir.ir.types import DType

SHAPE = (64, 128)
ARRIVAL_GELUS = 12  # the late rank's Gelus per iteration in the arrival check: ~0.2 ms of work
CHAIN = ("Gelu", "Add", "Mul", "Softmax", "ReduceSum", "MatMul", "Transpose", "Exp")


class Dispatch(NamedTuple):
    """The measured overheads (s): per op, per collective call, per point-to-point send; and the
    measured times they came from (chain step, per-iteration times)."""

    op_s: float
    collective_s: float
    p2p_s: float
    chain_s: float  # the one-rank chain's step
    allreduce_iter_s: float  # one [Gelu, AllReduce] iteration
    p2p_iter_s: float  # one [Gelu, send] half of a ping-pong
    arrival_s: float = 0.0  # a call one rank waits for, beyond one both enter together
    together_iter_s: float = 0.0  # one [m Gelus on both ranks, AllReduce] iteration
    apart_iter_s: float = 0.0  # one [m Gelus on one rank, alternating, AllReduce] iteration


def _tensor(dev: str, shape: tuple[int, ...] = SHAPE) -> str:
    return f"Tensor[f32, ({', '.join(map(str, shape))}), {dev}]"


def chain_text(n: int, shape: tuple[int, ...] = SHAPE) -> str:
    """One rank (d0): ``n`` ops cycling through ``CHAIN``, each on the previous result."""
    c = shape[1]
    lines = [f"func @chain(%x0: {_tensor('d0')}, %w: {_tensor('d0', (c, c))}, %y: {_tensor('d0')}) {{"]
    for i in range(n):
        op, x, y = CHAIN[i % len(CHAIN)], f"%x{i}", f"%x{i + 1}"
        if op in ("Add", "Mul"):
            lines.append(f"  {y} = {op}({x}, %y)")
        elif op == "Softmax":
            lines.append(f"  {y} = Softmax({x}, axis=-1)")
        elif op == "ReduceSum":  # keepdims and a broadcast back keep the shape
            lines.append(f"  %s{i} = ReduceSum({x}, axes=[-1], keepdims=1)")
            lines.append(f"  {y} = Add({x}, %s{i})")
        elif op == "MatMul":
            lines.append(f"  {y} = MatMul({x}, %w)")
        elif op == "Transpose":
            lines.append(f"  %t{i} = Transpose({x}, perm=[1, 0])")
            lines.append(f"  {y} = Transpose(%t{i}, perm=[1, 0])")
        else:
            lines.append(f"  {y} = {op}({x})")
    lines += [f"  return %x{n}", "}"]
    return "\n".join(lines) + "\n"


def chain_ops(n: int) -> list[str]:
    """The ops ``chain_text(n)`` runs, in order."""
    out: list[str] = []
    for i in range(n):
        op = CHAIN[i % len(CHAIN)]
        out += {"ReduceSum": ["ReduceSum", "Add"], "Transpose": ["Transpose", "Transpose"]}.get(op, [op])
    return out


def allreduce_text(n: int, shape: tuple[int, ...] = SHAPE) -> str:
    """Two ranks: ``n`` times, each a Gelu then an all-reduce of the two results."""
    lines = [f"func @ar(%a0: {_tensor('d0', shape)}, %b0: {_tensor('d1', shape)}) {{"]
    for i in range(n):
        lines.append(f"  %ga{i} = Gelu(%a{i})")
        lines.append(f"  %gb{i} = Gelu(%b{i})")
        lines.append(f"  %a{i + 1}, %b{i + 1} = AllReduce(%ga{i}, %gb{i})")
    lines += [f"  return %a{n}, %b{n}", "}"]
    return "\n".join(lines) + "\n"


def arrival_text(n: int, m: int, apart: bool, shape: tuple[int, ...] = SHAPE) -> str:
    """Two ranks: ``n`` times, ``m`` Gelus in a chain, then an all-reduce of the two results; the
    Gelus run on both ranks, or (``apart``) on d0 at even and d1 at odd iterations only (the other
    rank runs an Identity)."""
    lines = [f"func @arr(%a0: {_tensor('d0', shape)}, %b0: {_tensor('d1', shape)}) {{"]
    for i in range(n):
        ins = []
        for x, late in (("a", i % 2 == 0), ("b", i % 2 == 1)):
            cur = f"%{x}{i}"
            if apart and not late:
                lines.append(f"  %{x}i{i} = Identity({cur})")
                cur = f"%{x}i{i}"
            for j in range(m if late or not apart else 0):
                lines.append(f"  %{x}g{i}_{j} = Gelu({cur})")
                cur = f"%{x}g{i}_{j}"
            ins.append(cur)
        lines.append(f"  %a{i + 1}, %b{i + 1} = AllReduce({ins[0]}, {ins[1]})")
    lines += [f"  return %a{n}, %b{n}", "}"]
    return "\n".join(lines) + "\n"


def p2p_text(n: int, shape: tuple[int, ...] = SHAPE) -> str:
    """A ping-pong: ``n`` times, a Gelu on d0, a send to d1, a Gelu there, a send back."""
    lines = [f"func @pp(%a0: {_tensor('d0', shape)}) {{"]
    for i in range(n):
        lines.append(f"  %g{i} = Gelu(%a{i})")
        lines.append(f"  %r{i} = Send(%g{i}, dst=d1)")
        lines.append(f"  %h{i} = Gelu(%r{i})")
        lines.append(f"  %a{i + 1} = Send(%h{i}, dst=d0)")
    lines += [f"  return %a{n}", "}"]
    return "\n".join(lines) + "\n"


def _run(text: str, steps: int, cpu: bool = False) -> float:
    """The fastest step after the first of the program ``text`` run by the worker loop (the
    slowest rank's time per step; ``cpu``: its thread CPU time, not its wall time)."""
    import distir
    from distir.backend.launch import LaunchOptions, launch
    from distir.backend.program import file_program, rank_programs
    from distir.ir import parse_module

    prog = file_program(distir.check(parse_module(text)), "dispatch")
    results = [
        g[0] for g in launch([[j] for j in rank_programs(prog, steps)], LaunchOptions(timeout_s=120.0))
    ]
    per_rank = [r.step_cpu_times if cpu else r.step_times for r in results]
    per_step = [float(max(ts)) for ts in zip(*per_rank, strict=True)]
    return min(per_step[1:] or per_step)


def _tight(ops: Sequence[str], repeats: int) -> dict[str, float]:
    """Each op's tight-loop time on the chain's shapes (this process, one thread)."""
    from distir.backend import microbench as mb
    from distir.backend.microbench import Case

    c = SHAPE[1]
    cases = {
        "Gelu": Case("Gelu", (SHAPE,)),
        "Exp": Case("Exp", (SHAPE,)),
        "Add": Case("Add", (SHAPE, SHAPE)),
        "Mul": Case("Mul", (SHAPE, SHAPE)),
        "Softmax": Case("Softmax", (SHAPE,), (("axis", -1),)),
        "ReduceSum": Case("ReduceSum", (SHAPE,), (("axes", (-1,)), ("keepdims", 1))),
        "MatMul": Case("MatMul", (SHAPE, (c, c))),
        "Transpose": Case("Transpose", (SHAPE,), (("perm", (1, 0)),)),
    }
    work = [(cases[o], DType.f32) for o in sorted(set(ops))]
    # warm (one buffer set): the chain's ops read the result just written, still in cache
    timing = mb.run_cases(work, "cpu", batch_s=0.002, repeats=repeats, pool=0)
    out = {s.op: s.seconds for s in timing.ops}
    out.update({o: g.seconds for o, g in zip(("MatMul",), timing.gemm, strict=False)})
    return out


class Runs(NamedTuple):
    """What the three programs measured: the chain's step, one all-reduce iteration, one half
    of a ping-pong (s); and the tight-loop times they are compared with: the chain's ops (sum),
    one Gelu, and the 2-rank all-reduce and the send of one message on their fitted links."""

    chain_s: float
    allreduce_iter_s: float
    p2p_iter_s: float
    chain_tight_s: float
    chain_ops: int
    gelu_s: float
    allreduce_link_s: float
    p2p_link_s: float
    together_iter_s: float = 0.0  # the arrival check: one iteration, both ranks computing
    apart_iter_s: float = 0.0  # one iteration, one rank computing (alternating)


def derive(r: Runs) -> Dispatch:
    """The overheads of the module docstring from the measured times (each at least 0)."""
    op_s = max(0.0, (r.chain_s - r.chain_tight_s) / r.chain_ops)
    gelu = r.gelu_s + op_s
    return Dispatch(
        op_s,
        max(0.0, r.allreduce_iter_s - gelu - r.allreduce_link_s),
        max(0.0, r.p2p_iter_s - gelu - r.p2p_link_s),
        r.chain_s,
        r.allreduce_iter_s,
        r.p2p_iter_s,
        max(0.0, r.apart_iter_s - r.together_iter_s),
        r.together_iter_s,
        r.apart_iter_s,
    )


def measure(
    cal: Calibration,
    n: int = 200,
    steps: int = 8,
    repeats: int = 15,
    tick: Callable[[str], None] | None = None,
) -> Dispatch:
    """Run the three programs (see the module docstring) and derive the overheads on ``cal``'s
    links (its fitted all-reduce link, else point-to-point's)."""
    from distir.backend import require_torch
    from distir.hardware.fit import link_coefficients
    from distir.sim import collectives as coll

    torch = require_torch()
    # the chain is timed on the clock its ops' tight loops are (``microbench.op_clock``): on a
    # CPU both are the thread's CPU time, so other processes' load cancels out of the difference
    cpu_clock = not torch.cuda.is_available()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tight = _tight(CHAIN, repeats)
    finally:
        torch.set_num_threads(threads)
    ops = chain_ops(n)
    times = []
    arrivals = max(2, n // 2)
    for what, text, per, cpu in (
        ("op chain", chain_text(n), 1, cpu_clock),
        ("all-reduce", allreduce_text(n), n, False),
        ("point-to-point", p2p_text(n), 2 * n, False),
        ("arrivals together", arrival_text(arrivals, ARRIVAL_GELUS, False), arrivals, False),
        ("arrivals apart", arrival_text(arrivals, ARRIVAL_GELUS, True), arrivals, False),
    ):
        times.append(_run(text, steps, cpu) / per)
        if tick is not None:
            tick(f"dispatch: {what}")
    nbytes = 4.0 * SHAPE[0] * SHAPE[1]
    link = cal.links.get("allreduce", cal.links["p2p"]).link
    x, y = link_coefficients(coll.allreduce_time, 2, nbytes)
    runs = Runs(
        times[0],
        times[1],
        times[2],
        sum(tight[o] for o in ops),
        len(ops),
        tight["Gelu"],
        x / link.bandwidth + y * link.latency_s,
        cal.links["p2p"].link.time(nbytes),
        times[3],
        times[4],
    )
    return derive(runs)


def summary(d: Dispatch) -> str:
    return (
        f"{d.op_s * 1e6:.3g} µs per op, {d.collective_s * 1e6:.3g} µs per collective, "
        f"{d.p2p_s * 1e6:.3g} µs per send; a call one rank waits for +{d.arrival_s * 1e6:.3g} µs"
    )
