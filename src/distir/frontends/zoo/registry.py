"""The zoo: named models, model strings, and ``build_model``.

A model string is ``NAME`` or ``NAME:key=value,key=value`` — or an imported model: ``hf:PATH``
(a Hugging Face config) or ``package.module:factory`` (``distir.frontends.torch_import``), or a
model file: ``model.onnx`` or ``model.distir`` (``distir.frontends.files``).
``NAME`` is a zoo entry (``gpt2-117m``, ``llama3-8b``, ... — ``ZOO``) or a family (``mlp``,
``gpt``, ``llama``, ``nemotron``, ``transgan``); a bare family starts from its base entry
(``mlp-1b``, ``gpt2-117m``, ``llama2-7b``, ``nemotron-8b``, ``transgan-hetero``), and the
``key=value`` pairs override fields of the configuration: positive integers, one of the listed
words for an enumerated field (the transformers' ``attention=fused|naive``, ``qkv=split|fused``),
0 or 1 for a flag (GPT's ``tied``), or a number in [0, 1) for a probability (GPT's ``dropout``),
e.g.

    gpt:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200
    gpt2-117m:layers=2
    llama3-8b:attention=naive
    llama3-8b:qkv=fused
    gpt2-1.6b:dropout=0.1

An unknown name or key, a malformed pair or a bad value raises ``ModelError`` naming it, what
is expected and the close matches. ``build_model(spec, batch, dtype)`` builds the model for a
global batch (the loss is normalized by it) and checks the chain contract (``check_model``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distir.frontends.zoo import gpt, llama, mlp, nemotron, transgan
from distir.frontends.zoo._build import in_range
from distir.frontends.zoo.model import Model, ModelError
from distir.ir.dtensor import Placement
from distir.ir.types import DType
from distir.limits import MAX_BATCH, MAX_DIM, MAX_LAYERS, exceeds, over, read_int

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class Family:
    name: str
    config: type[Any]  # the family's config dataclass
    build: Callable[[Any, int, DType, str], Model]
    base: str  # the zoo entry a bare family name starts from
    doc: str


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("mlp", mlp.MLPConfig, mlp.build, "mlp-1b", "the DistIR paper's MLP (Relu(x·W) layers)"),
        Family("gpt", gpt.GPTConfig, gpt.build, "gpt2-117m", "GPT-2/GPT-3 decoder (pre-LN, GELU)"),
        Family("llama", llama.LlamaConfig, llama.build, "llama2-7b", "Llama decoder (RMSNorm, SwiGLU, GQA)"),
        Family(
            "nemotron",
            nemotron.NemotronConfig,
            nemotron.build,
            "nemotron-8b",
            "Nemotron decoder (LayerNorm1p, squared-ReLU MLP, GQA, partial RoPE)",
        ),
        Family("transgan", transgan.TransGANConfig, transgan.build, "transgan-hetero", "AMP's uneven model"),
    )
}


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    config: Any
    source: str


def _zoo() -> dict[str, ZooEntry]:
    out: dict[str, ZooEntry] = {}
    tables: Mapping[str, Mapping[str, tuple[Any, str]]] = {
        "mlp": mlp.ZOO,
        "gpt": gpt.ZOO,
        "llama": llama.ZOO,
        "nemotron": nemotron.ZOO,
        "transgan": transgan.ZOO,
    }
    for fam, table in tables.items():
        for name, (cfg, source) in table.items():
            out[name] = ZooEntry(name, fam, cfg, source)
    return out


ZOO: dict[str, ZooEntry] = _zoo()


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model string: the family and the full configuration."""

    text: str
    family: str
    config: Any
    # tensor-parallel placements replacing the declared ones, by weight name (a layout found by
    # search: ``--tp-layout auto``); the weights not named keep theirs
    tp: tuple[tuple[str, Placement], ...] = ()

    def build(self, batch: int, dtype: DType = DType.f32) -> Model:
        return build_from(self, batch, dtype)


def _close(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _config_path(text: str) -> bool:
    """Whether ``text`` is a path to a JSON file or to a directory holding a ``config.json``
    (what ``distir import`` reads as ``hf:PATH``; ``--model`` needs the prefix)."""
    p = Path(text).expanduser()
    return p.suffix == ".json" or (p.is_dir() and (p / "config.json").is_file())


IMPORTED = "imported"  # the family of a model string naming an imported model
MODEL_FILE = "file"  # the family of a model string naming a .onnx or .distir file


def parse_model_string(text: str) -> ModelSpec:
    """``NAME[:key=value,...]`` → ``ModelSpec`` (see the module docstring); an import string
    (``hf:PATH``, ``package.module:factory``: ``distir.frontends.torch_import.source``) is a
    spec of the ``imported`` family, resolved when built."""
    from distir.frontends.files import is_model_file
    from distir.frontends.torch_import.source import is_import_spec  # the importers build on the zoo

    text = text.strip()
    if is_model_file(text):
        return ModelSpec(text, MODEL_FILE, text)
    if is_import_spec(text, {*ZOO, *FAMILIES}):
        return ModelSpec(text, IMPORTED, text)
    head, colon, rest = text.partition(":")
    head = head.strip()
    if head in ZOO:
        family, base = ZOO[head].family, ZOO[head].config
    elif head in FAMILIES:
        family, base = head, ZOO[FAMILIES[head].base].config
    elif _config_path(text):
        raise ModelError(f"model {text[:200]!r}: a Hugging Face config is --model hf:{text[:200]}")
    else:
        known = [*FAMILIES, *ZOO]
        raise ModelError(
            f"unknown model {head!r}{_close(head, known)}; expected a family ({', '.join(FAMILIES)}) "
            f"or a zoo name ({', '.join(ZOO)})"
        )
    fields = {f.name: f for f in dataclasses.fields(base)}
    keys = list(fields)
    overrides: dict[str, int | str | float] = {}
    for item in rest.split(",") if colon and rest.strip() else []:
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key:
            raise ModelError(
                f"model {text!r}: {item.strip()!r} is not key=value; keys of {family}: {', '.join(keys)}"
            )
        if key not in keys:
            raise ModelError(
                f"model {text!r}: unknown key {key!r}{_close(key, keys)} for {family}; "
                f"its keys: {', '.join(keys)}"
            )
        if key in overrides:
            raise ModelError(f"model {text!r}: key {key!r} is given twice")
        if isinstance(fields[key].default, bool):  # a flag: 0 or 1
            if value not in ("0", "1"):
                raise ModelError(f"model {text!r}: {key}={value!r}; expected 0 or 1")
            overrides[key] = value == "1"
            continue
        bounds = fields[key].metadata.get("range")
        if bounds is not None:  # a probability
            overrides[key] = _number_value(text, key, value, bounds)
            continue
        overrides[key] = _option_value(text, key, value, fields[key].metadata.get("choices"))
    return ModelSpec(text, family, dataclasses.replace(base, **overrides))


def with_options(spec: str, options: Mapping[str, str]) -> str:
    """Model string ``spec`` with the ``options`` (``NAME:key=value``) it does not set itself
    and its family's config has (a trainer's, ``distir.parallel.trainers.model_options``); a
    model that is not a zoo string (a file, an import) or does not parse is left as it is (its
    error is reported when it is built)."""
    spec = spec.strip()
    try:
        config = parse_model_string(spec).config if options else None
    except ModelError:
        return spec
    if config is None or not dataclasses.is_dataclass(config):
        return spec
    have = {f.name for f in dataclasses.fields(config)}
    _, colon, rest = spec.partition(":")
    given = {item.partition("=")[0].strip() for item in rest.split(",")} if colon else set()
    extra = [f"{k}={v}" for k, v in options.items() if k in have and k not in given]
    if not extra:
        return spec
    return spec + ("," if rest.strip() else "" if colon else ":") + ",".join(extra)


def _number_value(text: str, key: str, value: str, bounds: tuple[float, float]) -> float:
    """The value of a ``key=value`` pair of a float field with a ``range`` (``[lo, hi)``)."""
    try:
        got = float(value)
    except ValueError:
        got = math.nan
    if not in_range(got, bounds):  # NaN and infinities fail too
        raise ModelError(
            f"model {text!r}: {key}={value!r}; expected a number in [{bounds[0]:g}, {bounds[1]:g})"
        )
    return got


def _option_value(text: str, key: str, value: str, choices: tuple[str, ...] | None) -> int | str:
    """The value of one ``key=value`` pair: a word of an enumerated field's ``choices``, else a
    positive integer."""
    if choices is not None:
        if value not in choices:
            raise ModelError(
                f"model {text!r}: {key}={value!r}{_close(value, list(choices))}; expected one of "
                f"{', '.join(choices)}"
            )
        return value
    n = read_int(value)
    if n is None or n < 1:
        raise ModelError(f"model {text!r}: {key}={value[:40]!r}; expected a positive integer")
    bound = MAX_LAYERS if key.endswith("layers") else MAX_DIM
    if exceeds(n, bound):
        raise ModelError(f"model {text[:80]!r}: {over(key, n, bound)}")
    return n


def build_from(spec: ModelSpec, batch: int, dtype: DType = DType.f32) -> Model:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ModelError(f"model {spec.text!r}: batch={batch!r}; expected a positive integer")
    if exceeds(batch, MAX_BATCH):
        raise ModelError(f"model {spec.text!r}: {over('the batch', batch, MAX_BATCH)}")
    if not isinstance(dtype, DType) or not dtype.is_float:
        raise ModelError(f"model {spec.text!r}: dtype={dtype!r}; expected a float DType (f32, bf16, ...)")
    if spec.family == MODEL_FILE:
        from distir.frontends.files import load_file

        return load_file(spec.text, batch, dtype)
    if spec.family == IMPORTED:
        from distir.frontends.torch_import.source import load

        model = load(spec.text, batch, dtype)
    else:
        model = FAMILIES[spec.family].build(spec.config, batch, dtype, spec.text)
    if not spec.tp:
        return model
    tp = dict(spec.tp)
    return dataclasses.replace(
        model, weights=tuple(dataclasses.replace(w, tp=tp.get(w.name, w.tp)) for w in model.weights)
    )


TRAINING_DTYPES = ("f32", "bf16", "f16")  # what the commands' --dtype offers (f64: numerics tests)


def parse_training_dtype(text: str, also: tuple[str, ...] = ()) -> DType:
    """``--dtype`` of the model commands: f32, bf16 or f16 (the dtypes trainers compute in and
    the cost model is calibrated for) and ``also`` (``run``: f64, for exact comparisons), else
    ModelError."""
    known = (*TRAINING_DTYPES, *also)
    if text not in known:
        raise ModelError(f"--dtype must be {', '.join(known[:-1])} or {known[-1]}, got {text!r}")
    return DType(text)


def build_model(spec: str, batch: int, dtype: DType = DType.f32) -> Model:
    """Build the model named by the model string ``spec`` for a global ``batch``; the result
    keeps the chain contract (checked) and carries ``flops_per_sample``."""
    return build_from(parse_model_string(spec), batch, dtype)


@dataclass(frozen=True)
class ZooRow:
    name: str
    family: str
    layers: int  # transformer blocks / dense layers (embedding, head and loss layers not counted)
    hidden: int  # the model width (transgan: its first stage's)
    heads: int | None
    params: int


@functools.cache
def _zoo_model(name: str) -> Model:
    """The zoo entry built at batch 1 (for its parameter and FLOP counts)."""
    e = ZOO[name]
    return FAMILIES[e.family].build(e.config, 1, DType.f32, e.name)


def _row(e: ZooEntry) -> ZooRow:
    c = e.config
    hidden = c.hidden
    params = _zoo_model(e.name).num_params
    return ZooRow(e.name, e.family, c.layers, hidden, getattr(c, "heads", None), params)


def zoo_table() -> list[ZooRow]:
    """One row per zoo entry, in ``ZOO`` order."""
    return [_row(e) for e in ZOO.values()]


def human_count(n: float) -> str:
    """``1.07B``, ``124M``, ``175B``: three significant digits and a unit."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def human_flops(n: float) -> str:
    """``159KFLOP``, ``1.5GFLOP``, ``6.47PFLOP``: three significant digits and a metric prefix
    (``human_count``'s ``B`` is a count's billions, not a FLOP prefix)."""
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}FLOP"
    return f"{n:.3g}FLOP"


def zoo_json() -> dict[str, Any]:
    """``{"models": [...], "families": {...}}`` for ``distir models --json``; per model the
    ``ZooRow`` fields, ``params_human``, ``flops_per_sample`` (forward), ``config``, ``source``."""
    rows = []
    for r in zoo_table():
        e = ZOO[r.name]
        rec = dataclasses.asdict(r)
        rec.update(
            params_human=human_count(r.params),
            flops_per_sample=_zoo_model(r.name).flops_per_sample,
            config=dataclasses.asdict(e.config),
            source=e.source,
        )
        rows.append(rec)
    return {"models": rows, "families": {f.name: f.doc for f in FAMILIES.values()}}


def render_zoo_table() -> Table:
    """The zoo as a rich table, for ``distir models``."""
    from rich.table import Table

    table = Table(
        title="model zoo: NAME or NAME:key=value,... (e.g. gpt2-117m:layers=2, "
        "gpt:layers=24,hidden=2304,heads=24,seq=2048)",
        caption="families: " + "; ".join(f"{f.name}: {f.doc}" for f in FAMILIES.values()),
        caption_justify="left",
    )
    for header in ("model", "family", "layers", "hidden", "heads", "params", "source"):
        numeric = header in ("layers", "hidden", "heads", "params")
        table.add_column(header, justify="right" if numeric else "left")
    for r in zoo_table():
        heads = "" if r.heads is None else str(r.heads)
        cells = (str(r.layers), str(r.hidden), heads, human_count(r.params))
        table.add_row(r.name, r.family, *cells, ZOO[r.name].source)
    return table
