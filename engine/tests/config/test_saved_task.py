"""eval, predict and export of a checkpoint take its run's task (config/saved_run.py), with the
command's overrides of ``task.`` keys applied to it; ``task=<option>`` chooses the command's own.
On the image test task, whose Task declares callbacks of its own (its figures)."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from vision_task.task import TASK

from ddp_engine.api import register
from ddp_engine.config.saved_run import apply_run_settings
from ddp_engine.config.schema import register_configs

DATA = "data.root=/data/images"


@pytest.fixture(autouse=True)
def test_task():
    """The image test task, registered for each test in place of the regression."""
    register(TASK)
    register_configs()
    return TASK


def compose_with(config_name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def saved_run(tmp_path):
    """A training run's directory whose task is not the default one: a checkpoint path in it."""
    run = compose_with("config", DATA, "task.objective=val/loss", "task.mode=min",
                       "task.metrics=[val/loss,test/loss]", "~task.callbacks.misclassified")  # fmt: skip
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(run, tmp_path / ".hydra" / "config.yaml")
    (tmp_path / "checkpoints").mkdir()
    checkpoint = tmp_path / "checkpoints" / "epoch_000.ckpt"
    checkpoint.write_bytes(b"")
    return checkpoint


def evaluated_task(checkpoint, *overrides: str):
    overrides = (f"ckpt_path={checkpoint}", DATA, *overrides)
    cfg = compose_with("eval", *overrides)
    apply_run_settings(cfg, overrides, "eval")
    return cfg.task


def test_the_runs_task_with_the_commands_task_overrides_applied(tmp_path):
    checkpoint = saved_run(tmp_path)
    task = evaluated_task(checkpoint)
    assert (task.objective, task.mode, list(task.metrics)) == ("val/loss", "min", ["val/loss", "test/loss"])
    assert set(task.callbacks) == {"input_batch"}
    # A key set or removed by the command changes that key of the run's task, and nothing else.
    task = evaluated_task(checkpoint, "task.metrics=[test/loss]", "~task.callbacks.input_batch", "task.mode=max")
    assert (task.objective, task.mode, list(task.metrics)) == ("val/loss", "max", ["test/loss"])
    assert set(task.callbacks) == set()
    # Choosing a task takes the command's, whole.
    task = evaluated_task(checkpoint, "task=default")
    assert (task.objective, task.mode) == ("val/acc", "max")
    assert set(task.callbacks) == {"input_batch", "misclassified"}
