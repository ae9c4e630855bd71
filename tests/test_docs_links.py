"""Every relative link in the front pages (README.md, benchmarks/README.md,
docs/*.md) names a file or folder of this repository: Markdown links
``[text](path)`` resolved against the page, and repository paths quoted as
code (``docs/x.md``, ``benchmarks/bench_x.py``) resolved against the root,
or against the page where they start with a folder beside it
(``results/x.md`` in benchmarks/README.md). Placeholders (``<topic>``, ``*``,
``{a,b}``) and folders git ignores (listed in .gitignore) are not checked."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
# top-level folders of the repository that quoted paths may start with
TOP = ("docs", "benchmarks", "tests", "bie_core", "examples", "scripts", "backends", "backend_cuda",
       "backend_cutlass", "backend_mlx", ".ci")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_PATH = re.compile(r"`([\w.-]+/[^`\s]*)`")
PLACEHOLDER = re.compile(r"[<>*{}]")


IGNORED = {ln.strip().lstrip("/") for ln in (ROOT / ".gitignore").read_text().splitlines()
           if ln.strip() and not ln.startswith("#")}


def _links(text: str, page_dir: Path = ROOT):
    for m in MD_LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue                      # URLs, mail, in-page anchors
        yield "link", target.split("#", 1)[0]
    for m in CODE_PATH.finditer(text):
        path = m.group(1).rstrip(".,;:").split("::", 1)[0].split("#", 1)[0]
        if PLACEHOLDER.search(path) or path in IGNORED:
            continue
        first = path.split("/", 1)[0]
        if first in TOP:
            yield "path", path
        elif (page_dir / first).is_dir():
            yield "link", path


def test_pages_found():
    assert (ROOT / "README.md") in PAGES and len(PAGES) >= 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for kind, target in _links(page.read_text(encoding="utf-8"), page.parent):
        base = page.parent if kind == "link" else ROOT
        if target and not (base / target).exists():
            broken.append(f"{kind} {target!r}")
    assert not broken, f"{page.relative_to(ROOT)}: broken relative links: {broken}"


def test_checker_sees_a_broken_link():
    text = "see [x](nope.md), `docs/missing.md`, `results/gone.md` and `benchmarks/bench_<t>.py`"
    found = list(_links(text, ROOT / "benchmarks"))
    assert found == [("link", "nope.md"), ("path", "docs/missing.md"), ("link", "results/gone.md")]
    assert not (ROOT / "benchmarks" / "results" / "gone.md").exists()
