"""The package's layers point one way: the import-linter contract in pyproject.toml holds for
``src/``, and breaks, naming the import, when a lower layer imports a higher one; no modules
import each other in a loop, inside a package either (``tools/import_graph.py --cycles``); and the
engine imports no module of the task (a second contract), every module being one or the other."""

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's own command line on the tree at ``root`` (its ``src/`` first on the path)."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
         "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_layers_point_one_way():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Layers point one way KEPT" in result.stdout


def planted(root: Path, module: str, line: str) -> Path:
    """A copy of the project's ``src/``, ``tools/`` and ``pyproject.toml`` in ``root``, with ``line``
    appended to ``src/mnist_ddp/<module>``; returns ``root``."""
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copytree(ROOT / "tools", root / "tools")
    shutil.copy(ROOT / "pyproject.toml", root)
    path = root / "src" / "mnist_ddp" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    return root


def test_an_import_of_a_higher_layer_breaks_the_contract(tmp_path):
    # A copy of the tree where the lowest layer (core) imports the config layer: a cycle.
    result = lint_imports(planted(tmp_path, "core/files.py", "from mnist_ddp.config.schema import CONFIG_DIR"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers point one way BROKEN" in result.stdout
    assert "mnist_ddp.core.files -> mnist_ddp.config.schema" in result.stdout, result.stdout


def module_cycles(root: Path) -> subprocess.CompletedProcess:
    """``tools/import_graph.py --cycles`` on the tree at ``root``."""
    return subprocess.run(
        [sys.executable, str(root / "tools" / "import_graph.py"), "--cycles"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_no_modules_import_each_other_in_a_loop():
    result = module_cycles(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "0 loop(s) of modules that import each other"


def test_a_loop_inside_a_package_is_found(tmp_path):
    # Inside one layer, where the contract does not look: the worker imports the supervisor back.
    result = module_cycles(planted(tmp_path, "launch/worker.py", "from mnist_ddp.launch.supervisor import JOB_FILE"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "mnist_ddp.launch.supervisor -> mnist_ddp.launch.worker -> mnist_ddp.launch.supervisor" in result.stdout


def test_the_engine_imports_no_task_module():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The engine imports no task module KEPT" in result.stdout


def test_an_engine_module_that_imports_the_task_breaks_the_contract(tmp_path):
    line = "from mnist_ddp.models.classifier import MNISTClassifier"
    result = lint_imports(planted(tmp_path, "launch/job.py", line))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "The engine imports no task module BROKEN" in result.stdout
    assert "mnist_ddp.launch.job -> mnist_ddp.models.classifier" in result.stdout, result.stdout


def test_every_module_is_the_engines_or_the_tasks():
    """A new module is placed on one side of the contract: a module of neither would go unchecked."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [contract for contract in contracts if contract["type"] == "forbidden"]
    sides = [*contract["source_modules"], *contract["forbidden_modules"]]
    package = ROOT / "src" / "mnist_ddp"
    modules = {
        ".".join(("mnist_ddp", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for path in package.rglob("*.py")
    }
    unplaced = sorted(
        module for module in modules - {"mnist_ddp"}
        if not any(module == side or module.startswith(f"{side}.") for side in sides)
        and not (package / Path(*module.split(".")[1:]) / "__init__.py").is_file()
    )  # fmt: skip
    assert unplaced == [], f"place these in pyproject.toml's engine or task list: {unplaced}"
