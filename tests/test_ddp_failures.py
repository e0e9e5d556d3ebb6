"""How DDP runs fail and coexist: a crashing rank, two runs at once, options refused on CPU."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, cli_command, cli_env, read_scalars, run_cli

from mnist_ddp.checkpoint_io import AtomicCheckpointIO
from mnist_ddp.distributed import check_device_options
from mnist_ddp.errors import ConfigValueError

QUICK = (
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.max_epochs=1",
    "data.val_size=200",
    "data.global_batch_size=64",
)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command:
            found.append(command)
    return found


def test_a_crashing_rank_ends_every_process_within_30_seconds(synthetic_data_dir, tmp_path):
    marker = tmp_path / "failed_at"
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", *QUICK,
        "+callbacks.fail._target_=probes.FailOnRank", "+callbacks.fail.rank=1", "+callbacks.fail.step=3",
        f"+callbacks.fail.marker={marker}", log_dir=tmp_path / "logs", timeout=300,
    )  # fmt: skip
    ended = time.time()
    output = result.stdout + result.stderr
    assert "injected failure on rank 1 at step 3" in output
    assert result.returncode != 0
    seconds = ended - float(marker.read_text())
    print(f"rank 1 raised; every process gone {seconds:.1f} s later (exit status {result.returncode})")
    assert seconds < 30
    assert processes_mentioning(str(tmp_path / "logs")) == [], "a process of the run is still alive"


def test_a_killed_rank_ends_the_job_within_30_seconds_and_the_last_checkpoint_survives(synthetic_data_dir, tmp_path):
    # SIGKILL, as the kernel's OOM killer or a lost node does: no Python cleanup in that process.
    # Rank 1 dies at step 20, in epoch 1 of 2; last.ckpt holds epoch 0 (16 steps).
    record = tmp_path / "record.jsonl"
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", *(o for o in QUICK if "max_epochs" not in o), "trainer.max_epochs=2",
        "+callbacks.kill._target_=probes.ElasticProbe", f"+callbacks.kill.record={record}",
        "+callbacks.kill.kill_rank=1", "+callbacks.kill.kill_step=20", log_dir=tmp_path / "logs", timeout=300,
    )  # fmt: skip
    ended = time.time()
    killed = json.loads(record.read_text().splitlines()[-1])
    assert killed["killed_step"] == 20 and result.returncode != 0
    seconds = ended - killed["time"]
    print(f"rank 1 killed; every process gone {seconds:.1f} s later (exit status {result.returncode})")
    assert seconds < 30
    assert processes_mentioning(str(tmp_path / "logs")) == [], "a process of the run is still alive"
    (run,) = (tmp_path / "logs" / "runs").iterdir()
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (0, 16)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch_000.ckpt", "last.ckpt"]


# Saves checkpoint A, then B over it through AtomicCheckpointIO; B's save hangs where it flushes
# the file to disk (os.fsync made to hang), so the kill below lands after B's bytes are written and
# before B replaces A: certain timing, where a real kill would land anywhere in the save.
SAVE_THEN_HANG = """
import os, sys, time, torch
from mnist_ddp.checkpoint_io import AtomicCheckpointIO
checkpoint_io = AtomicCheckpointIO()
checkpoint_io.save_checkpoint({"weights": torch.ones(1_000_000)}, sys.argv[1])
os.fsync = lambda fd: (print("B written", flush=True), time.sleep(600))
checkpoint_io.save_checkpoint({"weights": torch.zeros(1_000_000)}, sys.argv[1])
"""


def test_a_kill_while_saving_leaves_the_previous_checkpoint_whole(tmp_path):
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


def test_two_runs_started_at_once_use_different_rendezvous_ports(synthetic_data_dir, tmp_path):
    runs = [
        subprocess.Popen(
            cli_command(f"data.data_dir={synthetic_data_dir}", *QUICK, log_dir=tmp_path / name),
            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in ("a", "b")
    ]  # fmt: skip
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-5000:]
    ports = [json.loads(next((tmp_path / name / "runs").iterdir()).joinpath("ddp.json").read_text())["master_port"]
             for name in ("a", "b")]  # fmt: skip
    print("rendezvous ports:", ports)
    assert ports[0] != ports[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.sync_batchnorm=true", "model.net.batch_norm=true"], "trainer.sync_batchnorm=true needs GPUs"),
        (["strategy.process_group_backend=nccl"], "strategy.process_group_backend=nccl needs CUDA devices"),
    ],
)
def test_gpu_only_options_on_cpu_are_refused_before_any_process_launches(
    synthetic_data_dir, tmp_path, overrides, message
):
    result = run_cli(f"data.data_dir={synthetic_data_dir}", *QUICK, *overrides, log_dir=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {message}") and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [], "no run directory, no process"


def test_nccl_and_sync_batchnorm_need_cuda():
    with pytest.raises(ConfigValueError, match="process_group_backend=nccl needs CUDA devices, but this run is on cpu"):
        check_device_options("cpu", "nccl", sync_batchnorm=False)
    with pytest.raises(ConfigValueError, match="sync_batchnorm=true needs GPUs"):
        check_device_options("cpu", None, sync_batchnorm=True)
    check_device_options("cpu", "gloo", sync_batchnorm=False)
    check_device_options("cuda", "nccl", sync_batchnorm=True)
    check_device_options("cuda", "gloo", sync_batchnorm=False)  # gloo also runs on GPUs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: SyncBatchNorm and NCCL run only there")
def test_sync_batchnorm_and_nccl_on_a_gpu(synthetic_data_dir, tmp_path):
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", "trainer.accelerator=gpu", "trainer.devices=1", "trainer.max_epochs=1",
        "data.val_size=200", "data.global_batch_size=64", "trainer.sync_batchnorm=true", "model.net.batch_norm=true",
        "strategy=ddp_nccl", "strategy.comm_hook=fp16", log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = next((tmp_path / "runs").iterdir())
    settings = json.loads(run.joinpath("ddp.json").read_text())
    assert settings["backend"] == "nccl" and settings["sync_batchnorm"] is True
    assert settings["comm_hook"] == "fp16_compress_hook" and settings["static_graph"] is True
    # The GPU's own monitoring: peak memory of the one rank, more than the 0.7 MiB of parameters.
    (peak_mib,) = read_scalars(run / "tensorboard")["memory/rank_0/peak_mib"]
    assert 0.7 < peak_mib < 10_000
