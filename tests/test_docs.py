"""The README is a front door to the guides in docs/, every path the documentation names exists, and
docs/bench/ holds one current result per benchmark, earlier ones named by the git commit that holds
them (issue 54, item 3)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCH = ROOT / "docs" / "bench"
# a Markdown link or image: [text](target)
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
# an earlier result kept in git: `git show COMMIT:docs/bench/FILE`
HISTORICAL = re.compile(r"git show ([0-9a-f]{7,40}):(docs/[\w./-]*\w)")
# a repository path under docs/ named in text or code (a file, or a folder ending in /)
DOCS_PATH = re.compile(r"(?<![\w./:-])docs/[\w./-]*[\w/]")
# a section of a guide named by its title: docs/PRIVACY.md "Late nodes", (docs/EXPERIMENTS.md, 'Sweeps ...')
SECTION = re.compile(r"""\b(README|docs/[A-Z_]+\.md),? ["'“]([^"'”\n]{3,80})["'”]""")


def _markdown() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _sources() -> list[Path]:
    """The files that may name a path under docs/: the Markdown, the library, scripts and tests."""
    code = [p for room in ("fedpriv", "server", "client", "scripts", "tests") for p in sorted((ROOT / room).rglob("*"))
            if p.is_file() and p.suffix in {".py", ".sh", ".md"} and "golden" not in p.parts]
    return [*_markdown(), *code]


def test_the_readme_is_a_front_door_to_the_guides():
    """At most 400 lines; ``make demo`` and ``make test`` in its first screen (50 lines); a link to
    every guide in docs/."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines"
    first_screen = "\n".join(lines[:50])
    assert "make demo" in first_screen and "make test" in first_screen
    linked = set(LINK.findall(text))
    unlinked = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in linked)
    assert unlinked == [], f"README.md links no {unlinked}"


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for doc in _markdown():
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            if not (doc.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_path_under_docs_that_is_named_exists():
    """A path ``docs/...`` in the documentation, the code, the scripts or the tests exists, unless it
    is named as an earlier result in git (``git show COMMIT:docs/...``, checked below)."""
    missing = []
    for source in _sources():
        text = HISTORICAL.sub("", source.read_text(errors="replace"))
        for path in DOCS_PATH.findall(text):
            if not (ROOT / path.rstrip(".")).exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert missing == []


def test_a_section_named_in_the_docs_or_the_code_exists():
    """A guide's section named by its title (``docs/PRIVACY.md "Late nodes"``, in the documentation
    or in the library's messages and comments) is a heading or a bold lead of that guide."""
    def titles(doc: Path) -> list[str]:
        text = doc.read_text().replace("`", "")
        return [*(re.sub(r"^#+\s*", "", line) for line in text.splitlines() if line.startswith("#")),
                *re.findall(r"\*\*([^*]+)\*\*", text)]

    code = [p for room in ("fedpriv", "server", "client", "scripts") for p in sorted((ROOT / room).rglob("*.py"))]
    missing = []
    for source in [*_markdown(), *code]:
        for name, title in SECTION.findall(" ".join(source.read_text().split())):
            doc = README if name == "README" else ROOT / name
            if not doc.exists() or not any(t.startswith(title.replace("`", "")) for t in titles(doc)):
                missing.append(f"{source.relative_to(ROOT)}: {name} {title!r}")
    assert missing == []


def test_an_earlier_result_names_a_commit_that_holds_it():
    """Each ``git show COMMIT:PATH`` in the documentation shows a file (skipped outside a full clone)."""
    named = sorted({m.groups() for doc in _markdown() for m in HISTORICAL.finditer(doc.read_text())})
    assert named, "docs/BENCHMARKS.md names no earlier result"
    for commit, path in named:
        if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
            pytest.skip(f"commit {commit} is not in this clone")
        shown = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True)
        assert shown.returncode == 0, f"git show {commit}:{path} shows nothing"


def test_docs_bench_holds_one_current_result_per_benchmark():
    """No dated copy in docs/bench/ (history lives in git), and every entry is a result
    docs/BENCHMARKS.md quotes as current (named outside a ``git show``)."""
    entries = sorted(p.name for p in BENCH.iterdir())
    assert [e for e in entries if re.search(r"\d{4}-\d{2}-\d{2}", e)] == []
    current = set(DOCS_PATH.findall(HISTORICAL.sub("", (ROOT / "docs" / "BENCHMARKS.md").read_text())))
    unquoted = [e for e in entries if f"docs/bench/{e}" not in current and f"docs/bench/{e}/" not in current]
    assert unquoted == []
