"""The screen's peak memory against the exact simulation's tensor peak, schedule by schedule:
zero-bubble pipelines hold, besides the saved activations of the microbatches between F and I,
what each input-gradient pass carries to its deferred weight-gradient pass."""

from __future__ import annotations

import pytest

from distir.parallel.strategy import parse_strategy
from distir.search.run import SearchRequest, search
from distir.search.screen_figures import _zb_states, pending_weight_grads
from distir.search.space import Pins

MODEL = "gpt:layers=8,hidden=512,heads=8,seq=512,vocab=4096"


@pytest.mark.parametrize("schedule", ["zb1", "1f1b", "gpipe"])
def test_screened_peak_follows_the_exact_tensor_peak(schedule: str) -> None:
    req = SearchRequest(
        model=MODEL, cluster="dgx-a100", batch=64, dtype="bf16", precision="mixed", top=6, workers=1,
        pins=Pins(schedule=schedule),
    )  # fmt: skip
    o = search(req)
    screened = {str(e.strategy): e.peak_memory_bytes for e in o.screened}
    runtime = o.cluster.device_spec(0).runtime
    ratios = [
        screened[r["strategy"]] / runtime.tensor_capacity(r["peak_memory_bytes"])
        for r in o.results
        if parse_strategy(r["strategy"]).p > 1
    ]
    assert len(ratios) >= 3
    assert all(0.9 <= x <= 1.2 for x in ratios), ratios


def test_zero_bubble_defers_weight_gradients_and_others_do_not() -> None:
    """ZB-H1 (Qi et al. 2023) defers weight gradients the more the later the stage, and keeps
    1F1B's peak: on every stage at most p microbatches between F and W at once."""
    zb = parse_strategy("d1.t1.p4.k8.zb1")
    pending = [pending_weight_grads(zb, j, True) for j in range(4)]
    assert pending == sorted(pending) and pending[0] >= 1
    for states in _zb_states(4, 8, 1):
        assert max(fi + iw for fi, iw in states) == 4
    assert pending_weight_grads(parse_strategy("d1.t1.p4.k8.1f1b"), 0, True) == 0
    assert pending_weight_grads(zb, 0, False) == 0
