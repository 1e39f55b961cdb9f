"""The README is a front door to the guides in docs/, and every link and named section of the
documentation exists (issue 54, item 3)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# a Markdown link or image: [text](target)
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
# a section of a guide named by its title: docs/PRIVACY.md "Late nodes", (docs/EXPERIMENTS.md, 'Sweeps ...')
SECTION = re.compile(r"""\b(README|docs/[A-Z_]+\.md),? ["'“]([^"'”\n]{3,80})["'”]""")


def _markdown() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


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
