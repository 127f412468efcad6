"""The README is a user's front page and ``docs/`` the reference: size, links, no history.

History belongs to git and CHANGELOG.md: figures in the docs are the current ones with the
command that reproduces them, never "measured in session N" or "before that it took ..."."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
HISTORY = re.compile(
    r"\bsession \d+\b|\bsessions? \d+[–-]\d+\b|\bthe session's\b|\bin session\b", re.IGNORECASE
)


def _links(page: Path) -> list[tuple[str, Path]]:
    """The relative links of ``page`` (target text, resolved file), anchors dropped."""
    out = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (page.parent / target.split("#")[0]).resolve()))
    return out


def test_the_readme_is_under_12_kb() -> None:
    assert (ROOT / "README.md").stat().st_size < 12 * 1024


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [t for t, f in _links(page) if not f.exists()]
    assert not broken, f"{page.name}: {broken}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen: set[Path] = set()
    todo = [(ROOT / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo.extend(f for _t, f in _links(page))
    missing = [p.name for p in PAGES if p.resolve() not in seen]
    assert not missing, f"docs pages no link reaches from README.md: {missing}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_no_history_in_the_docs(page: Path) -> None:
    found = [m.group(0) for m in HISTORY.finditer(page.read_text(encoding="utf-8"))]
    assert not found, f"{page.name}: history belongs in CHANGELOG.md: {found}"
