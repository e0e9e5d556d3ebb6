"""The task's objective and metrics (``task.objective``, ``task.mode``, ``task.metrics``), through the
real command line on 2 gloo processes: an objective chosen by configuration chooses the best
checkpoint and is recorded, and an objective the task never logs is refused before the first
training step."""

import json
import re

import pytest
import torch
from harness import only, read_scalars, run_cli
from runs import TRAIN

pytestmark = pytest.mark.processes

RUN = ("trainer.accelerator=cpu", "trainer.devices=2")


def monitored(checkpoint: str) -> tuple[str, str]:
    """What the best checkpoint's ModelCheckpoint monitored, and its mode, as the checkpoint records them."""
    states = torch.load(checkpoint, weights_only=True)["callbacks"]
    ((monitor, score),) = [
        (state["monitor"], state["best_model_score"]) for state in states.values() if state["monitor"]
    ]
    (mode,) = re.findall(r"'mode': '(\w+)'", next(key for key in states if f"'monitor': '{monitor}'" in key))
    assert score is not None
    return monitor, mode


def test_a_configured_objective_chooses_the_best_checkpoint_and_is_recorded(sensor_data, tmp_path):
    """A minimized objective set by configuration (val/mae, not the task's val/mse) chooses the best
    checkpoint, is recorded in metrics.json and the checkpoint, and its metrics alone are shown; an
    evaluation of that checkpoint takes the run's metrics."""
    # Dropout 0.5 and a high learning rate: the validation error goes up and down over the epochs.
    result = run_cli(
        TRAIN, *sensor_data, *RUN, "trainer.max_epochs=4", "model.net.dropout=0.5", "model.optimizer.lr=0.03",
        "task.objective=val/mae", "task.mode=min", "task.metrics=[val/mae,test/mae]", log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run = only(tmp_path / "runs")
    scalars = read_scalars(run / "tensorboard")
    per_epoch = scalars["val/mae"][:-1]  # then the best checkpoint's, validated again
    assert len(per_epoch) == 4
    best_epoch = min(range(4), key=per_epoch.__getitem__)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["objective"] == "val/mae" and metrics["status"] == "completed"
    assert metrics["checkpoint"].endswith(f"epoch_{best_epoch:03d}.ckpt"), (per_epoch, metrics["checkpoint"])
    assert metrics["val/mae"] == pytest.approx(min(per_epoch), rel=1e-5)
    assert monitored(metrics["checkpoint"]) == ("val/mae", "min")
    # The final line shows the task's metrics, in the task's order, and nothing it did not name.
    (line,) = re.findall(r"Results: (.*) \(checkpoint", result.stdout + result.stderr)
    assert line == f"val/mae {metrics['val/mae']:.4f}, test/mae {metrics['test/mae']:.4f}"

    # An evaluation of its checkpoint takes the run's task (its metrics).
    evaluated = run_cli("sensor_task.eval", f"ckpt_path={metrics['checkpoint']}", *RUN, log_dir=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    evaluation = only(tmp_path / "evals")
    eval_metrics = json.loads((evaluation / "metrics.json").read_text())
    assert eval_metrics["test/mae"] == pytest.approx(metrics["test/mae"], rel=1e-5)
    assert "objective" not in eval_metrics
    assert f"Results: test/mae {eval_metrics['test/mae']:.4f} (" in evaluated.stdout + evaluated.stderr


def test_an_objective_the_task_never_logs_is_refused_before_the_first_step(sensor_data, tmp_path):
    """An objective the task never logs fails the run in one line naming what it logs, before any step."""
    result = run_cli(TRAIN, *sensor_data, *RUN, "trainer.max_epochs=1", "task.objective=val/rmse", log_dir=tmp_path)
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert (
        "JobFailedError: rank" in last
        and "task.objective=val/rmse is never logged" in last
        and "logged val/mae, val/mse" in last
    ), last
    run = only(tmp_path / "runs")
    assert json.loads((run / "metrics.json").read_text())["status"] == "failed"
    assert not (run / "checkpoints").exists()
    assert "train/loss" not in read_scalars(run / "tensorboard"), "no training step was taken"
    assert "Traceback" not in result.stderr
