"""GPT's ``dropout`` option (Megatron-LM's hidden dropout): the model string's float parsing and
range checks; at 0 the program is the one without the option; at p > 0 each block drops the
attention projection's and the MLP's results (two Dropout ops whose bool masks the backward
keeps) and passes ``dropout=p`` to the fused attention; such a model distributes and simulates,
and its simulated peak memory grows per layer by the two masks, 2·b·s·H bytes per microbatch
in flight (b, s: the microbatch's samples and the device's share of the sequence), computed here
from the strategy, not read from the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.reverse import attention_core
from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo import ModelError, build_model, parse_model_string
from distir.frontends.zoo.gpt import GPTConfig
from distir.hardware.cluster import parse_cluster
from distir.interp.loop import InterpretError
from distir.interp.reference import run_reference
from distir.ir.printer import print_module
from distir.ir.types import DType
from distir.ops.nn import DropoutError
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

TINY = "gpt:layers=2,hidden=16,heads=2,seq=6,vocab=24"


def test_the_model_string_parses_a_probability() -> None:
    assert parse_model_string("gpt2-117m:dropout=0.1").config.dropout == 0.1
    assert parse_model_string("gpt2-117m:dropout=0").config.dropout == 0.0
    assert parse_model_string("gpt2-117m").config.dropout == 0.0


@pytest.mark.parametrize("value", ["1", "1.5", "-0.1", "abc", "nan", "inf", ""])
def test_a_bad_probability_is_a_model_error(value: str) -> None:
    with pytest.raises(ModelError, match=r"dropout=.*expected a number in \[0, 1\)"):
        parse_model_string(f"gpt2-117m:dropout={value}")


def test_a_bad_probability_in_the_config_is_a_model_error() -> None:
    with pytest.raises(ModelError, match=r"dropout=1.0 must be a number in \[0.0, 1.0\)"):
        GPTConfig(2, 16, 2, 6, dropout=1.0)


def _ops(spec: str) -> list[tuple[str, dict[str, object]]]:
    model = build_model(spec, batch=2)
    fn = model.module[model.layers[1].callee]  # a block
    return [(op.name, dict(op.attrs.items())) for op in fn.ops()]


def test_no_dropout_is_the_program_without_the_option() -> None:
    plain = print_module(build_model(TINY, batch=2).module)
    assert print_module(build_model(f"{TINY},dropout=0", batch=2).module) == plain
    assert "Dropout" not in plain and "dropout" not in plain


def test_a_block_drops_both_residual_branches_and_the_attention() -> None:
    ops = _ops(f"{TINY},dropout=0.1")
    drops = [a for n, a in ops if n == "Dropout"]
    assert drops == [{"p": 0.1}, {"p": 0.1}]
    assert [a.get("dropout") for n, a in ops if n == "Attention"] == [0.1]
    names = [n for n, _ in ops]
    # each Dropout right after a bias Add, right before the residual Add
    for i in (k for k, n in enumerate(names) if n == "Dropout"):
        assert names[i - 1] == "Add" and names[i + 1] == "Add"


def test_the_naive_form_drops_the_probabilities_inside_the_recomputed_core() -> None:
    model = build_model(f"{TINY},dropout=0.1,attention=naive", batch=2)
    fn = model.module[model.layers[1].callee]
    drops = [op for op in fn.ops() if op.name == "Dropout"]
    assert len(drops) == 3
    core = attention_core(fn)
    assert sum(op in core for op in drops) == 1  # the probabilities' dropout, not the hidden ones


def test_the_reference_executor_refuses_a_model_with_dropout() -> None:
    model = build_model(f"{TINY},dropout=0.1,attention=naive", batch=2, dtype=DType.f64)
    step = training_step(model, Optimizer("sgd", lr=0.1))
    vals = model.random_inputs(seed=0)
    with pytest.raises(InterpretError, match=f"{DropoutError.__name__}: .* no sequential reference"):
        run_reference(step, [vals[p.name] for p in step.entry.params])


H, S, VOCAB = 256, 256, 64


def _activation_peaks(layers: int, p: float, strategy: str, batch: int, cluster: str) -> dict[int, float]:
    """Per GPU: the simulated peak minus the runtime memory (context, allocator reserve)."""
    model = build_model(f"gpt:layers={layers},hidden={H},heads=4,seq={S},vocab={VOCAB},dropout={p}", batch)
    st = parse_strategy(strategy)
    res = simulate(distribute(model, st, Optimizer("sgd", lr=0.1)), parse_cluster(cluster), device_map(st))
    return {g: res.peak_memory[g] - res.runtime_memory.get(g, 0.0) for g in res.peak_memory}


def _mask_growth_per_layer(strategy: str, batch: int, cluster: str) -> list[float]:
    """Per GPU, how much more the masks take per layer of a stage: the growth with dropout from
    4 to 8 layers, over the layers the stage gained."""
    stages = parse_strategy(strategy).p
    grow = {}
    for layers in (4, 8):
        on, off = (_activation_peaks(layers, p, strategy, batch, cluster) for p in (0.1, 0.0))
        grow[layers] = {g: on[g] - off[g] for g in on}
    per_stage = (8 - 4) / stages
    return sorted((grow[8][g] - grow[4][g]) / per_stage for g in grow[8])


def test_one_gpu_keeps_two_one_byte_masks_per_layer() -> None:
    batch = 2
    (got,) = _mask_growth_per_layer("d1.t1.p1.k1", batch, "h100")
    assert got == pytest.approx(2 * batch * S * H, rel=1e-6)


def test_a_distributed_model_with_dropout_keeps_its_masks_per_microbatch_in_flight() -> None:
    """d2.t2.sp.p2.k2, batch 8: a microbatch is 8 / (2·2) = 2 samples; sequence parallelism leaves
    each GPU S/2 tokens at the dropouts; under 1F1B the first stage holds 2 microbatches' masks at
    its peak, the second 1."""
    b, s = 8 // (2 * 2), S // 2
    got = _mask_growth_per_layer("d2.t2.sp.p2.k2", 8, "dgx-a100:8")
    unit = 2 * b * s * H
    want = sorted([unit] * 4 + [2 * unit] * 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
