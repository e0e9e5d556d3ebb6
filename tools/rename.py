#!/usr/bin/env python3
"""Make the template your project: ``make rename NAME=<name>`` (``python3 tools/rename.py <name>``).

Renames, in every file of the tree that git tracks (or would track) and in the package's path:

- the distribution name ``mnist-ddp`` -> ``<name>`` (normalized: lower case, ``-``):
  pyproject.toml, the console scripts (``mnist-ddp-train`` -> ``<name>-train``), the README's
  title, the SLURM job name;
- the import package ``mnist_ddp`` -> ``<name>`` with ``_`` for ``-``: ``src/mnist_ddp/``, every
  import, the Hydra ``_target_`` paths in ``conf/``, the ``python -m mnist_ddp.train`` commands
  in the docs; and its upper-case form in environment variable names (``MNIST_DDP_JOB``).

Nothing else changes: class names (``MNISTDataModule``), configs and docs about MNIST stay, to be
edited as your project moves away from MNIST (docs/customizing.md lists what is left).
The new package name must not be a word of the code or configs yet (``ddp``, ``train``, ``data``
are), so that a later rename replaces the project's name and nothing else. Every new file
content is computed before the first write, and in a git checkout the tree must be clean:
``git diff`` then shows the whole rename and ``git checkout . && git clean -fd`` undoes it. The
old package's build metadata (``src/mnist_ddp.egg-info``) is removed and, when ``.venv`` exists,
the old distribution uninstalled from it. Standard library only: it runs before ``.venv`` exists.

Exit status 0 on success, 1 with one line on stderr for a name or tree it refuses.
"""

import argparse
import keyword
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The current names; a rename rewrites these two lines too, so the script renames again later.
OLD_DIST = "mnist-ddp"
OLD_PACKAGE = "mnist_ddp"
#: Top-level modules the project imports, tests or keeps beside its package: a package of the same
#: name would shadow them.
TAKEN = {
    "torch", "torchvision", "lightning", "pytorch_lightning", "torchmetrics", "hydra", "omegaconf", "tensorboard",
    "matplotlib", "rich", "numpy", "pytest", "optuna", "onnx", "onnxruntime", "onnxscript", "benchmarks", "tests",
    "tools", "conf",
}  # fmt: skip
#: Where the new name must not be a word yet: what a later rename must rewrite precisely.
CODE_SUFFIXES = {".py", ".yaml", ".toml", ".sbatch"}
#: Outside a git checkout: top-level folders that are not the project (git ignores them).
UNTRACKED = {".git", ".venv", "logs", "data", ".pytest_cache", ".ruff_cache"}


class RenameError(Exception):
    """A name or a tree the rename refuses; the message says why and what to do."""


def names_for(name: str) -> tuple[str, str]:
    """``"My_Project"`` -> ``("my-project", "my_project")``: the normalized distribution name
    (PEP 503: lower case, runs of ``-_.`` as one ``-``) and the import package.

    Raises:
        RenameError: for a name that is not a valid project name, or whose package would be a Python
            keyword, the old name, or shadow the standard library or a dependency.
    """
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*[A-Za-z0-9]", name):
        raise RenameError(
            f"{name!r} is not a project name: use letters, digits and - _ . (starting with a letter, "
            "ending with a letter or digit)."
        )
    dist = re.sub(r"[-_.]+", "-", name).lower()
    package = dist.replace("-", "_")
    if package == OLD_PACKAGE:
        raise RenameError(f"the project is already named {OLD_DIST}.")
    if keyword.iskeyword(package) or package in sys.stdlib_module_names or package in TAKEN:
        raise RenameError(f"the package name {package!r} would shadow Python's own {package!r}: choose another name.")
    return dist, package


def project_files(root: Path) -> list[Path]:
    """The files to rewrite, relative to ``root``: what git tracks or would track (not ignored)
    in a git checkout, else every file outside the :data:`UNTRACKED` folders and ``__pycache__``.

    Raises:
        RenameError: in a git checkout with uncommitted changes.
    """
    if (root / ".git").exists():
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
        if status.stdout.strip():
            raise RenameError(
                "the git tree has uncommitted changes: commit or stash them first, so that `git diff` "
                "shows the rename alone and `git checkout . && git clean -fd` undoes it."
            )
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=root, capture_output=True, text=True, check=True).stdout.split("\0")  # fmt: skip
        files = [Path(name) for name in listed if name]
    else:
        files = [path.relative_to(root) for path in root.rglob("*")]
        files = [path for path in files if path.parts[0] not in UNTRACKED and "__pycache__" not in path.parts]
    return sorted(path for path in files if (root / path).is_file())


def _replace_all(text: str, replacements: tuple[tuple[str, str], ...]) -> str:
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def rename(root: Path, name: str) -> list[Path]:
    """Rename the project in ``root`` to ``name``; returns the files whose content changed.

    Raises:
        RenameError: see :func:`names_for` and :func:`project_files`; also when the new names
            already occur in the tree.
    """
    dist, package = names_for(name)
    files = project_files(root)
    texts = {}
    for path in files:
        try:
            texts[path] = (root / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binary files
    word = re.compile(rf"(?<![\w-])({re.escape(package)}|{re.escape(dist)})(?![\w-])")
    clashes = [str(path) for path, text in texts.items() if path.suffix in CODE_SUFFIXES and word.search(text)]
    if clashes:
        raise RenameError(
            f"{package} is already a word in {', '.join(clashes[:3])}{' ...' if len(clashes) > 3 else ''}: "
            "choose a name that is not, so that a later rename replaces the project's name and nothing else."
        )
    replacements = ((OLD_PACKAGE, package), (OLD_PACKAGE.upper(), package.upper()), (OLD_DIST, dist))
    new_texts = {path: _replace_all(text, replacements) for path, text in texts.items()}
    changed = [path for path in files if path in texts and new_texts[path] != texts[path]]

    # Folders and files named after the package (src/mnist_ddp/): the outermost one of each path.
    moves = set()
    for path in files:
        for depth, part in enumerate(path.parts):
            if OLD_PACKAGE in part:
                moves.add(Path(*path.parts[: depth + 1]))
                break
    for path in changed:
        target = root / path
        temporary = target.with_name(f".{target.name}.rename")
        temporary.write_text(new_texts[path], encoding="utf-8")
        shutil.copymode(target, temporary)
        os.replace(temporary, target)
    for path in sorted(moves):
        os.rename(root / path, root / path.parent / path.name.replace(OLD_PACKAGE, package))
    # The old package's build metadata (ignored by git): with src/ on the import path of an editable
    # install, it would still be listed as an installed distribution.
    shutil.rmtree(root / "src" / f"{OLD_PACKAGE}.egg-info", ignore_errors=True)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(prog="make rename NAME=", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the new project name (letters, digits, - _ .); the package is its - as _")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project to rename (default: this one)")
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        changed = rename(args.root, args.name)
    except RenameError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)
    dist, package = names_for(args.name)
    venv_python = args.root / ".venv" / "bin" / "python"
    if venv_python.exists():
        # The old distribution's metadata would stay installed beside the new one; make test
        # installs the new one, since pyproject.toml changed.
        subprocess.run([str(venv_python), "-m", "pip", "uninstall", "--quiet", "--yes", OLD_DIST], check=False)
    print(
        f"Renamed {OLD_DIST} -> {dist} (package {OLD_PACKAGE} -> {package}) in {len(changed)} files "
        f"in {time.perf_counter() - start:.1f} s.\n"
        f"Next: `make test` (reinstalls the package into .venv), review `git diff`, commit."
    )


if __name__ == "__main__":
    main()
