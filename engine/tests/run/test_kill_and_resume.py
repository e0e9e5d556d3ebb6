"""Resuming inside an epoch, exactly, on another number of processes, with DataLoader workers, from
a checkpoint without a data position, and after a SLURM requeue; and the resumes that are refused.

Every run trains the deterministic configuration of the test task (runs.DETERMINISTIC: 2 epochs of
21 global batches of 48) with ``last.ckpt`` rewritten every 5 optimizer steps. A rank is SIGKILLed
(as the OOM killer or a lost node would) at a seeded random step between two of those checkpoints;
the run is resumed from its ``last.ckpt`` through the real command line, and compared with the
uninterrupted run: parameters, and which samples were trained in each epoch (the sample recorder's
ledger: each training sample exactly once per epoch across the kill and the resume). A SLURM
requeue (its signal before a time limit, the requeue, the job's second run) runs the training under
simulated ``srun`` and ``scontrol`` (harness.simulated_slurm): the cluster is the one thing simulated.
"""

import json
import random
import signal
import subprocess

import pytest
import torch
from harness import HERE, cli_command, run_cli, simulated_slurm
from runs import DETERMINISTIC, GLOBAL_BATCH, TRAIN, TRAIN_SIZE, VAL_SIZE

pytestmark = pytest.mark.processes

CHECKPOINT_EVERY = 5
STEPS_PER_EPOCH = TRAIN_SIZE // GLOBAL_BATCH  # 21
EVERY_5_STEPS = ("callbacks.last_checkpoint.train_time_interval=null",
                 f"callbacks.last_checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
                 "+callbacks.val_counter._target_=probes.ValidationCounter",
                 "+callbacks.val_counter.out_dir=${paths.output_dir}/samples")  # fmt: skip
DROPOUT = "model.net.dropout=0.5"
# Float32 sums in another order on another world size: equal to rounding, not bit for bit.
PARAM_ATOL = 1e-5

rng = random.Random(16)
# In epoch 0 between the checkpoints of steps 10 and 15; in epoch 1 between 25 and 30.
KILL_2 = rng.randrange(11, 15)
KILL_3 = rng.randrange(26, 30)
# SLURM's requeue signal: sent by rank 1 at its step REQUEUE_AT (epoch 0) to both tasks.
REQUEUE_AT = rng.randrange(3, 17)


@pytest.fixture(scope="module")
def runs(deterministic_data, tmp_path_factory):
    """``runs(name, *overrides, expect=0)``: the deterministic configuration run once per name:
    ``(its run directory, the command's result)``."""
    done = {}

    def run(name, *overrides, expect=0):
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            result = run_cli(TRAIN, f"data.path={deterministic_data}", *DETERMINISTIC, *EVERY_5_STEPS, *overrides,
                             log_dir=log_dir)  # fmt: skip
            assert result.returncode == expect, f"{name}:\n" + result.stdout[-3000:] + result.stderr[-3000:]
            (run_dir,) = (log_dir / "runs").iterdir()
            done[name] = (run_dir, result)
        return done[name]

    return run


def killed(runs, name, devices, step):
    """A run whose rank 1 SIGKILLs itself at ``step``; returns its last.ckpt."""
    run_dir, result = runs(
        name, f"trainer.devices={devices}", "+callbacks.kill._target_=probes.ElasticProbe",
        "+callbacks.kill.record=${paths.output_dir}/record.jsonl", "+callbacks.kill.kill_rank=1",
        f"+callbacks.kill.kill_step={step}", expect=1,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1].endswith("rank 1 failed: killed by SIGKILL (exit status -9)")
    return run_dir / "checkpoints" / "last.ckpt"


def killed_with_workers(runs):
    """A 2-process run with 2 DataLoader workers each whose rank 1 SIGKILLs itself at KILL_3, inside
    epoch 1: its run directory (its epoch_000.ckpt is the best checkpoint so far, of epoch 0's end)."""
    run_dir, result = runs(
        "killed2_workers", "trainer.devices=2", "data.num_workers=2", "+callbacks.kill._target_=probes.ElasticProbe",
        "+callbacks.kill.record=${paths.output_dir}/record.jsonl", "+callbacks.kill.kill_rank=1",
        f"+callbacks.kill.kill_step={KILL_3}", expect=1,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1].endswith("rank 1 failed: killed by SIGKILL (exit status -9)")
    return run_dir


def params(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def ledger(runs_with_world_and_last_step, epoch):
    """Training-sample indices of ``epoch`` over all ranks, from the sample recorder of each
    ``(run directory, world size, last step)``, keeping each run's batches trained before its last
    step (those its checkpoint kept)."""
    trained = []
    for run_dir, world, last_step in runs_with_world_and_last_step:
        for rank in range(world):
            path = run_dir / "samples" / f"rank{rank}_epoch{epoch}.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    record = json.loads(line)
                    if record["step"] < last_step:
                        trained += record["indices"]
    return trained


@pytest.mark.parametrize(
    ("saved_by", "resumed_by", "kill_step"), [(2, 3, KILL_2), (3, 2, KILL_3)], ids=["2to3", "3to2"]
)
def test_a_checkpoint_resumes_on_another_world_size_at_the_same_global_batch(runs, saved_by, resumed_by, kill_step):
    """A checkpoint of 2 (3) processes resumes on 3 (2) to the uninterrupted run's parameters, each
    training sample once per epoch."""
    full, _ = runs("full", "trainer.devices=2")
    checkpoint = killed(runs, f"killed{saved_by}", saved_by, kill_step)
    saved_step = torch.load(checkpoint, weights_only=True)["global_step"]
    resumed, _ = runs(f"resumed{saved_by}to{resumed_by}", f"trainer.devices={resumed_by}", f"ckpt_path={checkpoint}")
    difference = max((params(full)[key] - params(resumed)[key]).abs().max().item() for key in params(full))
    print(f"{saved_by} -> {resumed_by} processes from step {saved_step}: max |parameter difference| {difference:.3g}")
    assert difference < PARAM_ATOL
    for epoch in (0, 1):
        trained = [
            *ledger([(checkpoint.parent.parent, saved_by, saved_step)], epoch),
            *ledger([(resumed, resumed_by, 10**9)], epoch),
        ]
        assert sorted(trained) == list(range(TRAIN_SIZE)), f"epoch {epoch}"


def test_a_resume_with_dataloader_workers_trains_the_uninterrupted_runs_samples(runs):
    """With DataLoader workers, a resume from an epoch's end or inside an epoch trains the
    uninterrupted run's samples, bit-identical: the workers fetch ahead only once the sampler knows
    its epoch."""
    full, _ = runs("full", "trainer.devices=2")
    run_dir = killed_with_workers(runs)
    inside, epoch_end = run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "epoch_000.ckpt"
    assert torch.load(inside, weights_only=True)["global_step"] == KILL_3 // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    assert torch.load(epoch_end, weights_only=True)["SensorDataModule"]["train_position"]["samples"] == TRAIN_SIZE
    for name, checkpoint in (("from_epoch_end", epoch_end), ("from_inside", inside)):
        resumed, _ = runs(f"workers_{name}", "trainer.devices=2", "data.num_workers=2", f"ckpt_path={checkpoint}")
        last = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
        assert last["global_step"] == 2 * STEPS_PER_EPOCH, name
        for key, value in params(full).items():
            assert torch.equal(params(resumed)[key], value), (name, key)
        saved_step = torch.load(checkpoint, weights_only=True)["global_step"]
        trained = ledger([(run_dir, 2, saved_step), (resumed, 2, 10**9)], 1)
        assert sorted(trained) == list(range(TRAIN_SIZE)), f"{name}: each sample of epoch 1 once"


def test_a_checkpoint_without_a_data_position_resumes_at_the_next_epoch(runs, tmp_path):
    """A checkpoint of an epoch's end without the data position resumes at the next epoch's start, exactly."""
    full, _ = runs("full", "trainer.devices=2")
    # The end of epoch 0 as the uninterrupted run passed it (the workers test shows that a resume
    # from it ends bit-identical); the uninterrupted run keeps only its best checkpoint, epoch 1's.
    state = torch.load(killed_with_workers(runs) / "checkpoints" / "epoch_000.ckpt", weights_only=True)
    del state["SensorDataModule"], state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    resumed, result = runs("resumed_old", "trainer.devices=2", f"ckpt_path={old}")
    assert (
        "The checkpoint holds no position inside an epoch (saved at the end of epoch 0, or without a DataModule's "
        "position): "
        "training resumes at the start of the next epoch." in result.stdout
    )
    assert sorted(path.name for path in (resumed / "samples").glob("rank*")) == [
        "rank0_epoch1.jsonl",
        "rank1_epoch1.jsonl",
    ]
    for key, value in params(full).items():
        assert torch.equal(params(resumed)[key], value), key


def test_a_resume_in_place_that_would_change_the_runs_arithmetic_is_refused(runs, tmp_path):
    """A resume in place with another global batch is refused in one line, writing nothing."""
    run_dir = killed(runs, "killed2", 2, KILL_2).parent.parent
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")}
    result = run_cli(TRAIN, f"hydra.run.dir={run_dir}", "ckpt_path=last", "data.global_batch_size=96", log_dir=tmp_path)
    assert result.returncode == 1 and result.stderr == (
        f"Error: data.global_batch_size=96: the run in {run_dir} has data.global_batch_size=48, and a resume in place "
        "continues that run. Leave data.global_batch_size out to resume it, or start a new run elsewhere (without "
        "hydra.run.dir and ckpt_path=last).\n"
    )
    assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")} == before, "nothing written"


def test_a_slurm_requeue_saves_at_the_next_step_and_the_requeued_job_resumes_exactly(
    runs, deterministic_data, tmp_path
):
    """On SLURM's requeue signal every rank saves at the next step and the job requeues itself; its
    second run resumes there, ending bit-identical to the uninterrupted run, each sample once."""
    # With dropout: the resume must also restore the random generators' state, or the masks differ.
    full, _ = runs("full_dropout", "trainer.devices=2", DROPOUT)
    env = simulated_slurm(tmp_path / "bin", job_id="4242", ntasks=2)
    # One srun task per process on one node, as a batch script starts the training (SLURM's variables
    # give each task its rank; trainer.num_nodes and trainer.devices are the job's).
    train = cli_command(
        TRAIN, "trainer.num_nodes=1", "trainer.devices=2", "strategy=ddp", f"data.path={deterministic_data}",
        *DETERMINISTIC, *EVERY_5_STEPS, DROPOUT, "+callbacks.signal._target_=probes.SignalTasks",
        f"+callbacks.signal.pid_file={tmp_path / 'bin' / 'tasks.pids'}", "+callbacks.signal.rank=1",
        f"+callbacks.signal.step={REQUEUE_AT}", log_dir=tmp_path / "logs",
    )  # fmt: skip

    def srun(restart_count):  # the job's step as SLURM runs it: first, then after the requeue
        return subprocess.run([str(tmp_path / "bin" / "srun"), *train], cwd=HERE, capture_output=True, text=True,
                              env={**env, "SLURM_RESTART_COUNT": str(restart_count)}, timeout=600)  # fmt: skip

    first = srun(0)
    assert first.returncode == 128 + signal.SIGUSR1, first.stdout[-3000:] + first.stderr[-5000:]
    run = tmp_path / "logs" / "runs" / "slurm-4242.0"
    assert (tmp_path / "bin" / "scontrol.log").read_text() == "requeue 4242\n"
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    saved_step = state["global_step"]
    # Rank 0 got the signal wherever it was in step REQUEUE_AT or the next: every rank saved at the
    # next optimizer step after it had.
    assert saved_step in (REQUEUE_AT + 1, REQUEUE_AT + 2) and state["epoch"] == 0
    assert state["SensorDataModule"]["train_position"]["samples"] == saved_step * GLOBAL_BATCH
    assert not list(run.glob("hpc_ckpt_*.ckpt")), "Lightning's own SIGUSR1 handler did not run"
    assert (
        f"SLURM's requeue signal SIGUSR1 in epoch 0 at global step {saved_step}: saved "
        f"{run / 'checkpoints' / 'last.ckpt'}. Requeued SLURM job 4242 (scontrol requeue)"
    ) in (run / "train.log").read_text()
    # The first run trained no batch beyond its checkpoint: nothing to redo.
    assert max(trained_steps(run, epoch=0)) == saved_step - 1

    second = srun(1)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
    assert "Restart 1 of this job by its launcher" in (run / "train.log").read_text()
    print(f"SLURM requeue signal at step {REQUEUE_AT}: saved at step {saved_step}, 0 steps redone")
    whole, resumed = (torch.load(r / "checkpoints" / "last.ckpt", weights_only=True) for r in (full, run))
    assert (resumed["epoch"], resumed["global_step"]) == (whole["epoch"], whole["global_step"]) == (1, 42)
    for key, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key
    momentum, expected = resumed["optimizer_states"][0]["state"], whole["optimizer_states"][0]["state"]
    assert all(torch.equal(momentum[i]["momentum_buffer"], expected[i]["momentum_buffer"]) for i in expected)
    assert resumed["lr_schedulers"] == whole["lr_schedulers"]
    # Both runs of the job appended to the same ledger: each training sample exactly once per epoch.
    for epoch in (0, 1):
        assert sorted(ledger([(run, 2, 10**9)], epoch)) == list(range(TRAIN_SIZE)), f"epoch {epoch}"
    assert sum(int((run / "samples" / f"val_rank{r}_epoch0.json").read_text()) for r in (0, 1)) == VAL_SIZE


def trained_steps(run_dir, epoch):
    """The optimizer steps of ``epoch`` that the sample recorder saw trained on any rank."""
    for path in run_dir.glob(f"samples/rank*_epoch{epoch}.jsonl"):
        for line in path.read_text().splitlines():
            yield json.loads(line)["step"]


def test_a_resume_whose_schedule_would_span_other_steps_is_refused_in_one_line(runs, deterministic_data, tmp_path):
    """A resume whose one-cycle schedule would span other steps than the checkpoint's is refused in one line."""
    # A one-cycle schedule cannot be stretched: 3 epochs instead of the checkpoint's 2.
    checkpoint = killed(runs, "killed2", 2, KILL_2)
    result = run_cli(TRAIN, f"data.path={deterministic_data}", *DETERMINISTIC, "trainer.devices=2",
                     "trainer.max_epochs=3", f"ckpt_path={checkpoint}", log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "ckpt_path: the checkpoint's learning-rate schedule spans 42 optimizer steps, this run 63" in output
    assert "Traceback" not in output
