"""Hydra the way users drive it, each through the real command line with 2 gloo processes: a sweep
(on the image test task, whose figures reach MLflow) and an Optuna search (on the regression)."""

import csv
import json
import re
from pathlib import Path

import optuna
import pytest
from harness import only, processes_mentioning, ranks_in_log, read_scalars, run_cli
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from vision_task.classifier import make_image_folder

pytestmark = pytest.mark.processes

# 2 gloo processes, one epoch: of the image folder's 240 training images (24 held out for validation)
# and its 70 test images, or the regression's 600 training windows.
BASE = ("trainer.accelerator=cpu", "trainer.devices=2", "data.global_batch_size=64")
QUICK = (*BASE, "trainer.max_epochs=1")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A folder of RGB PNGs, five classes, 5% of the labels moved to another class: a few test
    images come out misclassified (the misclassified figure is then drawn)."""
    return make_image_folder(tmp_path_factory.mktemp("images") / "colours", label_noise=0.05)


def fingerprints(run_dir) -> dict[int, str]:
    """Each rank's 'Composed config sha256' from the job's log."""
    text = (run_dir / "train.log").read_text()
    return {int(rank): sha for rank, sha in re.findall(r"\[rank (\d+)\].*Composed config sha256 (\w+)", text)}


def test_a_sweep_runs_each_job_once_with_its_own_ddp_processes_and_directory(images, tmp_path):
    result = run_cli(
        "vision_task.train",
        "-m",
        f"data.root={images}",
        *QUICK,
        "data.global_batch_size=32,64",
        "debug=profiler",
        "logger=[tensorboard,mlflow]",
        log_dir=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    # Beside the sweep, the MLflow store all runs under logs/ share (and the image folder's survey).
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache", "mlartifacts", "mlflow.db", "mlflow.db.lock",
                                                          "multiruns"]  # fmt: skip
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
    # The job's overrides, the swept one among them, are marked as the columns TensorBoard shows first.
    (experiment,) = {tags["_hparams_/experiment"] for tags in runs.PluginRunToTagToContent("hparams").values()}
    first = [info.name for info in HParamsPluginData.FromString(experiment).experiment.hparam_infos if info.differs]
    assert set(first) == {"data.root", "data.global_batch_size", "debug", "logger", "paths.log_dir",
                          "trainer.accelerator", "trainer.devices", "trainer.max_epochs"}  # fmt: skip

    # MLflow: one run per job in the store under logs/, read back with MLflow's own client.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow_runs = client.search_runs(
        [client.get_experiment_by_name("vision-task").experiment_id], order_by=["start_time"]
    )
    assert [run.info.run_name for run in mlflow_runs] == [f"multiruns/{sweep.name}/{job}" for job in "01"]
    for run, job, batch in zip(mlflow_runs, "01", (32, 64)):
        metrics = json.loads((sweep / job / "metrics.json").read_text())
        assert run.info.status == "FINISHED" and run.data.metrics["test/acc"] == metrics["test/acc"]
        assert run.data.params["data.global_batch_size"] == str(batch) and run.data.tags["run_dir"] == str(sweep / job)
        assert json.loads((sweep / job / "trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id
        artifacts = {artifact.path for artifact in client.list_artifacts(run.info.run_id, "test")}
        assert artifacts == {"test/confusion_matrix", "test/misclassified"}
        (download := tmp_path / "downloads" / job).mkdir(parents=True)
        config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(download))).read_text()
        assert f"global_batch_size: {batch}\n" in config


def test_optuna_search_gives_every_rank_of_a_trial_the_same_hyperparameters(windows, tmp_path):
    # Trial 0 fails on rank 1 at step 2: it is recorded as failed, reported, its processes end, and
    # the search goes on (the failed job of any sweep: the basic launcher's jobs run the same code).
    # The regression's search (sensor_task/conf/hparams_search/optuna.yaml): its learning rate and dropout.
    result = run_cli(
        "sensor_task.train", "-m", f"data.path={windows}", *QUICK,
        "+hparams_search=optuna", "hydra.sweeper.n_trials=2",
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
    output = result.stdout + result.stderr
    assert f"Job {trials[0]} failed: rank 1 failed: RuntimeError: injected failure on rank 1 at step 2. " in output
    assert completed["status"] == "completed" and "Sweep of 2 jobs, 1 failed" in output
    assert processes_mentioning(str(tmp_path)) == [], "a process of the sweep is still alive"
    # The regression's objective is the lowest val/mse (direction: null takes the task's mode).
    study = optuna.load_study(study_name="sensor_task", storage=f"sqlite:///{sweep}/optuna.db")
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert f"best_value: {completed['val/mse']}" in results, "the completed trial is the best"
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [row["status"] for row in rows] == ["failed", "completed"]
