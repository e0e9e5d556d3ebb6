"""The engine's import contracts (engine/pyproject.toml): its layers point one way and break, naming
the import, when a lower layer imports a higher one; the image machinery imports the engine from its
public module only, and a planted import of another module is named with the public name to use; no
modules import each other in a loop, inside a package either (``engine/tools/import_graph.py --cycles``)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

#: engine/: its pyproject.toml, src/ and tools/.
ENGINE = Path(__file__).resolve().parents[2]


def lint_imports(engine: Path) -> subprocess.CompletedProcess:
    """import-linter's own command line on the engine at ``engine`` (its ``src/`` first on the path),
    its output without the colours some versions of it write."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
         "--config", str(engine / "pyproject.toml"), "--no-cache"],
        cwd=engine, env={"PYTHONPATH": str(engine / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    result.stdout = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    return result


def planted(root: Path, module: str, line: str) -> Path:
    """A copy of the engine's ``src/``, ``tools/`` and ``pyproject.toml`` in ``root``, with ``line``
    appended to ``ddp_engine/<module>``; returns ``root``."""
    shutil.copytree(ENGINE / "src", root / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copytree(ENGINE / "tools", root / "tools")
    shutil.copy(ENGINE / "pyproject.toml", root)
    path = root / "src" / "ddp_engine" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    return root


def test_the_engines_contracts_hold():
    result = lint_imports(ENGINE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Layers point one way KEPT" in result.stdout
    assert "The image machinery imports the engine from its public module only KEPT" in result.stdout


def test_an_import_of_a_higher_layer_breaks_the_contract(tmp_path):
    # The lowest layer with code (core) imports the config layer: a cycle.
    result = lint_imports(planted(tmp_path, "core/files.py", "from ddp_engine.config.schema import register_configs"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers point one way BROKEN" in result.stdout
    assert "ddp_engine.core.files -> ddp_engine.config.schema" in result.stdout, result.stdout


def test_the_engine_never_imports_the_image_machinery(tmp_path):
    result = lint_imports(planted(tmp_path, "run/train.py", "from ddp_engine.vision.spec import DataSpec"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ddp_engine.run.train -> ddp_engine.vision.spec" in result.stdout, result.stdout


def test_an_import_of_an_engine_module_by_the_image_machinery_names_the_public_name(tmp_path):
    module = "vision/figures.py"
    text = (ENGINE / "src" / "ddp_engine" / module).read_text()
    result = lint_imports(
        planted(tmp_path, module, "from ddp_engine.core.errors import ConfigValueError, JobFailedError")
    )
    assert result.returncode == 1, result.stdout + result.stderr
    said = " ".join(result.stdout.split())  # as one line: the output wraps at the terminal's width
    assert (
        f"ddp_engine.vision.figures imports ddp_engine.core.errors (line {len(text.splitlines()) + 2}): "
        "from ddp_engine.core.errors import ConfigValueError, JobFailedError # noqa "
        "instead: from ddp_engine.api import ConfigValueError "
        "(ddp_engine.api has no JobFailedError: the engine keeps it to itself)"
    ) in said, result.stdout


def module_cycles(engine: Path) -> subprocess.CompletedProcess:
    """``tools/import_graph.py --cycles`` on the engine at ``engine``."""
    return subprocess.run(
        [sys.executable, str(engine / "tools" / "import_graph.py"), "--cycles"],
        cwd=engine, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_no_modules_import_each_other_in_a_loop():
    result = module_cycles(ENGINE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "0 loop(s) of modules that import each other"


def test_a_loop_inside_a_package_is_found(tmp_path):
    # Inside one layer, where the contract does not look: the worker imports the supervisor back.
    result = module_cycles(planted(tmp_path, "launch/worker.py", "from ddp_engine.launch.supervisor import JOB_FILE"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ddp_engine.launch.supervisor -> ddp_engine.launch.worker -> ddp_engine.launch.supervisor" in result.stdout
