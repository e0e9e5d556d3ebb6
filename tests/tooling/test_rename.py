"""``make rename NAME=...`` turns a copy of the template into a project of another name, whose own
``make test`` passes and whose console script trains with DDP.

The copy is this working tree as a fresh git checkout in a temporary folder. Its ``.venv`` is made
the way ``make`` would see an installed one, without downloading the dependencies a second time:
a virtual environment whose site-packages reaches this one's as a plain path (so this project's
own editable install, ``mnist_ddp``, is not importable there), with the renamed project installed
into it editable by pip. Then the renamed project's ``make test`` runs a quick subset of its tests.
"""

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from ddp_engine.api import TaskGuarantees
from helpers import REPO, cli_env, dependencies_pth, make_image_folder

#: The project's distribution name, and the template's (joined here: the rename rewrites the written-out one).
PROJECT, TEMPLATE = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"], "-".join(("mnist", "ddp"))

pytestmark = [
    pytest.mark.processes,
    # A clone has been renamed (and may have replaced the MNIST task): these test the template's rename.
    pytest.mark.skipif(PROJECT != TEMPLATE, reason=f"make rename's tests run on the template; this is {PROJECT}"),
]

# Joined here, not written out: the rename refuses a name that is already a word of the code.
NEW_DIST, NEW_PACKAGE = "-".join(("acme", "vision")), "_".join(("acme", "vision"))
#: The renamed project's quick subset: its configs compose under the renamed schema, and every
#: class named by a _target_ imports from the renamed package with the configs' defaults (a real
#: training run of the renamed project, through its command-line check, is the console-script test
#: below); and, with the project's default data set changed to a folder of its own, the tests of the
#: configs, their refusals and the IDX data, which choose the data set they read themselves (all in
#: process: a test that starts processes is marked ``processes``).
QUICK_TESTS = " ".join(f"tests/{path}.py" for path in ("mnist/test_defaults", "mnist/test_presets", "mnist/test_data"))


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def rename(project: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "tools/rename.py", name], cwd=project, capture_output=True, text=True, timeout=60
    )


def project_files(root: Path) -> list[str]:
    """What git tracks or would track in ``root`` (uncommitted work included, ignored files not)."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=root).split("\0")
    return [name for name in listed if name and (root / name).is_file()]


def cloned(project: Path) -> Path:
    """This working tree as git would clone it, committed as the first commit of a fresh repository."""
    for name in project_files(REPO):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, project / name)
    git("init", "--quiet", cwd=project)
    git("add", "--all", cwd=project)
    git("-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "--quiet", "-m", "template", cwd=project)
    return project


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    return cloned(tmp_path_factory.mktemp("clone") / "project")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my project", "is not a project name"),
        ("json", "would shadow Python's own 'json'"),
        ("Lightning", "would shadow Python's own 'lightning'"),
        ("mnist_ddp", "already named mnist-ddp"),
        ("ddp", "ddp is already a word in"),
    ],
)
def test_a_name_that_cannot_work_is_refused_and_nothing_changes(clone, name, message):
    result = rename(clone, name)
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and message in result.stderr
    assert git("status", "--porcelain", cwd=clone) == ""


def test_uncommitted_changes_are_refused(clone):
    (clone / "scratch.txt").write_text("work in progress\n")
    try:
        result = rename(clone, NEW_DIST)
        assert result.returncode == 1 and "uncommitted changes" in result.stderr
        assert (clone / "src" / "mnist_ddp").is_dir()
    finally:
        (clone / "scratch.txt").unlink()


@pytest.fixture(scope="module")
def renamed(clone) -> Path:
    # What `pip install --editable .` leaves in a clone (ignored by git).
    (clone / "src" / "mnist_ddp.egg-info").mkdir()
    (clone / "src" / "mnist_ddp.egg-info" / "PKG-INFO").write_text("Name: mnist-ddp\n")
    result = rename(clone, NEW_DIST)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Renamed mnist-ddp -> {NEW_DIST} (package mnist_ddp -> {NEW_PACKAGE}) in ")
    return clone


def test_no_trace_of_the_old_name_is_left(renamed):
    assert not (renamed / "src" / "mnist_ddp").exists() and (renamed / "src" / NEW_PACKAGE / "train.py").is_file()
    assert not (renamed / "src" / "mnist_ddp.egg-info").exists(), "the old distribution's metadata is gone"
    leftovers = [
        path for path in renamed.rglob("*")
        if ".git" not in path.parts and path.is_file() and path.suffix != ".png"
        and any(old in path.read_text() for old in ("mnist_ddp", "mnist-ddp", "MNIST_DDP"))
    ]  # fmt: skip
    assert leftovers == []
    assert (renamed / "README.md").read_text().splitlines()[0] == f"# {NEW_DIST}"
    pyproject = (renamed / "pyproject.toml").read_text()
    assert f'name = "{NEW_DIST}"' in pyproject and f'{NEW_DIST}-train = "{NEW_PACKAGE}.train:cli"' in pyproject
    assert f"_target_: {NEW_PACKAGE}.data.MNISTDataModule" in (renamed / "conf" / "data" / "idx.yaml").read_text()
    # git sees the package's files as renamed (and edited), not as deleted and added anew: each one
    # whose lines are not mostly the package's name (git's threshold: 50% similar; the entry points,
    # 36 lines of imports and references, fall below it).
    git("add", "--all", cwd=renamed)
    status = git("diff", "--cached", "--name-status", "-M", cwd=renamed)
    for module in ("data.py", "model.py", "networks.py", "schema.py"):
        assert re.search(rf"^R\d+\tsrc/mnist_ddp/{module}\tsrc/{NEW_PACKAGE}/{module}$", status, re.MULTILINE), status


#: A clone of a 15-character name (joined, as above), whose own task is a regression.
CLONE_DIST = "-".join(("acme", "sensorproj"))
CLONE_PACKAGE = CLONE_DIST.replace("-", "_")
#: A later fix of a file of the template, appended by its kind, as the commit hooks want it laid out (a
#: comment line where nothing else is said below).
LATER_FIX = {".py": b"\n\n# a later fix\n", ".md": b"\nA later fix.\n", ".png": b"a later fix"}
#: What the clone writes of its own, by path (``{package}``: its package): the regression as its task,
#: a subpackage, a model option and a test.
CLONE_FILES = {
    "src/{package}/task.py": '''
        """The regression on sensor windows as the engine runs it."""

        from ddp_engine.api import Task

        TASK = Task(
            package=__package__,
            data="sensors",
            model="regressor",
            objective="val/mse",
            mode="min",
            metrics=("val/mse", "test/mse", "val/mae", "test/mae"),
        )
        ''',
    "src/{package}/features/__init__.py": '''
        """Features of the windows."""

        from ddp_engine.api import ConfigValueError


        def channels(count: int) -> int:
            """``count``, refused below 1."""
            if count < 1:
                raise ConfigValueError(f"channels={count} must be at least 1")
            return count
        ''',
    "conf/model/regressor_wide.yaml": """
        defaults:
          - regressor
          - _self_
        net:
          hidden: 32
        """,
    "tests/test_features.py": '''
        """The clone's own test: its subpackage and its wide model option."""

        import pytest
        from ddp_engine.api import ConfigValueError
        from hydra import compose, initialize_config_dir

        from {package}.features import channels
        from {package}.task import TASK


        def test_channels_and_the_wide_model():
            assert channels(3) == 3
            with pytest.raises(ConfigValueError):
                channels(0)
            with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
                cfg = compose("config", overrides=["model=regressor_wide", "data.path=x"])
            assert cfg.model.net.hidden == 32
        ''',
}
#: The clone's fixture that points its task's tests at its data, in place of the template's.
TASK_OVERRIDES = """
    def task_overrides(tmp_path_factory) -> list[str]:
        from {package}.regression import make_sensor_windows

        return [f"data.path={make_sensor_windows(tmp_path_factory.mktemp('windows') / 'windows.npz')}"]
    """
#: The template's MNIST task, which the clone replaces: its modules, configs, tests and benchmarks.
MNIST_PATHS = (
    "src/{package}/data.py", "src/{package}/model.py", "src/{package}/networks.py", "src/{package}/schema.py",
    "src/{package}/download.py", "conf/data/idx.yaml", "conf/data/mnist.yaml", "conf/data/fashion_mnist.yaml",
    "conf/model/cnn.yaml", "conf/model/mlp.yaml", "conf/model/resnet.yaml", "conf/experiment", "conf/hparams_search",
    "tests/mnist", "benchmarks",
)  # fmt: skip


def make_it_a_regression(project: Path, package: str) -> None:
    """Replace the clone's task by a regression (the engine's test task's module and YAMLs, copied),
    its default: the changes docs/customizing.md lists for a task of one's own, plus a subpackage, a
    model option and a test of its own."""
    for name in MNIST_PATHS:
        path = project / name.replace("{package}", package)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    sensor = project / "engine" / "tests" / "sensor_task"
    shutil.copy(sensor / "regression.py", project / "src" / package / "regression.py")
    for name in ("data/sensors.yaml", "model/regressor.yaml"):
        (project / "conf" / name).write_text(
            (sensor / "conf" / name).read_text().replace("sensor_task.", f"{package}.")
        )
    for name, text in CLONE_FILES.items():
        path = project / name.replace("{package}", package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text.replace("{package}", package)).lstrip())
    edits = {
        # No MNIST presets; the regression's learning rate was tuned at its global batch, 48.
        "conf/config.yaml": [("  - experiment: null\n", ""), ("  - hparams_search: null\n", ""),
                             ("reference_batch_size: 128", "reference_batch_size: 48")],
        # predict and export of images are gone with them: the engine's part alone.
        "conf/predict.yaml": [(line, "") for line in ("input: ???\n", "resize: false\n")],
        "conf/export.yaml": [(line, "") for line in ("format: onnx\n", "output: null\n")],
        "pyproject.toml": [(f'{package.replace("_", "-")}-download = "{package}.download:main"\n', ""),
                           (f'packages = ["{package}", ', f'packages = ["{package}", "{package}.features", ')],
    }  # fmt: skip
    # The task's guarantees (tests/test_task.py) run on its data: the fixture that points them there.
    conftest = project / "tests" / "conftest.py"
    text = conftest.read_text()
    start, end = text.index("def task_overrides("), text.index("\n\n\n", text.index("def task_overrides("))
    conftest.write_text(
        text[:start] + textwrap.dedent(TASK_OVERRIDES.replace("{package}", package)).strip() + text[end:]
    )
    for name, replacements in edits.items():
        path = project / name
        text = path.read_text()
        for old, new in replacements:
            assert old in text, (name, old)
            text = text.replace(old, new)
        path.write_text(text)


def test_a_clone_that_makes_its_own_task_merges_the_templates_engine_fix_and_passes_its_tests(tmp_path):
    # The way docs/updating.md takes the template's fixes: the template as a git remote, merged.
    # The clone is renamed, its task replaced by a regression made the default (with a subpackage,
    # a model option and a test of its own), committed; then the template changes every file of
    # engine/ and the shared files a fix of it may touch (the Makefile, .ci/run, the engine's lines of
    # pyproject.toml), and the clone merges it: no conflict, every engine file the template's, and
    # the clone's own tests pass: its task's guarantees on the regression, its test, its contracts.
    template = cloned(tmp_path / "template")
    git("clone", "--quiet", str(template), "project", cwd=tmp_path)
    project, user = tmp_path / "project", ("-c", "user.name=test", "-c", "user.email=test@localhost")
    assert len(CLONE_DIST) == 15 and rename(project, CLONE_DIST).returncode == 0
    git("add", "--all", cwd=project)
    git(*user, "commit", "--quiet", "-m", "rename", cwd=project)
    make_it_a_regression(project, CLONE_PACKAGE)
    git("add", "--all", cwd=project)
    # The commit hooks lay out what was written (the copied module's imports sort as the clone's).
    subprocess.run([sys.executable, "-m", "pre_commit", "run", "--files", *project_files(project)], cwd=project,
                   capture_output=True, timeout=600)  # fmt: skip
    git("add", "--all", cwd=project)
    git(*user, "commit", "--quiet", "-m", "a regression of our own", cwd=project)

    engine_files = [name for name in project_files(template) if name.startswith("engine/")]
    assert len(engine_files) > 150
    for name in [*engine_files, "Makefile", ".ci/run"]:
        path = template / name
        path.write_bytes(path.read_bytes() + LATER_FIX.get(path.suffix, b"# a later fix\n"))
    pyproject = template / "pyproject.toml"
    fixed = pyproject.read_text().replace('"ddp-engine[vision]>=0.1",', '"ddp-engine[vision]>=0.1.1",')
    fixed = fixed.replace('optuna = ["ddp-engine[optuna]"]', 'optuna = ["ddp-engine[optuna]>=0.1.1"]')
    assert fixed != pyproject.read_text()
    pyproject.write_text(fixed)
    git(*user, "commit", "--quiet", "-am", "a fix of the engine", cwd=template)
    merge = subprocess.run(["git", *user, "pull", "--no-rebase", "--no-edit", "origin", "HEAD"],
                           cwd=project, capture_output=True, text=True)  # fmt: skip
    assert merge.returncode == 0, merge.stdout + merge.stderr
    assert git("diff", "--name-only", "--diff-filter=U", cwd=project) == ""
    for name in [*engine_files, "Makefile", ".ci/run"]:
        assert (project / name).read_bytes() == (template / name).read_bytes(), name
    assert '"ddp-engine[vision]>=0.1.1",' in (project / "pyproject.toml").read_text()
    assert f'name = "{CLONE_DIST}"' in (project / "pyproject.toml").read_text()

    result = subprocess.run(
        ["make", "test", "PYTEST_ARGS=-v -n 0 -p no:cacheprovider tests --deselect tests/tooling/test_rename.py"],
        cwd=with_venv(project), env=clean_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, result.stdout[-3000:]
    passed = re.findall(r"^tests/(\S+) PASSED", result.stdout, re.MULTILINE)
    ran = sorted(test.rpartition("::")[2] for test in passed if test.startswith("test_task.py::TestTask::"))
    assert ran == sorted(name for name in dir(TaskGuarantees) if name.startswith("test_")), "every guarantee ran"
    assert "test_features.py::test_channels_and_the_wide_model" in passed
    assert "tooling/test_layers.py::test_the_task_imports_the_engine_from_its_public_module_only" in passed


# Joined, as above. The long name sorts before the other first-party package (benchmarks), so its
# imports move; the short one lets the formatter join lines that it had to split for mnist_ddp.
@pytest.mark.parametrize("name", ["-".join(("a", "classifier", "of", "images", "for", "my", "own", "data")), "q" * 2])
def test_a_renamed_copy_passes_the_hygiene_checks_for_a_name_of_any_length(name, tmp_path):
    # The imports sort, the lines wrap and E501's limit follows the new name: the rename lays out
    # its Python files with the commit hooks' ruff (tools/rename.py), and the copy passes the
    # checks of tests/tooling/test_hygiene.py, which rewrite nothing.
    project = cloned(tmp_path / "project")
    result = rename(project, name)
    assert result.returncode == 0 and "Laid out" in result.stdout, result.stdout + result.stderr
    git("add", "--all", cwd=project)
    before = git("diff", "--cached", "--stat", cwd=project)
    check = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--hook-stage", "manual", "--color=never",
         "--files", *project_files(project)],
        cwd=project, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout[-5000:] + check.stderr[-2000:]
    # Nothing rewritten: the tree is still what was staged before the checks.
    assert git("diff", "--stat", cwd=project) == "" and git("diff", "--cached", "--stat", cwd=project) == before


def with_venv(project: Path) -> Path:
    """``project`` with its .venv, as ``make`` would find it installed: this environment's packages,
    and the project and its engine editable (pip, no download). Returns ``project``."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    target = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # Plain paths: the packages, not the .pth files (editable installs) inside those folders.
    Path(target, "template-dependencies.pth").write_text(dependencies_pth())
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--editable", str(project / "engine"), "--editable", str(project)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (venv / ".installed").touch()  # make's marker: the environment is up to date with pyproject.toml
    return project


@pytest.fixture(scope="module")
def installed(renamed) -> Path:
    """The renamed project with its .venv (:func:`with_venv`)."""
    python = with_venv(renamed) / ".venv" / "bin" / "python"
    probe = (
        f"import importlib.util as u; "
        f"print(u.find_spec('mnist_ddp'), u.find_spec('{NEW_PACKAGE}').origin, u.find_spec('ddp_engine').origin)"
    )
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert found == [
        "None",
        str(renamed / "src" / NEW_PACKAGE / "__init__.py"),
        str(renamed / "engine" / "src" / "ddp_engine" / "__init__.py"),
    ]
    return renamed


def clean_env() -> dict[str, str]:
    """A fresh shell's environment: no launcher variables, no PYTHONPATH (the renamed project finds
    its own tests' helpers), nothing of this pytest run or of a make that started it."""
    drop = ("PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    return {key: value for key, value in cli_env().items() if key not in drop and not key.startswith("PYTEST_")}


def test_the_renamed_projects_make_test_passes(installed, tmp_path):
    # The user's own data set, a folder of images, made the task's default (its Task's data).
    colours = make_image_folder(tmp_path / "colours", counts={"train": 6, "test": 2})
    (installed / "conf" / "data" / "colours.yaml").write_text(f"defaults:\n  - folder\n  - _self_\nroot: {colours}\n")
    task = installed / "src" / NEW_PACKAGE / "task.py"
    task.write_text(task.read_text().replace('    data="mnist",\n', '    data="colours",\n', 1))
    assert '    data="colours",\n' in task.read_text()
    env = clean_env()
    result = subprocess.run(
        ["make", "test", f"PYTEST_ARGS=-n 0 -p no:cacheprovider -rs {QUICK_TESTS}"],
        cwd=installed, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "pip install" not in result.stdout, "make must take the prepared .venv as installed"
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "skipped" not in summary, result.stdout[-3000:]


def test_the_renamed_console_scripts_run_the_renamed_package(installed, tmp_path):
    # Training itself is the renamed make test's (its configs instantiate the renamed classes) and
    # every other system test's; here, the console scripts: each runs its renamed entry point,
    # composes the renamed package's config and refuses a typo as the template's do.
    # export has no trainer (one process): its typo is another key.
    for command, typo in [("train", "trainer.devics"), ("eval", "trainer.devics"), ("predict", "trainer.devics"),
                          ("export", "data.global_batch_sze")]:  # fmt: skip
        result = subprocess.run(
            [str(installed / ".venv" / "bin" / f"{NEW_DIST}-{command}"), f"+{typo}=2",
             f"paths.log_dir={tmp_path / 'logs'}"],
            cwd=installed, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 1, (command, result.stdout[-2000:], result.stderr[-2000:])
        assert result.stderr.startswith(f"Error: Unknown key {typo}"), (command, result.stderr[-2000:])
    assert not (tmp_path / "logs").exists()
