"""The template's own hygiene: the tree passes the checks of its pre-commit hooks (ruff lint and
format, trailing whitespace, final newlines, YAML, TOML, merge markers), as the issue tracker and
the GitHub workflow require of every commit.

The checks run in check mode only: pre-commit's manual stage (``.pre-commit-config.yaml``), where
each fixer of the commit hooks is replaced by its check-only twin, with the same pinned package.
So ``make test`` never rewrites a file: a problem fails the test and its file is left as it was,
which a planted tree shows below.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO

#: The check-only twins of the commit hooks' fixers, by hook id.
TWINS = ("ruff-check-only", "ruff-format-check", "trailing-whitespace-check", "end-of-file-check")


def project_files(root: Path) -> list[str]:
    """What git tracks or would track in ``root`` (uncommitted files included, ignored ones not)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, text=True, check=True).stdout.split("\0")  # fmt: skip
    return [name for name in listed if name and (root / name).is_file()]


def check(root: Path, files: list[str]) -> subprocess.CompletedProcess:
    # The hooks' environments come from the package index on first use, then from pre-commit's cache.
    # --files, not --all-files: the files git would add are checked too, and pre-commit stashes nothing.
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--hook-stage", "manual", "--color=never", "--files", *files],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_tree_passes_its_checks_and_no_file_is_rewritten():
    files = project_files(REPO)
    before = {name: (REPO / name).read_bytes() for name in files}
    result = check(REPO, files)
    rewritten = [name for name in files if (REPO / name).read_bytes() != before[name]]
    assert rewritten == [], "the checks must not rewrite files"
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    # Every hook ran and none failed, however many hooks the file lists.
    assert "Passed" in result.stdout and "Failed" not in result.stdout, result.stdout
    assert "Skipped" not in result.stdout, "a check without files to check"
    assert "files were modified by this hook" not in result.stdout


def test_a_planted_problem_fails_the_check_and_its_file_is_left_as_it_was(tmp_path):
    # A fresh repository with this project's hooks and ruff settings, and one file per fixer, each
    # with what that fixer would rewrite (untracked: the checks take the files they are given).
    (tmp_path / "engine").mkdir()
    for name in (
        ".pre-commit-config.yaml",
        "pyproject.toml",
        "engine/pyproject.toml",
    ):  # ruff's settings extend the engine's
        shutil.copy(REPO / name, tmp_path / name)
    subprocess.run(["git", "init", "--quiet"], cwd=tmp_path, check=True)
    planted = {
        "unused.py": b"import os\n",  # F401: ruff check --fix deletes the import
        "layout.py": b"x = {  'a':1 }\n",  # ruff format rewrites the line
        "notes.md": b"a line with a trailing space \n",  # the trailing-whitespace fixer strips it
        "no_newline.txt": b"the last line has no newline",  # the end-of-file fixer adds one
        "blank_lines.yaml": b"key: value\n\n\n",  # and removes the blank lines at the end
        # SLF001: a library's private attribute, outside compat; allowed in tests.
        "private.py": b"def f(trainer):\n    return trainer._logger_connector\n",
        "tests/test_private.py": b"def f(trainer):\n    return trainer._logger_connector\n",
    }
    (tmp_path / "tests").mkdir()
    for name, content in planted.items():
        (tmp_path / name).write_bytes(content)
    result = check(tmp_path, list(planted))
    assert result.returncode == 1, result.stdout
    failed = {line.removeprefix("- hook id: ") for line in result.stdout.splitlines() if line.startswith("- hook id: ")}
    assert failed == set(TWINS), result.stdout
    for name in planted.keys() - {"tests/test_private.py"}:
        assert name in result.stdout, (name, result.stdout)
    assert "F401" in result.stdout and "+x = {" in result.stdout, result.stdout  # the finding, the diff
    # ruff's report: the rule's line, then " --> <file>:<line>:<column>".
    lines = result.stdout.splitlines()
    findings = [after.split("-->")[1].strip() for line, after in zip(lines, lines[1:]) if line.startswith("SLF001")]
    assert findings == ["private.py:2:12"], result.stdout
    assert {name: (tmp_path / name).read_bytes() for name in planted} == planted, "a check rewrote a file"
    assert "files were modified by this hook" not in result.stdout
