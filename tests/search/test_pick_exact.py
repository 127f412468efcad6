"""Which strategies the search simulates exactly: the ``top`` best, and the best pure ones only
when ``--explain`` will compare the winner with them."""

from __future__ import annotations

import pytest

from distir.search.run import SearchRequest, is_pure, pure_bests, search

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


@pytest.mark.slow
def test_pure_bests_are_simulated_only_to_explain() -> None:
    req = SearchRequest(model=GPT, cluster="p3.8xlarge:1", batch=8, top=1)
    plain = search(req)
    fitting = [e for e in plain.screened if e.fits]
    assert [r["strategy"] for r in plain.results] == [str(fitting[0].strategy)]
    explained = search(SearchRequest(**{**req.__dict__, "explain": True}))
    got = {r["strategy"] for r in explained.results}
    pure = [str(s) for s in pure_bests(explained.screened)]
    assert {str(fitting[0].strategy), *pure} == got
    # one of each kind the 4 GPUs allow, and the winner's figures do not depend on the extras
    assert {k for k in "dtp" for s in explained.results if is_pure(s["d"], s["t"], s["p"], k)} == set("dtp")
    same = next(r for r in explained.results if r["strategy"] == plain.results[0]["strategy"])
    assert same == plain.results[0]
