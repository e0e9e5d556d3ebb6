"""The engine's pages (README.md and docs/ under engine/) stand alone: every relative link resolves
and stays inside engine/, which a clone merges whole and never edits."""

import re
import subprocess
import sys
from pathlib import Path

#: engine/.
ENGINE = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]*)[^)]*\)")


def pages() -> list[Path]:
    return [ENGINE / "README.md", *sorted((ENGINE / "docs").glob("*.md"))]


def test_every_relative_link_of_the_engines_pages_resolves():
    result = subprocess.run([sys.executable, str(ENGINE / "tools" / "check_links.py")], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == f"{len(pages())} pages, every relative link resolves"


def test_no_link_of_the_engines_pages_leaves_engine():
    outside = [
        f"{page.relative_to(ENGINE)}: {target}"
        for page in pages()
        for target in LINK.findall(page.read_text())
        if target and not re.match(r"[a-z]+:", target) and not (page.parent / target).resolve().is_relative_to(ENGINE)
    ]
    assert len(pages()) >= 10 and outside == [], outside
