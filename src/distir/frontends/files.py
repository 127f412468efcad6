"""Model files as model strings: ``path/to/model.onnx`` and ``path/to/model.distir`` wherever
``--model`` is taken (``simulate``, ``search``, ``run``, ``distir import``).

- ``.onnx``: imported at the requested batch (dim 0 of its inputs when dynamic) with the zoo's
  token cross-entropy loss appended (``distir.frontends.onnx_import.model.to_model``); f32 only.
  ``model.onnx:seq=128,...`` sizes the export's other dynamic dims. Layers that fix the batch (a
  static export's folded sizes) run at it only, without microbatches (``Model.fixed_batch``).
- ``.distir``: a DistIR module that already follows the model contract
  (``distir.frontends.zoo.model``): its entry is a chain of layer calls ending in a loss layer,
  its parameters typed. The entry's *inputs* are the first call's first argument and the loss
  layer's other arguments (the labels), and they come first; every other parameter is a weight
  (replicated under tensor parallelism: a file declares no placements; data and pipeline
  parallelism apply as to a zoo model). Weights several calls take are tied. For another batch
  than the file's the inputs' dim 0 is retyped (layer functions never bake the batch in); the
  loss layer's normalization stays the file's. A file that does not parse, or does not keep the
  contract, is a one-line ``ModelError`` naming the file and the broken rule.

Both are cached per (path, modification time, batch, dtype, dims): the search builds a model many times.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec, check_model
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Call
from distir.ir.types import DType, TensorType
from distir.ir.values import Value
from distir.limits import MAX_BATCH, exceeds, over

if TYPE_CHECKING:
    from distir.frontends.onnx_import import OnnxImport
    from distir.frontends.onnx_import.attention import CausalAt
    from distir.frontends.onnx_import.reader import OnnxModel

SUFFIXES = (".onnx", ".distir")


# ``path/to/model.onnx[:name=N,...]``: the file, then the sizes of an ONNX export's dynamic dims
_FILE = re.compile(r"^(?P<path>.+?\.(?:onnx|distir))(?::(?P<dims>[^/\\]*))?$", re.IGNORECASE)
_DIM = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)=(?P<size>[0-9]+)$")


def is_model_file(text: str) -> bool:
    """Whether the model string ``text`` names a model file (by its suffix, before any dims)."""
    return _FILE.match(text.strip()) is not None


def model_input(text: str) -> Path | None:
    """The file the model string ``text`` reads: a model file, a Hugging Face config (a
    factory's module is not looked up: that imports its package). Never raises: a string that
    names no readable file reads none (None), and building the model reports it."""
    t = text.strip()
    try:
        if is_model_file(t):
            return Path(file_dims(t)[0])
        if t.startswith("hf:"):
            from distir.frontends.torch_import.hf import config_path
            from distir.frontends.torch_import.source import hf_path

            return config_path(hf_path(t)[0])
    except (ValueError, OSError):  # ModelError, SourceError: reported when the model is built
        return None
    return None


def file_dims(text: str) -> tuple[str, dict[str, int]]:
    """The path of the model string ``text`` and the dim sizes after it (``model.onnx:seq=128``);
    malformed sizes, or sizes after a ``.distir`` file, are a one-line ``ModelError``."""
    m = _FILE.match(text.strip())
    if m is None:
        raise ModelError(f"{text[:200]}: not a model file (.onnx or .distir)")
    path, given = m["path"], m["dims"]
    if given is None:
        return path, {}
    if not path.lower().endswith(".onnx"):
        raise ModelError(f"{text[:200]}: a .distir file takes no dim sizes (an ONNX file's dynamic dims do)")
    dims: dict[str, int] = {}
    for part in given.split(","):
        d = _DIM.match(part.strip())
        if d is None or int(d["size"]) < 1:
            raise ModelError(f"{text[:200]}: {part.strip()!r} is not name=N (N ≥ 1), as in {path}:seq=128")
        if exceeds(int(d["size"]), MAX_BATCH):
            raise ModelError(f"{text[:200]}: {over(d['name'], int(d['size']), MAX_BATCH)}")
        dims[d["name"]] = int(d["size"])
    return path, dims


def load_file(text: str, batch: int, dtype: DType = DType.f32) -> Model:
    """The ``Model`` of the file ``text`` at ``batch`` (module docstring)."""
    name, dims = file_dims(text)
    path = Path(name).expanduser()
    if not path.is_file():
        raise ModelError(f"{name}: no such model file")
    return _load(str(path.resolve()), path.stat().st_mtime_ns, batch, dtype, tuple(sorted(dims.items())))


def own_dtype(text: str) -> DType | None:
    """The dtype the model file ``text`` computes in: a DistIR file's own; None for ONNX, which
    imports in any (its floats taken as the dtype asked)."""
    path = Path(file_dims(text)[0]).expanduser()
    if path.suffix.lower() == ".onnx":
        return None
    if not path.is_file():
        raise ModelError(f"{text}: no such model file")
    return _own_dtype(str(path.resolve()), path.stat().st_mtime_ns)


def _parsed(path: Path) -> tuple[Module, Mapping[object, tuple[int, int]]]:
    """The module in ``path`` and where each op, call and value was written; a parse error is a
    one-line ``ModelError`` at ``FILE:LINE:COL``, as ``distir show`` names it."""
    from distir.ir.parser import parse_with_positions

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read: {e}") from None
    positions: Mapping[object, tuple[int, int]] = {}
    try:
        return parse_with_positions(text, str(path))
    except ValueError as e:  # the parser's errors
        raise ModelError(_located(e, path, positions)) from None


def _located(e: BaseException, path: Path, positions: Mapping[object, tuple[int, int]], why: str = "") -> str:
    """``e`` at ``FILE:LINE:COL`` (``FILE`` when no place is known), prefixed by ``why``, in one
    line: a parse error's excerpt dropped, an interpreter error's call chain joined on."""
    from distir.ir.parser import ParseError
    from distir.report.errors import locate

    if isinstance(e, ParseError):
        return f"{path}:{e.line}:{e.col}: {why}{e.message}"
    where, _, message = locate(e, str(path), positions).partition(f"{path}")[2].partition(": ")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return f"{path}{where}: {why}{'; '.join(lines)}"


@functools.lru_cache(maxsize=16)
def _own_dtype(path: str, mtime: int) -> DType:
    module, _ = _parsed(Path(path))
    dt = _model_of(Path(path), module).inputs[0].type.dtype
    return dt if dt.is_float else DType.f32


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime: int, batch: int, dtype: DType, dims: tuple[tuple[str, int], ...]) -> Model:
    if path.lower().endswith(".onnx"):
        return _onnx(Path(path), mtime, batch, dtype, dict(dims))
    return _distir(Path(path), batch, dtype)


def _onnx(path: Path, mtime: int, batch: int, dtype: DType, dims: dict[str, int]) -> Model:
    from distir.frontends.onnx_import.model import other_batch, to_model

    # the file at another batch too (one import for every batch): what follows the batch (a
    # dynamic export's sizes) and what does not (``to_model``)
    key = tuple(sorted(dims.items()))
    try:
        other = _onnx_import(path, mtime, other_batch(batch), key, dtype)
        named = [d for d in other.batch_dims if d in dims]
        if named:  # the command line's batch is --batch
            raise ModelError(
                f"{path}:{named[0]}={dims[named[0]]}: {named[0]!r} is the batch (dim 0 of the inputs), "
                "which --batch sets"
            )
        # a causal mask known at batch 1 is causal at this batch too, where it may be too large to
        # know; this import is not kept (asked once)
        main = _onnx_import.__wrapped__(path, mtime, batch, key, dtype, other.causal)
    finally:
        _read_onnx.cache_clear()  # the file, read once for both imports, not kept
    return to_model(main, path.stem, batch, other)


@functools.lru_cache(maxsize=1)
def _read_onnx(path: Path, mtime: int) -> OnnxModel:
    """The file read and checked (``read_model``) once for the imports of one load."""
    from distir.frontends.onnx_import.reader import read_model

    return read_model(path)


@functools.lru_cache(maxsize=1)  # the other batch's, for every batch the process builds
def _onnx_import(
    path: Path,
    mtime: int,
    batch: int,
    dims: tuple[tuple[str, int], ...],
    dtype: DType = DType.f32,
    causal_at: tuple[CausalAt, ...] = (),
) -> OnnxImport:
    """The import at ``batch`` without the weights' values (a model holds none)."""
    from distir.frontends.onnx_import import import_onnx

    imp = import_onnx(_read_onnx(path, mtime), dims=dict(dims), batch=batch, causal_at=causal_at, dtype=dtype)
    return replace(imp, weights=tuple(replace(w, value=None) for w in imp.weights))


def _distir(path: Path, batch: int, dtype: DType) -> Model:
    import distir
    from distir.frontends.zoo._build import forward_flops

    module, positions = _parsed(path)
    model = _model_of(path, module)
    if model.inputs[0].type.dtype.is_float and model.inputs[0].type.dtype is not dtype:
        raise ModelError(f"{path}: the file's model computes in {model.inputs[0].type.dtype}, not {dtype}")
    if batch != model.batch:
        model = _rebatched(model, batch)
    try:
        check_model(model)
        typed = distir.check(model.module)
    except ValueError as e:
        why = "not a model (the contract of distir.frontends.zoo.model): "
        raise ModelError(_located(e, path, positions, why)) from None
    flops = forward_flops(typed, [p.type for p in typed.entry.params if p.type is not None])
    return replace(model, flops_per_sample=flops / model.batch)


def _model_of(path: Path, module: Module) -> Model:
    """The ``Model`` a parsed module declares (module docstring), not yet checked."""
    entry = module.entry
    calls = [i for i in entry.body if isinstance(i, Call)]
    if not calls or len(calls) != len(entry.body):
        raise ModelError(f"{path}: not a model: its entry @{entry.name} must be a chain of layer calls")
    params = set(entry.params)
    inputs = dict.fromkeys([calls[0].inputs[0], *(v for v in calls[-1].inputs[1:] if v in params)])
    specs: list[InputSpec] = []
    for v in inputs:
        if not isinstance(v.type, TensorType) or v.type.rank < 1:
            raise ModelError(f"{path}: input %{v.name} must be a typed tensor whose dim 0 is the batch")
        specs.append(InputSpec(v.name, v.type, high=_classes(module, calls[-1])))
    weights = []
    for v in entry.params:
        if v in inputs:
            continue
        if not isinstance(v.type, TensorType):
            raise ModelError(f"{path}: weight %{v.name} must be a typed tensor")
        weights.append(WeightSpec(v.name, v.type))
    uses: dict[Value, int] = {}
    for c in calls:
        for v in dict.fromkeys(c.inputs[1:]):
            uses[v] = uses.get(v, 0) + 1
    tied = tuple(w.name for w in weights if uses.get(_param(entry, w.name), 0) > 1)
    return Model(
        path.stem,
        {"family": "file", "source": str(path)},
        module,
        tuple(specs),
        tuple(weights),
        specs[0].type.shape[0],
        tied=tied,
        post=1,
    )


def _param(fn: Function, name: str) -> Value:
    return next(p for p in fn.params if p.name == name)


def _classes(module: Module, loss: Call) -> int:
    """Integer inputs (token ids, labels) are drawn below the logits' last dim, when typed."""
    t = loss.inputs[0].type
    return t.shape[-1] if isinstance(t, TensorType) and t.rank else 2


def _rebatched(model: Model, batch: int) -> Model:
    """``model`` with its inputs' dim 0 ``batch``: the entry rebuilt with those types."""
    fb = FunctionBuilder(model.forward.name)
    inputs = tuple(replace(i, type=replace(i.type, shape=(batch, *i.type.shape[1:]))) for i in model.inputs)
    types = {i.name: i.type for i in inputs}
    env = {p: fb.param(p.name, types.get(p.name, p.type)) for p in model.forward.params}
    for c in model.layers:
        (env[c.outputs[0]],) = fb.call(c.callee, *(env[v] for v in c.inputs), names=[c.outputs[0].name])
    entry = fb.ret(env[model.forward.outputs[0]])
    fns = tuple(f for f in model.module.functions if f is not model.forward)
    return replace(model, module=Module((*fns, entry)), inputs=inputs, batch=batch)


__all__ = ["SUFFIXES", "file_dims", "is_model_file", "load_file"]
