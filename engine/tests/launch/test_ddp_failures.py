"""How DDP runs fail and coexist: a stalled rank, mismatched collectives, a killed rank, a kill while
saving, two runs at once (the test task's regression, 2 gloo processes); and SyncBatchNorm with NCCL
on a GPU (the image test task's ResNet, whose BatchNorm layers SyncBatchNorm replaces; skipped
without a GPU)."""

import json
import subprocess
import sys
import time

import pytest
import torch
from harness import HERE, cli_command, cli_env, only, processes_mentioning, read_scalars, run_cli
from runs import TRAIN
from vision_task.classifier import make_image_folder

from ddp_engine.distributed.checkpoint_io import AtomicCheckpointIO
from ddp_engine.distributed.failures import TIMEOUT_PATTERN

pytestmark = pytest.mark.processes

# 600 training windows over 2 processes in global batches of 48: 13 optimizer steps per epoch.
QUICK = ("trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", "data.global_batch_size=48")
STEPS_PER_EPOCH = 13


def test_a_stalled_rank_is_named_by_every_ranks_stack(sensor_data, tmp_path):
    """A rank that stops making progress fails the run at strategy.timeout, and every rank's Python
    stack is kept: the waiting one in its AllReduce, the stalled one where it stalled."""
    # Rank 1 stops making progress at step 3 (a deadlock in user code); rank 0 waits for it in the
    # next AllReduce until strategy.timeout (5 s here), then fails.
    result = run_cli(
        TRAIN, *sensor_data, *QUICK, "strategy.timeout.seconds=5",
        "+callbacks.stall._target_=probes.StallOnRank", "+callbacks.stall.rank=1", "+callbacks.stall.step=3",
        log_dir=tmp_path / "logs", timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    run = only(tmp_path / "logs" / "runs")
    stacks = [run / "hang-rank0.txt", run / "hang-rank1.txt"]
    assert f"Every rank's Python stack: {stacks[0]}, {stacks[1]}" in output
    waiting, stalled = (path.read_text() for path in stacks)
    # gloo's own words ("Timed out waiting 5000ms ..."): the timeout configured is the key fragment.
    assert "5000ms" in waiting and "loss.backward" in waiting  # in the gradient AllReduce
    assert "in stall_here_for_an_hour" in stalled and TIMEOUT_PATTERN.search(stalled.splitlines()[0])
    last = result.stdout.strip().splitlines()[-1]
    assert "JobFailedError: rank 0 failed: RuntimeError: " in last and "5000ms" in last, last
    assert not (run / ".stacks").exists()
    assert processes_mentioning(str(tmp_path / "logs")) == [], "a process of the run is still alive"


def test_debug_ddp_names_mismatched_collectives_at_once(sensor_data, tmp_path):
    """With debug=ddp, collectives that differ between ranks fail the run at once, named with their
    operation and shapes."""
    # At step 2, rank 0 AllReduces 3 numbers and rank 1 5: without the checks gloo would wait or
    # mix them up; with debug=ddp torch refuses the pair at once and names the operation and shapes.
    result = run_cli(
        TRAIN, *sensor_data, *QUICK, "debug=ddp",
        "+callbacks.mismatch._target_=probes.MismatchedCollective", "+callbacks.mismatch.step=2",
        log_dir=tmp_path / "logs", timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    # torch's own sentence ("Detected mismatch between collectives on ranks ..."): its key fragments.
    assert "failed: RuntimeError: " in last and "mismatch" in last.lower(), last
    assert "ALLREDUCE" in last and "[3]" in last and "[5]" in last


def test_a_killed_rank_ends_the_job_within_10_seconds_and_the_last_checkpoint_survives(sensor_data, tmp_path):
    """A rank SIGKILLed mid-epoch ends every process within 10 s; the command names it, and the last
    complete checkpoint is kept and named with the command that resumes the run in place."""
    # SIGKILL, as the kernel's OOM killer or a lost node does: no Python cleanup in that process.
    # Rank 1 dies at step KILL_STEP, in epoch 1 of 2; last.ckpt holds epoch 0 (STEPS_PER_EPOCH steps).
    record, kill_step = tmp_path / "record.jsonl", STEPS_PER_EPOCH + 3
    result = run_cli(
        TRAIN, *sensor_data, *(o for o in QUICK if "max_epochs" not in o), "trainer.max_epochs=2",
        "+callbacks.kill._target_=probes.ElasticProbe", f"+callbacks.kill.record={record}",
        "+callbacks.kill.kill_rank=1", f"+callbacks.kill.kill_step={kill_step}", log_dir=tmp_path / "logs",
        timeout=300,
    )  # fmt: skip
    ended = time.time()
    killed = json.loads(record.read_text().splitlines()[-1])
    assert killed["killed_step"] == kill_step and result.returncode != 0
    seconds = ended - killed["time"]
    print(f"rank 1 killed; every process gone {seconds:.1f} s later (exit status {result.returncode})")
    assert seconds < 10
    last = result.stdout.strip().splitlines()[-1]
    assert last.endswith("JobFailedError: rank 1 failed: killed by SIGKILL (exit status -9)"), last
    assert processes_mentioning(str(tmp_path / "logs")) == [], "a process of the run is still alive"
    run = only(tmp_path / "logs" / "runs")
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (0, STEPS_PER_EPOCH)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    output = result.stdout + result.stderr
    assert f"resume this run in place with: {sys.executable} -m {TRAIN} hydra.run.dir={run} ckpt_path=last" in output
    # The checkpoint it names, with the step it holds, as a stop's line names it.
    assert f"Last complete checkpoint: {run / 'checkpoints' / 'last.ckpt'} (global step {STEPS_PER_EPOCH})." in output


# Saves checkpoint A, then B over it through AtomicCheckpointIO; B's save hangs where it flushes
# the file to disk (os.fsync made to hang), so the kill below lands after B's bytes are written and
# before B replaces A: certain timing, where a real kill would land anywhere in the save.
SAVE_THEN_HANG = """
import os, sys, time, torch
from ddp_engine.distributed.checkpoint_io import AtomicCheckpointIO
from ddp_engine.distributed.failures import TIMEOUT_PATTERN
checkpoint_io = AtomicCheckpointIO()
checkpoint_io.save_checkpoint({"weights": torch.ones(1_000_000)}, sys.argv[1])
os.fsync = lambda fd: (print("B written", flush=True), time.sleep(600))
checkpoint_io.save_checkpoint({"weights": torch.zeros(1_000_000)}, sys.argv[1])
"""


def test_a_kill_while_saving_leaves_the_previous_checkpoint_whole(tmp_path):
    """A process killed after a checkpoint's bytes are written, before they replace the previous
    checkpoint, leaves the previous one whole; the next complete save clears the leftover."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    child = subprocess.Popen([sys.executable, "-c", SAVE_THEN_HANG, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "B written\n"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.ones(1_000_000)), "A, whole"
    (leftover,) = [p for p in path.parent.iterdir() if p != path]
    assert leftover.name.startswith(".last.ckpt.") and leftover.name.endswith(".tmp"), "B stayed beside it"
    assert torch.equal(torch.load(leftover, weights_only=True)["weights"], torch.zeros(1_000_000))
    # The next complete save replaces A and clears the killed save's leftover.
    AtomicCheckpointIO().save_checkpoint({"weights": torch.full((3,), 2.0)}, path)
    assert list(path.parent.iterdir()) == [path]
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.full((3,), 2.0))


def test_two_runs_started_at_once_use_different_rendezvous_ports(sensor_data, tmp_path):
    """Two runs started on one machine at the same moment both finish, each on its own port."""
    runs = [
        subprocess.Popen(
            cli_command(TRAIN, *sensor_data, *QUICK, log_dir=tmp_path / name),
            cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in ("a", "b")
    ]  # fmt: skip
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-5000:]
    ports = [json.loads((only(tmp_path / name / "runs") / "ddp.json").read_text())["master_port"] for name in "ab"]
    print("rendezvous ports:", ports)
    assert ports[0] != ports[1]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: SyncBatchNorm and NCCL run only there")
def test_sync_batchnorm_and_nccl_on_a_gpu(tmp_path):
    """On a GPU the image test task's ResNet trains with SyncBatchNorm, NCCL and the fp16 hook in
    effect (read back from the live DDP wrapper), and its rank's peak memory is monitored."""
    images = make_image_folder(tmp_path / "images")
    result = run_cli(
        "vision_task.train", f"data.root={images}", "model=resnet", "trainer.accelerator=gpu", "trainer.devices=1",
        "trainer.max_epochs=1", "trainer.sync_batchnorm=true", "strategy=ddp_nccl", "strategy.comm_hook=fp16",
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = only(tmp_path / "logs" / "runs")
    settings = json.loads(run.joinpath("ddp.json").read_text())
    assert settings["backend"] == "nccl" and settings["sync_batchnorm"] is True
    assert settings["comm_hook"] == "fp16_compress_hook" and settings["static_graph"] is True
    # The GPU's own monitoring: peak memory of the one rank, more than the network's parameters.
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    parameters_mib = sum(value.numel() * value.element_size() for value in state.values()) / 2**20
    (peak_mib,) = read_scalars(run / "tensorboard")["memory/rank_0/peak_mib"]
    assert parameters_mib < peak_mib < 10_000, (parameters_mib, peak_mib)
