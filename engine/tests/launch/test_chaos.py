"""Chaos test: one fault per trial, at a seeded random rank, step and phase, into real runs.

Each trial starts a real run of the test task through the command line (2 or 3 gloo processes)
on its sensor windows, injects one fault (an exception in a rank, SIGKILL or SIGTERM to a worker or
to the supervisor) at one phase, and checks what a user on a shared cluster relies on:

- no process of the run is alive 10 s after the fault (``/proc`` scanned for every process whose
  command line names the run's log folder: the supervisor and each worker);
- the command's exit status is non-zero, and its last error line names what failed;
- every checkpoint on disk loads with ``weights_only=True``, and nothing but hidden temporary
  files of a cut-off save is beside them (none is taken for a checkpoint).

The trial table (fault, phase, seconds until every process was gone) is printed; run with
``-s`` to see it.
"""

import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from harness import HERE, cli_command, cli_env, processes_mentioning
from runs import TRAIN

from sensor_task.regression import make_sensor_windows

pytestmark = pytest.mark.processes

# 400 training windows in global batches of 48 (24 per process at 2, 16 at 3): 9 optimizer steps
# per epoch (the last one short); 2 epochs, so that a fault in epoch 1 finds epoch 0's last.ckpt.
RUN = ("trainer.accelerator=cpu", "trainer.max_epochs=2", "data.global_batch_size=48",
       "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false")  # fmt: skip
STEPS_PER_EPOCH = 9
SECONDS_TO_END = 10


@dataclass
class Trial:
    phase: str  # start-up, setup, train, validation, checkpoint, test
    action: str  # raise, sigkill, sigterm, sigkill_supervisor, sigterm_supervisor
    world_size: int = 2


# Each kind of fault in a worker and a SIGKILL of the command, over the phases; ranks and steps
# drawn below. A rank killed or raising while training, a kill while a checkpoint is written,
# SIGTERM and SIGINT to the command and a failed job of a sweep have tests of their own
# (test_ddp_failures.py, test_interrupts.py, test_sweep_resume.py).
TRIALS = [
    Trial("start-up", "sigkill"),
    Trial("setup", "raise"),
    Trial("train", "sigkill_supervisor"),
    Trial("validation", "sigterm"),
    Trial("test", "raise", world_size=3),
]


@pytest.fixture(scope="module")
def chaos_windows(tmp_path_factory) -> Path:
    """400 training, 200 validation and 150 test windows."""
    return make_sensor_windows(tmp_path_factory.mktemp("chaos") / "windows.npz", n_train=400, n_val=200, n_test=150)


def run_processes(scope: list[str]) -> list[str]:
    """``pid command line`` of each live process whose command line holds every string of ``scope``."""
    return [line for line in processes_mentioning(scope[0]) if all(text in line for text in scope)]


def expected_last_line(trial: Trial, rank: int) -> str:
    """What the command's last error line must name."""
    if trial.action == "raise":
        return f"rank {rank} failed: RuntimeError: injected fault in {trial.phase} on rank {rank}"
    if trial.action == "sigkill":
        return f"rank {rank} failed: killed by SIGKILL"
    if trial.action == "sigterm":
        return f"rank {rank} failed: stopped by SIGTERM (exit status 143)"
    return "stopped by SIGTERM: every process has ended."  # sigterm_supervisor


def run_trial(trial: Trial, rng: random.Random, windows: Path, tmp: Path) -> dict:
    rank = rng.randrange(trial.world_size)
    # In epoch 1 for a training fault (epoch 0's checkpoint exists), else the phase's first time.
    step = STEPS_PER_EPOCH + rng.randrange(STEPS_PER_EPOCH) if trial.phase == "train" else 0
    marker, log_dir = tmp / "fault.json", tmp / "logs"
    overrides = [f"data.path={windows}", *RUN, f"trainer.devices={trial.world_size}"]
    if trial.phase != "start-up":
        overrides += [
            "+callbacks.fault._target_=probes.Fault", f"+callbacks.fault.phase={trial.phase}",
            f"+callbacks.fault.action={trial.action}", f"+callbacks.fault.marker={marker}",
            f"+callbacks.fault.step={step}", f"+callbacks.fault.rank={rank}",
        ]  # fmt: skip
    command = cli_command(TRAIN, *overrides, log_dir=log_dir)
    scope = [str(log_dir)]  # the processes that must end: the run's
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "output.txt", "w") as output:
        run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=output, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 180
        if trial.phase == "start-up":
            # Right after the workers start (forked from the forkserver), before any process group exists.
            while len(workers := processes_mentioning(f"ddp_engine.launch.worker {log_dir}")) < trial.world_size:
                assert time.time() < deadline and run.poll() is None, "the workers never started"
                time.sleep(0.02)
            os.kill(int(sorted(workers)[rank].split()[0]), signal.SIGKILL)
            fault_time = time.time()
        else:
            while not marker.exists():
                assert time.time() < deadline and run.poll() is None, (tmp / "output.txt").read_text()[-3000:]
                time.sleep(0.02)
            fault_time = json.loads(marker.read_text())["time"]
        while run_processes(scope) and time.time() - fault_time < 60:
            time.sleep(0.05)
        seconds, left = time.time() - fault_time, run_processes(scope)
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for line in processes_mentioning(str(log_dir)):  # never leave one behind, even on failure
            os.kill(int(line.split()[0]), signal.SIGKILL)
    output = (tmp / "output.txt").read_text()
    return {"rank": rank, "step": step, "output": output, "status": run.returncode, "seconds": seconds,
            "left": left, "log_dir": log_dir}  # fmt: skip


def check_checkpoints(log_dir: Path) -> str:
    """Every checkpoint of the run loads with weights_only=True; only hidden temporaries beside them."""
    found = []
    for folder in log_dir.rglob("checkpoints"):
        for path in folder.iterdir():
            if path.suffix == ".ckpt":
                state = torch.load(path, weights_only=True, map_location="cpu")
                found.append(f"{path.name}@{state['global_step']}")
            else:
                assert path.name.startswith(".") and path.name.endswith(".tmp"), f"unexpected file {path}"
    return " ".join(sorted(found)) or "-"


def test_every_fault_ends_every_process_within_10_seconds(chaos_windows, tmp_path):
    """Whatever the fault, phase and rank, every process of the run is gone within 10 s, the command
    fails naming what failed, and every checkpoint left on disk loads."""
    rng = random.Random(20261201)
    rows, problems = [], []
    for number, trial in enumerate(TRIALS):
        result = run_trial(trial, rng, chaos_windows, tmp_path / f"trial{number}")
        lines = [line for line in result["output"].splitlines() if line.strip()]
        last_error = next((line for line in reversed(lines) if "[ERROR]" in line or "[WARNING]" in line), "")
        checkpoints = check_checkpoints(result["log_dir"])
        rows.append(
            f"{number:>2}  {trial.phase:<10}  {trial.action:<18}  {trial.world_size:>5}  "
            f"rank {result['rank']}  step {result['step']:>2}  exit {result['status']:>4}  "
            f"{result['seconds']:5.1f} s  {checkpoints}"
        )
        what = f"trial {number} ({trial}, rank {result['rank']}, step {result['step']})"
        if result["left"]:
            problems.append(f"{what}: still alive after {result['seconds']:.0f} s: {result['left']}")
        elif result["seconds"] > SECONDS_TO_END:
            problems.append(f"{what}: processes ended only {result['seconds']:.1f} s after the fault")
        if result["status"] == 0:
            problems.append(f"{what}: exit status 0")
        if trial.action == "sigkill_supervisor":
            if result["status"] != -signal.SIGKILL:
                problems.append(f"{what}: exit status {result['status']}, not -9")
        elif expected_last_line(trial, result["rank"]) not in last_error:
            problems.append(f"{what}: last error line {last_error!r}\n{result['output'][-3000:]}")
    print(
        "\ntrial  phase  fault  world size  rank  step  exit status  seconds until every process was gone  checkpoints"
    )
    print("\n".join(rows))
    assert not problems, "\n".join(problems)
