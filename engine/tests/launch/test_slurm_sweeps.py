"""SLURM sweeps (``hydra/launcher=slurm``), as far as they run without SLURM.

SLURM cannot exist here. What runs for real: submitit's local executor (``hydra/launcher=slurm_local``)
runs the test task's sweeps through the real command line, one submitit job of 2 tasks (2 gloo DDP
processes, started by submitit, which run the engine's SLURM path) per sweep job; submitit's own signal
(SIGUSR2) reaches the tasks of a job; and the sweep is continued. What stands in for the cluster:
a fake ``scontrol`` that records its arguments (the requeue), and a fake ``srun`` on PATH that is
never run, without which submitit refuses to build the batch script of its SLURM executor.
"""

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import HERE, cli_command, cli_env, processes_mentioning, ranks_in_log, run_cli
from hydra.utils import instantiate
from runs import DETERMINISTIC, TRAIN

from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.compose import composed_jobs
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.launch.slurm_launcher import slurm_variables_of_local_task

TINY = ("trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", "data.global_batch_size=48",
        "logger=[csv]")  # fmt: skip


def submitit_jobs(sweep_dir: Path) -> list[str]:
    """The ids of the submitit jobs of a sweep: its folders in ``.submitit/`` (``%j`` is submitit's own)."""
    return sorted(path.name for path in (sweep_dir / ".submitit").iterdir() if path.name.isdigit())


def submitted(output: str) -> dict[str, str]:
    """Job number -> submitit job id, from the launcher's log lines (``#<n> : submitit job <id> (<dir>)``)."""
    return dict(re.findall(r"#(\d+) : submitit job (\d+) \(", output))


@pytest.mark.processes
def test_a_sweep_runs_each_job_as_one_submitit_job_of_two_ddp_tasks(windows, tmp_path):
    """Each job of a slurm_local sweep is one submitit job of 2 tasks, which form one DDP run with
    SLURM's ranks and a port from the submitit job's id; the summary shows each job's result."""
    sweep = tmp_path / "logs" / "sweep"
    result = run_cli(
        TRAIN, "-m", "hydra/launcher=slurm_local", f"data.path={windows}", *TINY, f"hydra.sweep.dir={sweep}",
        "model.optimizer.lr=0.001,0.003", log_dir=tmp_path / "logs", timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    jobs = submitted(output)
    # Predicting the mean of the validation targets scores their variance: a job that learned scores less.
    with np.load(windows) as arrays:
        mean_predictor = float(arrays["val_y"].var())
    # One submitit job per sweep job, each with its 2 tasks' results (global ranks 0 and 1).
    assert sorted(jobs) == ["0", "1"] and sorted(jobs.values()) == submitit_jobs(sweep)
    for number, lr in (("0", 0.001), ("1", 0.003)):
        job_dir, folder = sweep / number, sweep / ".submitit" / jobs[number]
        assert sorted(path.name for path in folder.glob("*_result.pkl")) == [
            f"{jobs[number]}_0_result.pkl",
            f"{jobs[number]}_1_result.pkl",
        ]
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert metrics["status"] == "completed" and metrics["world_size"] == 2
        assert f"model.optimizer.lr={lr}" in metrics["overrides"] and 0 < metrics["val/mse"] < mean_predictor
        assert ranks_in_log(job_dir) == {0, 1}
        # The ranks ran Lightning's SLURMEnvironment with the submitit job's id as SLURM's: it
        # derives the rendezvous port from the job id (15000 + its last 4 digits).
        assert json.loads((job_dir / "ddp.json").read_text())["master_port"] == 15000 + int(jobs[number][-4:])
        assert (job_dir / "checkpoints" / "last.ckpt").is_file()
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [(row["job"], row["status"], row["overrides"].split()[-1]) for row in rows] == [
        ("0", "completed", "model.optimizer.lr=0.001"),
        ("1", "completed", "model.optimizer.lr=0.003"),
    ]
    for row in rows:
        assert row["val/mse"] == f"{json.loads((sweep / row['job'] / 'metrics.json').read_text())['val/mse']:.4f}"


def sbatch_script(tmp_path: Path, monkeypatch, *overrides: str) -> str:
    """The batch script that ``hydra/launcher=slurm`` would submit for the 2-job sweep of ``overrides``."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")  # never run: submitit only looks for it on PATH
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    # The data: a file on the cluster's shared filesystem, which the submitting machine need not read.
    args = ["-m", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}", "data.path=/shared/windows.npz",
            *overrides, "seed=1,2"]  # fmt: skip
    (job, _) = composed_jobs("config", args)
    launcher = instantiate(job.cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=job.cfg)
    return launcher.sbatch_script(job_count=2)


def test_the_slurm_preset_submits_one_array_task_per_job_with_one_task_per_gpu(tmp_path, monkeypatch):
    """The batch script of hydra/launcher=slurm: one array task per job, one SLURM task per GPU on
    each node, requeueable, with submitit's signal before the time limit."""
    script = sbatch_script(
        tmp_path, monkeypatch, "trainer.accelerator=gpu", "trainer.devices=4", "trainer.num_nodes=2",
        "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=90", "hydra.launcher.cpus_per_task=8",
    )  # fmt: skip
    flags = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    folder = tmp_path / "sweep" / ".submitit"
    assert flags == [
        "#SBATCH --array=0-1%2",  # one SLURM job (array task) per sweep job
        "#SBATCH --cpus-per-task=8",
        f"#SBATCH --error={folder}/%A_%a/%A_%a_0_log.err",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --job-name=train",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",  # one task per DDP process: SLURM starts the ranks
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={folder}/%A_%a/%A_%a_0_log.out",
        "#SBATCH --partition=gpu",
        "#SBATCH --requeue",  # scontrol requeue needs a requeueable job
        "#SBATCH --signal=USR2@120",  # submitit's signal, which the engine's requeue acts on
        "#SBATCH --time=90",
        "#SBATCH --wckey=submitit",
    ]
    (command,) = [line for line in script.splitlines() if line.startswith("srun ")]
    # Each task's own log, in the array task's folder of the sweep's .submitit/.
    assert command.startswith(f"srun --unbuffered --output {folder}/%A_%a/%A_%a_%t_log.out --error {folder}/%A_%a/")
    assert command.endswith(f"-u -m submitit.core._submit {folder}/%j")


def test_cpu_nodes_get_no_gpus_and_the_signal_follows_its_delay(tmp_path, monkeypatch):
    """On CPU nodes the batch script asks for no GPU and no partition, and sends the signal
    hydra.launcher.signal_delay_s before the limit."""
    script = sbatch_script(tmp_path, monkeypatch, "trainer.accelerator=cpu", "trainer.devices=3",
                           "hydra.launcher.signal_delay_s=300")  # fmt: skip
    assert "#SBATCH --ntasks-per-node=3" in script and "#SBATCH --signal=USR2@300" in script
    flags = [line.split("=")[0] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert not [flag for flag in flags if "gpu" in flag] and "#SBATCH --partition" not in flags


def test_the_local_adapter_gives_each_task_the_variables_srun_would():
    """Each task of a local submitit job gets the SLURM variables srun would give it."""
    # What submitit's local controller sets in task 1 of a 2-task job whose controller is pid 4321.
    local = {"SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_ID": "4321", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
             "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1"}  # fmt: skip
    assert slurm_variables_of_local_task(local) == {
        "SLURM_JOB_ID": "4321", "SLURM_JOB_NAME": "submitit-local", "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
        "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_NODELIST": "127.0.0.1",
    }  # fmt: skip


#: Of 21 steps (1 epoch of DETERMINISTIC's): global rank 0 of job 1 sends submitit's signal to every
#: task of its job at the start of this step.
SIGNAL_AT = 5


@pytest.mark.processes
def test_submitits_signal_saves_and_requeues_once_and_the_continued_sweep_resumes_in_place(
    deterministic_data, tmp_path
):
    """Job 0 trains uninterrupted; job 1, the same run, gets SIGUSR2 in step SIGNAL_AT, as SLURM
    sends it before a time limit or a preemption: the engine's handler (not submitit's) saves
    last.ckpt at the next optimizer step and runs ``scontrol requeue`` once. Without SLURM nothing
    runs it again: the same sweep command continues it, in place, to what job 0 computed."""
    bin_dir, sweep = tmp_path / "bin", tmp_path / "logs" / "sweep"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {bin_dir / "scontrol.log"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    command = cli_command(
        TRAIN, "-m", "hydra/launcher=slurm_local", f"data.path={deterministic_data}", *DETERMINISTIC,
        "trainer.max_epochs=1",
        "trainer.devices=2", "logger=[csv]", "callbacks.last_checkpoint.train_time_interval=null",
        f"hydra.sweep.dir={sweep}",
        "+callbacks.signal._target_=probes.SignalJobTasks", "+callbacks.signal.marker=${paths.output_dir}/signalled",
        f"+callbacks.signal.step=1000,{SIGNAL_AT}", log_dir=tmp_path / "logs",
    )  # fmt: skip

    first = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-5000:]
    jobs = submitted(output)
    job1 = sweep / "1"
    # Requeued once, by global rank 0 of job 1, with its job id.
    assert (bin_dir / "scontrol.log").read_text() == f"requeue {jobs['1']}\n"
    state = torch.load(job1 / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] in (SIGNAL_AT + 1, SIGNAL_AT + 2) and state["epoch"] == 0
    assert (
        f"SLURM's requeue signal SIGUSR2 in epoch 0 at global step {state['global_step']}: saved "
        f"{job1 / 'checkpoints' / 'last.ckpt'}. Requeued SLURM job {jobs['1']} (scontrol requeue)"
    ) in (job1 / "train.log").read_text()
    assert not list(job1.rglob("hpc_ckpt_*.ckpt")), "Lightning's own requeue handler did not run"
    for task in (0, 1):  # submitit's handler did not run either (it logs the signal), and no task restarted
        log = (sweep / ".submitit" / jobs["1"] / f"{jobs['1']}_{task}_log.err").read_text()
        log += (sweep / ".submitit" / jobs["1"] / f"{jobs['1']}_{task}_log.out").read_text()
        assert "Caught signal" not in log and log.count("Starting with JobEnvironment") == 1, log[-3000:]
    assert f"#1 (submitit job {jobs['1']}) ended without completing" in output
    assert json.loads((job1 / "metrics.json").read_text())["status"] == "stopped"
    assert json.loads((sweep / "0" / "metrics.json").read_text())["status"] == "completed"
    kept = {path: path.stat().st_mtime_ns for path in (sweep / "0").rglob("*")}

    again = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-5000:]
    assert "#0 completed in an earlier run of this sweep" in output and f"#1 resumes in place from {job1}" in output
    assert list(submitted(output)) == ["1"], "only the stopped job is submitted again"
    assert len(submitit_jobs(sweep)) == 3
    assert {path: path.stat().st_mtime_ns for path in (sweep / "0").rglob("*")} == kept
    assert (bin_dir / "scontrol.log").read_text() == f"requeue {jobs['1']}\n", "no second requeue"
    whole, resumed = (torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True) for job in "01")
    assert (resumed["epoch"], resumed["global_step"]) == (whole["epoch"], whole["global_step"]) == (0, 21)
    for key, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "resumed")]
    assert rows[0]["test/mse"] == rows[1]["test/mse"]


def test_the_check_before_launch_leaves_the_nodes_devices_to_the_cluster(tmp_path):
    """A SLURM sweep's check on the submitting machine leaves the nodes' devices and data to them,
    and still refuses several nodes without a launcher and trainer.devices=auto."""
    # The submitting machine (here: no GPU) runs none of the jobs: 2 nodes of 4 GPUs pass there.
    gpus = ["-m", "trainer.accelerator=gpu", "trainer.devices=4", "trainer.num_nodes=2", f"paths.log_dir={tmp_path}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}", "data.path=/nowhere/on/this/machine.npz", "seed=1,2"]  # fmt: skip
    check_command_line("config", ["hydra/launcher=slurm", *gpus])
    with pytest.raises(ConfigValueError, match="trainer.num_nodes=2: a run on several machines needs a launcher"):
        check_command_line("config", gpus)
    with pytest.raises(ConfigValueError, match=r"trainer.devices=auto: hydra/launcher=slurm submits each job with"):
        check_command_line("config", ["hydra/launcher=slurm", *gpus, "trainer.devices=auto"])


@pytest.mark.processes
def test_the_local_tasks_stop_when_the_sweeps_command_is_killed_and_the_sweep_continues(windows, tmp_path):
    """The tasks of a local submitit job stop within seconds of a SIGKILL of the sweep's command,
    and the same command continues the sweep, training the job once."""
    # submitit's local tasks are children of its controller, not of the command: they watch the
    # command (core.lifetime.stop_with_process), else they would train on, and the continue would
    # train the same jobs a second time into the same directories.
    sweep = tmp_path / "logs" / "sweep"
    paused = ("+callbacks.pause._target_=probes.PauseAfterStep", "+callbacks.pause.step=3",
              "+callbacks.pause.seconds=5", "+callbacks.pause.marker=${paths.output_dir}/paused",
              f"+callbacks.pause.release={tmp_path / 'release'}")  # fmt: skip
    command = cli_command(TRAIN, "-m", "hydra/launcher=slurm_local", f"data.path={windows}", *TINY, *paused,
                          f"hydra.sweep.dir={sweep}", log_dir=tmp_path / "logs")  # fmt: skip
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 240
        while not (sweep / "0" / "paused").exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert (sweep / "0" / "paused").exists(), "the job never reached its step 3"
        os.kill(run.pid, signal.SIGKILL)  # the command alone, as the OOM killer would
        run.wait(timeout=30)
        # Paused 5 s a step, an orphan would train on for over a minute: the tasks stop within seconds.
        deadline = time.time() + 15
        while processes_mentioning(str(sweep)) and time.time() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(sweep)) == [], "a task outlived the sweep's command"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
    (tmp_path / "release").touch()
    result = subprocess.run(command, cwd=HERE, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert json.loads((sweep / "0" / "metrics.json").read_text())["status"] == "completed"
    log = (sweep / "0" / "train.log").read_text()
    assert log.count("Epoch 0 done") == 1, "the job trained its epoch once, after the continue"
