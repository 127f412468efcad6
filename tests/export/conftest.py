"""The ``golden`` fixture: an exported file compared, byte for byte, with ``golden/<name>``.

``DISTIR_REGEN_GOLDEN=1`` rewrites the file instead (a change meant to alter the export)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("golden")


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if os.environ.get("DISTIR_REGEN_GOLDEN") == "1":
            path.write_text(text)
        assert text == path.read_text(), f"{name}: the export differs from its golden file"

    return check
