"""Launchers that start the processes themselves: torchrun (with an elastic restart) and SLURM.

torchrun runs for real (``python -m torch.distributed.run``). SLURM cannot exist here: its
``srun`` is simulated by a script that starts the tasks with the variables srun gives each task,
on one node; everything after that (Lightning's SLURMEnvironment, gloo, the run) is real.
"""

import json
import subprocess
import sys

import pytest
import torch
from harness import read_scalars
from helpers import REPO, simulated_slurm, torchrun

pytestmark = pytest.mark.processes

# 1,000 training images, 500 per rank in micro-batches of 32: 16 optimizer steps per epoch.
SMALL = ("trainer.accelerator=cpu", "data.val_size=200", "data.global_batch_size=64")
STEPS_PER_EPOCH = 16


def test_elastic_restart_resumes_from_the_latest_checkpoint_and_finishes(synthetic_data_dir, tmp_path):
    # 3 epochs, last.ckpt every 5 steps; rank 1 kills itself with SIGKILL at step 23 (epoch 1) in
    # the first attempt only.
    record = tmp_path / "record.jsonl"
    result = torchrun(
        "--standalone", "--nproc-per-node=2", "--max-restarts=1",
        overrides=(f"data.data_dir={synthetic_data_dir}", *SMALL, "trainer.devices=2", "trainer.max_epochs=3",
                   "callbacks.last_checkpoint.train_time_interval=null",
                   "callbacks.last_checkpoint.every_n_train_steps=5",
                   "+callbacks.probe._target_=probes.ElasticProbe", f"+callbacks.probe.record={record}",
                   "+callbacks.probe.kill_rank=1", "+callbacks.probe.kill_step=23"),
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    first, killed, second = (json.loads(line) for line in record.read_text().splitlines())
    assert (first["attempt"], first["start_step"]) == (0, 0) and killed == {**killed, "attempt": 0, "killed_step": 23}
    # The restarted attempt starts inside epoch 1, at the last checkpoint (step 20): only the 3
    # steps done after it are redone, at most the checkpoint interval.
    assert (second["attempt"], second["start_epoch"], second["start_step"]) == (1, 1, 20)
    print(f"restart: {second['time'] - killed['time']:.1f} s from the kill to training again; "
          f"{killed['killed_step'] - second['start_step']} steps redone")  # fmt: skip

    (run,) = (tmp_path / "logs" / "runs").iterdir()
    assert run.name.startswith("torchrun-"), "one run directory across both attempts"
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 3 * STEPS_PER_EPOCH), "the configured 3 epochs, ended"
    log = (run / "train.log").read_text()
    assert "Restart 1 of this job by its launcher: fit resumes from the run's latest checkpoint" in log
    # Lightning's own line says that it restored the checkpoint: its path, not its words.
    last_ckpt = str(run / "checkpoints" / "last.ckpt")
    assert any(last_ckpt in line and "restor" in line.lower() for line in log.splitlines()), "restored from last.ckpt"
    assert json.loads((run / "metrics.json").read_text())["test/acc"] > 0.9
    # Validation after epochs 0 (first attempt), 1 and 2 (second attempt), then the best checkpoint;
    # Lightning logs an epoch's values at the step index of its last batch.
    val_steps = [STEPS_PER_EPOCH * epoch - 1 for epoch in (1, 2, 3)]
    assert [step for step, _ in read_scalars(run / "tensorboard", steps=True)["val/acc"]][:3] == val_steps


def test_sbatch_script_runs_under_simulated_slurm(synthetic_data_dir, tmp_path):
    # On CPU: the script's own knobs for CPU nodes; the rest is the script as users submit it.
    knobs = {"PYTHON": sys.executable, "ACCELERATOR": "cpu", "STRATEGY": "ddp", "DATA_DIR": str(synthetic_data_dir)}
    env = {**simulated_slurm(tmp_path / "bin", job_id="4242", ntasks=2), **knobs}
    overrides = [f"paths.log_dir={tmp_path / 'logs'}", "trainer.max_epochs=1", "data.val_size=200",
                 "data.global_batch_size=64", "+callbacks.ranks._target_=probes.RankRecorder",
                 "+callbacks.ranks.out_dir=${paths.output_dir}/ranks"]  # fmt: skip
    result = subprocess.run(
        ["bash", str(REPO / "slurm" / "train.sbatch"), *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = tmp_path / "logs" / "runs" / "slurm-4242.0"
    ranks = sorted((json.loads(p.read_text()) for p in (run / "ranks").iterdir()), key=lambda r: r["global_rank"])
    assert [(r["global_rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 2), (1, 1, 0, 2)
    ]  # fmt: skip
    # Lightning's SLURMEnvironment picked the rendezvous port from the job id: 15000 + its last 4 digits.
    assert json.loads((run / "ddp.json").read_text())["master_port"] == 15000 + 4242
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
