"""The template's own hygiene: the tree passes its pre-commit hooks (ruff lint and format, file
checks), as the issue tracker and the GitHub workflow require of every commit."""

import subprocess
import sys

from helpers import REPO


def test_the_tree_passes_its_pre_commit_hooks():
    # The hooks' environments come from the package index on first use, then from pre-commit's cache.
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--show-diff-on-failure", "--color=never"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    # Every hook ran and none failed, however many hooks the file lists.
    assert "Passed" in result.stdout and "Failed" not in result.stdout, result.stdout
