"""The package's layers point one way: the import-linter contract in pyproject.toml holds for
``src/``, and breaks, naming the import, when a lower layer imports a higher one."""

import shutil
import subprocess
import sys
from pathlib import Path

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


def test_an_import_of_a_higher_layer_breaks_the_contract(tmp_path):
    # A copy of the tree where the lowest layer (core) imports the config layer: a cycle.
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    files = tmp_path / "src" / "mnist_ddp" / "core" / "files.py"
    files.write_text(files.read_text() + "\nfrom mnist_ddp.config.schema import CONFIG_DIR  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers point one way BROKEN" in result.stdout
    assert "mnist_ddp.core.files -> mnist_ddp.config.schema" in result.stdout, result.stdout
