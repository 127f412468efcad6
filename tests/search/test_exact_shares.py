"""What the exact simulations of one search share (``distir.search.rerank``), against each done
afresh: one model object for every t the trainer runs the same model at, so strategies of one
microbatch size share the layers' differentiation (``layer_sharder._differentiated``); and
``distribute(called_only=True)``'s programs (``tests/parallel/test_called_only.py`` compares
them with the whole ones). Results, field for field, as each strategy evaluated alone from cold
caches gives them."""

from __future__ import annotations

from distir.hardware.cluster import parse_cluster
from distir.parallel import layer_sharder
from distir.search import rerank
from distir.search.rerank import ExactJob, evaluate

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
# the same microbatch of 4 at t = 1 and t = 2, and another
STRATEGIES = ["d2.t1.p2.k4.zb1", "d2.t2.p2.k4.1f1b", "d1.t2.sp.p2.k2.1f1b", "d4.t1.p1.k1.1f1b"]


def _job(trainer: str = "distir") -> ExactJob:
    return ExactJob(GPT, parse_cluster("p3.8xlarge:2"), 16, trainer=trainer)


def _cold() -> None:
    rerank._built.cache_clear()
    layer_sharder._DIFFERENTIATED.clear()


def test_one_model_for_every_t_the_trainer_runs_alike() -> None:
    job = _job()
    assert rerank._model(job, 1) is rerank._model(job, 2) is rerank._model(job, 4)
    assert rerank._model(job, 1).batch == 16


def test_shared_evaluations_give_what_each_gives_alone() -> None:
    job = _job()
    _cold()
    together = [evaluate(job, s) for s in STRATEGIES]
    model = rerank._model(job, 1)  # differentiated at microbatches of 4 (t = 1 and 2), 8, 16
    assert sum(got[0] is model for got in layer_sharder._DIFFERENTIATED.values()) == 3
    alone = []
    for s in STRATEGIES:
        _cold()
        alone.append(evaluate(job, s))
    assert [repr(r) for r in together] == [repr(r) for r in alone]
