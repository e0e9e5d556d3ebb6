#!/usr/bin/env python3
"""Make the template your project: ``make rename NAME=<name>`` (``python3 tools/rename.py <name>``).

Renames, in every file of the tree that git tracks (or would track) and in the package's path:

- the distribution name ``mnist-ddp`` -> ``<name>`` (normalized: lower case, ``-``):
  pyproject.toml, the console scripts (``mnist-ddp-train`` -> ``<name>-train``), the README's
  title, the SLURM job name;
- the import package ``mnist_ddp`` -> ``<name>`` with ``_`` for ``-``: ``src/mnist_ddp/``, every
  import, the Hydra ``_target_`` paths in ``conf/``, the ``python -m mnist_ddp.train`` commands
  in the docs; and its upper-case form in environment variable names (``MNIST_DDP_JOB``).

The engine (``engine/``, the ``ddp_engine`` package) is not touched: it names no project, and a
clone takes its later versions by merging the template (docs/updating.md).
Nothing else changes: class names (``MNISTDataModule``), configs and docs about MNIST stay, to be
edited as your project moves away from MNIST (docs/customizing.md lists what is left).
The new package name must not be a word of the code or configs yet (``ddp``, ``train``, ``data``
are), so that a later rename replaces the project's name and nothing else. Every new file
content is computed before the first write, and in a git checkout the tree must be clean:
``git diff`` then shows the whole rename and ``git checkout . && git clean -fd`` undoes it. The
old package's build metadata (``src/mnist_ddp.egg-info``) is removed and, when ``.venv`` exists,
the old distribution uninstalled from it. Standard library only: it runs before ``.venv`` exists.

Then the Python files it changed are laid out for the new name as the commit hooks would: a name of
another length or spelling moves where the formatter wraps a line and where an import sorts. The
hooks ``ruff-check`` and ``ruff-format`` of ``.pre-commit-config.yaml`` (ruff pinned there) run on
them, through the pre-commit of ``.venv``, of this Python or of the PATH. Lines that the new name
made longer than ruff's ``line-length`` and that the formatter does not wrap (prose, strings) raise
E501's limit, ``[tool.ruff.lint.pycodestyle] max-line-length`` in pyproject.toml, to the longest of
them. Without pre-commit (``make rename`` before ``make`` made ``.venv``) the rename says so, and
``make .venv/.installed && .venv/bin/python tools/rename.py --layout`` does this step alone.

Exit status 0 on success (the output's "Next:" says when the layout is left to do), 1 with one line
on stderr for a name or tree it refuses; with ``--layout``, 1 when the layout could not be done.
"""

import argparse
import importlib.util
import keyword
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the layout step leaves E501's limit as it is
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
#: The current names; a rename rewrites these two lines too, so the script renames again later.
OLD_DIST = "mnist-ddp"
OLD_PACKAGE = "mnist_ddp"
#: Top-level modules the project imports, tests or keeps beside its package: a package of the same
#: name would shadow them.
TAKEN = {
    "torch", "torchvision", "lightning", "pytorch_lightning", "torchmetrics", "hydra", "omegaconf", "tensorboard",
    "matplotlib", "rich", "numpy", "pytest", "optuna", "onnx", "onnxruntime", "onnxscript", "benchmarks", "tests",
    "tools", "conf", "ddp_engine",
}  # fmt: skip
#: The engine's folder, its own distribution: never rewritten, so that the template's later engine
#: merges into the renamed project without a conflict (docs/updating.md). It names no project.
ENGINE = "engine"
#: Where the new name must not be a word yet: what a later rename must rewrite precisely.
CODE_SUFFIXES = {".py", ".yaml", ".toml", ".sbatch"}
#: Outside a git checkout: top-level folders that are not the project (git ignores them).
UNTRACKED = {".git", ".venv", ".venv-floors", "logs", "data", ".pytest_cache", ".ruff_cache"}
#: The commit hooks (.pre-commit-config.yaml) that lay out Python code: lint fixes (import order
#: included), then the formatter.
LAYOUT_HOOKS = ("ruff-check", "ruff-format")
#: Where E501's limit goes when lines naming the package stay longer than ruff's line-length.
PYCODESTYLE = "[tool.ruff.lint.pycodestyle]"


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


def project_files(root: Path, clean: bool = True) -> list[Path]:
    """The files to rewrite, relative to ``root``: what git tracks or would track (not ignored)
    in a git checkout, else every file outside the :data:`UNTRACKED` folders and ``__pycache__``;
    never the engine's (:data:`ENGINE`).

    Raises:
        RenameError: in a git checkout with uncommitted changes, unless ``clean`` is False.
    """
    if (root / ".git").exists():
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
        if clean and status.stdout.strip():
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
    return sorted(path for path in files if (root / path).is_file() and path.parts[0] != ENGINE)


def _replace_all(text: str, replacements: tuple[tuple[str, str], ...]) -> str:
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def rename(root: Path, name: str) -> list[Path]:
    """Rename the project in ``root`` to ``name``; returns the files whose content changed, by
    their new paths.

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
    return [_moved(path, package) for path in changed]


def _moved(path: Path, package: str) -> Path:
    """Where ``path`` is after the rename: its outermost part named after the package renamed."""
    for depth, part in enumerate(path.parts):
        if OLD_PACKAGE in part:
            return Path(*path.parts[:depth], part.replace(OLD_PACKAGE, package), *path.parts[depth + 1 :])
    return path


def _pre_commit(root: Path) -> list[str] | None:
    """The command that runs pre-commit: the project's ``.venv``'s, this Python's, the PATH's."""
    if (root / ".venv" / "bin" / "pre-commit").is_file():
        return [str(root / ".venv" / "bin" / "pre-commit")]
    if importlib.util.find_spec("pre_commit") is not None:
        return [sys.executable, "-m", "pre_commit"]
    found = shutil.which("pre-commit")
    return [found] if found else None


def lay_out(
    root: Path, files: list[Path], names: tuple[str, ...], old_names: tuple[str, ...] | None = None
) -> tuple[str, str]:
    """Lay out the Python ``files`` (relative to ``root``) as the commit hooks would, and raise
    E501's limit to the longest line naming the project (one of ``names``) that stays longer than
    ruff's line-length, as the module's docstring says: of those lines, only the ones that the
    ``old_names`` (each in place of the name at its index) would keep within the limit, when given.

    Returns:
        ``(done, left)``: what was done, and what is left to do with the command that does it; each
        a sentence or "".
    """
    python = [str(path) for path in files if path.suffix in {".py", ".pyi"}]
    if not python:
        return "", ""
    later = "`make .venv/.installed && .venv/bin/python tools/rename.py --layout`"
    command = _pre_commit(root)
    if command is None or not (root / ".git").exists():
        why = "no pre-commit found" if command is None else "not a git checkout, where pre-commit runs"
        return "", f"lay out the Python files for the new name ({why}): {later}."

    def hook(hook_id: str) -> subprocess.CompletedProcess:
        run = [*command, "run", hook_id, "--color=never", "--files", *python]
        # Without ruff's cache: the rename leaves no folder behind that git ignores.
        env = {**os.environ, "RUFF_NO_CACHE": "true"}
        return subprocess.run(run, cwd=root, env=env, capture_output=True, text=True, timeout=600)

    # Each hook fails (exit status 1) when it changed a file, so the statuses that count are those
    # of a second run, after E501's limit: nothing left to change or report.
    for hook_id in LAYOUT_HOOKS:
        if hook(hook_id).returncode not in (0, 1):
            return "", f"lay out the Python files for the new name (pre-commit could not run {hook_id}): {later}."
    done = f"Laid out {len(python)} Python files with the hooks {', '.join(LAYOUT_HOOKS)}."
    done += _raise_line_limit(root, python, names, old_names)
    for hook_id in LAYOUT_HOOKS:
        result = hook(hook_id)
        if result.returncode != 0:
            return done, f"fix what the hook {hook_id} still finds:\n{result.stdout[-3000:]}\n"
    return done, ""


def _ruff_settings(pyproject: Path) -> dict | None:
    """``[tool.ruff]`` of ``pyproject`` over the configuration it ``extend``s (the engine's, where the
    line length is set): ``line-length`` and ``pycodestyle``, the latter from ``lint`` or the top; None
    without a ``[tool.ruff]``."""
    ruff = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("ruff")
    if ruff is None:
        return None
    base = (_ruff_settings(pyproject.parent / ruff["extend"]) or {}) if "extend" in ruff else {}
    pycodestyle = {**base.get("pycodestyle", {}), **ruff.get("lint", {}).get("pycodestyle", {})}
    return {"line-length": ruff.get("line-length", base.get("line-length", 88)), "pycodestyle": pycodestyle}


def _raise_line_limit(root: Path, python: list[str], names: tuple[str, ...], old_names: tuple[str, ...] | None) -> str:
    """Raise E501's limit in pyproject.toml to the longest line of ``python`` that names the
    project and exceeds it (and, with ``old_names``, would not exceed it under the old names: a line
    that was too long already is left to the check); returns a sentence saying so, or ""."""
    pyproject = root / "pyproject.toml"
    if tomllib is None or not pyproject.is_file():
        return ""
    text = pyproject.read_text(encoding="utf-8")
    ruff = _ruff_settings(pyproject)
    if ruff is None:
        return ""
    line_length = ruff.get("line-length", 88)
    limit = ruff.get("pycodestyle", {}).get("max-line-length", line_length)

    def lengthened(line: str) -> bool:
        if len(line) <= limit or not any(name in line for name in names):
            return False
        return old_names is None or len(_replace_all(line, tuple(zip(names, old_names)))) <= limit

    long_lines = [
        line for name in python for line in (root / name).read_text(encoding="utf-8").splitlines() if lengthened(line)
    ]
    if not long_lines:
        return ""
    longest = max(len(line) for line in long_lines)
    setting = f"max-line-length = {longest}\n"
    lines = text.splitlines(keepends=True)
    if f"{PYCODESTYLE}\n" in lines:
        start = lines.index(f"{PYCODESTYLE}\n") + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
        found = [i for i in range(start, end) if re.match(r"max-line-length\s*=", lines[i])]
        if found:
            lines[found[0]] = setting
        else:
            lines.insert(start, setting)
        text = "".join(lines)
    else:
        text = (
            f"{text.rstrip()}\n\n{PYCODESTYLE}\n"
            "# E501's limit, above line-length: lines naming the package that `make rename` lengthened and\n"
            f"# the formatter does not wrap (prose, strings). Rewrap them, then this can go.\n{setting}"
        )
    if tomllib.loads(text)["tool"]["ruff"]["lint"]["pycodestyle"].get("max-line-length") != longest:
        return f" {len(long_lines)} lines naming the package are longer than {limit} characters."
    pyproject.write_text(text, encoding="utf-8")
    return (
        f" {len(long_lines)} lines naming the package (prose, strings) stay longer than line-length = "
        f"{line_length}: E501 allows {longest} ({PYCODESTYLE} max-line-length in pyproject.toml)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="make rename NAME=", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "name", nargs="?", help="the new project name (letters, digits, - _ .); the package is its - as _"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the project to rename (default: this one)")
    parser.add_argument(
        "--layout", action="store_true",
        help="only lay out the Python files that name the project, as after a rename (needs pre-commit)",
    )  # fmt: skip
    parser.add_argument(
        "--layout-follows", action="store_true",
        help="the caller lays the files out next (make rename, once .venv is installed): not a step left to do",
    )  # fmt: skip
    args = parser.parse_args()
    if args.layout:
        names = (OLD_PACKAGE, OLD_PACKAGE.upper(), OLD_DIST)
        files = [
            path for path in project_files(args.root, clean=False) if path.suffix in {".py", ".pyi"}
            and any(name in (args.root / path).read_text(encoding="utf-8") for name in names)
        ]  # fmt: skip
        before = {path: (args.root / path).read_bytes() for path in files}
        done, left = lay_out(args.root, files, names)
        if left:
            print(f"{done} Not done: {left}".strip(), file=sys.stderr)
        elif not files:
            print("No Python file names the project.")
        elif all((args.root / path).read_bytes() == content for path, content in before.items()):
            # make rename runs this after the rename, which has laid them out already where pre-commit ran.
            print(f"The {len(files)} Python files that name the project are laid out already.")
        else:
            print(done)
        sys.exit(1 if left else 0)
    if args.name is None:
        parser.error("the new project name is required (or --layout)")
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
    done, left = lay_out(
        args.root, changed, (package, package.upper(), dist), (OLD_PACKAGE, OLD_PACKAGE.upper(), OLD_DIST)
    )
    print(
        f"Renamed {OLD_DIST} -> {dist} (package {OLD_PACKAGE} -> {package}) in {len(changed)} files "
        f"in {time.perf_counter() - start:.1f} s.{' ' + done if done else ''}\n"
        f"Next: {left + ' Then ' if left and not args.layout_follows else ''}`make test-fast` (under 2 minutes; "
        "`make test` runs every test, about 20 minutes on 2 cores), review `git diff`, commit."
    )


if __name__ == "__main__":
    main()
