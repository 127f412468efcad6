"""The model zoo: builders of chain-shaped models (``model.py``'s contract) for the DistIR
paper's MLP, GPT-2/GPT-3, Llama-style decoders and the TransGAN generator of AMP's
heterogeneous-model experiment.

    from distir.frontends.zoo import build_model
    m = build_model("gpt2-117m:layers=2", batch=8)     # a Model; m.module is the DistIR module
"""

from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec, check_model
from distir.frontends.zoo.registry import (
    FAMILIES,
    ZOO,
    ModelSpec,
    ZooEntry,
    ZooRow,
    build_model,
    human_count,
    parse_model_string,
    zoo_table,
)

__all__ = [
    "FAMILIES",
    "ZOO",
    "InputSpec",
    "Model",
    "ModelError",
    "ModelSpec",
    "WeightSpec",
    "ZooEntry",
    "ZooRow",
    "build_model",
    "check_model",
    "human_count",
    "parse_model_string",
    "zoo_table",
]
