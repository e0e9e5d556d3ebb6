"""The project's pages: every relative link of the README, docs/ and the engine's pages resolves
(``engine/tools/check_links.py``), and the README stays short, its first screen showing the two
commands, what the engine does and which folders are yours."""

import subprocess
import sys

from helpers import REPO

#: The README's first screen: the lines a reader sees before scrolling.
FIRST_SCREEN = 40


def test_every_relative_link_of_the_pages_resolves():
    pages = ["README.md", "docs", "engine/README.md", "engine/docs"]
    result = subprocess.run([sys.executable, "engine/tools/check_links.py", *pages], cwd=REPO, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().endswith("pages, every relative link resolves")


def test_the_readme_is_at_most_200_lines_and_its_first_screen_says_what_is_whose():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    screen = "\n".join(lines[:FIRST_SCREEN])
    for shown in ("make train", "make test", "engine/", "`src/", "`conf/`", "`tests/`", "yours", "resumable"):
        assert shown in screen, shown
