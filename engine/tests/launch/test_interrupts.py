"""Ctrl-C and SIGTERM during a two-process run: every process stops within 10 s, the command exits
128 + the signal number, the last complete checkpoint is intact and named in the log, and resuming
from it continues the run to its end.

Ctrl-C in a terminal signals the whole foreground process group; ``kill`` and most schedulers
signal the process they started (the parent), SLURM's scancel every task. The signals are real,
sent by this test to the real processes.
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from harness import HERE, cli_command, cli_env, default_sigint, only, processes_mentioning, read_scalars, run_cli
from mlflow.tracking import MlflowClient
from runs import TRAIN

pytestmark = pytest.mark.processes

# 600 training windows over 2 processes in micro-batches of 24: 13 optimizer steps per epoch.
RUN = ("trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=4", "data.global_batch_size=48")
STEPS_PER_EPOCH, SIGNAL_STEP = 13, 16  # the signal comes in epoch 1; last.ckpt then holds epoch 0
# The run that is resumed also logs to CSV and MLflow, which the resume must continue.
TRACKERS = "logger=[tensorboard,csv,mlflow]"


@pytest.mark.parametrize(
    ("signum", "target"),
    # SIGTERM to every process (SLURM's scancel): the chaos test's SIGTERM to a worker, and Ctrl-C's
    # delivery to the whole group, cover its two halves.
    # SIGHUP to the group: a closed terminal, which also reaches Python's resource tracker.
    [(signal.SIGINT, "group"), (signal.SIGTERM, "parent"), (signal.SIGHUP, "group")],
    ids=["ctrl-c", "kill", "hangup"],
)
def test_a_signal_stops_every_process_keeps_the_checkpoint_and_the_run_resumes(sensor_data, tmp_path, signum, target):
    """Every process is gone within 10 s of the signal, the command exits 128 + its number without a
    traceback, names the intact last checkpoint and the command that resumes the run; that command
    finishes the run in place, and every tracker shows each step once."""
    marker, log_dir = tmp_path / "ready", tmp_path / "logs"
    resumed_here = signum == signal.SIGTERM and target == "parent"  # resumed once: the path is the same for each
    command = cli_command(
        TRAIN, *sensor_data, *RUN, *([TRACKERS] if resumed_here else []),
        "+callbacks.pause._target_=probes.PauseAfterStep",
        f"+callbacks.pause.step={SIGNAL_STEP}", f"+callbacks.pause.marker={marker}", log_dir=log_dir,
    )  # fmt: skip
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True, preexec_fn=default_sigint)  # fmt: skip
    try:
        deadline = time.time() + 300
        while not marker.exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the run never reached the signal step"
        running = processes_mentioning(str(log_dir))
        assert len(running) == 4, f"the supervisor, the workers' forkserver and the 2 workers: {running}"
        assert sum("ddp_engine.launch.worker" in line for line in running) == 2, running
        sent = time.time()
        os.killpg(run.pid, signum) if target == "group" else os.kill(run.pid, signum)
        while processes_mentioning(str(log_dir)) and time.time() - sent < 30:
            time.sleep(0.05)
        seconds = time.time() - sent
        output = run.communicate(timeout=30)[0]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    print(f"{signum.name} to the {target}: every process gone {seconds:.1f} s later, exit status {run.returncode}")
    assert seconds < 10 and processes_mentioning(str(log_dir)) == []
    assert run.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output, output[-3000:]  # the resource tracker's KeyErrors, after a SIGHUP killed it

    run_dir = only(log_dir / "runs")
    stopped = re.search(rf"Stopped by {signum.name} in epoch 1 at global step (\d+)\. Last complete checkpoint: "
                        rf"(\S+) \(global step (\d+)\)\. Resume this run in place with: {re.escape(sys.executable)} "
                        rf"-m {re.escape(TRAIN)} hydra.run.dir=(\S+) ckpt_path=last\n", output)  # fmt: skip
    assert stopped, output[-3000:]
    assert SIGNAL_STEP <= int(stopped[1]) < 2 * STEPS_PER_EPOCH
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert stopped[2] == str(checkpoint) and stopped[4] == str(run_dir)
    state = torch.load(checkpoint, weights_only=True)  # whole: it loads
    assert (state["epoch"], state["global_step"]) == (0, STEPS_PER_EPOCH) and int(stopped[3]) == STEPS_PER_EPOCH

    if resumed_here:
        # The command the message printed, in place: the run's own overrides are read from its directory.
        record = tmp_path / "resumed.jsonl"
        resumed = run_cli(
            TRAIN, f"hydra.run.dir={run_dir}", "ckpt_path=last", "+callbacks.probe._target_=probes.ElasticProbe",
            f"+callbacks.probe.record={record}", "+callbacks.probe.kill_rank=-1", "+callbacks.probe.kill_step=-1",
            log_dir=log_dir,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        start = json.loads(record.read_text())
        assert (start["start_epoch"], start["start_step"]) == (1, STEPS_PER_EPOCH), "continues after epoch 0"
        assert [path.name for path in (log_dir / "runs").iterdir()] == [run_dir.name], "in the run's own directory"
        final = torch.load(checkpoint, weights_only=True)
        assert (final["epoch"], final["global_step"]) == (3, 4 * STEPS_PER_EPOCH), "ends with the configured epochs"
        assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
        # One TensorBoard run whose every tag's steps increase strictly: the points the stopped run
        # logged after its checkpoint were replaced, not duplicated (TensorBoard's purge_step).
        # ("epoch" is logged again at the last step by the validation and test after fit, in any run.)
        scalars = read_scalars(run_dir / "tensorboard", steps=True)
        for tag, points in scalars.items():
            steps = [step for step, _ in points]
            assert steps == sorted(steps if tag == "epoch" else set(steps)), f"{tag}: {steps}"
        assert len(scalars["val/mse"]) == 4 + 1, "4 epochs and the best checkpoint's"
        # CSV likewise: the rows before the checkpoint kept, those after it logged once, by the resume.
        with (run_dir / "csv" / "metrics.csv").open(newline="") as file:
            rows = list(csv.DictReader(file))
        for tag in scalars:
            steps = [int(row["step"]) for row in rows if row.get(tag)]
            assert steps == sorted(steps if tag == "epoch" else set(steps)), f"csv {tag}: {steps}"
            assert len(steps) == len(scalars[tag]), f"csv {tag}: {steps}, TensorBoard: {scalars[tag]}"
        # MLflow: the same run, continued to the end (its id kept in the run directory).
        client = MlflowClient(f"sqlite:///{log_dir}/mlflow.db")
        (mlflow_run,) = client.search_runs([client.get_experiment_by_name("sensor-task").experiment_id])
        assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == mlflow_run.info.run_id
        assert mlflow_run.info.status == "FINISHED"
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert mlflow_run.data.metrics["test/mse"] == metrics["test/mse"]
        val_steps = [point.step for point in client.get_metric_history(mlflow_run.info.run_id, "val/mse")]
        assert val_steps == [step for step, _ in scalars["val/mse"]], "epoch 0 before the signal, the rest after"
        log_text = (run_dir / "train.log").read_text()
        assert "Stopped by SIGTERM" in log_text and "Results: val/mse" in log_text, "both runs in the run's train.log"


def wait_for(condition, seconds: float = 120) -> bool:
    """Poll ``condition()`` every 5 ms until it holds (True) or ``seconds`` have passed (False).

    True as soon as one poll saw it hold, not polled again: a condition that held only for a
    moment (a child that showed the command's line until it exec'd) returned False when asked twice.
    """
    deadline = time.time() + seconds
    while not condition():
        if time.time() >= deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("moment", ["checking", "starting"])
def test_ctrl_c_while_the_command_starts_ends_it_with_one_line_and_no_process_left(sensor_data, tmp_path, moment):
    """Ctrl-C in a command's first seconds ends it with status 130, one line and no traceback, and
    leaves no process: before anything is written, or with the run's stop recorded."""
    # While it checks its values (its workers' forkserver is importing; nothing is written yet), or
    # once its run directory exists and before its workers run (the job file is written; torch's
    # agent is about to start them): Python's KeyboardInterrupt would come out as a traceback from
    # wherever it hit.
    log_dir = tmp_path / "logs"
    command = cli_command(TRAIN, *sensor_data, "trainer.accelerator=cpu", "trainer.devices=2", log_dir=log_dir)
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True, preexec_fn=default_sigint)  # fmt: skip
    try:
        if moment == "checking":  # the forkserver starts right after the key check, before the value check's imports
            # At least the command and its forkserver (a child the command forks to run a program, as
            # ctypes' ldconfig, also shows its command line until it execs).
            assert wait_for(lambda: len(processes_mentioning(str(log_dir))) >= 2 or run.poll() is not None)
            assert not (log_dir / "runs").exists()
        else:
            assert wait_for(lambda: any(log_dir.glob("runs/*/.hydra/job.yaml")) or run.poll() is not None)
        os.killpg(run.pid, signal.SIGINT)
        output, errors = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signal.SIGINT, output[-2000:] + errors[-2000:]
    assert wait_for(lambda: processes_mentioning(str(log_dir)) == [], seconds=10), "no process left"
    assert "Traceback" not in output + errors, output[-2000:] + errors[-2000:]
    if moment == "checking":
        assert errors == "Stopped by SIGINT before the run started: no process trained.\n"
        assert output == "" and not (log_dir / "runs").exists(), "nothing written"
    else:
        # The run records its stop, as one stopped later does; the supervisor or its workers (had
        # the agent started them by then) say that there is nothing to resume.
        run_dir = only(log_dir / "runs")
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert (metrics["status"], metrics["signal"]) == ("stopped", "SIGINT")
        assert f"Run {run_dir} stopped by SIGINT: every process has ended." in output
        assert "There is nothing to resume" in output, output[-2000:]


def test_ctrl_c_once_the_run_has_its_results_keeps_them(sensor_data, tmp_path):
    """Ctrl-C just after global rank 0 wrote its test results, while the processes end, keeps the
    completed run's results (the stop's record does not replace them) and says so."""
    log_dir = tmp_path / "logs"
    command = cli_command(TRAIN, *sensor_data, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1",
                          log_dir=log_dir)  # fmt: skip
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True, preexec_fn=default_sigint)  # fmt: skip
    try:
        assert wait_for(lambda: any(log_dir.glob("runs/*/metrics.json")) or run.poll() is not None, seconds=300)
        os.killpg(run.pid, signal.SIGINT)
        output = run.communicate(timeout=60)[0]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    run_dir = only(log_dir / "runs")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # A model that learned: the targets' variance is about 3.5, the MSE of a model that learned nothing.
    assert metrics["status"] == "completed" and metrics["test/mse"] < 0.5, (metrics, output[-2000:])
    # The signal comes while the processes end (status 130, said so) or, on a fast machine, after (0).
    assert run.returncode in (0, 128 + signal.SIGINT), output[-2000:]
    if run.returncode:
        assert f"Run {run_dir} stopped by SIGINT after its task had finished: its results are kept" in output
