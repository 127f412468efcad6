"""bench/bench_h100_attribution.py's bookkeeping (no simulation): README rows built from the
records keep their record's flags and take the row's settings, a row that is a record is the
record, and the pair algebra solves the two rows' equations."""

from __future__ import annotations

import pytest

from .scripts import load_script

ba = load_script("bench_h100_attribution")
RUNS = {r.name: r for r in ba.vp.load_runs()}
SIBLINGS = [s for pair in (*ba.PAIRS, *ba.KERNEL_PAIRS, *ba.SAME_CONFIG) for s in pair] + list(ba.GPU_SERIES)


@pytest.mark.parametrize("s", SIBLINGS, ids=lambda s: s.label)
def test_sibling_takes_the_rows_settings_and_the_records_flags(s: object) -> None:
    run = ba.build(s, RUNS)
    base = RUNS[s.base]
    assert run.published.value == s.value
    assert (run.model.seq, run.cluster.gpus, run.strategy.dp) == (s.seq, s.gpus, s.gpus)
    assert (run.strategy.microbatch, run.strategy.global_batch) == (s.microbatch, s.global_batch)
    assert run.strategy.recompute == s.recompute
    assert run.cluster.spec == ("h100" if s.h100 else base.cluster.spec)
    assert run.optimizer_kernels == base.optimizer_kernels and run.kernels == base.kernels
    assert run.attention_kernel == ("fa2" if s.flash else base.attention_kernel)


def test_a_row_that_is_a_record_is_the_record() -> None:
    flash, triton = ba.KERNEL_PAIRS[2]
    assert ba.build(triton, RUNS) is RUNS["mosaic-h100-7b-s2048-g8"]
    assert ba.build(flash, RUNS).model.unpad


def test_sequence_pairs_share_tokens_per_microbatch_and_accumulation() -> None:
    for short, long in ba.PAIRS:
        assert short.microbatch * short.seq == long.microbatch * long.seq
        accum = [s.global_batch // (s.gpus * s.microbatch) for s in (short, long)]
        assert accum[0] == accum[1] and short.seq < long.seq


def test_pair_factors_solve_both_rows() -> None:
    a, g = 0.7, 1.3
    short = ba.Classes(0.0, 20.0, 5.0, 6.0, g * 20.0 + a * 5.0 + 6.0)
    long = ba.Classes(0.0, 20.0, 11.0, 6.5, g * 20.0 + a * 11.0 + 6.5)
    assert ba.pair_factors(short, long) == pytest.approx((a, g))


def test_same_config_pairs_differ_only_in_the_gpu() -> None:
    for a100, h100 in ba.SAME_CONFIG:
        ra, rh = ba.build(a100, RUNS), ba.build(h100, RUNS)
        assert ra.cluster.spec != "h100" and rh.cluster.spec == "h100"
        assert (ra.model, ra.cluster.gpus) == (rh.model, rh.cluster.gpus)
        sa, sh = ra.strategy, rh.strategy
        assert (sa.microbatch, sa.recompute) == (sh.microbatch, sh.recompute)
        assert ra.attention_kernel == rh.attention_kernel == "fa-triton"


def test_gpu_series_keeps_the_13b_records_microbatch_and_one_step() -> None:
    record = RUNS["mosaic-h100-13b-s2048-g64"]
    assert ba.build(ba.GPU_SERIES[-1], RUNS) is record
    for s in ba.GPU_SERIES:
        run = ba.build(s, RUNS)
        assert run.strategy.global_batch == run.strategy.dp * run.strategy.microbatch == 2 * s.gpus
