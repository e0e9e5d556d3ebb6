"""The task's objective and metrics (``conf/task/``), through the real command line on 2 gloo
processes: a task minimizing its validation loss chooses its best checkpoint by it and records it,
an objective the task never logs is refused before the first training step, and the task's own
callbacks (figures) leave train and eval by configuration."""

import json
import re

import pytest
import torch
from harness import only, read_scalars
from helpers import run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.processes

RUN = ("trainer.accelerator=cpu", "trainer.devices=2", "data.global_batch_size=64")
NO_FIGURES = ("~task.callbacks.misclassified", "~task.callbacks.input_batch")


def images(event_dir) -> list[str]:
    events = EventAccumulator(str(event_dir))
    events.Reload()
    return events.Tags()["images"]


def monitored(checkpoint: str) -> tuple[str, str]:
    """What the best checkpoint's ModelCheckpoint monitored, and its mode, as the checkpoint records them."""
    states = torch.load(checkpoint, weights_only=True)["callbacks"]
    ((monitor, score),) = [
        (state["monitor"], state["best_model_score"]) for state in states.values() if state["monitor"]
    ]
    (mode,) = re.findall(r"'mode': '(\w+)'", next(key for key in states if f"'monitor': '{monitor}'" in key))
    assert score is not None
    return monitor, mode


def test_a_minimized_objective_chooses_the_best_checkpoint_and_is_recorded(synthetic_data, tmp_path):
    # Dropout 0.5 and a high learning rate: the validation loss goes up and down over the epochs.
    result = run_cli(
        *synthetic_data, *RUN, "trainer.max_epochs=4", "model.optimizer.lr=0.02", "task.objective=val/loss",
        "task.mode=min", "task.metrics=[val/loss,test/loss]", *NO_FIGURES, log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run = only(tmp_path / "runs")
    scalars = read_scalars(run / "tensorboard")
    per_epoch = scalars["val/loss"][:-1]  # then the best checkpoint's, validated again
    assert len(per_epoch) == 4
    best_epoch = min(range(4), key=per_epoch.__getitem__)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["objective"] == "val/loss" and metrics["status"] == "completed"
    assert metrics["checkpoint"].endswith(f"epoch_{best_epoch:03d}.ckpt"), (per_epoch, metrics["checkpoint"])
    assert metrics["val/loss"] == pytest.approx(min(per_epoch), rel=1e-5)
    assert monitored(metrics["checkpoint"]) == ("val/loss", "min")
    # The final line shows the task's metrics, in the task's order, and nothing it did not name.
    (line,) = re.findall(r"Results: (.*) \(checkpoint", result.stdout + result.stderr)
    assert line == f"val/loss {metrics['val/loss']:.4f}, test/loss {metrics['test/loss']:.4f}"
    # The task's figures were removed by configuration: no image at all.
    assert images(run / "tensorboard") == []

    # An evaluation of its checkpoint takes the run's task (its metrics, its callbacks).
    evaluated = run_cli(f"ckpt_path={metrics['checkpoint']}", *RUN, module="mnist_ddp.eval", log_dir=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    evaluation = only(tmp_path / "evals")
    eval_metrics = json.loads((evaluation / "metrics.json").read_text())
    assert eval_metrics["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-5)
    assert "objective" not in eval_metrics
    assert f"Results: test/loss {eval_metrics['test/loss']:.4f} (" in evaluated.stdout + evaluated.stderr
    assert images(evaluation / "tensorboard") == []


def test_an_objective_the_task_never_logs_is_refused_before_the_first_step(synthetic_data, tmp_path):
    result = run_cli(*synthetic_data, *RUN, "trainer.max_epochs=1", "task.objective=val/accuracy", log_dir=tmp_path)
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert (
        "JobFailedError: rank" in last
        and "task.objective=val/accuracy is never logged" in last
        and "logged val/acc, val/loss" in last
    ), last
    run = only(tmp_path / "runs")
    assert json.loads((run / "metrics.json").read_text())["status"] == "failed"
    assert not (run / "checkpoints").exists()
    assert "train/loss" not in read_scalars(run / "tensorboard"), "no training step was taken"
    assert "Traceback" not in result.stderr


def test_the_default_tasks_figures_and_results_line(synthetic_run):
    """The default task (image classification) keeps its figures and its metrics in its final line."""
    log_dir, result = synthetic_run
    run = only(log_dir / "runs")
    assert {"train/input_batch", "test/confusion_matrix"} <= set(images(run / "tensorboard"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["objective"] == "val/acc"
    shown = ", ".join(f"{name} {metrics[name]:.4f}" for name in ("val/acc", "test/acc", "val/loss", "test/loss"))
    assert f"Results: {shown} (checkpoint" in result.stdout + result.stderr
    assert monitored(metrics["checkpoint"]) == ("val/acc", "max")
