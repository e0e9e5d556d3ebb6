"""The test suite's own layout (docs/testing.md): every test file's name is unique across the
folders of tests/ and engine/tests/, which one pytest run collects (it imports them by basename: no
``__init__.py``), no module imports conftest or
another test module (shared helpers are in tests/helpers.py), and a test that starts real
processes is marked ``processes`` (its module's ``pytestmark``, or the test itself), so that
``make test-fast`` (``-m "not processes"``) leaves it out.

Each rule is checked on tests/ and, to show that it can fail, on a planted tree that breaks it.
"""

import ast
from collections import defaultdict
from pathlib import Path

from helpers import REPO

#: What starts the project's processes: the helpers that run the command line, torchrun or a
#: simulated SLURM job, the fixtures that train a DDP run, subprocess itself and the conformance
#: check (gloo processes of its own).
PROCESS_NAMES = {"run_cli", "cli_command", "cli_env", "torchrun", "simulated_slurm", "synthetic_run",
                 "deterministic_run", "subprocess", "check_conformance"}  # fmt: skip

#: Modules that run a tool for a second or two, not the project: they stay in make test-fast.
TOOL_RUNNERS = {
    "test_hygiene.py": "pre-commit's hooks",
    "test_layers.py": "import-linter",
    "test_engine_layers.py": "import-linter",
    "test_docs.py": "the link check (engine/tools/check_links.py)",
    "test_engine_docs.py": "the link check (engine/tools/check_links.py)",
    "test_gpu_check.py": "stand-in commands (python -c) for the GPU check's executor",
}


def modules(*roots: Path) -> list[tuple[Path, Path]]:
    """``(root, module)`` of every Python file under ``roots``."""
    return [(root, path) for root in roots for path in sorted(root.rglob("*.py"))]


def marked_processes(node: ast.AST) -> bool:
    """Whether an expression (a decorator, a pytestmark value) names ``pytest.mark.processes``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "processes" for n in ast.walk(node))


def uses(function: ast.FunctionDef) -> set[str]:
    names = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    return (names | {a.arg for a in function.args.args}) & PROCESS_NAMES


def layout_problems(*roots: Path) -> list[str]:
    """Every break of the rules above in the test trees ``roots`` (collected together), one line each."""
    problems = []
    by_name = defaultdict(list)
    for root, path in modules(*roots):
        name = path.relative_to(root.parent) if len(roots) > 1 else path.relative_to(root)
        if path.name.startswith("test_"):
            by_name[path.name].append(str(name))
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            imported = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            for module in imported:
                top = module.split(".")[0]
                if top == "conftest" or top.startswith("test_"):
                    problems.append(f"{name}:{node.lineno} imports {top}: import shared helpers from helpers")
        if not path.name.startswith("test_") or path.name in TOOL_RUNNERS:
            continue
        module_marked = any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            and marked_processes(node.value)
            for node in tree.body
        )
        if module_marked:
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not uses(node):
                continue
            if node.name.startswith("test_") and any(marked_processes(d) for d in node.decorator_list):
                continue
            problems.append(
                f"{name}:{node.lineno} {node.name} uses {', '.join(sorted(uses(node)))} but is not marked processes"
            )
    for basename, paths in sorted(by_name.items()):
        if len(paths) > 1:
            problems.append(f"{basename} is the name of {len(paths)} test files: {', '.join(paths)}")
    return problems


def test_the_suite_keeps_its_layout():
    assert layout_problems(REPO / "tests", REPO / "engine" / "tests") == []


def test_the_layout_check_finds_each_kind_of_break(tmp_path):
    files = {
        "a/test_one.py": "import conftest\n",
        "a/test_two.py": "from test_one import helper\nimport test_three.sub\n",
        "b/test_one.py": "",
        "b/test_cli.py": "from helpers import run_cli\n\n\ndef test_run(tmp_path):\n    run_cli(log_dir=tmp_path)\n",
        "b/test_fixture.py": "import pytest\n\n\n@pytest.fixture\ndef run(synthetic_run):\n    return synthetic_run\n",
        # Marked as a module, or as the one test that starts processes: no problem.
        "c/test_marked.py": "import pytest\n\npytestmark = [pytest.mark.processes]\n\n\ndef test_run():\n"
        "    subprocess.run([])\n",
        "c/test_one_marked.py": "import pytest\n\n\n@pytest.mark.processes\ndef test_run(deterministic_run):\n"
        "    pass\n\n\ndef test_in_process():\n    pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert layout_problems(tmp_path) == [
        "a/test_one.py:1 imports conftest: import shared helpers from helpers",
        "a/test_two.py:1 imports test_one: import shared helpers from helpers",
        "a/test_two.py:2 imports test_three: import shared helpers from helpers",
        "b/test_cli.py:4 test_run uses run_cli but is not marked processes",
        "b/test_fixture.py:5 run uses synthetic_run but is not marked processes",
        "test_one.py is the name of 2 test files: a/test_one.py, b/test_one.py",
    ]
