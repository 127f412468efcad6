"""Every part of a strategy as its own field, for the JSON and CSV outputs (``docs/json.md``).

``strategy_fields(strategy, batch, blocks)`` spells out what the strategy string packs:

    strategy          the string (``distir.parallel.strategy``)
    d, t, p           data-, tensor-, pipeline-parallel degrees
    k                 microbatches per step and data-parallel replica
    v                 virtual pipeline stages (chunks) per pipeline rank
    schedule          gpipe, 1f1b, interleaved or zb1
    microbatch_size   samples per microbatch and replica: batch / (d·k)
    sp                sequence parallelism on the tensor-parallel axis
    c                 context-parallel degree (ring attention over the sequence; 1: none)
    zero              ZeRO stage 0-3
    recompute         none, selective, full or ops
    partition         uniform, params or explicit (an ``L…`` part)
    layers_per_chunk  repeated blocks of each of the p·v chunks (chunk c on stage c mod p), the
                      partition resolved on the model (embedding with chunk 0, head with the last)
    placement         the cluster GPU of each program device (stage-major, tensor rank fastest)
    shares            batch shares of the d replicas, lowest terms (all 1: even)

``SCHEMA`` versions the JSON objects that carry these fields: bump it when a field changes meaning
or goes away (adding one is compatible).
"""

from __future__ import annotations

import functools
from typing import Any

from distir.frontends.zoo import build_model
from distir.frontends.zoo.model import Model
from distir.parallel.pipeline.partition import chunk_blocks as _blocks
from distir.parallel.strategy import Strategy

SCHEMA = 1
STRATEGY_FIELDS = (
    "strategy",
    "d",
    "t",
    "p",
    "k",
    "v",
    "schedule",
    "microbatch_size",
    "sp",
    "c",
    "zero",
    "shard_group",
    "recompute",
    "partition",
    "layers_per_chunk",
    "placement",
    "shares",
)


def _model(spec: str) -> Model:
    """The model of ``spec`` at batch 1, cached by the contents of the files it reads."""
    from distir.frontends.torch_import.source import content_digest

    return _model_at(spec, content_digest(spec))


@functools.lru_cache(maxsize=8)
def _model_at(spec: str, model_files: str) -> Model:
    return build_model(spec, batch=1)


def chunk_blocks(model: str, strategy: Strategy) -> tuple[int, ...]:
    """The repeated blocks of every pipeline chunk of zoo ``model`` under ``strategy`` (its
    partition resolved as ``distribute`` resolves it; raises ``StrategyError`` when it does not fit
    the model)."""
    return _blocks(_model(model), strategy)


def strategy_fields(strategy: Strategy, batch: int, blocks: tuple[int, ...] | None) -> dict[str, Any]:
    """The fields of ``strategy`` (module docstring), in ``STRATEGY_FIELDS`` order; ``blocks``:
    ``chunk_blocks`` (None when unknown: ``layers_per_chunk`` null)."""
    s = strategy
    part = s.partition if isinstance(s.partition, str) else "explicit"
    return {
        "strategy": str(s),
        "d": s.d,
        "t": s.t,
        "p": s.p,
        "k": s.k,
        "v": s.v,
        "schedule": s.schedule,
        "microbatch_size": batch // (s.d * s.k),
        "sp": s.sp,
        "c": s.c,
        "zero": s.zero,
        "shard_group": s.zero_degree if s.zero else None,  # ZeRO's shard group (HSDP: < d)
        "recompute": s.recompute,
        "partition": part,
        "layers_per_chunk": list(blocks) if blocks is not None else None,
        "placement": list(s.gpus),
        "shares": list(s.shares) if s.shares is not None else [1] * s.d,
    }


def fields_for(model: str, strategy: Strategy, batch: int) -> dict[str, Any]:
    """``strategy_fields`` with the blocks resolved on zoo ``model``."""
    return strategy_fields(strategy, batch, chunk_blocks(model, strategy))


__all__ = ["SCHEMA", "STRATEGY_FIELDS", "chunk_blocks", "fields_for", "strategy_fields"]
