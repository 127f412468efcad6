"""Evaluation functions for the store/executor tests, at module level so that worker processes (and
the subprocess of the kill-and-resume test) can unpickle them by reference."""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path
from typing import Any

from distir.search.executor import run_all
from distir.search.store import ResultStore


def pure(task: str) -> dict[str, Any]:
    """A deterministic result, with the values JSON cannot hold directly."""
    return {"task": task, "n": len(task), "half": len(task) / 2, "inf": math.inf, "ninf": -math.inf}


def logged(log: str, task: str, *, sleep: float = 0.0) -> dict[str, Any]:
    """Sleep, append ``"<task> <pid>"`` to ``log`` (one line per finished evaluation), return a result
    that differs on every evaluation (pid, nonce), so a re-evaluated result cannot pass as the stored
    one."""
    time.sleep(sleep)
    with open(log, "a") as f:
        f.write(f"{task} {os.getpid()}\n")
    return {"task": task, "n": len(task), "inf": math.inf, "pid": os.getpid(), "nonce": time.time_ns()}


def failing(log: str, task: str) -> dict[str, Any]:
    """``logged``, but raises ``ValueError`` for tasks starting with "bad" (after logging them)."""
    result = logged(log, task)
    if task.startswith("bad"):
        raise ValueError(f"cannot evaluate {task}")
    return result


def interrupting(log: str, task: str) -> dict[str, Any]:
    """``logged``, but raises ``KeyboardInterrupt`` for the task "stop" (after logging it)."""
    result = logged(log, task)
    if task == "stop":
        raise KeyboardInterrupt
    return result


def tasks(count: int) -> list[str]:
    return [f"t{i:02d}" for i in range(count)]


def main(argv: list[str]) -> None:
    """``main([db, key, log, workers, count, sleep])``: run a search of ``tasks(count)`` with
    ``logged``; the kill-and-resume test runs this in a subprocess and kills it."""
    db, key, log, workers, count, sleep = argv
    with ResultStore(Path(db), key, {"test": "kill"}) as store:
        fn = functools.partial(logged, log, sleep=float(sleep))
        run_all(tasks(int(count)), fn, store, workers=int(workers))
