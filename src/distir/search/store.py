"""A resumable SQLite store of search results.

A search evaluates many candidate strategies, each with an expensive exact simulation. Every
finished result is committed here as soon as it exists, so a search that is killed resumes where it
stopped (``done()`` lists what not to evaluate again) and a finished search re-renders from
``final()`` without evaluating anything.

One file can hold several searches. Each is identified by a ``key`` the caller derives from
everything that determines the results (model, cluster, batch, options; see ``search_key``), so
changing any of them starts a fresh search instead of mixing stale results in.

Layout (schema version ``SCHEMA_VERSION``, kept in ``PRAGMA user_version``; ``PRAGMA
application_id`` marks the file as a distir store):

- ``searches(key PRIMARY KEY, meta, final, created)``: ``meta`` is the JSON the key was first
  opened with; ``final`` the finished search's output, NULL until ``put_final``;
- ``results(key, strategy, json, created, PRIMARY KEY (key, strategy))``: one row per evaluated
  strategy; a strategy is never stored twice for a key.

Values are JSON with one extension: JSON has no infinity or NaN, so a non-finite float is written as
the object ``{"__distir_float__": "inf" | "-inf" | "nan"}`` and read back as the float. That keeps
the files standard JSON (readable by any tool) while ``inf`` (e.g. the time of a strategy that does
not fit in memory) round-trips exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

__all__ = ["SCHEMA_VERSION", "DuplicateResult", "ResultStore", "StoreError", "dumps", "loads", "search_key"]

SCHEMA_VERSION: Final = 1
# "dIst" in ASCII: tells a distir store from any other SQLite file, whose application_id is 0.
_APPLICATION_ID: Final = 0x64497374
_FLOAT_TAG: Final = "__distir_float__"
_NONFINITE: Final = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

_SCHEMA: Final = (
    """CREATE TABLE searches (
        key TEXT PRIMARY KEY,
        meta TEXT NOT NULL,
        final TEXT,
        created REAL NOT NULL
    )""",
    """CREATE TABLE results (
        key TEXT NOT NULL REFERENCES searches(key),
        strategy TEXT NOT NULL,
        json TEXT NOT NULL,
        created REAL NOT NULL,
        PRIMARY KEY (key, strategy)
    )""",
)


class StoreError(Exception):
    """A result store cannot be opened, read or written; the message names the file and the problem."""


class DuplicateResult(StoreError):
    """``put`` of a strategy the search already has a result for (another process stored it)."""


def _plain(value: object, where: str) -> Any:
    """``value`` as plain JSON-ready data: dicts with ``str`` keys, lists, ``str``, ``int``, finite
    ``float``, ``bool``, ``None``, and non-finite floats as tagged objects.

    Tuples become lists, and numeric scalars that are not built-in types (numpy's, registered with
    ``numbers``) become ``int``/``float``, so what ``loads`` returns is exactly what was stored.
    Raises ``TypeError`` naming ``where`` (the path inside the value) for anything else.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (e.g. an Enum mixin) as its plain text
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number
        return {_FLOAT_TAG: "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise TypeError(f"{where}: key {name!r} is not a str (JSON object keys are strings)")
            if name == _FLOAT_TAG:
                raise TypeError(f"{where}: key {_FLOAT_TAG!r} is reserved for non-finite floats")
            out[name] = _plain(item, f"{where}[{name!r}]")
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__module__}.{type(value).__qualname__} is not storable as JSON")


def _unplain(obj: dict[str, Any]) -> Any:
    if _FLOAT_TAG in obj:
        tag = obj[_FLOAT_TAG]
        if len(obj) != 1 or not isinstance(tag, str) or tag not in _NONFINITE:
            # a ValueError, as json's own errors are: the readers turn it into a StoreError
            raise ValueError(f"{_FLOAT_TAG} must be alone and one of {', '.join(_NONFINITE)}, got {obj!r}")
        return _NONFINITE[tag]
    return obj


def dumps(value: object, *, sort_keys: bool = False) -> str:
    """Standard JSON text for ``value`` (see ``_plain`` for what is accepted; ``TypeError`` if not).

    ``loads(dumps(v))`` equals ``v`` up to tuples becoming lists and numeric scalars becoming
    ``int``/``float``; NaN compares unequal to itself but comes back as NaN.
    """
    return json.dumps(_plain(value, "value"), allow_nan=False, sort_keys=sort_keys, separators=(",", ":"))


def loads(text: str) -> Any:
    """The value ``dumps`` encoded as ``text``; ``ValueError`` if it is not JSON or holds a
    malformed non-finite float tag (a hand-edited file)."""
    return json.loads(text, object_hook=_unplain)


def search_key(parts: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit key for a search: sha256 of ``parts`` as canonical JSON (sorted keys,
    no whitespace). Equal ``parts`` give the same key in every process and Python version; key order
    does not matter, and a tuple hashes like the equal list."""
    canonical = dumps(parts, sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# SQLite's primary result codes (the low byte of an extended one) that say why a file cannot be used
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 13, 14, 26


def _open_problem(exc: sqlite3.Error) -> str:
    """What is wrong with a store that failed to open, in words: a read-only file or directory
    is not a corrupt one."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code in (_SQLITE_READONLY, _SQLITE_PERM) or "readonly" in str(exc):
        return (
            f"the result store cannot be written ({exc}: the file or its directory is read-only); "
            "give a writable --store FILE, or --fresh"
        )
    if code in (_SQLITE_CANTOPEN, _SQLITE_IOERR, _SQLITE_FULL):
        return f"cannot use the result store: {exc}"
    return f"not a distir result store or corrupt: {exc}"


class ResultStore:
    """The results of one search (``key``) in a SQLite file at ``path``.

    Opening creates the file (not its directory) and the search's row if missing; ``meta`` is stored
    on the first open of ``key`` and kept as is by later opens (``self.meta`` is the stored one).
    Every write is committed and synced (WAL, ``synchronous=FULL``) before the method returns, so a
    kill at any moment loses nothing that was acknowledged. Several processes may open one file;
    each store object must be used from the thread that opened it.

    Raises ``StoreError`` (naming ``path``) when the file is not a SQLite database, is a database of
    another application, is corrupt, or has a schema version this code does not read.
    """

    def __init__(self, path: Path | str, key: str, meta: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.key = key
        meta_json = self._encode(meta, "meta")
        try:
            # Autocommit mode: every statement outside an explicit BEGIN is its own transaction,
            # committed when it completes. The timeout waits out another process's write lock.
            self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open result store: {exc}") from exc
        try:
            fresh = self._check()
            if fresh:
                # Journal mode cannot change inside a transaction, and is only set once the file is
                # known to be ours (or empty): another application's database is left untouched.
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._create()
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.execute(
                "INSERT OR IGNORE INTO searches (key, meta, final, created) VALUES (?, ?, NULL, ?)",
                (key, meta_json, time.time()),
            )
        except StoreError:
            self._conn.close()
            raise
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: {_open_problem(exc)}") from exc
        self._closed = False

    def _check(self) -> bool:
        """Whether the file is empty (to be initialised); raises ``StoreError`` unless it is empty or a
        distir store of ``SCHEMA_VERSION``. Reading the header is what fails on a non-SQLite file."""
        # One read transaction, so a schema another process commits meanwhile is seen whole or not
        # at all (not, say, its application id missing but its tables present).
        outer = self._conn.in_transaction
        if not outer:
            self._conn.execute("BEGIN")
        try:
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            if not outer:
                self._conn.execute("COMMIT")
        if app_id == 0:
            if tables == 0 and version == 0:
                return True
            raise StoreError(f"{self.path}: not a distir result store (a SQLite database of something else)")
        if app_id != _APPLICATION_ID:
            raise StoreError(f"{self.path}: not a distir result store (SQLite application id {app_id:#x})")
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: result store schema version {version}, this distir reads version "
                f"{SCHEMA_VERSION}; use another file or delete this one"
            )
        return False

    def _create(self) -> None:
        # BEGIN IMMEDIATE takes the write lock, so of two processes creating the same new file one
        # creates the schema and the other, re-checking under the lock, finds it done.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            if self._check():
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA application_id={_APPLICATION_ID}")
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def _encode(self, value: Mapping[str, Any], what: str) -> str:
        if not isinstance(value, Mapping):
            raise StoreError(f"{self.path}: {what} must be a mapping, got {type(value).__name__}")
        try:
            return dumps(value)
        except TypeError as exc:
            raise StoreError(f"{self.path}: {what} is not storable: {exc}") from exc

    def _live(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"{self.path}: result store is closed")
        return self._conn

    @property
    def meta(self) -> dict[str, Any]:
        """The ``meta`` stored when ``key`` was first opened."""
        try:
            row = self._live().execute("SELECT meta FROM searches WHERE key = ?", (self.key,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read search {self.key}: {exc}") from exc
        try:
            meta: dict[str, Any] = loads(row[0])
        except (ValueError, TypeError) as exc:  # TypeError: the column edited to a non-text value
            raise StoreError(f"{self.path}: the stored meta of search {self.key} is not JSON: {exc}") from exc
        return meta

    def done(self) -> dict[str, dict[str, Any]]:
        """Every stored result of this search: strategy -> result, in the order they were stored."""
        try:
            rows = (
                self._live()
                .execute("SELECT strategy, json FROM results WHERE key = ? ORDER BY rowid", (self.key,))
                .fetchall()
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read results of search {self.key}: {exc}") from exc
        out: dict[str, dict[str, Any]] = {}
        for strategy, text in rows:
            where = f"{self.path}: the stored result of {strategy!r} in search {self.key}"
            try:
                value = loads(text)
            except (ValueError, TypeError) as exc:  # TypeError: the column edited to a non-text value
                raise StoreError(f"{where} is not JSON: {exc}") from exc
            if not isinstance(strategy, str) or not isinstance(value, dict):
                raise StoreError(f"{where} is a {type(value).__name__}, not an object")
            out[strategy] = value
        return out

    def put(self, strategy: str, result: Mapping[str, Any]) -> None:
        """Store ``strategy``'s result, committed and synced before returning.

        Raises ``StoreError`` if this search already has a result for ``strategy`` (the stored one
        is kept: a resumed search must never evaluate a strategy twice) or ``result`` is not
        storable (see ``dumps``).
        """
        text = self._encode(result, f"result of {strategy!r}")
        try:
            self._live().execute(
                "INSERT INTO results (key, strategy, json, created) VALUES (?, ?, ?, ?)",
                (self.key, strategy, text, time.time()),
            )
        except sqlite3.IntegrityError as exc:
            raise DuplicateResult(
                f"{self.path}: search {self.key} already has a result for strategy {strategy!r}"
            ) from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot store result of {strategy!r}: {exc}") from exc

    def put_final(self, payload: Mapping[str, Any]) -> None:
        """Store the finished search's full output, replacing any earlier one; committed on return."""
        text = self._encode(payload, "final output")
        try:
            self._live().execute("UPDATE searches SET final = ? WHERE key = ?", (text, self.key))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot store final output of search {self.key}: {exc}") from exc

    def final(self) -> dict[str, Any] | None:
        """The output stored by ``put_final``, or ``None`` while the search is unfinished."""
        try:
            row = self._live().execute("SELECT final FROM searches WHERE key = ?", (self.key,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read search {self.key}: {exc}") from exc
        if row is None or row[0] is None:
            return None
        try:
            payload = loads(row[0])
        except (ValueError, TypeError) as exc:  # the file was edited or damaged
            raise StoreError(
                f"{self.path}: the stored output of search {self.key} is not JSON: {exc}"
            ) from exc
        if not isinstance(payload, dict):
            raise StoreError(
                f"{self.path}: the stored output of search {self.key} is a {type(payload).__name__}, "
                "not an object"
            )
        return payload

    def close(self) -> None:
        """Close the file; idempotent. Later reads and writes raise ``StoreError``."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
