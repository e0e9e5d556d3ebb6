"""How DDP runs fail and coexist: a crashing rank, two runs at once, options refused on CPU."""

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, cli_command, cli_env, read_scalars, run_cli

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
