"""Model strings of imported models, and their cache.

- ``hf:PATH`` / ``hf:PATH:seq=N`` — a Hugging Face config (``hf.py``);
- ``package.module:factory`` — a Python function returning ``(nn.Module, example inputs)``
  (``trace.py`` says what the inputs may be), imported from ``sys.path`` (the current
  directory included).

``is_import_spec(text)`` tells such strings from zoo model strings (which never contain a dot
before their colon, nor start with ``hf:``). ``load(text, batch, dtype)`` builds the ``Model``:
the module is traced and converted once per (text, dtype, file contents) and cached in the
process, so the search's many builds at different microbatch sizes cost one trace, and a file
edited meanwhile is traced again. ``content_digest(text)`` is the digest of the files a string
reads (the Hugging Face config; the factory's module source), for caches and the result store's
key: the module a factory imports from elsewhere is not followed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Container
from pathlib import Path
from typing import Any

from distir.frontends.torch_import.errors import SourceError, first_line
from distir.frontends.torch_import.stages import StageSpec
from distir.frontends.zoo.model import Model
from distir.ir.types import DType
from distir.limits import MAX_DIM, exceeds, over, read_int

_FACTORY = re.compile(r"^(?P<module>[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*):(?P<attr>[A-Za-z_]\w*)$")
_OPTION = re.compile(r"^(?P<path>.+):(?P<key>[A-Za-z_]\w*)=(?P<value>[^/\\]*)$")  # hf:PATH:seq=N


def is_import_spec(text: str, zoo_names: Container[str] = ()) -> bool:
    """Whether ``text`` names an imported model: ``hf:...``, or ``module:factory`` whose module
    is dotted or not one of ``zoo_names`` (zoo strings are ``NAME:key=value``, never that)."""
    t = text.strip()
    if t.startswith("hf:"):
        return True
    m = _FACTORY.match(t)
    return bool(m and ("." in m.group("module") or m.group("module") not in zoo_names))


def _factory(text: str) -> tuple[Any, Any]:
    m = _FACTORY.match(text)
    if not m:
        raise SourceError(f"model {text!r}: expected package.module:factory")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = importlib.import_module(m.group("module"))
    except ImportError as e:
        raise SourceError(f"model {text!r}: cannot import {m.group('module')} ({e})") from None
    except (Exception, SystemExit) as e:  # the user's module failed (or exited) while imported: where
        raise SourceError(f"model {text!r}: importing {m.group('module')} raised {_raised(e)}") from None
    fn = getattr(mod, m.group("attr"), None)
    if not callable(fn):
        raise SourceError(f"model {text!r}: {m.group('module')} has no function {m.group('attr')}")
    try:
        got = fn()
    except (Exception, SystemExit) as e:  # a factory's sys.exit is its error, not distir's exit status
        raise SourceError(f"model {text!r}: {m.group('attr')}() raised {_raised(e)}") from None
    if not (isinstance(got, tuple) and len(got) == 2):
        raise SourceError(f"model {text!r}: {m.group('attr')}() must return (nn.Module, example inputs)")
    import torch.nn as nn

    if not isinstance(got[0], nn.Module):
        raise SourceError(
            f"model {text!r}: {m.group('attr')}() returned a {type(got[0]).__name__}, not an nn.Module"
        )
    return got


def _raised(e: BaseException) -> str:
    """``Type: message (file:line)`` of an exception raised in the user's code: its first line,
    and the innermost frame of the traceback (a syntax error: the line it points at)."""
    first = first_line(e)
    where = ""
    if isinstance(e, SyntaxError) and e.filename:
        where = f" ({e.filename}:{e.lineno})"
        first = e.msg
    else:
        tb = traceback.extract_tb(e.__traceback__)
        if tb:
            where = f" ({tb[-1].filename}:{tb[-1].lineno})"
    return f"{type(e).__name__}: {first}{where}" if first else f"{type(e).__name__}{where}"


def module_of(text: str, layers: int | None = None) -> tuple[Any, Any, dict[str, object]]:
    """The nn.Module, its example inputs and a config summary for the model string ``text``
    (``layers``: a Hugging Face model built with that many blocks)."""
    text = text.strip()
    if text.startswith("hf:"):
        from distir.frontends.torch_import.hf import hf_model, read_config

        path, seq = hf_path(text)
        raw = read_config(path)
        module, inputs = hf_model(path, seq, layers=layers)
        return module, inputs, {"source": text, "model_type": raw.get("model_type")}
    module, inputs = _factory(text)
    return module, inputs, {"source": text}


def hf_path(text: str) -> tuple[str, int | None]:
    """The config path and the sequence length (None: the config's) of ``hf:PATH[:seq=N]``; a
    ``:key=value`` suffix other than a positive ``seq`` is an error (unless the whole is a file)."""
    rest = text[3:]
    m = _OPTION.match(rest)
    if m is None or Path(rest).expanduser().exists():
        return rest, None
    key, value = m.group("key"), m.group("value")
    if key != "seq":
        raise SourceError(f"{text[:80]}: unknown option {key!r} after the config path (hf:PATH takes :seq=N)")
    seq = read_int(value)
    if seq is None or seq < 1:
        raise SourceError(f"{text[:80]}: seq={value[:20]!r}; expected a positive integer")
    if exceeds(seq, MAX_DIM):
        raise SourceError(f"{text[:80]}: {over('seq', seq, MAX_DIM)}")
    return m.group("path"), seq


def content_digest(text: str) -> str:
    """A digest of what the model string ``text`` reads from files: the Hugging Face config
    (``hf:``), the factory module's source (``module:factory``; its package imported to find it,
    as building it would); ``""`` for a zoo string (its config is distir's code). A file that
    cannot be found or read gives a marker naming the problem (building the model then fails
    with its own error); never raises."""
    t = text.strip()
    if not is_import_spec(t):
        return ""
    try:
        if t.startswith("hf:"):
            from distir.frontends.torch_import.hf import config_path

            path = config_path(hf_path(t)[0])
        else:
            m = _FACTORY.match(t)
            if m is None:
                return "unresolved"
            spec = importlib.util.find_spec(m.group("module"))
            if spec is None or spec.origin is None or not Path(spec.origin).is_file():
                return "unresolved"
            path = Path(spec.origin)
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except (SourceError, ImportError, OSError, ValueError) as e:
        return f"unreadable: {type(e).__name__}"


SHALLOW = 2  # blocks a Hugging Face model of alike blocks is traced with (``converted``)


def _require(text: str) -> None:
    """torch (and transformers for ``hf:``) are optional extras: a ``SourceError`` naming the
    one to install when missing."""
    wanted = [("torch", "torch")] + ([("transformers", "hf")] if text.startswith("hf:") else [])
    for module, extra in wanted:
        try:
            importlib.import_module(module)
        except ImportError:
            raise SourceError(
                f"model {text!r} needs {module}: pip install -c constraints.txt 'distir[{extra}]'"
            ) from None


def converted(text: str, dtype: DType, stages: StageSpec | None = None) -> tuple[Any, dict[str, object]]:
    """The converted model of ``text`` (``_converted``), cached by the contents of the files it
    reads (``content_digest``), not only by their names."""
    if text.strip().startswith("hf:"):  # a missing config fails at once, before torch is imported
        from distir.frontends.torch_import.hf import read_config

        read_config(hf_path(text.strip())[0])
    return _converted(text, dtype, stages, content_digest(text))


@functools.lru_cache(maxsize=8)
def _converted(
    text: str, dtype: DType, stages: StageSpec | None, digest: str
) -> tuple[Any, dict[str, object]]:
    """The converted model of ``text`` (``digest`` keys the cache only). A Hugging Face config
    whose blocks are all alike is traced with ``SHALLOW`` blocks and its block function repeated
    to the config's depth (``convert.deepen``: the blocks must have come out as one function,
    else the full depth is traced): tracing time grows with depth, the program does not change.
    With split points (``stages``) the full depth is traced and the layers are the pipeline
    stages."""
    _require(text)
    if not text.startswith("hf:"):
        return _traced_and_converted(text, dtype, stages)
    from distir.frontends.torch_import.hf import quiet

    with quiet():
        return _traced_and_converted(text, dtype, stages)


def _traced_and_converted(text: str, dtype: DType, stages: StageSpec | None) -> tuple[Any, dict[str, object]]:
    from distir.frontends.torch_import.convert import convert, deepen
    from distir.frontends.torch_import.trace import trace

    if text.startswith("hf:") and not (stages and stages.split):
        from distir.frontends.torch_import.hf import depth, read_config

        full = depth(read_config(hf_path(text)[0]))
        if full is not None and full > SHALLOW:
            module, inputs, config = module_of(text, SHALLOW)
            deep = deepen(convert(trace(module, inputs, text), dtype, stages), full)
            if deep is not None:
                return deep, config
    module, inputs, config = module_of(text)
    return convert(trace(module, inputs, text), dtype, stages), config


def load(text: str, batch: int, dtype: DType = DType.f32, stages: StageSpec | None = None) -> Model:
    """The ``Model`` of the import string ``text`` for a global ``batch`` (cached trace);
    ``stages``: split points and multi-use policy (``stages`` module)."""
    from distir.frontends.torch_import.assemble import build_imported

    conv, config = converted(text.strip(), dtype, stages)
    return build_imported(conv, text.strip(), batch, dtype, config)
