"""``distir.report.bounds``: the sizes commands estimate before building anything, against
independent counts (a naive recursive expansion, closed-form byte counts, the op count of the
program ``distribute`` really builds)."""

from __future__ import annotations

import pytest

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.frontends.zoo.model import ModelError
from distir.ir.function import Module
from distir.ir.ops import Call
from distir.ir.parser import parse_module
from distir.ir.types import DType
from distir.parallel.distribute import distribute
from distir.parallel.sharding.propagate import ShardingError
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.report.bounds import (
    check_cluster_fits,
    check_elements,
    check_program_ops,
    check_shard_size,
    flat_ops,
    program_ops_estimate,
    search_error,
    search_ops_error,
    value_bytes,
)

GPT = "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64"


def expanded(module: Module, name: str | None = None) -> int:
    """Primitive ops with calls expanded, by naive recursion (the oracle for ``flat_ops``)."""
    fn = module[name] if name is not None else module.entry
    return sum(expanded(module, i.callee) if isinstance(i, Call) else 1 for i in fn.body)


@pytest.mark.parametrize("strategy", ["d1.t1.p1.k1", "d2.t2.p2.k4", "d1.t1.p2.k8"])
def test_flat_ops_counts_every_call_expanded(strategy: str) -> None:
    model = build_model(GPT, batch=8)
    prog = distribute(model, parse_strategy(strategy), Optimizer("adam"), train=True, comm_streams=True)
    assert flat_ops(model.module) == expanded(model.module)
    assert flat_ops(prog) == expanded(prog)


@pytest.mark.parametrize(
    "strategy", ["d1.t1.p1.k1", "d1.t1.p1.k8", "d2.t2.p2.k4", "d4.t1.p1.k2", "d1.t4.p1.k4"]
)
def test_the_ops_estimate_is_within_a_small_factor_of_the_program(strategy: str) -> None:
    st = parse_strategy(strategy)
    model = build_model(GPT, batch=8 * st.d)
    prog = distribute(model, st, Optimizer("adam"), train=True, comm_streams=True)
    ratio = flat_ops(prog) / program_ops_estimate(model, st.k, True)
    assert 0.1 < ratio < 2.0, ratio


def test_the_ops_guard_names_the_size() -> None:
    model = build_model(GPT, batch=8)
    n = program_ops_estimate(model, 4, True)
    check_program_ops(model, 4, True, n, "m")
    with pytest.raises(ModelError, match=f"about {n:,} ops .* above --max-ops {n - 1:,}"):
        check_program_ops(model, 4, True, n - 1, "m")


def test_value_bytes_counts_inputs_and_results_of_every_call() -> None:
    text = """
    func @layer(%x: Tensor[f32, (8, 16), d0], %w: Tensor[f32, (16, 4), d0]) {
      %y = MatMul(%x, %w)
      %z = Relu(%y)
      return %z
    }
    func @main(%x: Tensor[f32, (8, 16), d0], %w: Tensor[f32, (16, 4), d0]) {
      %a = @layer(%x, %w)
      %b = @layer(%x, %w)
      return %a
    }
    """
    typed = distir.check(parse_module(text))
    params = (8 * 16 + 16 * 4) * 4
    per_call = params + 2 * 8 * 4 * 4  # its parameters, MatMul's and Relu's results
    assert value_bytes(typed) == params + 2 * per_call


def test_elements_beyond_2_53_are_refused_for_any_layer_count() -> None:
    spec = "gpt:layers=1000,hidden=16777216,heads=1,seq=16777216,vocab=16777216"
    bound = r"elements = [0-9,]+ is above distir's bound of 9,007,199,254,740,992"
    with pytest.raises(ModelError, match=bound):
        check_elements(spec, 16777216, DType.f32, spec)
    check_elements(GPT, 8, DType.f32, GPT)


def test_a_strategy_needs_its_gpus_on_the_cluster() -> None:
    check_cluster_fits(parse_strategy("d8"), "dgx-a100")
    check_cluster_fits(parse_strategy("d9"), None)
    check_cluster_fits(parse_strategy("d9"), "no-such-preset")  # the caller reports the cluster
    with pytest.raises(StrategyError, match="needs 9 GPUs but dgx-a100 has 8"):
        check_cluster_fits(parse_strategy("d9"), "dgx-a100")


def test_search_workers_and_batch() -> None:
    assert search_error(2, "local", 8) is None
    assert "--workers 10,000" in (search_error(10000, "local", 8) or "")
    assert "4,096 Ray workers" in (search_error(10000, "ray", 8) or "")
    assert "--batch = 16,777,217" in (search_error(1, "local", 2**24 + 1) or "")


def test_shard_size_grows_with_the_square_of_the_devices() -> None:
    m = parse_module("func @f(%x: Tensor[f32, (4,), d0]) {\n  %y = Relu(%x)\n  return %y\n}\n")
    check_shard_size(m, 100, 10_000)
    with pytest.raises(ShardingError, match="about 10,201 op-device entries"):
        check_shard_size(m, 101, 10_000)


def test_search_refuses_programs_too_big_to_simulate_exactly() -> None:
    ops = flat_ops(build_model("gpt2-117m", batch=1).module)
    assert search_ops_error("gpt2-117m", None, 128, 512, True) is None  # the defaults
    why = search_ops_error("gpt2-117m", 50000, 128, 50000, True) or ""
    assert f"about {ops * 50000 * 6:,} ops" in why and "--microbatches" in why
    assert "--max-microbatches" in (search_ops_error("gpt2-117m", None, 50000, 50000, True) or "")
    assert search_ops_error("gpt2-117m", None, 50000, 64, True) is None  # k is at most the batch
    assert search_ops_error("no-such-model", 50000, 128, 50000, True) is None  # the search reports it
