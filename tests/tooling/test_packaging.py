"""``pip install ./engine .`` (not editable), as a cluster image installs the project: the engine's
wheel and the project's, whose console scripts find ``conf/`` as package data of the installed copy,
from any directory.

The project is installed from a copy of this working tree as git would clone it (so neither this
tree's ``build/`` nor its egg-info takes part), into a fresh virtual environment whose
site-packages reaches this one's as a plain path: the dependencies without installing them again,
and without this project's own editable install, whose ``.pth`` files that path does not run.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ddp_engine.config.compose import group_options
from ddp_engine.config.schema import register_configs
from helpers import CONFIG_DIR, REPO, cli_env, dependencies_pth
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

pytestmark = pytest.mark.processes


def clean_copy(destination: Path) -> Path:
    """The files git tracks or would track (uncommitted work included, ignored files not)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    return destination


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, Path]:
    """A fresh virtual environment with the project installed non-editable: (its bin/, its site-packages)."""
    root = tmp_path_factory.mktemp("packaging")
    project = clean_copy(root / "project")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=60)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    # Plain paths: the packages (setuptools for the build too), not the .pth files inside those folders.
    (site / "dependencies.pth").write_text(dependencies_pth())
    packages = "('ddp_engine', 'mnist_ddp')"
    probe = f"import importlib.util as u; print([(s := u.find_spec(p)) and s.origin for p in {packages}])"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert found == "[None, None]", f"this project's editable installs leak into the new environment: {found}"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-build-isolation", str(project / "engine"), str(project)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert found == str([str(site / package / "__init__.py") for package in ("ddp_engine", "mnist_ddp")])
    return python.parent, site


def run_script(venv: tuple[Path, Path], script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """An installed console script, from ``cwd``, in a fresh shell's environment (no PYTHONPATH)."""
    env = {key: value for key, value in cli_env().items() if key != "PYTHONPATH"}
    return subprocess.run([str(venv[0] / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_carries_every_module_and_config(venv):
    site = venv[1]
    # Both pyproject.toml list their packages by hand: a subpackage missing there would be missing here.
    for source, installed in ((REPO / "src" / "mnist_ddp", site / "mnist_ddp"),
                              (REPO / "engine" / "src" / "ddp_engine", site / "ddp_engine")):  # fmt: skip
        assert sorted(p.relative_to(installed) for p in installed.rglob("*.py")) == sorted(
            p.relative_to(source) for p in source.rglob("*.py")
        )
    plugins = REPO / "engine" / "src" / "hydra_plugins"
    assert {p.name for p in (site / "hydra_plugins").glob("*.py")} == {p.name for p in plugins.glob("*.py")}
    # The project's conf/ (its task's groups), the engine's (trainer, strategy, logger, ...) and the
    # image machinery's (data/folder.yaml, data/image.yaml).
    engine = REPO / "engine" / "src" / "ddp_engine"
    for source, installed in (
        (REPO / "conf", site / "mnist_ddp" / "conf"),
        (engine / "conf", site / "ddp_engine" / "conf"),
        (engine / "vision" / "conf", site / "ddp_engine" / "vision" / "conf"),
    ):
        configs = sorted(p.relative_to(source) for p in source.rglob("*.yaml"))
        assert configs and sorted(p.relative_to(installed) for p in installed.rglob("*.yaml")) == configs
    assert Path("config.yaml") in sorted(p.relative_to(REPO / "conf") for p in (REPO / "conf").glob("*.yaml"))


def composed(config_name: str) -> DictConfig:
    """This tree's ``config_name`` as the task's commands compose it, without Hydra's node."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=["paths.root_dir=."])


def test_the_installed_console_scripts_compose_the_packaged_config_from_anywhere(venv, task_overrides, tmp_path):
    site = venv[1]
    # --info all: Hydra's search path and the composed config, without running the job.
    result = run_script(venv, "mnist-ddp-train", "--info", "all", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    main_search_path = re.search(r"^\| main +\| file://(\S+) +\|$", result.stdout, re.MULTILINE)
    assert main_search_path and main_search_path[1] == str(site / "mnist_ddp" / "conf"), result.stdout[:3000]
    # The engine's groups, after the project's: from the installed engine's package.
    engine_search_path = re.search(r"^\| ddp-engine +\| pkg://ddp_engine.conf +\|$", result.stdout, re.MULTILINE)
    assert engine_search_path and result.stdout.index("| main ") < engine_search_path.start(), result.stdout[:3000]
    assert str(REPO) not in result.stdout
    cfg = yaml.safe_load(result.stdout.split("\nConfig\n******\n")[1])
    # The task's data and model (conf/data/, conf/model/) and the engine's groups, as this tree composes them.
    here = composed("config")
    for key in ("data._target_", "data.global_batch_size", "model._target_", "trainer.max_epochs", "task.objective"):
        assert OmegaConf.select(OmegaConf.create(cfg), key) == OmegaConf.select(here, key), key
    assert cfg["logger"]["tensorboard"]["name"] is None  # the engine's logger/tensorboard.yaml

    # The checks before Hydra (config/checks.py) compose the config too: a value only the composed
    # config refuses, and a group option listed from the packaged conf/data/.
    result = run_script(
        venv, "mnist-ddp-train", *task_overrides, "trainer.accelerator=cpu", "trainer.devices=2",
        "data.global_batch_size=127", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.startswith(
        "Error: data.global_batch_size=127 does not split evenly over world_size=2 processes"
    ), result.stderr[-3000:]
    result = run_script(venv, "mnist-ddp-eval", "data=nosuch", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    listed = re.match(
        r"Error: data=nosuch: no such option \(available: ([\w, -]+); yours go in conf/data/\)\.$", result.stderr, re.M
    )
    # The data sets of the packaged conf/data/ and of the image machinery, as in this tree.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        options = group_options("data")
    assert listed and set(listed[1].split(", ")) == set(options) and "folder" in options, result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == [], "a refused command writes nothing"
