"""End to end through the real command line: real DDP processes over gloo on CPU.

Each run starts ``python -m mnist_ddp.train`` in a subprocess, which launches its second DDP
process itself (Lightning's subprocess launcher), exactly as a user's run does.
"""

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from harness import only, ranks_in_log, read_scalars
from helpers import cli_env, run_cli
from private_api import LOST, compat_private_names, hiding_sitecustomize
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.processes

TAGS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "train/lr"}


def test_run_writes_one_run_directory_shared_by_both_processes(synthetic_run):
    log_dir, result = synthetic_run
    runs = list((log_dir / "runs").iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    # Rank 1 was started by Lightning, ran the same job and logged into the same file.
    assert ranks_in_log(run) == {0, 1}
    assert (run / "metrics.json").is_file() and not (run / "multiruns").exists()
    assert f"Run directory: {run}" in result.stdout + result.stderr
    assert "world_size=2, global batch 64 = 32 per device x 2 processes" in result.stdout + result.stderr
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["trainer"]["devices"] == 2


def test_checkpoints_hold_the_trained_model(synthetic_run):
    log_dir, _ = synthetic_run
    (run,) = (log_dir / "runs").iterdir()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["epoch_000.ckpt", "last.ckpt"] or checkpoints == ["epoch_001.ckpt", "last.ckpt"]
    # weights_only: a checkpoint of this template is plain tensors and containers, no pickled code.
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    # 1,000 training images, 500 per rank, 16 micro-batches of 32 per epoch, 2 epochs.
    assert last["epoch"] == 1 and last["global_step"] == 2 * 16
    assert last["state_dict"]["net.features.0.weight"].shape == (32, 1, 5, 5)


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


def test_console_shows_one_progress_bar_and_rank_tagged_lines_only_where_ranks_differ(synthetic_run):
    _, result = synthetic_run
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
    # Its Python warnings, if any, are in the log file only (see the filter's own test below).
    assert "[rank 1][py.warnings]" not in console


@pytest.fixture(scope="module")
def trained(synthetic_run):
    log_dir, result = synthetic_run
    return only(log_dir / "runs"), result


def test_one_job_writes_config_once_one_rank_tagged_log_and_metrics(trained):
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
    assert metrics.keys() >= {"val/acc", "val/loss", "test/acc", "test/loss"}
    # Which command made them, and how it ended.
    assert metrics["status"] == "completed" and "trainer.devices=2" in metrics["overrides"]
    assert not (run / ".stacks").exists(), "the stacks of stopped workers are kept only after a hang"
    assert result.stdout.count(f"Run directory: {run}") == 2, "printed at start and end"


def test_eval_reports_the_training_runs_test_metrics_with_two_processes(trained, synthetic_data_dir, tmp_path):
    run, _ = trained
    expected = json.loads((run / "metrics.json").read_text())
    checkpoint = run / "checkpoints" / Path(expected["checkpoint"]).name
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", "trainer.accelerator=cpu", "trainer.devices=2",
        "data.global_batch_size=64", f"ckpt_path={checkpoint}", log_dir=tmp_path, module="mnist_ddp.eval",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    evaluation = only(tmp_path / "evals")
    metrics = json.loads((evaluation / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and ranks_in_log(evaluation, "eval") == {0, 1}
    assert metrics["test/acc"] == expected["test/acc"]
    assert metrics["test/loss"] == pytest.approx(expected["test/loss"], rel=1e-6)
    # Its own TensorBoard run holds the test images too: the same misclassified digits, pixel for pixel.
    evaluated, trained_run = (EventAccumulator(str(d / "tensorboard")).Reload() for d in (evaluation, run))
    assert set(evaluated.Tags()["images"]) == {"test/confusion_matrix", "test/misclassified"}
    (grid,), (trained_grid,) = evaluated.Images("test/misclassified"), trained_run.Images("test/misclassified")
    assert grid.encoded_image_string == trained_grid.encoded_image_string


def _train_with_hidden(hidden, data_dir, tmp_path):
    """The default 2-process training (1 epoch) with the private names ``hidden`` from compat in
    its every process (a sitecustomize; the libraries keep their own), checked to have completed
    and learnt; returns its log and console, and how often each name was said lost in its
    ``train.log``."""
    site = hiding_sitecustomize(tmp_path / "site", hidden)
    result = run_cli(
        f"data.data_dir={data_dir}", "data.val_size=200", "trainer.accelerator=cpu", "trainer.devices=2",
        "trainer.max_epochs=1", log_dir=tmp_path / "logs",
        env={"PYTHONPATH": os.pathsep.join([str(site), cli_env()["PYTHONPATH"]])},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = only(tmp_path / "logs" / "runs")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["test/acc"] > 0.9, metrics
    assert read_scalars(run / "tensorboard")["test/acc"][-1] == pytest.approx(
        metrics["test/acc"]
    )  # TensorBoard's charts
    assert (run / "checkpoints" / "last.ckpt").is_file()
    log = (run / "train.log").read_text()
    return log + result.stdout + result.stderr, Counter(re.findall(rf"- (\S+){re.escape(LOST)}", log))


def test_the_default_training_completes_with_every_private_api_that_compat_reads_hidden(synthetic_data_dir, tmp_path):
    # As if a release of each library had renamed every private name the engine reads: the default
    # 2-process training still learns, writes its results, and each process says once what it lost.
    output, said = _train_with_hidden(compat_private_names(), synthetic_data_dir, tmp_path)
    # The names on the default path, each said once by each process that reached it: the command's
    # own (its lines in train.log are rank 0's too) and the two ranks.
    default_path = {
        "Trainer._logger_connector.should_update_logs", "_TrainingEpochLoop._broadcast_sigterm_tensor",
        "DistributedDataParallel._get_ddp_logging_data", "DistributedDataParallel._set_ddp_runtime_logging_sample_rate",
        "Backend.Options._timeout", "ModelCheckpoint._every_n_epochs", "ModelCheckpoint._save_topk_checkpoint",
        "SummaryWriter._get_file_writer", "Trainer.fit_loop.epoch_loop.batch_progress", "atexit._run_exitfuncs",
    }  # fmt: skip
    assert set(said) >= default_path and max(said.values()) <= 3, said
    # And the command's start, before the run's log exists: on its console.
    for start in ("forkserver.ensure_running", "dynamic_rendezvous.get_method_name", "Hydra.get_mode"):
        assert f"{start}{LOST}" in output, start


@pytest.mark.in_turn
@pytest.mark.parametrize("name", sorted(compat_private_names()))
def test_the_default_training_completes_with_each_private_api_that_compat_reads_hidden_alone(
    name, synthetic_data_dir, tmp_path
):
    # One library's release renames one private name (make test-private-apis; not in make test,
    # whose all-at-once test above covers the same paths in one run): each alone also leaves a run
    # that completes, and a name on the default path is said lost at most once per process.
    _, said = _train_with_hidden({name}, synthetic_data_dir, tmp_path)
    assert all(name in lost for lost in said) and max(said.values(), default=0) <= 3, said
