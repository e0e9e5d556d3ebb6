#!/usr/bin/env python3
"""Check the relative links of Markdown pages: ``python3 engine/tools/check_links.py [PATH ...]``, each
PATH a page or a folder of pages (default: the engine's README.md and docs/).

Every ``[text](target)`` and ``![alt](target)`` outside code blocks whose target is not a URL must
name a file that exists, and its ``#anchor``, if any, a heading of that Markdown file (GitHub's
anchors: lower case, punctuation dropped, spaces as ``-``, ``-1``, ``-2`` for repeated headings).
Prints each broken link as ``file:line: target (why)`` and exits 1 if there is one. Standard
library only.
"""

import re
import sys
from pathlib import Path

#: ``engine/``, whose pages are checked by default.
ENGINE = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def without_code(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, re.sub(r"`[^`]*`", "", line)))
    return lines


def heading_texts(path: Path) -> list[str]:
    """The headings of a Markdown file, outside code blocks (inline code kept: its words are in the anchor)."""
    fenced, headings = False, []
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            headings.append(line.lstrip("#").strip())
    return headings


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives those headings."""
    found, seen = set(), {}
    for raw in heading_texts(path):
        slug = re.sub(r"[^\w\- ]", "", raw.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for number, line in without_code(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page}:{number}: {target}"
            if not linked.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in slugs(linked):
                problems.append(f"{where} (no such heading in {linked})")
    return problems


def main() -> int:
    paths = [Path(arg) for arg in sys.argv[1:]] or [ENGINE / "README.md", ENGINE / "docs"]
    pages = sorted(page for path in paths for page in (sorted(path.glob("*.md")) if path.is_dir() else [path]))
    problems = [problem for page in pages for problem in broken_links(page)]
    print("\n".join(problems) if problems else f"{len(pages)} pages, every relative link resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
