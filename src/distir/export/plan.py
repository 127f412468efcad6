"""The plan an exporter writes: a strategy resolved against a model, a batch and numerics.

``make_plan(model, strategy, batch, dtype, precision, optimizer, cluster)`` checks what every
trainer needs (the batch divides into ``d·k`` microbatches, the strategy fits the model's blocks
and the cluster's GPUs) and resolves what the strategy string leaves implicit: the microbatch
size, the blocks of every pipeline chunk (a ``uniform`` or ``params`` partition as counts), the
model's shape, and ``auto`` numerics (mixed precision in the GPUs' fast half format, as
``distir search`` resolves them). FP8 training (``fp8``: torchao's dynamic tensorwise scaling;
``fp8-delayed``: Transformer Engine's delayed scaling; ``distir.autodiff.precision``) computes in
bf16 what is not float8 and needs FP8 tensor cores: another ``--dtype``, or a cluster whose GPUs
have none (A100, V100, T4), is refused as the simulator refuses it.

An exporter (one module per target in this package) turns a ``Plan`` into an ``Exported``: the
target's configuration text, the ``warnings`` where it wrote the nearest configuration the target
can express (never silently), and ``notes`` on what the user does in code. What a target cannot
express at all raises ``ExportError`` naming the feature and the target. Two features no trainer
expresses are refused here for all of them (``refuse_common``): uneven batch shares and a device
placement other than the trainers' rank order (distir's program device ``s·d·c·t + r·c·t + i·t +
j`` — stage s, replica r, context rank i, tensor rank j — is the rank order of Megatron-LM
(``tp-cp-dp-pp``), DeepSpeed and torchtitan's ``(pp, dp, cp, tp)`` mesh, so the identity placement
needs nothing). Context parallelism (``c<n>``) only Megatron-LM and torchtitan express
(``refuse_context`` for the others).
"""

from __future__ import annotations

from dataclasses import dataclass

from distir.autodiff.precision import FP8, FP8_DELAYED
from distir.export.hf_shape import hf_shape
from distir.export.shape import ModelShape
from distir.frontends.zoo.model import ModelError
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import Cluster
from distir.parallel.strategy import Strategy, StrategyError, parse_strategy
from distir.parallel.tp_split import split_refusal, tp_sizes
from distir.report.fields import chunk_blocks

FLOAT8 = (str(FP8), str(FP8_DELAYED))  # torchao's dynamic tensorwise scaling, Transformer Engine's delayed
# targets whose mixed precision computes in bf16 only (torchtitan's mixed_precision_param)
BF16_TARGETS = ("torchtitan",)


class ExportError(ValueError):
    """A plan the target cannot express, or bad input to the export (one line, names what)."""


@dataclass(frozen=True, slots=True)
class Plan:
    model: str  # the model string
    shape: ModelShape | None
    strategy: Strategy
    batch: int  # global batch (samples per step)
    microbatch: int  # samples per microbatch per data-parallel replica: batch / (d·k)
    blocks: tuple[int, ...]  # repeated blocks of each pipeline chunk (p·v of them), chunk c on stage c mod p
    dtype: str  # f32, bf16 or f16
    precision: str  # mixed (fp32 master weights and optimizer state), pure, fp8 or fp8-delayed
    optimizer: str  # adam or sgd
    cluster: str | None = None

    @property
    def uniform_blocks(self) -> int | None:
        """The blocks per chunk when every chunk holds as many, else None."""
        return self.blocks[0] if len(set(self.blocks)) == 1 else None

    @property
    def half(self) -> bool:
        return self.dtype in ("bf16", "f16")

    @property
    def float8(self) -> bool:
        """The linear layers multiply in float8 (mixed precision otherwise)."""
        return self.precision in FLOAT8


@dataclass(frozen=True, slots=True)
class Exported:
    target: str
    text: str
    suffix: str  # the file name ending the target reads: .toml, .json, .sh, .py
    warnings: tuple[str, ...] = ()  # where the nearest configuration the target can express was written
    notes: tuple[str, ...] = ()  # what the user does in code (the target's config cannot say it)


def model_shape(spec: str) -> ModelShape | None:
    """The trainers' arguments for the model string ``spec`` (None: none; ``shape_reason``)."""
    if spec.strip().startswith("hf:"):
        return hf_shape(spec).shape
    ms = parse_model_string(spec)
    c = ms.config
    if ms.family == "gpt":
        return ModelShape(
            "gpt", c.layers, c.hidden, c.heads, c.heads, 4 * c.hidden, c.seq, c.vocab, c.tied, None, c.dropout
        )
    if ms.family == "llama":
        return ModelShape(
            "llama", c.layers, c.hidden, c.heads, c.kv_heads, c.ffn, c.seq, c.vocab, False, c.rope_theta, 0.0
        )
    return None


def split_sizes(spec: str) -> dict[str, int]:
    """The sizes a tensor-parallel degree must divide in the model string ``spec``
    (``distir.parallel.tp_split``): a transformer's heads, query groups and FFN columns (of any
    family whose config names them: ``heads``, ``kv_heads``, ``ffn``, Nemotron's too), TransGAN's
    heads; {} for a model without attention heads (the MLPs, an imported module)."""
    shape = model_shape(spec)
    if shape is not None:
        return tp_sizes(shape)
    if spec.strip().startswith("hf:"):
        return _hf_split_sizes(spec)
    cfg = parse_model_string(spec).config
    heads = getattr(cfg, "heads", None)
    if not isinstance(heads, int):
        return {}
    sizes = {"heads": heads}
    kv, ffn = getattr(cfg, "kv_heads", None), getattr(cfg, "ffn", None)
    if isinstance(kv, int) and kv != heads:
        sizes["kv_heads"] = kv
    if isinstance(ffn, int):
        sizes["ffn"] = ffn
    return sizes


def _hf_split_sizes(spec: str) -> dict[str, int]:
    """``split_sizes`` of a Hugging Face config no trainer builds (GPT-2's, a Llama with a
    window): its heads, KV heads and FFN columns under the config's own names."""
    from distir.frontends.torch_import.hf import read_config
    from distir.frontends.torch_import.source import hf_path

    raw = read_config(hf_path(spec.strip())[0])
    heads = raw.get("num_attention_heads", raw.get("n_head"))
    if not isinstance(heads, int) or heads < 1:
        return {}
    sizes = {"heads": heads}
    kv = raw.get("num_key_value_heads")
    if isinstance(kv, int) and kv != heads:
        sizes["kv_heads"] = kv
    hidden = raw.get("hidden_size", raw.get("n_embd"))
    ffn = raw.get("intermediate_size") or raw.get("n_inner")
    ffn = ffn or (4 * hidden if isinstance(hidden, int) else None)
    if isinstance(ffn, int):
        sizes["ffn"] = ffn
    return {k: v for k, v in sizes.items() if isinstance(v, int) and v > 0}


def tp_split_refusal(spec: str, t: int) -> str:
    """Why tensor-parallel degree ``t`` cannot run the model string ``spec`` (its heads, query
    groups or FFN columns split across ranks: ``distir.parallel.tp_split``), or ""."""
    sizes = split_sizes(spec) if t > 1 else {}
    why = split_refusal(sizes, t) if sizes else ""
    return f"{spec}: {why}" if why else ""


def resolve_numerics(
    dtype: str, precision: str, cluster: str | Cluster | None, model: str = "", train: bool = True
) -> tuple[str, str]:
    """``auto`` as ``distir search`` and ``simulate`` resolve it (``distir.report.numerics``;
    without a cluster, f16, which every GPU with tensor cores runs fast); fp8 in bf16."""
    from distir.report.numerics import NumericsError, check_choices
    from distir.report.numerics import resolve_numerics as resolve

    try:
        check_choices(dtype, precision)
    except NumericsError as e:
        raise ExportError(str(e)) from None
    if precision in FLOAT8:
        return _float8_numerics(dtype, precision, cluster), precision
    if cluster is None and dtype == "auto" and not model.strip().lower().endswith(".onnx"):
        dtype = "f16"
    try:
        got = resolve(model, dtype, precision, train, cluster if cluster is not None else "dgx-a100")
    except NumericsError as e:
        raise ExportError(str(e)) from None
    return got.dtype, got.precision


def _float8_numerics(dtype: str, precision: str, cluster: str | Cluster | None) -> str:
    """FP8's dtype (bf16) after the simulator's checks: the dtype, the GPUs' FP8 tensor cores."""
    from distir.autodiff.precision import Precision, PrecisionError
    from distir.hardware.cluster import parse_cluster

    if dtype not in ("auto", "bf16"):
        raise ExportError(
            f"--precision {precision} computes what is not float8 in bf16: give --dtype bf16 (or auto), "
            f"not {dtype}"
        )
    if cluster is not None:
        try:
            Precision.parse(precision).check_devices(n.device for n in parse_cluster(cluster).nodes)
        except PrecisionError as e:
            raise ExportError(str(e)) from None
    return "bf16"


def make_plan(
    model: str,
    strategy: str | Strategy,
    batch: int,
    dtype: str = "auto",
    precision: str = "auto",
    optimizer: str = "adam",
    cluster: str | None = None,
    target: str = "",
) -> Plan:
    """Check and resolve a plan (module docstring). Raises ``ExportError``, ``StrategyError``,
    ``ModelError`` or ``HardwareError`` naming what is wrong. ``target``: the trainer exported to,
    whose half format ``auto`` takes without a cluster (torchtitan's is bf16: ``BF16_TARGETS``)."""
    s = parse_strategy(strategy) if isinstance(strategy, str) else strategy
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ExportError(f"batch must be a positive integer, got {batch!r}")
    if optimizer not in ("adam", "sgd"):
        raise ExportError(f"--optimizer must be adam or sgd, got {optimizer!r}")
    micro, rem = divmod(batch, s.d * s.k)
    if rem or micro < 1:
        raise ExportError(
            f"{s}: batch {batch} does not split into d·k = {s.d}·{s.k} = {s.d * s.k} equal microbatches "
            f"(a multiple of {s.d * s.k}: {', '.join(str(n * s.d * s.k) for n in (1, 2, 3))}, ...)"
        )
    if cluster is not None:
        from distir.hardware.cluster import parse_cluster

        n = parse_cluster(cluster).num_devices
        if s.devices > n:
            raise ExportError(f"{s} needs {s.devices} GPUs but {cluster} has {n}")
    if cluster is None and dtype == "auto" and target in BF16_TARGETS:
        dtype = "bf16"  # the target's only half format, as auto takes the GPUs' fast one
    dtype, precision = resolve_numerics(dtype, precision, cluster, model)
    try:
        blocks = chunk_blocks(model, s)
    except StrategyError as e:
        raise ExportError(f"{model}: {e}") from None
    return Plan(model, model_shape(model), s, batch, micro, blocks, dtype, precision, optimizer, cluster)


def refuse_common(plan: Plan, target: str) -> None:
    """The features no trainer's configuration expresses (module docstring)."""
    s = plan.strategy
    if s.shares is not None:
        raise ExportError(
            f"{target} cannot express uneven batch shares (b{'-'.join(map(str, s.shares))}): its "
            "data-parallel "
            "replicas take equal microbatches"
        )
    if s.placement is not None and s.placement != tuple(range(s.devices)):
        raise ExportError(
            f"{target} cannot express the device placement @{'-'.join(map(str, s.placement))}: its ranks are "
            "laid out pipeline stage, then data-parallel replica, then tensor rank; start the job with the "
            "GPUs (ranks) in the placement's order instead"
        )


def refuse_split_heads(plan: Plan, target: str, shape: ModelShape, ffn: bool) -> None:
    """A tensor-parallel size that splits a head, a query group or (``ffn``) an FFN column
    (``distir.parallel.tp_split``): ``target`` runs whole ones per rank, so its configuration
    would fail at startup."""
    why = split_refusal(tp_sizes(shape, ffn), plan.strategy.t)
    if why:
        raise ExportError(f"{target}: {why}")


def degrees_text(s: Strategy) -> str:
    """The world size's factors for a header: ``d·t·p = 2·4·2``, ``d·c·t·p`` with context parallelism."""
    if s.c == 1:
        return f"d·t·p = {s.d}·{s.t}·{s.p}"
    return f"d·c·t·p = {s.d}·{s.c}·{s.t}·{s.p}"


def refuse_context(plan: Plan, target: str) -> None:
    """Context parallelism (``c<n>``) for a target without it (DeepSpeed's Ulysses shards the
    heads, not the sequence by ring; FSDP2's script has no ``cp`` mesh dim)."""
    c = plan.strategy.c
    if c > 1:
        raise ExportError(
            f"{target} cannot express context parallelism (c{c}: the sequence split by ring attention); "
            "export it to megatron or torchtitan"
        )


BUILDS_ITS_OWN = ("megatron", "torchtitan")  # the targets that build the model from arguments


def transformer_refusal(model: str, target: str) -> str:
    """Why ``target`` (one of ``BUILDS_ITS_OWN``) has no arguments for the model string
    ``model``, and what to export it to ("" when it has them): known from the model alone, so
    ``search --export`` says it before searching."""
    if model_shape(model) is not None:
        return ""
    if model.strip().startswith("hf:"):
        what = hf_shape(model).why
    else:
        family = parse_model_string(model).family
        what = "an imported model" if family == "imported" else f"a model of the {family} family"
        what += " it has no arguments for"
    return (
        f"{target} builds its own transformers (GPT, Llama) from arguments; {model} is {what}: export "
        "it to deepspeed (a config for your module) or fsdp (a PyTorch file that parallelizes your module)"
    )


def need_transformer(plan: Plan, target: str) -> ModelShape:
    if plan.shape is None:
        raise ExportError(transformer_refusal(plan.model, target))
    return plan.shape


__all__ = [
    "BUILDS_ITS_OWN",
    "FLOAT8",
    "ExportError",
    "Exported",
    "ModelError",
    "ModelShape",
    "Plan",
    "degrees_text",
    "make_plan",
    "model_shape",
    "need_transformer",
    "refuse_common",
    "refuse_context",
    "refuse_split_heads",
    "resolve_numerics",
    "split_sizes",
    "tp_split_refusal",
    "transformer_refusal",
]
