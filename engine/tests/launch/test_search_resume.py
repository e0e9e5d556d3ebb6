"""A hyperparameter search by Optuna that survives a kill, through the test task's real command line:
4 trials, one after another, 1 gloo process each on its sensor windows, ``last.ckpt`` every 5 steps,
logged to TensorBoard, CSV and MLflow; the engine's continued Optuna sweeper as the test task's
preset sets it up (``+hparams_search=optuna``). The search is killed (SIGKILL to its whole process
group, as a node failure or the OOM killer would) while trial 2 trains, after its first checkpoint;
the same command with its ``hydra.sweep.dir`` continues it from the study in the sweep's directory
(``optuna.db``), and every tracker shows each trial's job once."""

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from harness import HERE, cli_command, cli_env, processes_mentioning, read_scalars
from mlflow import MlflowClient
from runs import TRAIN

from ddp_engine.config.command_line import check_command_line
from ddp_engine.core.errors import ConfigValueError

pytestmark = pytest.mark.processes

STEPS = 13  # 1 epoch of 600 windows in global batches of 48 (the last one short)
STUDY = "sensor_task"  # hydra.sweeper.study_name of the test task's preset (sensor_task/conf/hparams_search/)
SEARCH = (
    "trainer.accelerator=cpu", "trainer.devices=1", "data.global_batch_size=48", "trainer.max_epochs=1",
    "+hparams_search=optuna", "hydra.sweeper.n_trials=4", "logger=[tensorboard,csv,mlflow]",
    "callbacks.last_checkpoint.train_time_interval=null", "callbacks.last_checkpoint.every_n_train_steps=5",
    # Trial 2 slows down from step 6 (after its checkpoint at step 5) until the test releases it.
    "+callbacks.pause._target_=probes.PauseAfterStep", "+callbacks.pause.step=6", "+callbacks.pause.seconds=1",
    "+callbacks.pause.job=2", "+callbacks.pause.marker=${paths.output_dir}/paused",
)  # fmt: skip


def snapshot(folder: Path) -> dict:
    """Every file under ``folder``, with its modification time and bytes."""
    return {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.rglob("*") if path.is_file()}


def study_of(sweep_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep_dir}/optuna.db")


def test_a_killed_search_continues_toward_n_trials_and_finishes_the_trial_in_flight(windows, tmp_path):
    """A search SIGKILLed while a trial trains continues with the same command: the told trials'
    jobs are kept, the trial in flight resumes in place with its own parameters, new trials are
    asked up to n_trials, and every tracker shows each trial's job once. Another search into its
    directory is refused before anything runs."""
    log_dir, sweep_dir, release = tmp_path / "logs", tmp_path / "logs" / "search", tmp_path / "release"
    args = ("-m", f"data.path={windows}", *SEARCH, f"+callbacks.pause.release={release}")
    command = cli_command(TRAIN, *args, f"hydra.sweep.dir={sweep_dir}", log_dir=log_dir)
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 300
        while not (sweep_dir / "2" / "paused").exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert (sweep_dir / "2" / "paused").exists(), "trial 2 never reached its step 6"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    deadline = time.time() + 30
    while processes_mentioning(str(log_dir)) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(log_dir)) == []
    states = [trial.state for trial in study_of(sweep_dir).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.RUNNING]
    in_flight = study_of(sweep_dir).trials[2].params
    kept = snapshot(sweep_dir / "0") | snapshot(sweep_dir / "1")

    # Checked before anything runs: another search into that directory is refused, naming what differs;
    # asking for more trials in all is the same search, continued further.
    task = [*command[3:]]  # -m, paths.log_dir, the overrides
    with pytest.raises(ConfigValueError, match=r"sets hydra\.sweeper\.direction=maximize, that search set hydra\.sw"):
        check_command_line("config", [*task, "hydra.sweeper.direction=maximize"])
    with pytest.raises(ConfigValueError, match=r"this command sets model\.net\.dropout=interval\(0\.0,0\.3\), that"):
        check_command_line("config", [*task, "model.net.dropout=interval(0.0,0.3)"])
    with pytest.raises(ConfigValueError, match=r"this command sets trainer\.max_epochs=2, that sweep set trainer\.ma"):
        check_command_line("config", [arg.replace("max_epochs=1", "max_epochs=2") for arg in task])
    check_command_line("config", [*task, "hydra.sweeper.n_trials=6"])
    # A search whose study was kept in memory (Optuna's storage: null) cannot be continued.
    lost = tmp_path / "lost"
    shutil.copytree(sweep_dir / "0", lost / "0")
    record = yaml.safe_load((sweep_dir / "multirun.yaml").read_text())
    record["hydra"]["sweeper"]["storage"] = None
    (lost / "multirun.yaml").write_text(yaml.safe_dump(record))
    with pytest.raises(ConfigValueError, match=rf"{lost} holds a search whose study was kept in memory"):
        check_command_line("config", [*task, f"hydra.sweep.dir={lost}"])

    release.touch()
    result = subprocess.run(command, cwd=HERE, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Trial 2 was in flight when the search stopped: it runs again with its parameters" in output
    assert f"#2 resumes in place from {sweep_dir / '2' / 'checkpoints' / 'last.ckpt'}" in output
    assert "Continuing the search of sqlite:///" in output and "3 trials done, 1 to go" in output

    # hydra.sweeper.direction is null: the task's (task.mode=min for val/mse).
    assert yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["hydra"]["sweeper"]["direction"] is None
    assert study_of(sweep_dir).direction == optuna.study.StudyDirection.MINIMIZE
    trials = study_of(sweep_dir).trials
    assert [trial.state for trial in trials] == [optuna.trial.TrialState.COMPLETE] * 4, "4 in all, none RUNNING"
    assert trials[2].params == in_flight, "the trial in flight finished with its own parameters"
    assert trials[3].params != trials[0].params, "the continued search draws new parameters"
    assert snapshot(sweep_dir / "0") | snapshot(sweep_dir / "1") == kept, "the told trials' jobs are untouched"
    for trial in trials:  # trial n is job n: the job's own parameters and result
        job = sweep_dir / str(trial.number)
        config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        assert config["model"]["optimizer"]["lr"] == trial.params["model.optimizer.lr"], trial.number
        assert trial.value == json.loads((job / "metrics.json").read_text())["val/mse"], trial.number
    last = torch.load(sweep_dir / "2" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == STEPS, "the resumed trial trained to its end"
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    assert [(row["job"], row["status"]) for row in rows] == [
        ("0", "completed"), ("1", "completed"), ("2", "resumed"), ("3", "completed")
    ]  # fmt: skip
    # Each job once in every tracker, the resumed one too: TensorBoard and CSV with the uninterrupted
    # job's steps (the points after the checkpoint logged once), one finished MLflow run per job.
    # ("epoch" is logged again at the last step by the validation and test after fit, in any run.)
    reference = read_scalars(sweep_dir / "0" / "tensorboard", steps=True)
    resumed = read_scalars(sweep_dir / "2" / "tensorboard", steps=True)
    assert {tag: [step for step, _ in points] for tag, points in resumed.items()} == {
        tag: [step for step, _ in points] for tag, points in reference.items()
    }
    for job in ("0", "2"):
        rows = list(csv.DictReader((sweep_dir / job / "csv" / "metrics.csv").open(newline="")))
        steps = [int(row["step"]) for row in rows if row.get("train/loss")]
        assert steps == sorted(set(steps)) == [step for step, _ in reference["train/loss"]], job
    client = MlflowClient(f"sqlite:///{log_dir}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("sensor-task").experiment_id])
    assert sorted(run.info.run_name for run in runs) == [f"search/{job}" for job in "0123"]
    for run in runs:
        job = sweep_dir / run.info.run_name.split("/")[1]
        assert run.info.status == "FINISHED", run.info.run_name
        assert run.data.metrics["test/mse"] == json.loads((job / "metrics.json").read_text())["test/mse"]
    assert processes_mentioning(str(log_dir)) == []
