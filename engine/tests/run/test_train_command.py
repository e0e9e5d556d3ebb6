"""End to end through the real command line: real DDP processes over gloo on CPU.

Each run starts ``python -m sensor_task.train`` in a subprocess, which launches its second DDP
process itself (Lightning's subprocess launcher), exactly as a user's run does.
"""

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from harness import only, ranks_in_log, read_scalars, run_cli

pytestmark = pytest.mark.processes

#: The tags the regression logs.
TAGS = {"train/loss", "val/mse", "val/mae", "test/mse", "test/mae", "train/lr"}
# The targets' variance is about 3.6: a model that learned nothing has an MSE near it.
LEARNED_MSE = 0.5


def test_run_writes_one_run_directory_shared_by_both_processes(sensor_run):
    """Both processes of a run write one run directory and one rank-tagged log, and the command says
    where it is and how the global batch is split."""
    log_dir, result = sensor_run
    runs = list((log_dir / "runs").iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    # Rank 1 was started by Lightning, ran the same job and logged into the same file.
    assert ranks_in_log(run) == {0, 1}
    assert (run / "metrics.json").is_file() and not (run / "multiruns").exists()
    assert f"Run directory: {run}" in result.stdout + result.stderr
    assert "world_size=2, global batch 48 = 24 per device x 2 processes" in result.stdout + result.stderr
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["trainer"]["devices"] == 2


def test_checkpoints_hold_the_trained_model(sensor_run):
    """The run keeps its best checkpoint and last.ckpt, plain tensors holding the trained network."""
    log_dir, _ = sensor_run
    (run,) = (log_dir / "runs").iterdir()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["epoch_000.ckpt", "last.ckpt"] or checkpoints == ["epoch_001.ckpt", "last.ckpt"]
    # weights_only: a checkpoint of the engine is plain tensors and containers, no pickled code.
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    # 600 training windows, 300 per rank, 13 micro-batches of 24 per epoch (the last one of 12), 2 epochs.
    assert last["epoch"] == 1 and last["global_step"] == 2 * 13
    assert last["state_dict"]["net.features.0.weight"].shape == (16, 3, 5)


def test_tensorboard_metrics_json_and_the_log_hold_the_runs_results(sensor_run):
    """TensorBoard holds every tag the task logs; metrics.json and the final line hold the best
    checkpoint's results and the run's batch layout; the log file has one line per epoch."""
    log_dir, result = sensor_run
    (run,) = (log_dir / "runs").iterdir()
    scalars = read_scalars(run / "tensorboard")
    assert TAGS <= scalars.keys(), TAGS - scalars.keys()
    assert len(scalars["val/mse"]) == 3, "one val/mse per epoch, then the best checkpoint's"
    (test_mse,) = scalars["test/mse"]
    assert test_mse < LEARNED_MSE
    printed = re.search(r"Results: .*test/mse (\d\.\d{4})", result.stdout + result.stderr)
    assert printed and float(printed.group(1)) == pytest.approx(test_mse, abs=5e-5)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/mse"] == pytest.approx(test_mse)
    assert metrics["val/mse"] == pytest.approx(scalars["val/mse"][-1])
    assert metrics["checkpoint"].endswith(".ckpt") and metrics["world_size"] == 2
    assert metrics["per_device_batch_size"] == 24 and metrics["global_batch_size"] == 48
    epochs = re.findall(
        r"\[rank 0\]\S+ - Epoch (\d) done in [\d.]+ s \(global step (\d+)\)", (run / "train.log").read_text()
    )
    assert epochs == [("0", "13"), ("1", "26")], "one line per epoch in the log file"


def test_console_shows_one_progress_bar_and_rank_tagged_lines_only_where_ranks_differ(sensor_run):
    """The console shows rank 0's progress and results once; rank 1 prints only what is its own."""
    _, result = sensor_run
    console = result.stdout + result.stderr
    lines = [line for line in console.replace("\r", "\n").splitlines() if re.search(r"[A-Za-z0-9]", line)]
    tagged = [line for line in lines if re.match(r"\[[^]]+\]\[rank \d\]", line)]
    untagged = [line for line in lines if line not in tagged]
    # Progress bars and result tables come from rank 0 alone: no untagged line is printed twice.
    assert [line for line in untagged if untagged.count(line) > 1] == []
    assert sum(line.startswith("Testing ") for line in untagged) == 1
    # Rank 1 prints only what is its own: its config fingerprint, seed and place in the process group.
    rank_1 = [re.sub(r"^\[[^]]+\]\[rank 1\]\[[^]]+\]\[\w+\] - ", "", line) for line in tagged if "[rank 1]" in line]
    allowed = (
        r"Composed config sha256 \w+",
        r"\[rank: 1\] Seed set to \d+",
        r"Initializing distributed: GLOBAL_RANK: 1, ",
    )
    assert rank_1 and all(any(re.match(pattern, line) for pattern in allowed) for line in rank_1), rank_1
    # Its Python warnings, if any, are in the log file only.
    assert "[rank 1][py.warnings]" not in console


@pytest.fixture(scope="module")
def trained(sensor_run):
    log_dir, result = sensor_run
    return only(log_dir / "runs"), result


def test_one_job_writes_config_once_one_rank_tagged_log_and_metrics(trained):
    """A job writes its config once, one log with every line rank-tagged, and metrics.json with the
    task's metrics, its command line and how it ended."""
    run, result = trained
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == [
        "config.yaml",
        "hydra.yaml",
        "job.yaml",
        "overrides.yaml",
    ]
    assert sorted(p.name for p in run.glob("*.log")) == ["train.log"]
    lines = (run / "train.log").read_text().splitlines()
    assert all(re.match(r"\[[^]]+\]\[rank [01]\]", line) for line in lines if line.startswith("[")), lines[:5]
    assert ranks_in_log(run) == {0, 1}
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics.keys() >= {"val/mse", "val/mae", "test/mse", "test/mae"}
    # Which command made them, and how it ended.
    assert metrics["status"] == "completed" and "trainer.devices=2" in metrics["overrides"]
    assert not (run / ".stacks").exists(), "the stacks of stopped workers are kept only after a hang"
    assert result.stdout.count(f"Run directory: {run}") == 2, "printed at start and end"


def test_eval_reports_the_training_runs_test_metrics_with_two_processes(trained, tmp_path):
    """An evaluation of the best checkpoint on 2 processes reports the training run's test metrics."""
    run, _ = trained
    expected = json.loads((run / "metrics.json").read_text())
    checkpoint = run / "checkpoints" / Path(expected["checkpoint"]).name
    result = run_cli("sensor_task.eval", "trainer.accelerator=cpu", "trainer.devices=2", f"ckpt_path={checkpoint}",
                     log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    evaluation = only(tmp_path / "evals")
    metrics = json.loads((evaluation / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and ranks_in_log(evaluation, "eval") == {0, 1}
    # The same checkpoint, world size and batches as the training run's test: the same predictions.
    assert metrics["test/mse"] == expected["test/mse"]
    assert metrics["test/mae"] == pytest.approx(expected["test/mae"], rel=1e-6)
