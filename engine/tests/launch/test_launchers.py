"""Launchers that start the processes themselves: torchrun (with an elastic restart) and SLURM's
srun, each running the test task's command (``python -m sensor_task.train``) in every process.

torchrun runs for real (``python -m torch.distributed.run``). SLURM cannot exist here: its
``srun`` is simulated by a script that starts the tasks with the variables srun gives each task,
on one node; everything after that (Lightning's SLURMEnvironment, gloo, the run) is real.
"""

import json
import subprocess

import pytest
import torch
from harness import HERE, cli_command, only, read_scalars, simulated_slurm, torchrun
from runs import TRAIN

pytestmark = pytest.mark.processes

# 600 training windows, 300 per rank in micro-batches of 24: 13 optimizer steps per epoch.
SMALL = ("trainer.accelerator=cpu", "data.global_batch_size=48")
STEPS_PER_EPOCH = 13
# Killed inside epoch 1, 3 steps after its last checkpoint (last.ckpt every 5 steps: step 15).
KILL_STEP, LAST_CHECKPOINT = 18, 15


def test_elastic_restart_resumes_from_the_latest_checkpoint_and_finishes(sensor_data, tmp_path):
    """A rank SIGKILLed under torchrun with a restart left: the restarted attempt resumes from the
    run's latest last.ckpt, in the same run directory, and trains to the configured end."""
    # 3 epochs, last.ckpt every 5 steps; rank 1 kills itself with SIGKILL at KILL_STEP (epoch 1) in
    # the first attempt only.
    record = tmp_path / "record.jsonl"
    result = torchrun(
        TRAIN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
        overrides=(*sensor_data, *SMALL, "trainer.devices=2", "trainer.max_epochs=3",
                   "callbacks.last_checkpoint.train_time_interval=null",
                   "callbacks.last_checkpoint.every_n_train_steps=5",
                   "+callbacks.probe._target_=probes.ElasticProbe", f"+callbacks.probe.record={record}",
                   "+callbacks.probe.kill_rank=1", f"+callbacks.probe.kill_step={KILL_STEP}"),
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    first, killed, second = (json.loads(line) for line in record.read_text().splitlines())
    assert (first["attempt"], first["start_step"]) == (0, 0)
    assert killed == {**killed, "attempt": 0, "killed_step": KILL_STEP}
    # The restarted attempt starts inside epoch 1, at the last checkpoint: only the 3 steps done
    # after it are redone, at most the checkpoint interval.
    assert (second["attempt"], second["start_epoch"], second["start_step"]) == (1, 1, LAST_CHECKPOINT)
    print(f"restart: {second['time'] - killed['time']:.1f} s from the kill to training again; "
          f"{killed['killed_step'] - second['start_step']} steps redone")  # fmt: skip

    run = only(tmp_path / "logs" / "runs")
    assert run.name.startswith("torchrun-"), "one run directory across both attempts"
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 3 * STEPS_PER_EPOCH), "the configured 3 epochs, ended"
    log = (run / "train.log").read_text()
    assert "Restart 1 of this job by its launcher: fit resumes from the run's latest checkpoint" in log
    # Lightning's own line says that it restored the checkpoint: its path, not its words.
    last_ckpt = str(run / "checkpoints" / "last.ckpt")
    assert any(last_ckpt in line and "restor" in line.lower() for line in log.splitlines()), "restored from last.ckpt"
    # A model that learned: the targets' variance is about 3.5, the MSE of a model that learned nothing.
    assert json.loads((run / "metrics.json").read_text())["test/mse"] < 0.5
    # Validation after epochs 0 (first attempt), 1 and 2 (second attempt), then the best checkpoint;
    # Lightning logs an epoch's values at the step index of its last batch.
    val_steps = [STEPS_PER_EPOCH * epoch - 1 for epoch in (1, 2, 3)]
    assert [step for step, _ in read_scalars(run / "tensorboard", steps=True)["val/mse"]][:3] == val_steps


def test_srun_tasks_get_their_ranks_from_slurm(sensor_data, tmp_path):
    """Each task srun starts learns its ranks from SLURM's variables, the rendezvous port comes from
    the job id, and the run is named after the job and step; the overrides are recorded."""
    env = simulated_slurm(tmp_path / "bin", job_id="4242", ntasks=2)
    # The command a batch script runs under srun, on CPU nodes: the layout from SLURM's variables.
    overrides = (*sensor_data, "trainer.accelerator=cpu", "trainer.num_nodes=1", "trainer.devices=2", "strategy=ddp",
                 "trainer.max_epochs=1", "+callbacks.ranks._target_=probes.RankRecorder",
                 "+callbacks.ranks.out_dir=${paths.output_dir}/ranks")  # fmt: skip
    command = [str(tmp_path / "bin" / "srun"), *cli_command(TRAIN, *overrides, log_dir=tmp_path / "logs")]
    result = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
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
