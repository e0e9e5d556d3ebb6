"""The engine's own tests run on its test task, :mod:`sensor_task` (a regression on float windows,
no data files), registered with the engine for every test here: a test that composes a config in
its own process composes the test task's. The commands the tests start register it themselves
(``python -m sensor_task.train``). The image machinery's tests (``vision/``) register theirs,
:mod:`vision_task`, in their own conftest.py.

Fixtures: the test task's data sets and the runs several test files check, each trained once per
session. Not registered when this file is imported: pytest imports the conftest of every test path
before it collects a test module, and the project's test modules (tests/) compose with the
project's at import.
"""

import subprocess
from pathlib import Path

import pytest
from harness import only, run_cli
from runs import DETERMINISTIC, TRAIN, deterministic_windows

from ddp_engine.api import register
from ddp_engine.config.schema import register_configs
from sensor_task.regression import make_sensor_windows
from sensor_task.task import TASK


@pytest.fixture(autouse=True)
def test_task():
    """The test task, registered for each test: a pytest worker also runs the project's tests,
    whose conftest registers the project's own."""
    register(TASK)
    register_configs()  # the task's node and schemas in Hydra's ConfigStore, where tests compose
    return TASK


@pytest.fixture(scope="session")
def windows(tmp_path_factory) -> Path:
    """The test task's data: 600 training, 97 validation and 131 test windows (``data.path``)."""
    return make_sensor_windows(tmp_path_factory.mktemp("sensors") / "windows.npz")


@pytest.fixture(scope="session")
def sensor_data(windows) -> list[str]:
    """The overrides that point a command at :func:`windows`."""
    return [f"data.path={windows}"]


@pytest.fixture(scope="session")
def sensor_run(sensor_data, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One finished 2-epoch run with 2 gloo processes, logged to TensorBoard, CSV and W&B (offline):
    (its log_dir, the command's result)."""
    log_dir = tmp_path_factory.mktemp("logs")
    result = run_cli(TRAIN, *sensor_data, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2",
                     "logger=[tensorboard,csv,wandb]", log_dir=log_dir)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return log_dir, result


@pytest.fixture(scope="session")
def deterministic_data(tmp_path_factory) -> Path:
    """The windows of the deterministic runs (runs.deterministic_windows)."""
    return deterministic_windows(tmp_path_factory.mktemp("deterministic"))


@pytest.fixture(scope="session")
def deterministic_run(deterministic_data, tmp_path_factory):
    """``deterministic_run(name, *overrides)``: the run directory of runs.DETERMINISTIC plus
    ``overrides``, trained once per session (on first use) and shared by every test that names it."""
    done: dict[str, tuple[tuple[str, ...], Path]] = {}

    def get(name: str, *overrides: str) -> Path:
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            result = run_cli(TRAIN, f"data.path={deterministic_data}", *DETERMINISTIC, *overrides, log_dir=log_dir)
            assert result.returncode == 0, f"{name}:\n" + result.stdout[-3000:] + result.stderr[-5000:]
            done[name] = (overrides, only(log_dir / "runs"))
        assert done[name][0] == overrides, f"run {name} was trained with other overrides"
        return done[name][1]

    return get
