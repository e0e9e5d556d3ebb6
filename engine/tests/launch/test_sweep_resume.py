"""Sweeps that use the whole machine and survive a stop, through the test task's real command line
(1 gloo process per job, the deterministic configuration of runs.py, ``last.ckpt`` every 5 steps).

The three jobs of each sweep differ only in the step where a probe starts to slow them down (job 0
never, jobs 1 and 2 from steps 6 and 7, one second a step, until the test releases them), which
changes nothing they compute: job 0, uninterrupted, is the reference the resumed jobs must equal
bit for bit. Each sweep is stopped by SIGTERM while the slowed jobs train, and continued by the
same command with its ``hydra.sweep.dir``: one after another in the command's process
(``hydra.launcher.n_jobs=1``), and two at a time on this 2-core machine, each job on its own core
(read from ``/proc``). A failing job among parallel ones ends alone. The plan per job
(``ddp_engine.launch.sweep_launcher``) and the machine's slots (``ddp_engine.launch.job_slots``, with
8 faked GPUs) are tested on their own too."""

import csv
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import HERE, cli_command, cli_env, processes_mentioning, read_scalars, run_cli
from omegaconf import OmegaConf
from runs import DETERMINISTIC, TRAIN

from ddp_engine.config.command_line import check_command_line
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.launch.job_slots import DevicePool, cpu_slot_size, jobs_at_a_time, visible_gpus
from ddp_engine.launch.sweep_launcher import JobPlan, PlannedJob, move_aside, parallel_jobs, plan_job

pytestmark = pytest.mark.processes

STEPS = 2 * 21  # DETERMINISTIC: 2 epochs of 21 global batches
SWEEP = (
    *DETERMINISTIC, "trainer.devices=1", "callbacks.last_checkpoint.train_time_interval=null",
    "callbacks.last_checkpoint.every_n_train_steps=5", "+callbacks.pause._target_=probes.PauseAfterStep",
    "+callbacks.pause.marker=${paths.output_dir}/paused", "+callbacks.pause.seconds=1",
)  # fmt: skip
CONTINUE = "Continue the sweep with the same command and hydra.sweep.dir="


def params(job_dir: Path) -> dict:
    return torch.load(job_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder``, with its modification time and bytes."""
    return {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.rglob("*") if path.is_file()}


def status(job_dir: Path) -> str | None:
    path = job_dir / "metrics.json"
    return json.loads(path.read_text()).get("status") if path.is_file() else None


def cores_of(job_dir: Path) -> dict[int, str]:
    """``Cpus_allowed_list`` of each live process of the job (its command and its DDP process), by pid."""
    cores = {}
    for entry in processes_mentioning(str(job_dir)):
        pid = int(entry.split()[0])
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        cores[pid] = next(line.split()[1] for line in lines if line.startswith("Cpus_allowed_list:"))
    return cores


class Sweep:
    """The sweep's command in ``tmp_path``: ``start`` it and ``stop`` it with SIGTERM once ``ready()``."""

    def __init__(self, windows: Path, tmp_path: Path, *extra: str, pause_steps: str = "1000,6,7") -> None:
        self.log_dir, self.dir, self.release = tmp_path / "logs", tmp_path / "logs" / "sweep", tmp_path / "release"
        overrides = (f"data.path={windows}", *SWEEP, f"+callbacks.pause.step={pause_steps}",
                     f"+callbacks.pause.release={self.release}", *extra)  # fmt: skip
        self.command = cli_command(TRAIN, "-m", *overrides, f"hydra.sweep.dir={self.dir}", log_dir=self.log_dir)

    def stop_when(self, ready) -> tuple[int, str]:
        """Start the sweep, send it SIGTERM once ``ready()``; its exit status and output."""
        run = subprocess.Popen(self.command, cwd=HERE, env=cli_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        try:
            deadline = time.time() + 300
            while not ready() and run.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            assert ready(), "the sweep never reached the point to stop it"
            self.seen = {job: cores_of(self.dir / job) for job in ("0", "1", "2")}
            os.kill(run.pid, signal.SIGTERM)
            output = run.communicate(timeout=120)[0]
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
        return run.returncode, output

    def again(self) -> subprocess.CompletedProcess:
        """The same command again, the slowed jobs released."""
        self.release.touch()
        result = subprocess.run(self.command, cwd=HERE, env=cli_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    def summary(self) -> list[tuple[str, str]]:
        rows = list(csv.DictReader((self.dir / "summary.csv").open()))
        for row in rows:
            metrics = json.loads((self.dir / row["job"] / "metrics.json").read_text())
            assert row["test/mse"] == f"{metrics['test/mse']:.4f}", row
        return [(row["job"], row["status"]) for row in rows]


def test_a_stopped_sweep_continues_with_the_same_command(deterministic_data, tmp_path):
    """A sweep run one job after another, stopped by SIGTERM, names how to continue; another sweep
    or a second command into its directory is refused; the same command keeps the completed job
    and resumes the stopped one to what the uninterrupted job computed, bit for bit."""
    sweep = Sweep(deterministic_data, tmp_path, "hydra.launcher.n_jobs=1")
    returncode, output = sweep.stop_when(lambda: (sweep.dir / "1" / "paused").exists())
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .endswith(
            f"{CONTINUE}{sweep.dir}: the completed jobs are kept, this one resumes from its last.ckpt, the others run."
        )
    )
    assert processes_mentioning(str(sweep.log_dir)) == []
    assert (status(sweep.dir / "0"), status(sweep.dir / "1")) == ("completed", "stopped")
    assert not (sweep.dir / "2").exists(), "job 2 never started"
    kept = snapshot(sweep.dir / "0")

    # Another sweep into that directory, with or without ckpt_path=last: refused before anything runs.
    args = sweep.command[3:]  # -m, paths.log_dir, the overrides
    changed = r"this command sets \+callbacks\.pause\.step=1000,6,8, that sweep set \+callbacks\.pause\.step=1000,6,7\."
    with pytest.raises(ConfigValueError, match=rf"holds another sweep: {changed} Its results"):
        check_command_line("config", [arg.replace("step=1000,6,7", "step=1000,6,8") for arg in args])
    with pytest.raises(ConfigValueError, match="ckpt_path=last: a sweep is continued without it"):
        check_command_line("config", [*args, "ckpt_path=last"])
    # The same command twice at once: the second is refused while the first holds the sweep's lock.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; lock = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(lock, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(sweep.dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigValueError, match=rf"{sweep.dir} is in use by another command running this sweep"):
            check_command_line("config", args)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert snapshot(sweep.dir / "0") == kept

    again = sweep.again()
    assert "#0 completed in an earlier run of this sweep" in again.stdout
    assert f"#1 resumes in place from {sweep.dir / '1' / 'checkpoints' / 'last.ckpt'}" in again.stdout
    assert snapshot(sweep.dir / "0") == kept, "the completed job's files are untouched"
    for job in ("1", "2"):
        assert torch.load(sweep.dir / job / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
        for key, value in params(sweep.dir / "0").items():
            assert torch.equal(params(sweep.dir / job)[key], value), (job, key)
    assert sweep.summary() == [("0", "completed"), ("1", "resumed"), ("2", "completed")]


def test_a_parallel_sweep_runs_each_job_on_its_own_core_and_continues_after_a_stop(deterministic_data, tmp_path):
    """Two jobs at a time, each with its processes on a core of its own; stopped by SIGTERM and
    continued, the stopped jobs resume to what the uninterrupted job computed, bit for bit, and
    TensorBoard shows each resumed job's steps once."""
    sweep = Sweep(deterministic_data, tmp_path)

    def ready() -> bool:  # job 0 done, jobs 1 and 2 slowed, mid-epoch
        paused = all((sweep.dir / job / "paused").exists() for job in ("1", "2"))
        return status(sweep.dir / "0") == "completed" and paused

    returncode, output = sweep.stop_when(ready)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "2 jobs at a time, each on its own CPU cores" in output
    assert (
        output.strip()
        .splitlines()[-1]
        .endswith(
            f"{CONTINUE}{sweep.dir}: the completed jobs are kept, the stopped ones resume from their last.ckpt, "
            "the others run."
        )
    )
    # While they ran: each job's command, its workers' forkserver and its DDP process on one core,
    # the two jobs on different ones.
    one, two = sweep.seen["1"], sweep.seen["2"]
    assert len(one) == len(two) == 3, sweep.seen
    assert len(set(one.values())) == len(set(two.values())) == 1, sweep.seen
    assert set(one.values()).isdisjoint(two.values()) and all(cores.isdigit() for cores in one.values()), sweep.seen
    assert processes_mentioning(str(sweep.log_dir)) == []
    assert [status(sweep.dir / job) for job in "012"] == ["completed", "stopped", "stopped"]
    kept = snapshot(sweep.dir / "0")
    assert "[#1] " in output and "[#2] " in output, "each job's lines reach the console, prefixed"

    again = sweep.again()
    assert "#0 completed in an earlier run of this sweep" in again.stdout
    assert snapshot(sweep.dir / "0") == kept, "the completed job's files are untouched"
    for job in ("1", "2"):
        assert f"#{job} resumes in place from" in again.stdout
        assert torch.load(sweep.dir / job / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
        for key, value in params(sweep.dir / "0").items():
            assert torch.equal(params(sweep.dir / job)[key], value), (job, key)
    assert sweep.summary() == [("0", "completed"), ("1", "resumed"), ("2", "resumed")]
    # TensorBoard shows each resumed job once: its points before the checkpoint kept, those after it
    # logged once (the in-place resume's purge step), the same steps as the uninterrupted job's.
    # ("epoch" is logged again at the last step by the validation and test after fit, in any run.)
    reference = read_scalars(sweep.dir / "0" / "tensorboard", steps=True)
    for job in ("1", "2"):
        scalars = read_scalars(sweep.dir / job / "tensorboard", steps=True)
        assert scalars.keys() == reference.keys(), job
        for tag, points in scalars.items():
            steps = [step for step, _ in points]
            assert steps == sorted(steps if tag == "epoch" else set(steps)), (job, tag, steps)
            assert steps == [step for step, _ in reference[tag]], (job, tag)


@pytest.mark.parametrize("phase", ["checks", "start"])
def test_a_parallel_sweep_stopped_before_its_jobs_train_continues_them(deterministic_data, tmp_path, phase):
    """Jobs stopped before they train are recorded stopped, and the same command starts them again."""
    # SIGTERM while the first two jobs' commands check their values (started, no config written yet: each
    # command ends with status 143 before its run records anything), or as they start their
    # processes (the run's config written; they wait before their first step until the sweep runs
    # again, however late the second job starts); the sweep records them stopped either way.
    hold = ("+callbacks.hold._target_=probes.HoldBeforeTraining", f"+callbacks.hold.release={tmp_path / 'release'}")
    sweep = Sweep(deterministic_data, tmp_path, *hold)

    def ready() -> bool:
        started = all(processes_mentioning(str(sweep.dir / job)) for job in ("0", "1"))
        configs = [(sweep.dir / job / ".hydra" / "config.yaml").exists() for job in ("0", "1")]
        return started and (not any(configs) if phase == "checks" else all(configs))

    returncode, output = sweep.stop_when(ready)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert processes_mentioning(str(sweep.log_dir)) == []
    assert [status(sweep.dir / job) for job in "01"] == ["stopped", "stopped"], output[-3000:]
    assert not any((sweep.dir / job / "checkpoints" / "last.ckpt").exists() for job in "01"), "stopped before training"
    assert not (sweep.dir / "2").exists(), "job 2 never started"

    again = sweep.again()
    for job in ("0", "1"):
        assert f"#{job} stopped before its first checkpoint: starts again" in again.stdout, again.stdout[-3000:]
    assert sweep.summary() == [("0", "completed"), ("1", "completed"), ("2", "completed")]


def test_a_parallel_sweep_stopped_in_its_jobs_final_test_continues_them(deterministic_data, tmp_path):
    """Jobs stopped in their final test resume from their last.ckpt straight to the test, and end
    as the uninterrupted jobs would."""
    # SIGTERM while both jobs test their best checkpoint, their training done: each records itself
    # stopped, and the same command resumes each from its last.ckpt, which holds the whole training,
    # straight to the test.
    test_pause = (
        "+callbacks.test_pause._target_=probes.PauseInTest", "+callbacks.test_pause.marker=${paths.output_dir}/testing",
        f"+callbacks.test_pause.release={tmp_path / 'release'}",
    )  # fmt: skip
    sweep = Sweep(deterministic_data, tmp_path, *test_pause, pause_steps="1000,1001")

    def ready() -> bool:
        return all((sweep.dir / job / "testing").exists() for job in ("0", "1"))

    returncode, output = sweep.stop_when(ready)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert processes_mentioning(str(sweep.log_dir)) == []
    assert [status(sweep.dir / job) for job in "01"] == ["stopped", "stopped"], output[-3000:]
    for job in "01":
        assert torch.load(sweep.dir / job / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS

    again = sweep.again()
    # Predicting the mean of the test targets scores their variance: a job that learned scores less.
    with np.load(deterministic_data) as arrays:
        mean_predictor = float(arrays["test_y"].var())
    for job in ("0", "1"):
        assert f"#{job} resumes in place from" in again.stdout, again.stdout[-3000:]
        metrics = json.loads((sweep.dir / job / "metrics.json").read_text())
        assert metrics["status"] == "completed" and 0 < metrics["test/mse"] < mean_predictor, metrics
    assert sweep.summary() == [("0", "resumed"), ("1", "resumed")]
    for key, value in params(sweep.dir / "0").items():
        assert torch.equal(params(sweep.dir / "1")[key], value), key


def test_a_failing_job_among_parallel_jobs_ends_alone(deterministic_data, tmp_path):
    """A job of a parallel sweep whose process is killed fails alone: the others finish, the summary
    names the failure, and the command fails."""
    # Job 1's process SIGKILLs itself at step 3; jobs 0 and 2 (kill steps never reached) finish.
    result = run_cli(
        TRAIN, "-m", f"data.path={deterministic_data}", *DETERMINISTIC, "trainer.devices=1", "trainer.max_epochs=1",
        "+callbacks.kill._target_=probes.ElasticProbe", "+callbacks.kill.record=${paths.output_dir}/record.jsonl",
        "+callbacks.kill.kill_rank=0", "+callbacks.kill.kill_step=1000,3,1001", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 jobs at a time" in result.stdout
    assert processes_mentioning(str(tmp_path)) == []
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "failed"), ("2", "completed")]
    assert rows[1]["error"].startswith("rank 0: "), rows[1]
    assert "killed by SIGKILL" in rows[1]["error"], rows[1]


def test_each_job_of_a_continued_sweep_is_planned_by_its_directory(tmp_path):
    """A continued sweep keeps, resumes, restarts or runs each job by what its directory holds."""

    def job(name, status=None, checkpoint=False):
        folder = tmp_path / name
        folder.mkdir()
        if status:
            (folder / "metrics.json").write_text(json.dumps({"status": status}))
        if checkpoint:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"state")
        return folder

    assert plan_job(job("completed", "completed", checkpoint=True), rerun_failed=True) is JobPlan.KEEP
    failed = job("failed", "failed", checkpoint=True)
    assert plan_job(failed, rerun_failed=False) is JobPlan.KEEP
    assert plan_job(failed, rerun_failed=True) is JobPlan.RESUME
    assert plan_job(job("stopped", "stopped", checkpoint=True), rerun_failed=False) is JobPlan.RESUME
    assert plan_job(job("killed", checkpoint=True), rerun_failed=False) is JobPlan.RESUME, "SIGKILL: no metrics.json"
    early = job("early", "stopped")
    assert plan_job(early, rerun_failed=False) is JobPlan.RESTART
    assert plan_job(tmp_path / "never", rerun_failed=False) is JobPlan.RUN
    # A job stopped before its first checkpoint starts again in an empty directory; what it wrote is kept.
    assert move_aside(early) == tmp_path / ".stopped" / "early.0" and not early.exists()
    early.mkdir()
    assert move_aside(early) == tmp_path / ".stopped" / "early.1"
    assert json.loads((tmp_path / ".stopped" / "early.0" / "metrics.json").read_text()) == {"status": "stopped"}


def test_eight_gpus_and_two_per_job_give_four_jobs_at_a_time_on_disjoint_gpus(monkeypatch):
    """The machine's GPUs are shared out to the jobs running at once, never one GPU to two jobs."""
    # No GPU here: the slot logic is given 8 faked ones, as torch.cuda.device_count() would count them.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pool = DevicePool(visible_gpus(8))
    assert jobs_at_a_time(None, len(pool.free), per_job=2) == 4
    running = [pool.take(2) for _ in range(4)]
    assert running == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")] and pool.take(2) is None
    pool.give_back(running[1])  # job 1 ends: its GPUs go to the next job, and to no other
    assert pool.take(2) == ("2", "3") and pool.take(1) is None
    held = [gpu for slot in (running[0], ("2", "3"), *running[2:]) for gpu in slot]
    assert len(held) == len(set(held)) == 8, "no GPU given to two running jobs"
    # CUDA_VISIBLE_DEVICES of the command: each job sees its share of those, by their names.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert DevicePool(visible_gpus(4)).take(2) == ("3", "5")
    assert jobs_at_a_time(None, 8, per_job=3) == 2 and jobs_at_a_time(1, 8, per_job=2) == 1
    assert jobs_at_a_time(None, 2, per_job=1) == 2 and cpu_slot_size(2, 2) == 1 and cpu_slot_size(16, 3) == 5


@pytest.mark.parametrize(("devices", "n_jobs", "line"), [
    (2, None, "Jobs one after another, in this process: each job runs 2 processes and this machine has 2 CPU cores "
              "(hydra.launcher.n_jobs=2 shares them anyway)."),
    (1, None, "2 jobs at a time, each on its own CPU cores: each job runs 1 process and this machine has 2 CPU cores."),
    (2, 2, "2 jobs at a time, each on its own CPU cores: hydra.launcher.n_jobs=2; each job runs 2 processes and this "
           "machine has 2 CPU cores."),
    (1, 1, "Jobs one after another, in this process: hydra.launcher.n_jobs=1."),
])  # fmt: skip
def test_a_sweep_says_how_many_jobs_run_at_a_time_and_why(monkeypatch, tmp_path, devices, n_jobs, line):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # this machine's 2 cores, wherever it runs
    trainer = {"accelerator": "cpu", "devices": devices}
    config = OmegaConf.create({"trainer": trainer, "launcher": {}, "hydra": {"overrides": {"hydra": []}}})
    planned = [PlannedJob(index, [f"seed={index}"], config, tmp_path / str(index)) for index in range(3)]
    # The launcher's own logger, whatever an earlier test's Hydra did to logging in this process.
    logger, said = logging.getLogger("ddp_engine.launch.sweep_launcher"), []
    handler = logging.Handler()
    handler.emit = said.append
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(handler)
    try:
        runs_side_by_side = parallel_jobs(planned, n_jobs)
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage().strip() for record in said] == [line]
    assert (runs_side_by_side is not None) == line.startswith("2 jobs at a time")
