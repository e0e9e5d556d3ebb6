"""The template task's exact resume: a rank SIGKILLed inside an epoch, resumed on the same world size.

The run trains the deterministic configuration (helpers.DETERMINISTIC: 2 epochs of 21 global
batches of 48) with ``last.ckpt`` rewritten every 5 optimizer steps. A rank is SIGKILLed (as the
OOM killer or a lost node would) at a seeded random step between two of those checkpoints; the
run is resumed from its ``last.ckpt`` through the real command line, and compared with the
uninterrupted run: parameters, which samples were trained in each epoch (the sample recorder's
ledger: each training sample exactly once per epoch across the kill and the resume), and the
validation after the resume. The engine's resumes on its own test task (another world size,
DataLoader workers, a SLURM requeue, the refusals): engine/tests/run/test_kill_and_resume.py.
"""

import json
import random

import pytest
import torch
from harness import read_scalars
from helpers import DETERMINISTIC, TRAIN_SIZE, VAL_SIZE, run_cli

pytestmark = pytest.mark.processes

CHECKPOINT_EVERY = 5
EVERY_5_STEPS = ("callbacks.last_checkpoint.train_time_interval=null",
                 f"callbacks.last_checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
                 "+callbacks.val_counter._target_=probes.ValidationCounter",
                 "+callbacks.val_counter.out_dir=${paths.output_dir}/samples")  # fmt: skip
# In epoch 0 between the checkpoints of steps 10 and 15.
KILL_2 = random.Random(16).randrange(11, 15)


@pytest.fixture(scope="module")
def runs(noisy_data_dir, tmp_path_factory):
    """``runs(name, *overrides, expect=0)``: the deterministic configuration run once per name:
    ``(its run directory, the command's result)``."""
    done = {}

    def run(name, *overrides, expect=0):
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            result = run_cli(f"data.data_dir={noisy_data_dir}", *DETERMINISTIC, *EVERY_5_STEPS, *overrides,
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


@pytest.mark.task
def test_a_kill_inside_an_epoch_resumes_exactly_on_the_same_world_size(runs):
    full, _ = runs("full", "trainer.devices=2")
    checkpoint = killed(runs, "killed2", 2, KILL_2)
    state = torch.load(checkpoint, weights_only=True)
    saved_step = state["global_step"]
    assert saved_step == KILL_2 // CHECKPOINT_EVERY * CHECKPOINT_EVERY and state["epoch"] == 0
    assert state["MNISTDataModule"]["train_position"] == {
        "epoch": 0,
        "samples": saved_step * 48,
        "global_batch_size": 48,
    }
    resumed, result = runs("resumed2", "trainer.devices=2", f"ckpt_path={checkpoint}")
    print(f"killed at step {KILL_2}, resumed from step {saved_step}: {KILL_2 - saved_step} steps redone")
    assert KILL_2 - saved_step < CHECKPOINT_EVERY

    # Bit-identical: the same samples in the same order with the same arithmetic.
    for key, value in params(full).items():
        assert torch.equal(params(resumed)[key], value), key
    # Each training sample once per epoch: the killed run up to its checkpoint, then the resumed run.
    for epoch in (0, 1):
        trained = ledger([(checkpoint.parent.parent, 2, saved_step), (resumed, 2, 10**9)], epoch)
        assert sorted(trained) == sorted(ledger([(full, 2, 10**9)], epoch)) == list(range(TRAIN_SIZE))
    # The validation after the resume covers the whole split, as in the uninterrupted run.
    assert sum(int((resumed / "samples" / f"val_rank{r}_epoch0.json").read_text()) for r in (0, 1)) == VAL_SIZE
    assert (
        read_scalars(resumed / "tensorboard", steps=True)["val/loss"]
        == read_scalars(full / "tensorboard", steps=True)["val/loss"]
    )
