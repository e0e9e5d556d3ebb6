"""This project's import contracts (pyproject.toml): the engine imports no module of the task, whose
package it never names, nor anything of the template's task; the task imports the engine from its
public module only, and a planted import of another module is named with the public name to use;
a subpackage of one's own needs no contract line. (The engine's own: engine/tests/tooling.)"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's own command line on the tree at ``root`` (its ``src/`` first on the path), its
    output without the colours some versions of it write."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
         "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, env={"PYTHONPATH": f"{root / 'engine' / 'src'}:{root / 'src'}", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    result.stdout = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    return result


def planted(root: Path, module: str, line: str) -> Path:
    """A copy of the project's ``src/``, the engine's ``engine/src/`` and both ``pyproject.toml`` in
    ``root``, with ``line`` appended to the engine's ``ddp_engine/<module>``; returns ``root``."""
    ignore = shutil.ignore_patterns("*.egg-info", "__pycache__")
    shutil.copytree(ROOT / "src", root / "src", ignore=ignore)
    shutil.copytree(ROOT / "engine" / "src", root / "engine" / "src", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", root)
    shutil.copy(ROOT / "engine" / "pyproject.toml", root / "engine")
    path = root / "engine" / "src" / "ddp_engine" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    return root


def test_the_engine_imports_no_task_module():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The engine imports no task module KEPT" in result.stdout


def test_an_engine_module_that_imports_the_task_breaks_the_contract(tmp_path):
    line = "from mnist_ddp.task import TASK"
    result = lint_imports(planted(tmp_path, "launch/job.py", line))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "The engine imports no task module BROKEN" in result.stdout
    assert "ddp_engine.launch.job -> mnist_ddp.task" in result.stdout, result.stdout


def test_the_engine_names_no_project():
    """What keeps ``make rename`` off the engine, and so a renamed clone's merges of it free of
    conflicts: no file of ``engine/`` names the project's package or distribution (it learns them
    from the project: ddp_engine.project)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package, distribution = config["tool"]["importlinter"]["root_packages"][1], config["project"]["name"]
    named = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "engine").rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path)
        for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if package in text or distribution in text or package.upper() in text
    ]
    assert len(list((ROOT / "engine").rglob("*.py"))) > 60
    assert named == [], f"engine files that name the project {package!r}: {named}"


def test_the_task_imports_the_engine_from_its_public_module_only():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The task imports the engine from its public module only KEPT" in result.stdout


def test_a_task_import_of_an_engine_module_names_the_public_name_to_use(tmp_path):
    root = planted(tmp_path, "api.py", "")
    module = root / "src" / "mnist_ddp" / "task.py"
    text = module.read_text()
    module.write_text(text + "from ddp_engine.data.sharded import ShardedDataModule, WithIndices\n")
    number = len(text.splitlines()) + 1
    result = lint_imports(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "The task imports the engine from its public module only BROKEN" in result.stdout
    said = " ".join(result.stdout.split())  # as one line: the output wraps at the terminal's width
    assert (
        f"mnist_ddp.task imports ddp_engine.data.sharded (line {number}): "
        "from ddp_engine.data.sharded import ShardedDataModule, WithIndices "
        "instead: from ddp_engine.api import ShardedDataModule "
        "(ddp_engine.api has no WithIndices: the engine keeps it to itself)"
    ) in said, result.stdout


def test_a_subpackage_of_ones_own_needs_no_contract_line(tmp_path):
    root = planted(tmp_path, "api.py", "")
    mine = root / "src" / "mnist_ddp" / "augmentations"
    mine.mkdir()
    (mine / "__init__.py").write_text("from ddp_engine.api import ConfigValueError\n\nERROR = ConfigValueError\n")
    train = root / "src" / "mnist_ddp" / "train.py"
    train.write_text(train.read_text() + "\nfrom mnist_ddp.augmentations import ERROR  # noqa\n")
    result = lint_imports(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


#: What the template's task names that a task of another kind would not: its metrics, data keys,
#: data set and network arguments.
TEMPLATE_NAMES = ("val/acc", "test/acc", "mnist", "val_size", "split_seed", "class_names", "crop_padding",
                  "in_channels", "image_size")  # fmt: skip


def test_the_engines_core_names_nothing_of_the_templates_task():
    """The engine reads a task's facts from its Task and its DataModule (its loading keys, its
    checks), so no module or config of the engine's core names a metric, data key or data set of
    the template's task (the shared image machinery, ``ddp_engine.vision``, aside)."""
    core = ROOT / "engine" / "src"
    named = [
        f"{path.relative_to(ROOT)}:{number}: {name}"
        for path in sorted(core.rglob("*"))
        if path.suffix in (".py", ".yaml") and "vision" not in path.relative_to(core).parts
        for number, text in enumerate(path.read_text().splitlines(), 1)
        for name in TEMPLATE_NAMES
        if name in text.lower()
    ]
    assert named == [], named
