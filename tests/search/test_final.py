"""A finished search re-renders from the store (``distir.search.final``): nothing screened or
simulated, the same output; another view of the same search screens again."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from distir.parallel.strategy import parse_strategy
from distir.search import run
from distir.search.final import FORMAT, estimates_from_plain, estimates_plain
from distir.search.run import SearchRequest, search
from distir.search.screen import Estimate
from distir.search.space import Pins
from distir.search.store import ResultStore, StoreError, dumps, loads, search_key

MODEL = "mlp:layers=4,hidden=256"


def _req(tmp_path: Path, **kw: object) -> SearchRequest:
    base: dict[str, object] = dict(
        model=MODEL, cluster="dgx-a100", batch=64, top=3, store=tmp_path / "s.sqlite"
    )
    base.update(kw)
    return SearchRequest(**base)  # type: ignore[arg-type]


def test_estimates_round_trip_through_the_store_format() -> None:
    strategies = ["d2.t2.p2.k4.zb1.z1.rsel", "d1.t1.p4.k8.1f1b.L1-1-1-3.@3-2-1-0", "d1.t2.sp.p1.k1.1f1b"]
    es = [
        Estimate(parse_strategy(s), 0.1 * i + 1 / 3, 2.0**40 + i, 3e10, i != 1, 0.25, 0.5, 0.01, 0.02, -1.5)
        for i, s in enumerate(strategies)
    ]
    es.append(
        Estimate(
            parse_strategy("d8.t1.p1.k1.gpipe"), math.inf, 1.0, 2.0, False, 0.0, 0.0, 0.0, 0.0, -math.inf
        )
    )
    back = estimates_from_plain(loads(dumps(estimates_plain(es))), "here")
    assert back == es


def test_malformed_estimates_are_a_store_error_naming_where() -> None:
    cols = estimates_plain(
        [Estimate(parse_strategy("d8.t1.p1.k1.gpipe"), 1.0, 1.0, 2.0, True, 0, 0, 0, 0, 1)]
    )
    with pytest.raises(StoreError, match="here: stored screen columns differ"):
        estimates_from_plain(cols | {"fits": []}, "here")
    with pytest.raises(StoreError, match="here: stored screen estimates are malformed"):
        estimates_from_plain(cols | {"strategy": ["d3.x"]}, "here")
    with pytest.raises(StoreError, match="malformed: 'sync_s'"):
        estimates_from_plain({k: v for k, v in cols.items() if k != "sync_s"}, "here")


def test_a_finished_search_re_renders_without_screening_or_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = search(_req(tmp_path))
    assert not first.from_store and first.n_cached == 0
    t = first.timings  # this process's CPU time by part: the screen's profiles within the screen's
    assert 0 <= t["screen_shard_cpu_s"] <= t["screen_profile_cpu_s"] <= t["screen_cpu_s"]
    assert min(t["anneal_cpu_s"], t["shares_cpu_s"], t["exact_cpu_s"]) >= 0

    def no(*a: object, **k: object) -> None:
        raise AssertionError("nothing may be screened or simulated on a rerun")

    monkeypatch.setattr(run, "screen_space", no)
    monkeypatch.setattr(run, "run_all", no)
    again = search(_req(tmp_path))
    assert again.from_store and again.n_cached == len(first.results)
    assert again.results == first.results
    assert again.screened == first.screened
    assert (again.n_screened, again.profiles) == (first.n_screened, first.profiles)
    assert {k: again.timings[k] for k in first.timings} == first.timings
    assert again.timings["render_s"] >= 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "other",
    [{"top": 2}, {"explain": True}, {"pins": Pins(tp=2)}, {"anneal_iters": 10}],
    ids=["top", "explain", "pins", "anneal"],
)
def test_another_view_screens_again_and_reuses_exact_results(
    tmp_path: Path, other: dict[str, object]
) -> None:
    first = search(_req(tmp_path))
    second = search(_req(tmp_path, **other))
    assert not second.from_store
    shared = {r["strategy"] for r in first.results} & {r["strategy"] for r in second.results}
    assert second.n_cached == len(shared)
    # the store now holds the second view's output: the second view re-renders, the first screens
    assert search(_req(tmp_path, **other)).from_store
    assert not search(_req(tmp_path)).from_store


def test_without_a_store_nothing_is_re_rendered(tmp_path: Path) -> None:
    search(_req(tmp_path))
    assert not search(_req(tmp_path, store=None)).from_store


def test_a_malformed_stored_output_is_a_store_error(tmp_path: Path) -> None:
    req = _req(tmp_path)
    search(req)
    key = search_key(req.key_parts())
    with ResultStore(req.store, key, req.key_parts()) as store:  # type: ignore[arg-type]
        payload = store.final()
        assert payload is not None and payload["format"] == FORMAT
        del payload["n_screened"]
        store.put_final(payload)
    with pytest.raises(StoreError, match=f"search {key}: stored output has no 'n_screened'"):
        search(req)
    # a payload of another format is not this code's to read: searched again, and replaced
    with ResultStore(req.store, key, req.key_parts()) as store:  # type: ignore[arg-type]
        store.put_final({"format": FORMAT + 1})
    assert not search(req).from_store
    assert search(req).from_store
