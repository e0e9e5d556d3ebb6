"""Hydra the way users drive it, each through the real command line with 2 gloo processes:
sweeps, presets, eval, resume, refused command lines, and an Optuna search."""

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import DETERMINISTIC, ranks_in_log, read_scalars, run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from mnist_ddp.cli.preflight import check_command_line
from mnist_ddp.cli.schema import MOVED_CLASSES, MOVED_MODULES
from mnist_ddp.errors import UsageError

# 2 gloo processes, 1,000 synthetic training images, 200 for validation.
BASE = ("trainer.accelerator=cpu", "trainer.devices=2", "data.val_size=200", "data.global_batch_size=64")
QUICK = (*BASE, "trainer.max_epochs=1")


def only(path):
    (item,) = path.iterdir()
    return item


def fingerprints(run_dir) -> dict[int, str]:
    """Each rank's 'Composed config sha256' from the job's log."""
    text = (run_dir / "train.log").read_text()
    return {int(rank): sha for rank, sha in re.findall(r"\[rank (\d+)\].*Composed config sha256 (\w+)", text)}


# --- multirun --------------------------------------------------------------------------------


def test_a_sweep_runs_each_job_once_with_its_own_ddp_processes_and_directory(synthetic_data_dir, tmp_path):
    result = run_cli(
        "-m",
        f"data.data_dir={synthetic_data_dir}",
        *QUICK,
        "data.global_batch_size=32,64",
        "debug=profiler",
        log_dir=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multiruns"], "no stray run directories"
    sweep = only(tmp_path / "multiruns")
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml", "summary.csv"]
    assert result.stdout.count("Launching 2 jobs locally") == 1, "the sweep must not be started again"
    ports = []
    for job, batch in (("0", 32), ("1", 64)):
        job_dir = sweep / job
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert metrics["global_batch_size"] == batch and metrics["world_size"] == 2
        assert ranks_in_log(job_dir) == {0, 1}, "both processes of the job log into its train.log"
        assert set(fingerprints(job_dir)) == {0, 1} and len(set(fingerprints(job_dir).values())) == 1
        assert read_scalars(job_dir / "tensorboard")["test/acc"] == [metrics["test/acc"]]
        assert (job_dir / "checkpoints" / "last.ckpt").is_file()
        # debug=profiler: each process of the job writes its own report into the job's directory.
        for rank in (0, 1):
            report = (job_dir / f"fit-profile-{rank}.txt").read_text()
            assert "run_training_epoch" in report and "Total" in report
        assert not (job_dir / "multiruns").exists() and not (job_dir / ".hydra" / "multirun.yaml").exists()
        ports.append(json.loads((job_dir / "ddp.json").read_text())["master_port"])
    assert fingerprints(sweep / "0") != fingerprints(sweep / "1")
    assert ports[0] != ports[1], "each job starts its own process group"
    # The sweep's summary: a row per job with its overrides, status and metrics, printed and in summary.csv.
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    for row, job, batch in zip(rows, "01", (32, 64)):
        metrics = json.loads((sweep / job / "metrics.json").read_text())
        assert metrics["status"] == row["status"] == "completed" and row["job"] == job
        assert (
            f"data.global_batch_size={batch}" in metrics["overrides"]
            and f"data.global_batch_size={batch}" in row["overrides"]
        )
        assert row["test/acc"] == f"{metrics['test/acc']:.4f}" and row["val/acc"] == f"{metrics['val/acc']:.4f}"
        assert re.search(
            rf"\n{job} +data.global_batch_size={batch} +completed +{row['val/acc']} +{row['test/acc']}", result.stdout
        )
    # TensorBoard on the sweep directory: one run per job, side by side, each with its own HPARAMS row.
    runs = EventMultiplexer().AddRunsFromDirectory(str(sweep))
    runs.Reload()
    sessions = {
        run: HParamsPluginData.FromString(tags["_hparams_/session_start_info"]).session_start_info.hparams
        for run, tags in runs.PluginRunToTagToContent("hparams").items()
    }
    assert sorted(sessions) == ["0/tensorboard", "1/tensorboard"]
    assert [sessions[f"{job}/tensorboard"]["global_batch_size"].number_value for job in "01"] == [32, 64]


# --- outputs of one job ----------------------------------------------------------------------


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


# --- eval ------------------------------------------------------------------------------------


def test_eval_reports_the_training_runs_test_metrics_with_two_processes(trained, synthetic_data_dir, tmp_path):
    run, _ = trained
    expected = json.loads((run / "metrics.json").read_text())
    # The run as version 0.1 saved it: its config names the modules of the flat layout.
    old_run = tmp_path / "old_run"
    shutil.copytree(run / ".hydra", old_run / ".hydra")
    shutil.copytree(run / "checkpoints", old_run / "checkpoints")
    old_paths = {new: old for old, new in (*MOVED_MODULES.items(), *MOVED_CLASSES.items())}
    config = (old_run / ".hydra" / "config.yaml").read_text()
    for target in sorted(set(re.findall(r"_target_: (mnist_ddp\.\S+)", config))):
        module, _, name = target.rpartition(".")
        old = old_paths.get(target) or (f"{old_paths[module]}.{name}" if module in old_paths else target)
        config = config.replace(f"_target_: {target}\n", f"_target_: {old}\n")
    assert "_target_: mnist_ddp.model.CNN\n" in config and "_target_: mnist_ddp.model.MNISTClassifier\n" in config
    (old_run / ".hydra" / "config.yaml").write_text(config)
    checkpoint = old_run / "checkpoints" / Path(expected["checkpoint"]).name
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


# --- resume ----------------------------------------------------------------------------------


# Dropout on: resuming must also restore the random generator state, or the masks differ.
DROPOUT = ("trainer.devices=2", "model.net.dropout=0.5")
STOP_AFTER_EPOCH_0 = ("+callbacks.stop._target_=probes.StopAfterEpoch", "+callbacks.stop.epoch=0")


def test_resuming_from_last_ckpt_continues_exactly_where_the_run_stopped(deterministic_run):
    # Uninterrupted: 2 epochs. Stopped: the same run ended after epoch 0. Resumed: from its last.ckpt.
    whole_run = deterministic_run("ws2_dropout", *DROPOUT)
    stopped_last = deterministic_run("ws2_dropout_stopped", *DROPOUT, *STOP_AFTER_EPOCH_0) / "checkpoints" / "last.ckpt"
    assert torch.load(stopped_last, weights_only=True)["epoch"] == 0
    resumed_run = deterministic_run("ws2_dropout_resumed", *DROPOUT, f"ckpt_path={stopped_last}")

    whole = torch.load(whole_run / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(resumed_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (whole["epoch"], whole["global_step"]) == (1, 42)
    for key, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key
    momentum, expected = resumed["optimizer_states"][0]["state"], whole["optimizer_states"][0]["state"]
    assert all(torch.equal(momentum[i]["momentum_buffer"], expected[i]["momentum_buffer"]) for i in expected)
    assert resumed["lr_schedulers"] == whole["lr_schedulers"]
    # No epoch repeated or skipped: the resumed run trained epoch 1 only, on epoch 1's shards.
    assert sorted(p.name for p in (resumed_run / "samples").iterdir()) == ["rank0_epoch1.jsonl", "rank1_epoch1.jsonl"]
    for rank in (0, 1):
        name = f"rank{rank}_epoch1.jsonl"
        assert (resumed_run / "samples" / name).read_text() == (whole_run / "samples" / name).read_text()


def test_resuming_with_a_longer_schedule_is_refused_in_one_line(deterministic_run, noisy_data_dir, tmp_path):
    stopped_last = deterministic_run("ws2_dropout_stopped", *DROPOUT, *STOP_AFTER_EPOCH_0) / "checkpoints" / "last.ckpt"
    result = run_cli(
        f"data.data_dir={noisy_data_dir}", *DETERMINISTIC, *DROPOUT, "trainer.max_epochs=3",
        f"ckpt_path={stopped_last}", log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert (
        "ConfigValueError: ckpt_path: the checkpoint's learning-rate schedule spans 42 optimizer steps, this run 63"
        in output
    )
    assert "Traceback" not in output


# --- presets ---------------------------------------------------------------------------------


def test_fast_experiment_with_debug_limit(synthetic_data_dir, tmp_path):
    result = run_cli(f"data.data_dir={synthetic_data_dir}", *BASE, "experiment=fast", "debug=limit", log_dir=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = only(tmp_path / "runs")
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert any("running_mean" in key for key in state["state_dict"]), "BatchNorm layers from experiment=fast"
    # 500 images per rank make 16 batches of 32 (global 64 from the command line wins over the
    # preset's); debug=limit trains 2 epochs of at most 20 batches, validates and tests 5.
    assert (state["epoch"], state["global_step"]) == (1, 2 * 16)
    scalars = read_scalars(run / "tensorboard")
    assert len(scalars["val/acc"]) == 3 and len(scalars["test/acc"]) == 1


def test_long_experiment_with_debug_fast_dev_run(synthetic_data_dir, tmp_path):
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", *BASE, "experiment=long", "debug=fast_dev_run", log_dir=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Running in `fast_dev_run` mode: will run the requested loop using 1 batch(es)" in result.stdout
    run = only(tmp_path / "runs")
    assert "hidden: 256" in (run / ".hydra" / "config.yaml").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["checkpoint"] is None, "fast_dev_run saves no checkpoint; the final weights are tested"
    assert not (run / "checkpoints").exists()


def test_debug_overfit_memorizes_a_few_batches(synthetic_data_dir, tmp_path):
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", *BASE, "debug=overfit", "trainer.max_epochs=10", log_dir=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    train_acc = read_scalars(only(tmp_path / "runs") / "tensorboard")["train/acc"]
    assert len(train_acc) == 10 * 4, "4 batches per epoch, logged every step"
    assert train_acc[0] < 0.5 and train_acc[-4:] == [1.0] * 4


# --- refused command lines -------------------------------------------------------------------


REFUSED = [
    ("data.global_batchsize=64", "Unknown key data.global_batchsize (keys of data: _target_, data_dir, global_"),
    ("trainer.max_epochs=three", "trainer.max_epochs: Value 'three' of type 'str' could not be converted to Int"),
    ("trainer.devices=0", "trainer.devices=0 is not a positive process count on CPU."),
    ("data.global_batch_size=-64", "data.global_batch_size must be at least 1, got -64."),
    ("model=transformer", "model=transformer: no such option in conf/model/ (available: cnn, mlp)."),
    ("+data.shuffle=true", "data: MNISTDataModule.__init__() got an unexpected keyword argument 'shuffle'"),
    (
        "strategy.comm_hook=fp32",
        "strategy.comm_hook: Invalid value 'fp32', expected one of [none, fp16, bf16, powersgd]",
    ),
]


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_preflight_names_the_problem_and_what_is_allowed(override, message):
    with pytest.raises(UsageError) as error:
        check_command_line("config", ["trainer.accelerator=cpu", override])
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_a_bad_sweep_job_is_refused_before_the_sweep_starts():
    with pytest.raises(UsageError, match="data.global_batch_size=127 does not split evenly"):
        check_command_line("config", ["-m", "trainer.accelerator=cpu", "data.global_batch_size=128,127"])


BATCH_SPLIT = (
    "data.global_batch_size=63",
    "data.global_batch_size=63 does not split evenly over world_size=2 processes x "
    "trainer.accumulate_grad_batches=1: it must be a multiple of 2. Use data.global_batch_size=62 or 64.",
)


@pytest.mark.parametrize(("override", "message"), [REFUSED[0], BATCH_SPLIT])
def test_a_bad_command_line_is_one_line_before_any_process_or_directory(override, message, tmp_path):
    result = run_cli("trainer.accelerator=cpu", override, log_dir=tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {message}")
    assert list(tmp_path.iterdir()) == []


# --- hyperparameter search -------------------------------------------------------------------


def test_optuna_search_gives_every_rank_of_a_trial_the_same_hyperparameters(synthetic_data_dir, tmp_path):
    # Trial 0 fails on rank 1 at step 2: it is recorded as failed, and the search goes on.
    result = run_cli(
        "-m", f"data.data_dir={synthetic_data_dir}", *QUICK, "hparams_search=optuna", "hydra.sweeper.n_trials=2",
        "+callbacks.fail._target_=probes.FailOnRank", "+callbacks.fail.rank=1", "+callbacks.fail.step=2",
        f"+callbacks.fail.marker={tmp_path / 'failed'}", "+callbacks.fail.job=0", log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Failed experiment: " in result.stdout + result.stderr, "Optuna told the trial failed"
    sweep = only(tmp_path / "multiruns")
    trials = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in trials] == ["0", "1"]
    rates = []
    for trial in trials:
        shas = fingerprints(trial)
        assert set(shas) == {0, 1} and len(set(shas.values())) == 1, "both ranks composed the same trial config"
        overrides = (trial / ".hydra" / "overrides.yaml").read_text()
        rates.append(re.search(r"model.optimizer.lr=([\d.e-]+)", overrides).group(1))
    assert rates[0] != rates[1], "two trials, two sampled learning rates"
    results = (sweep / "optimization_results.yaml").read_text()
    failed, completed = (json.loads((trial / "metrics.json").read_text()) for trial in trials)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: injected failure on rank 1 at step 2"
    assert f"best_value: {completed['val/acc']}" in results, "the completed trial is the best"
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [row["status"] for row in rows] == ["failed", "completed"]
