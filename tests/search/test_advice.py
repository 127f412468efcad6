"""When nothing fits, the search says what would (``distir.search.advice``): each change estimated
by the screen, the ones it says fit checked by the exact simulation."""

from __future__ import annotations

import pytest

from distir.search.rerank import ExactJob, evaluate
from distir.search.run import SearchOutput, SearchRequest, search
from distir.search.space import Pins

# ~1B parameters: 16 GiB of weights and Adam state in mixed precision, on 16 GiB T4s
MODEL = "gpt:layers=4,hidden=4096,heads=32,seq=1024"
CLUSTER = "g4dn.12xlarge"


@pytest.fixture(scope="module")
def pinned() -> SearchOutput:
    pins = Pins(tp=1, pp=1, zero=0, recompute="none")
    req = SearchRequest(MODEL, CLUSTER, 16, dtype="f16", precision="mixed", pins=pins, top=2, anneal_iters=0)
    return search(req)


def test_nothing_fits_and_the_advice_starts_from_the_nearest(pinned: SearchOutput) -> None:
    assert pinned.results and not any(r["fits"] for r in pinned.results)
    head, *changes = pinned.advice
    # microbatches of one sample (k = 4 at p = 1) are the nearest: the space has k at p = 1
    assert head.startswith("nothing fits: the nearest, d4.t1.p1.k4.1f1b, needs ")
    names = [line.split(": ")[0].strip() for line in changes]
    assert names[:2] == ["ZeRO-3", "full recomputation"] and "all of these" in names
    assert any(n.startswith("2× the nodes (g4dn.12xlarge:2)") for n in names)
    zero3 = next(line for line in changes if line.lstrip().startswith("ZeRO-3"))
    assert "fits" in zero3 and "(overrides your --zero)" in zero3


def test_what_the_advice_says_fits_fits_when_simulated_exactly(pinned: SearchOutput) -> None:
    checked = 0
    for line in pinned.advice[1:]:
        if "— fits" not in line:
            continue
        what, rest = line.strip().split(": ", 1)
        strategy = rest.split(",")[0]
        cluster = what.split("(")[1].rstrip(")") if "nodes" in what else CLUSTER
        job = ExactJob(MODEL, cluster, 16, True, "adam", "f16", "mixed")
        assert evaluate(job, strategy)["fits"], (what, strategy)
        checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_no_advice_when_something_fits() -> None:
    out = search(SearchRequest("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "dgx-a100", 16, top=2))
    assert out.results[0]["fits"] and out.advice == []


def test_node_scaling_stops_at_the_largest_cluster_distir_builds() -> None:
    """On 8,192 H100 nodes (65,536 GPUs, ``MAX_DEVICES``) there is no larger cluster to suggest:
    no advice to add nodes, and no error."""
    from distir.frontends.zoo.registry import parse_model_string
    from distir.hardware.cluster import parse_cluster
    from distir.ir.types import DType
    from distir.parallel.strategy import parse_strategy
    from distir.search.advice import _more_gpus
    from distir.search.profile import Profiler
    from distir.search.screen import Problem, Screen

    spec = parse_model_string("gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128")
    prof = Profiler(spec, parse_cluster("h100:8192"), DType.bf16, True, mixed=True)
    screen = Screen(prof, Problem(65_536, True, "adam", True))
    assert _more_gpus(screen, parse_strategy("d65536.t1.p1.k1.1f1b"), "h100:8192") is None


def test_the_advice_writes_a_step_as_the_table_does() -> None:
    """A change's step reads as the results table's (`15.535 s`), not `15535.1 ms`."""
    from distir.parallel.strategy import parse_strategy
    from distir.search.advice import Change, advice_lines
    from distir.search.screen import Estimate

    gib = float(1 << 30)

    def est(s: str, step: float, peak: float) -> Estimate:
        return Estimate(
            parse_strategy(s), step, peak * gib, 16 * gib, peak <= 16, 0.0, step, 0.0, 0.0, (16 - peak) * gib
        )

    lines = advice_lines(
        [est("d1.t1.p1.k8", 61.2, 131.7)], [Change("ZeRO-3", est("d1.t1.p1.k8.z3", 15.5351, 26.0))], set()
    )
    assert lines[1].endswith("still 10.0 GiB over, step 15.535 s"), lines[1]
