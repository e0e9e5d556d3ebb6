"""The template task's own results of a run through the real command line (``python -m
mnist_ddp.train`` on 2 gloo processes): every tag it logs, and the accuracy it reaches. What the
engine does in any run (its run directory, checkpoints, console, evaluation): the engine's tests,
engine/tests/run/test_train_command.py.
"""

import json
import re

import pytest
from harness import read_scalars, supervisor_imports

pytestmark = pytest.mark.processes

TAGS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "train/lr"}


@pytest.mark.task
def test_tensorboard_events_hold_every_tag_and_the_test_accuracy(synthetic_run):
    log_dir, result = synthetic_run
    (run,) = (log_dir / "runs").iterdir()
    scalars = read_scalars(run / "tensorboard")
    assert TAGS <= scalars.keys(), TAGS - scalars.keys()
    assert len(scalars["val/acc"]) == 3, "one val/acc per epoch, then the best checkpoint's"
    (test_acc,) = scalars["test/acc"]
    # The synthetic digits are easy: a working DDP training loop gets nearly all of them right.
    assert test_acc >= 0.95
    printed = re.search(r"Results: .*test/acc (\d\.\d{4})", result.stdout + result.stderr)
    assert printed and float(printed.group(1)) == pytest.approx(test_acc, abs=5e-5)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/acc"] == pytest.approx(test_acc)
    assert metrics["val/acc"] == pytest.approx(scalars["val/acc"][-1])
    assert metrics["checkpoint"].endswith(".ckpt") and metrics["world_size"] == 2
    assert metrics["per_device_batch_size"] == 32 and metrics["global_batch_size"] == 64
    epochs = re.findall(
        r"\[rank 0\]\S+ - Epoch (\d) done in [\d.]+ s \(global step (\d+)\)", (run / "train.log").read_text()
    )
    assert epochs == [("0", "16"), ("1", "32")], "one line per epoch in the log file"


def test_the_command_supervises_its_processes_without_importing_lightning(synthetic_run):
    """The command's own process (the supervisor) imports torch, for the elastic agent, but never
    Lightning or torchmetrics (seconds of CPU each command): the task's data and model have schemas,
    so its keys are checked without their classes; the workers' forkserver imports Lightning, and
    the values are checked in a process forked from it."""
    log_dir, _ = synthetic_run
    imported = set(supervisor_imports(log_dir).read_text().split())
    assert {"hydra", "omegaconf", "torch", "mnist_ddp", "ddp_engine"} <= imported, sorted(imported)
    assert not imported & {"lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics"}, sorted(imported)
