"""The engine's guarantees, tested on a task of one's own: :class:`TaskGuarantees`, a pytest class that
a task's test module subclasses, names its task in, and so runs on real DDP processes over gloo,
through the task's real command line, on whatever the task's configs select:

- its DataModule keeps the sharding, exact evaluation and resume on 2 and 3 processes
  (:func:`~ddp_engine.data.conformance.check_conformance`);
- a 2-process training completes and records the task's objective;
- its best checkpoint evaluated on 1 and on 2 processes gives the training's test metrics;
- a training stopped by a signal inside its run and resumed in place ends with the uninterrupted
  training's parameters, bit for bit;
- every option of its ``model`` and ``data`` groups builds only what a run folder's saved config
  may build (:mod:`ddp_engine.config.trust`), so that eval, predict and export take its runs.

A test module of the task's::

    import pytest
    from ddp_engine.api import TaskGuarantees
    from my_task.task import TASK

    pytestmark = pytest.mark.processes

    class TestMyTask(TaskGuarantees):
        task = TASK

Every training gets the overrides of a fixture ``task_overrides`` of the task's (session- or
class-scoped, in its ``conftest.py``), which point its commands at test-sized data; without one, the
task's configs as they are. Set ``overrides`` on the subclass to test other options
(``("model=mlp",)``). Each command writes its runs into a temporary folder of its own.
"""

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ddp_engine.config.compose import group_options
from ddp_engine.config.schema import register_configs
from ddp_engine.config.trust import BUILT_FROM_A_RUN, check_target, targets_in
from ddp_engine.core.lifetime import SUPERVISOR_ENV
from ddp_engine.core.run_dir import LAST_CHECKPOINT
from ddp_engine.data.conformance import check_conformance
from ddp_engine.task import Task, register

#: What every training of the suite sets: 2 CPU processes, 2 epochs, last.ckpt every 2 optimizer
#: steps (where a stopped run resumes from), no tracker but TensorBoard.
TRAINING = (
    "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2", "logger=tensorboard",
    "callbacks.last_checkpoint.train_time_interval=null", "callbacks.last_checkpoint.every_n_train_steps=2",
)  # fmt: skip
#: Seconds one command may take.
TIMEOUT = 600


class StopTheCommandAt(L.Callback):
    """Sends SIGTERM to the command that supervises the run (as ``kill`` would) when global rank 0
    starts optimizer step ``step`` of a fit that resumes no checkpoint: the run stops, and its resume
    (which keeps this callback) trains on."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.is_global_zero and trainer.global_step == self.step and trainer.ckpt_path is None:
            os.kill(int(os.environ[SUPERVISOR_ENV]), signal.SIGTERM)


class TaskGuarantees:
    """The engine's guarantees on :attr:`task` (see the module's docstring). Subclass it in a test
    module and set :attr:`task`; its tests share one uninterrupted training (a class fixture)."""

    #: The task under test (its ``TASK``).
    task: Task
    #: Overrides of the task's options for every command of this class (``("model=mlp",)``).
    overrides: Sequence[str] = ()

    @pytest.fixture(scope="class")
    @classmethod
    def suite_overrides(cls, request) -> list[str]:
        """The overrides that point the task's commands at its test data: the value of the task's own
        fixture ``task_overrides`` (its ``conftest.py``; session- or class-scoped), else none."""
        try:
            return list(request.getfixturevalue("task_overrides"))
        except pytest.FixtureLookupError:
            return []

    @classmethod
    def command(cls, name: str, *overrides: str, log_dir: Path) -> subprocess.CompletedProcess:
        """``python -m <package>.<name>`` with ``overrides``, its runs under ``log_dir``, to its end;
        the task's package found where this process finds it (a test task's folder on PYTHONPATH)."""
        command = [sys.executable, "-m", f"{cls.task.package}.{name}", f"paths.log_dir={log_dir}", *overrides]
        home = Path(importlib.util.find_spec(cls.task.package).origin).parent.parent
        path = os.pathsep.join(filter(None, [str(home), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)

    @classmethod
    def train(cls, overrides: Sequence[str], log_dir: Path) -> Path:
        """A training of :data:`TRAINING` with ``overrides``, ended by itself; its run directory."""
        result = cls.command("train", *overrides, *cls.overrides, *TRAINING, log_dir=log_dir)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        (run,) = (log_dir / "runs").iterdir()
        return run

    @pytest.fixture(scope="class")
    @classmethod
    def trained(cls, suite_overrides, tmp_path_factory) -> Path:
        """The uninterrupted 2-process training's run directory."""
        return cls.train(suite_overrides, tmp_path_factory.mktemp("trained"))

    def test_its_datamodule_shards_evaluates_and_resumes_exactly_on_2_and_3_processes(self, suite_overrides):
        register(self.task)
        register_configs()
        with initialize_config_dir(config_dir=str(self.task.configs()), version_base="1.3"):
            cfg = compose("config", overrides=[*suite_overrides, *self.overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # a data path's ${hydra:runtime.cwd} resolves as in a run
        data = OmegaConf.to_container(cfg.data, resolve=True)
        # The data's global batch, made a multiple of 6, which 2 and 3 processes both divide.
        batch = 6 * max(1, math.ceil(data.get("global_batch_size", 12) / 6))
        report = check_conformance(data, world_sizes=(2, 3), global_batch_size=batch)
        train = report.split_sizes["train"]
        for world_size in (2, 3):
            seen = report.world_sizes[world_size]
            assert seen.trained_per_epoch == (train - train % world_size,) * 2, world_size
            assert seen.evaluated["test"] == report.split_sizes["test"], world_size

    def test_every_option_of_its_models_and_data_builds_only_what_a_saved_run_may(self):
        # A class of another library than the task's and the engine's trusted ones: Task.trusted_modules.
        register(self.task)
        register_configs()
        with initialize_config_dir(config_dir=str(self.task.configs()), version_base="1.3"):
            for group in ("model", "data"):
                for option in group_options(group):
                    if not (self.task.configs() / group / f"{option}.yaml").is_file():
                        continue  # the engine's (the image machinery's data sets): its own tests check them
                    cfg = compose("config", overrides=[*self.overrides, f"{group}={option}"])
                    for key in BUILT_FROM_A_RUN:
                        for target in targets_in(OmegaConf.to_container(cfg[key], resolve=False)):
                            check_target(target, f"{group}={option} ({key})")

    def test_a_2_process_training_completes_and_records_its_objective(self, trained):
        metrics = json.loads((trained / "metrics.json").read_text())
        assert metrics["status"] == "completed", metrics
        assert metrics["objective"] == self.task.objective
        assert math.isfinite(metrics[self.task.objective]), metrics
        assert metrics["world_size"] == 2
        assert set(self.task.metrics) & set(metrics), "none of the task's metrics was recorded"

    def test_its_best_checkpoint_evaluates_alike_on_1_and_2_processes(self, trained, tmp_path):
        trained_metrics = json.loads((trained / "metrics.json").read_text())
        tested = [name for name in self.task.metrics if name.startswith("test/") and name in trained_metrics]
        assert tested, f"the training recorded no test metric of {list(self.task.metrics)}"
        for devices in (1, 2):
            log_dir = tmp_path / str(devices)
            result = self.command("eval", f"ckpt_path={trained_metrics['checkpoint']}", "trainer.accelerator=cpu",
                                  f"trainer.devices={devices}", log_dir=log_dir)  # fmt: skip
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            (evaluation,) = (log_dir / "evals").iterdir()
            metrics = json.loads((evaluation / "metrics.json").read_text())
            assert metrics["world_size"] == devices
            # Every test sample once on any world size; only float rounding differs (batches differ).
            for name in tested:
                assert metrics[name] == pytest.approx(trained_metrics[name], rel=1e-5, abs=1e-7), (devices, name)

    def test_a_stopped_training_resumes_in_place_to_the_uninterrupted_parameters(
        self, trained, suite_overrides, tmp_path
    ):
        steps = int(torch.load(trained / LAST_CHECKPOINT, map_location="cpu", weights_only=True)["global_step"])
        stop = steps // 2 + 1  # inside the run; its last.ckpt is at most 2 steps older
        assert 1 < stop < steps, f"a 2-epoch training of {steps} steps is too short to stop and resume"
        log_dir = tmp_path / "logs"
        probe = (f"+callbacks.stop._target_={__name__}.StopTheCommandAt", f"+callbacks.stop.step={stop}")
        result = self.command("train", *suite_overrides, *self.overrides, *TRAINING, *probe, log_dir=log_dir)
        assert result.returncode == 128 + signal.SIGTERM, result.stdout[-3000:] + result.stderr[-3000:]
        (run,) = (log_dir / "runs").iterdir()
        assert json.loads((run / "metrics.json").read_text())["status"] == "stopped"
        assert 0 < torch.load(run / LAST_CHECKPOINT, weights_only=True)["global_step"] < steps
        # The stop probe of the run's command line is this module's, which a run folder's files may not name
        # unless the command trusts it (ddp_engine.config.trust).
        trust = f"trusted_targets=[{__name__}.StopTheCommandAt]"
        resumed = self.command("train", f"hydra.run.dir={run}", "ckpt_path=last", trust, log_dir=log_dir)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        ours, theirs = (torch.load(path / LAST_CHECKPOINT, weights_only=True)["state_dict"] for path in (run, trained))
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            assert torch.equal(ours[name], value), name
