"""The screen's figures (``distir.search.stage_costs``: per-stage rows memoized per strategy,
short sums in Python) against the plain numpy formulation written out here, bit for bit, on
strategies of every kind (balanced and pinned partitions, interleaved, ZeRO-1/3, one stage, stages
of more than 8 layers, inference) at random placements of a heterogeneous cluster."""

from __future__ import annotations

import itertools
import random
from dataclasses import astuple

import numpy as np
import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import uniform_counts
from distir.parallel.pipeline.analysis import (
    compiled_schedule,
    dependencies,
    merge,
    schedule_times,
    time_order,
)
from distir.parallel.pipeline.partition import block_counts, call_counts
from distir.parallel.pipeline.schedules import KINDS, build_schedule
from distir.parallel.strategy import Strategy
from distir.search.layer_assignment import assign_layers, objective
from distir.search.profile import Profiler
from distir.search.screen import Estimate, Problem, Screen
from distir.search.stage_costs import StageRows, delayed_ready

MODEL = "gpt:layers=16,hidden=64,heads=4,seq=16,vocab=128"
CLUSTER = "p3.8xlarge:1+g4dn.12xlarge:1"


def _pipeline(
    s: Strategy,
    rows: list[StageRows],
    t_chunk: list[float],
    bounds: np.ndarray,
    c_cut: list[float],
    train: bool,
) -> tuple[list[float], list[tuple[float, float]]]:
    """Per stage when its last pass ends, and per chunk (start, end) of its last pass computing
    weight gradients (its last backward; zero-bubble: its last weight pass): each chunk's forward
    its layers' forward rows, its backward the rest (a zero-bubble input-gradient pass its
    layers' rows of that pass, the weight pass the rest), the schedule's action lists in
    ``merge``'s order, each action starting when its stage is free and its dependencies have
    ended, plus half the cut's transfer (each direction) from another stage. One stage, or no
    backward: (k−1)·max(T, C) + ΣT + ΣC, the last backward the chunk's last."""
    t_stage = [sum(t_chunk[c] for c in range(len(t_chunk)) if c % s.p == j) for j in range(s.p)]
    passes = []
    for c, t in enumerate(t_chunk):
        r = rows[c % s.p]
        f = float(r.fwd[bounds[c] : bounds[c + 1]].sum())
        b = max(t - f, 0.0)
        i = min(float(r.ibwd[bounds[c] : bounds[c + 1]].sum()), b) if s.schedule == "zb1" else b
        passes.append({"F": f, "B": b, "I": i, "W": b - i})
    if s.p == 1 or not train:
        end_ = (s.k - 1) * max([*t_stage, *c_cut]) + sum(t_stage) + sum(c_cut)
        return [end_] * s.p, [(end_ - ps["B"], end_) if train else (0.0, 0.0) for ps in passes]
    v = s.v if s.schedule == "interleaved" else 1
    end: dict[object, float] = {}
    free = [0.0] * s.p
    grad = [(0.0, 0.0)] * len(t_chunk)
    kind = "W" if s.schedule == "zb1" else "B"
    for r_, a in merge(build_schedule(s.schedule, s.p, s.k, v), s.p, v):
        start = free[r_]
        for d in dependencies(a, s.p, v):
            hop = 0.0 if d.stage % s.p == r_ else c_cut[min(d.stage, a.stage)] / 2.0
            start = max(start, end[d] + hop)
        end[a] = free[r_] = start + passes[a.stage][a.kind]
        if a.kind == kind and end[a] >= grad[a.stage][1]:
            grad[a.stage] = (start, end[a])
    return free, grad


def _reduced_by(
    end: float,
    chunks: dict[int, tuple[float, float, float, list[tuple[float, float]]]],
    delayed: bool,
    stall: float,
    cap: float,
) -> float:
    """When a stage's reductions end, bucket by bucket: per chunk (its share of the reduction,
    its last weight-gradient pass's start and end, its layers' (gradient time, weight bytes)
    from its last layer to its first), in the order the chunks end, the layers filling buckets
    of ``cap`` bytes in that order, each bucket reduced once its last layer has run (Megatron's
    ``delayed`` chunks but the model's first: one call after the pass), one after another on
    one stream; the stage's computation (ending at ``end``) slowed by ``stall`` of each chunk's
    reduction time beside it, the chunk's reduction counted as one span ending with its last
    bucket."""
    free = beside = 0.0
    for c, (r, start, ready, layers) in sorted(chunks.items(), key=lambda x: x[1][2]):
        total_t = sum(t for t, _ in layers)
        total_w = sum(w for _, w in layers)
        if delayed and c > 0:
            free = max(free, ready) + r
        else:
            t = held = 0.0
            for i, (dt, w) in enumerate(layers):
                t += dt
                held += w
                if held >= cap or i == len(layers) - 1:
                    close = start + (ready - start) * (t / total_t if total_t else (i + 1) / len(layers))
                    free = max(free, close) + r * held / total_w
                    held = 0.0
        beside += max(0.0, min(free, end) - (free - r))
    return max(free, end + stall * beside)


def _replay(s: Strategy, j: int) -> list[tuple[str, int, dict[int, tuple[int, int, int]]]]:
    """Replaying stage j's actions: before each backward pass (``B``: full or input-gradient;
    ``W``: weight-gradient), after each forward (``F``) and at the end (``O``), the chunk whose
    pass runs (-1 at the end) and per chunk (virtual stage) of the stage, how many microbatches
    sit between F and B or I (their saved activations held), between I and W (what I carries to
    W held), and whether it has run a backward (its gradient accumulator held)."""
    held = {c: [0, 0, 0] for c in range(j, s.p * s.v, s.p)}
    out = []
    for a in build_schedule(s.schedule, s.p, s.k, s.v)[j]:
        if a.kind != "F":
            out.append(
                ("W" if a.kind == "W" else "B", a.stage, {c: (x[0], x[1], x[2]) for c, x in held.items()})
            )
        h = held[a.stage]
        if a.kind == "F":
            h[0] += 1
        elif a.kind == "B":
            h[0] -= 1
            h[2] = 1
        elif a.kind == "I":
            h[0], h[1] = h[0] - 1, h[1] + 1
        elif a.kind == "W":
            h[1] -= 1
            h[2] = 1
        if a.kind == "F":
            out.append(("F", a.stage, {c: (x[0], x[1], x[2]) for c, x in held.items()}))
    out.append(("O", -1, {c: (x[0], x[1], x[2]) for c, x in held.items()}))
    return out


def backward_terms(
    rows: list[StageRows],
    r: list[int],
    grad_f: float,
    split: bool,
    zero3: bool,
    saved: np.ndarray,
    carried: np.ndarray,
) -> tuple[float, float]:
    """What a microbatch's backward of the chunk of layers ``r`` adds at its worst layer to what
    the stage holds before it, (first backward, later ones): running the layers last to first,
    layer i's incoming gradient and working set (the worst of the stages'; the input-gradient
    pass's when ``split``; with ZeRO-3 its weights dying in it), less the saved activations the
    layers after it freed (less what they carry to W), plus in the first backward their weight
    gradients; in a later one, after layer i, its gradient passed on, its weight gradients and
    the sum of the largest with its accumulator."""
    r = r[::-1]
    rows_bw = [x.ibwd_work if split else x.zbwd_work if zero3 else x.bwd_work for x in rows]
    bw = np.max(rows_bw, axis=0)[r]
    dec = saved[r] - carried[r] if split else saved[r]
    gone = np.concatenate([[0.0], np.cumsum(dec)[:-1]])
    grads = np.zeros(len(r)) if split else grad_f * rows[0].weight[r]
    made = np.concatenate([[0.0], np.cumsum(grads)[:-1]])
    base = rows[0].out[r] + bw - gone
    first, later = float(max(0.0, (base + made).max(initial=0.0))), float(max(0.0, base.max(initial=0.0)))
    if not split and len(r):
        dx = np.array([rows[0].out[i - 1] if i > 0 else 0.0 for i in r])
        after = dx + grad_f * rows[0].weight[r] + grad_f * rows[0].largest[r] - np.cumsum(dec)
        later = max(later, float(after.max()))
    return first, later


def reference(screen: Screen, s: Strategy, placement: tuple[int, ...], balance: bool) -> tuple[object, ...]:
    """``Screen.estimate`` as one numpy computation on the stacked stages (no memo of figures)."""
    pr = screen.problem
    b = pr.batch // (s.d * s.k)
    stages = screen.stage_gpus(s, placement)
    rows = [screen._stage_rows(s, g, b)[1] for g in stages]
    n_layers = rows[0].time.size
    chunks = s.p * s.v
    stage_of = [c % s.p for c in range(chunks)]
    kinds = [screen._kinds[g[0]] for g in stages]
    links = [
        None
        if stages[stage_of[c]] == stages[stage_of[c + 1]]
        else screen._link(stages[stage_of[c]], stages[stage_of[c + 1]])
        for c in range(chunks - 1)
    ]
    groups = [tuple(g[:: s.t][: s.d]) for g in stages]
    h = s.shard_group or s.d  # HSDP gathers within its group, shards its state over it
    zero3 = [screen._gather(grp[:h]) for grp in groups] if pr.train and s.zero == 3 and s.d > 1 else []
    fb = 1.0 if pr.train else 0.0
    lt = np.array([r.time for r in rows])
    w_bytes, n_w, saved, out_b = rows[0].weight, rows[0].n_w, rows[0].saved * fb, rows[0].out
    work = np.max([r.work for r in rows], axis=0)
    static_f = 1.0 / h if s.zero == 3 else 1.0
    grad_f = 0.0
    if pr.train:  # the gradient (accumulated in place; a shard from ZeRO-2) and optimizer state
        grad_f = 1.0 / h if s.zero >= 2 else 1.0
        static_f += pr.n_state / (h if s.zero >= 1 else 1)
    # ZeRO-3, gathered one layer ahead: a pass over layers with compute c_i and gathers g_i takes
    # g_first + Σ max(c_i + s·g_next, g_next) + c_last (s: the SMs a gather holds); per layer
    # max(f_i + s·g_{i+1}, g_{i+1}) + max(b_i + s·g_{i-1}, g_{i-1}), and
    # per chunk its ends (``edges``); b_i is a zero-bubble schedule's input-gradient pass (the
    # weight pass reads no weights)
    edges = []
    for j, (lat, per_byte, *_) in enumerate(zero3):
        g = w_bytes * per_byte + (n_w > 0) * lat  # a layer's gathers: one call
        f = rows[j].fwd
        bw = rows[j].ibwd if s.schedule == "zb1" else rows[j].time - rows[j].fwd
        gemm = screen._specs[kinds[j]].gemm
        sm = gemm.comm_sms / gemm.sms if gemm is not None else 0.0  # a layer beside a gather slows
        g_next, g_prev = np.append(g[1:], 0.0), np.insert(g[:-1], 0, 0.0)
        f_over = np.maximum(f + sm * g_next, g_next) - f
        b_over = np.maximum(bw + sm * g_prev, g_prev) - bw
        lt[j] += f_over + b_over
        edges.append((g, f_over, b_over))
    if pr.train and s.k > 1:
        for j in range(s.p):
            spec = screen._specs[kinds[j]]
            lt[j] += (
                (s.k - 1)
                / s.k
                * (3 * grad_f * w_bytes / (0.8 * spec.memory_bandwidth) + n_w * spec.launch_overhead_s)
            )
    time_c = lt[stage_of]
    comm = np.zeros((max(chunks - 1, 0), max(n_layers - 1, 0)))
    for c, link in enumerate(links):
        if link is not None:
            comm[c] = (2.0 if pr.train else 1.0) * (link[0] + out_b[:-1] * link[1])
    holds = [
        _replay(s, j) if pr.train else [("F", -1, dict.fromkeys(range(j, chunks, s.p), (1, 0, 0)))]
        for j in range(s.p)
    ]
    infl = [max(sum(x[0] for x in h.values()) for _, _, h in hs) for hs in holds]
    pending = [max(sum(x[1] for x in h.values()) for _, _, h in hs) for hs in holds]
    carried = rows[0].carried * fb
    f = static_f + grad_f  # the layer assignment's bound: each term at its worst
    mem = np.array([f * w_bytes + infl[j] * saved + pending[j] * carried for j in range(s.p)])
    caps = np.array([r.cap for r in rows], float)
    transient = work.max() + (w_bytes.max() if zero3 else 0.0)  # ZeRO-3: with a gathered layer
    # the embedding stays with the first chunk, head and loss with the last: a cut between two
    # of their calls costs more than any step (the screen merges them into one unit instead)
    e = screen.ends
    n_blocks = n_layers - e.pre - e.post
    uni = call_counts(uniform_counts(n_blocks, chunks), e)
    if isinstance(s.partition, tuple):
        counts = call_counts(s.partition, e)
    elif balance and s.v == 1 and s.p > 1:
        walled = comm.copy()
        walled[:, [*range(e.pre - 1), *range(n_layers - e.post, n_layers - 1)]] = 1e6
        got = assign_layers(time_c, s.k, walled, mem, caps - transient) or assign_layers(time_c, s.k, walled)
        assert got is not None
        counts = got.counts
        if counts != uni and objective(uni, time_c, s.k, comm) <= objective(counts, time_c, s.k, comm) * (
            1 + 1e-6
        ):
            cut = np.concatenate([[0], np.cumsum(uni)])
            if all(mem[j, cut[j] : cut[j + 1]].sum() <= caps[j] - transient for j in range(s.p)):
                counts = uni
    else:
        counts = uni
    bounds = np.concatenate([[0], np.cumsum(counts)])
    t_chunk = [float(time_c[c, bounds[c] : bounds[c + 1]].sum()) for c in range(chunks)]
    for c, (a, z) in enumerate(itertools.pairwise(bounds)):
        if edges and z > a:  # each pass's first gather; no overlap with gathers past the chunk
            g, f_over, b_over = edges[stage_of[c]]
            t_chunk[c] += float(g[a] + g[z - 1] - f_over[z - 1] - b_over[a])
    c_cut = [float(comm[c, bounds[c + 1] - 1]) for c in range(chunks - 1)]
    t_stage = [sum(t_chunk[c] for c in range(chunks) if stage_of[c] == j) for j in range(s.p)]
    stage_end, grad = _pipeline(s, rows, t_chunk, bounds, c_cut, pr.train)
    pipe = max(stage_end)
    peaks, sync = [], 0.0
    for j in range(s.p):
        layers = [i for c in range(chunks) if stage_of[c] == j for i in range(bounds[c], bounds[c + 1])]
        wj, nwj = float(w_bytes[layers].sum()), int(n_w[layers].sum())
        sv, cv = float(saved[layers].sum()), float(carried[layers].sum())
        # per chunk: saved and carried bytes per microbatch, gradient bytes
        per = {c: list(range(bounds[c], bounds[c + 1])) for c in range(j, chunks, s.p)}
        b_c = {
            c: (float(saved[i].sum()), float(carried[i].sum()), grad_f * float(w_bytes[i].sum()))
            for c, i in per.items()
        }
        if s.v == 1:
            b_c = {j: (sv, cv, grad_f * wj)}
        # the pass running: its working set; a backward's, of the running chunk (its first or a
        # later one)
        fwd_w = float(np.max([r.fwd_work for r in rows], axis=0)[layers].max(initial=0.0))
        split = pending[j] > 0
        bt = {c: backward_terms(rows, i, grad_f, split, bool(zero3), saved, carried) for c, i in per.items()}
        pass_w = {"F": fwd_w, "W": float(w_bytes[layers].max(initial=0.0)), "O": 0.0}
        add = grad_f * float(rows[0].largest[layers].max(initial=0.0))  # a W pass's accumulation
        act = max(
            sum(x[0] * b_c[c][0] for c, x in h.items())
            + sum(x[1] * b_c[c][1] for c, x in h.items())
            + sum(x[2] * b_c[c][2] for c, x in h.items())
            + (
                bt[run][0 if h[run][2] == 0 else 1]
                if ph == "B"
                else pass_w[ph] + add
                if ph == "W" and h[run][2]
                else pass_w[ph]
            )
            for ph, run, h in holds[j]
        )
        # ZeRO-3: the running layer's gathered weights and the next one's (of its chunk)
        gathered = 0.0
        if zero3:
            gathered = max(
                [
                    0.0,
                    *[
                        float((w_bytes[i] + np.append(w_bytes[i][1:], 0.0)).max())
                        for i in per.values()
                        if len(i)
                    ],
                ]
            )
        peaks.append(static_f * wj + act + gathered)
        if pr.train:  # the reductions beside the last backwards, then what follows them
            tb = screen._tables_of(s)
            red, after = screen._sync_time(s, tb, groups[j], kinds[j], wj, nwj)
            grad_t = rows[j].time - rows[j].fwd
            if s.schedule == "zb1":
                grad_t = grad_t - np.minimum(rows[j].ibwd, grad_t)
            parts = {
                c: (
                    red * float(w_bytes[i].sum()) / wj,
                    *grad[c],
                    [(float(grad_t[x]), float(w_bytes[x])) for x in reversed(i)],
                )
                for c, i in per.items()
                if float(w_bytes[i].sum()) > 0
            }
            if red <= 0.0:
                done = stage_end[j]
            elif tb.reduction.after_stage:
                done = stage_end[j] + red
            else:
                end_j = stage_end[j]
                if s.zero == 3 or (s.zero == 2 and s.p == 1):  # every backward reduces
                    end_j += screen._stalls[kinds[j]] * red * (s.k - 1)
                done = _reduced_by(
                    end_j, parts, tb.reduction.delayed, screen._stalls[kinds[j]], tb.reduction.bucket_bytes
                )
            sync = max(sync, done + after)
    headroom = [float(c) - p for c, p in zip(caps, peaks, strict=True)]
    worst = int(np.argmin(headroom))
    step = max(pipe, sync)
    busy = s.k * max(t_stage)
    blocks = block_counts(counts, e)
    part = "uniform" if blocks == uniform_counts(n_blocks, chunks) else blocks
    place = None if placement == tuple(range(len(placement))) else placement
    return (
        astuple(
            Strategy(
                s.d,
                s.t,
                s.p,
                s.k,
                s.schedule,
                s.v,
                s.zero,
                s.recompute,
                part,
                place,
                shard_group=s.shard_group,
            )
        ),
        step,
        max(peaks),
        float(caps[worst]) if peaks[worst] > caps[worst] else float(caps.min()),
        min(headroom) >= 0,
        max(0.0, 1.0 - s.k * sum(t_stage) / s.p / step) if step > 0 else 0.0,
        busy,
        max(pipe - busy, 0.0),
        step - pipe,
        min(headroom),
    )


def _assert_equal(got: Estimate, want: tuple[object, ...]) -> None:
    """The screen's estimate is the reference's: the strategy exactly, the figures to rounding
    (the reference runs the gradient buckets one by one, the screen in closed form)."""
    assert astuple(got.strategy) == want[0]
    assert astuple(got)[1:] == pytest.approx(want[1:], rel=1e-12, abs=1e-15)


STRATEGIES = [
    (Strategy(d=2, t=1, p=4, k=8, schedule="1f1b"), True),
    (Strategy(d=1, t=1, p=8, k=16, schedule="zb1"), True),
    (Strategy(d=1, t=1, p=2, k=4, schedule="1f1b"), True),  # stages of 8 layers and more
    (Strategy(d=2, t=2, p=2, k=4, schedule="gpipe", zero=1, recompute="selective"), True),
    (Strategy(d=2, t=2, p=2, k=4, schedule="zb1", zero=3), True),
    (Strategy(d=2, t=1, p=2, k=4, schedule="interleaved", v=2), True),
    (Strategy(d=8, t=1, p=1, k=1, schedule="1f1b", zero=2), True),
    (Strategy(d=4, t=1, p=2, k=2, schedule="1f1b", zero=3, shard_group=2), True),  # HSDP
    (Strategy(d=2, t=1, p=4, k=8, schedule="1f1b"), False),
    (Strategy(d=1, t=2, p=4, k=4, schedule="1f1b", partition=(2, 3, 3, 8)), True),
    (Strategy(d=1, t=2, p=4, k=4, schedule="1f1b", partition=(0, 8, 8, 0)), True),  # end-only chunks
    (Strategy(d=2, t=1, p=1, k=2, schedule="interleaved", v=2), True),  # a cut inside one stage
    (Strategy(d=1, t=1, p=4, k=8, schedule="1f1b"), True),  # one node: ties with the uniform split
]


@pytest.mark.parametrize("train", [True, False])
def test_estimates_equal_the_numpy_formulation(train: bool) -> None:
    profiler = Profiler(parse_model_string(MODEL), parse_cluster(CLUSTER), train=train)
    screen = Screen(profiler, Problem(16, train=train))  # shared: its memos are exercised too
    rng = random.Random(7)
    n_layers, compared = 0, 0
    for s, balance in STRATEGIES:
        groups = [tuple(range(i, i + s.t)) for i in range(0, s.devices, s.t)]
        for r in range(12):
            if r:
                rng.shuffle(groups)
            pl = tuple(g for grp in groups for g in grp)
            got = screen.estimate(s, pl, balance)
            _assert_equal(got, reference(screen, s, pl, balance))
            compared += 1
        n_layers = screen._stage_rows(s, list(range(s.d * s.t)), 16 // (s.d * s.k))[1].time.size
    assert n_layers >= 16 and compared == 12 * len(STRATEGIES)


def test_estimates_equal_the_numpy_formulation_when_nothing_fits() -> None:
    """Activations beyond every GPU's memory: the layers are balanced on time alone."""
    model = "gpt:layers=6,hidden=1024,heads=16,seq=1024,vocab=128"
    screen = Screen(Profiler(parse_model_string(model), parse_cluster(CLUSTER)), Problem(1024))
    rng = random.Random(3)
    s = Strategy(d=2, t=1, p=4, k=1, schedule="gpipe")
    pl = list(range(s.devices))
    for _ in range(6):
        rng.shuffle(pl)
        got = screen.estimate(s, tuple(pl))
        assert not got.fits
        _assert_equal(got, reference(screen, s, tuple(pl), True))


def test_estimates_equal_the_numpy_formulation_when_the_uniform_split_ties() -> None:
    """Identical stages and blocks (an MLP: no embedding, a loss that costs little): an optimal
    split other than the uniform one gives way to it."""
    model = "mlp:layers=9,hidden=64"
    screen = Screen(Profiler(parse_model_string(model), parse_cluster("p3.8xlarge:2")), Problem(16))
    s = Strategy(d=1, t=1, p=4, k=8, schedule="1f1b")
    got = screen.estimate(s)
    assert got.strategy.partition == "uniform"
    _assert_equal(got, reference(screen, s, tuple(range(4)), True))


@pytest.mark.parametrize("p, k, v", [(2, 4, 2), (4, 8, 2), (4, 8, 3)])
def test_delayed_ready_is_the_ranks_backward_rank_steps_later(p: int, k: int, v: int) -> None:
    """``delayed_ready``: per virtual stage, the end of its rank's backward ``rank`` backward
    steps after the stage's last one (the rank's last if fewer), read off ``time_order``'s list
    scheduling of the same durations (Megatron-LM's delayed interleaved reductions)."""
    rng = random.Random(p * 100 + k * 10 + v)
    durations = [[rng.uniform(0.5, 2.0) for _ in KINDS] for _ in range(p * v)]
    order = compiled_schedule("interleaved", p, k, v)
    got = delayed_ready(order, schedule_times(order, durations, [(0.0, 0.0)] * (p * v - 1)).action_end, p)
    timed = time_order(
        build_schedule("interleaved", p, k, v), p, v, lambda r, a: durations[a.stage][KINDS.index(a.kind)]
    )
    for vs in range(p * v):
        r = vs % p
        mine = sorted((t for t in timed if t.rank == r and t.action.kind == "B"), key=lambda t: t.start)
        last = max(i for i, t in enumerate(mine) if t.action.stage == vs)
        assert got[vs] == pytest.approx(mine[min(last + r, len(mine) - 1)].end, rel=1e-12)
