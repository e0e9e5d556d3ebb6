"""ZeRO-1 (``strategy.optimizer_sharding=true``) over real gloo DDP processes, through the real command
line: the same parameters as plain DDP, the optimizer state split over the ranks, checkpoints with
the whole state that resume exactly in place and on another world size.

Every run trains the deterministic configuration (runs.DETERMINISTIC: SGD with momentum and a
one-cycle schedule, global batch 48) for 20 optimizer steps, inside the first epoch, on a network
of two equal weight matrices (probes.BalancedNet: 384 x 192 and 192 x 384): torch's
ZeroRedundancyOptimizer assigns whole tensors to ranks, so the split of the state is even only for
a model without one dominant tensor (the regression's own network has one).
"""

import json
import random
import shutil

import pytest
import torch
from harness import read_scalars, run_cli
from runs import DETERMINISTIC, TRAIN

pytestmark = pytest.mark.processes

STEPS, CHECKPOINT_EVERY = 20, 5
BALANCED_NET = ("model.net._target_=probes.BalancedNet", "model.net.hidden=192")
SETUP = (*DETERMINISTIC, *BALANCED_NET, f"trainer.max_steps={STEPS}", "trainer.log_every_n_steps=1",
         "callbacks.last_checkpoint.train_time_interval=null",
         f"callbacks.last_checkpoint.every_n_train_steps={CHECKPOINT_EVERY}")  # fmt: skip
ZERO = "strategy.optimizer_sharding=true"
# Between the checkpoints of steps 10 and 15.
KILL_AT = random.Random(29).randrange(11, 15)
# Float32 sums in another order on another world size: equal to rounding, not bit for bit.
PARAM_ATOL = 1e-5
TENSORS = ("parameters", "gradients", "ddp_buckets", "optimizer_state")


@pytest.fixture(scope="module")
def runs(deterministic_data, tmp_path_factory):
    """``runs(name, *overrides, expect=0)``: the setup run once per name: ``(run directory, result)``."""
    done = {}

    def run(name, *overrides, expect=0, in_place=None):
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            setup = () if in_place else (f"data.path={deterministic_data}", *SETUP)
            result = run_cli(TRAIN, *setup, *overrides, log_dir=log_dir)
            assert result.returncode == expect, f"{name}:\n" + result.stdout[-3000:] + result.stderr[-3000:]
            done[name] = (in_place or next((log_dir / "runs").iterdir()), result)
        return done[name]

    return run


@pytest.fixture(scope="module")
def killed(runs, tmp_path_factory):
    """A ZeRO run on 2 processes whose rank 1 SIGKILLs itself at step KILL_AT: its run directory, and
    a copy of its last.ckpt (the resume in place replaces the file)."""
    run_dir, result = runs(
        "killed", "trainer.devices=2", ZERO, "+callbacks.kill._target_=probes.ElasticProbe",
        "+callbacks.kill.record=${paths.output_dir}/record.jsonl", "+callbacks.kill.kill_rank=1",
        f"+callbacks.kill.kill_step={KILL_AT}", expect=1,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1].endswith("rank 1 failed: killed by SIGKILL (exit status -9)")
    copy = tmp_path_factory.mktemp("saved") / "last.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", copy)
    return run_dir, copy


def checkpoint(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


def max_difference(a: dict, b: dict) -> float:
    return max((a[key] - b[key]).abs().max().item() for key in a)


def momentum(state: dict) -> dict:
    """The SGD momentum buffers of a checkpoint's optimizer state, by parameter index."""
    (optimizer,) = state["optimizer_states"]
    return {index: entry["momentum_buffer"] for index, entry in optimizer["state"].items()}


def memory(run_dir, snapshot="first_step"):
    return json.loads((run_dir / "ddp.json").read_text())["memory"][snapshot]["ranks"]


def test_zero_trains_to_the_plain_runs_parameters_with_the_whole_state_in_its_checkpoint(runs):
    """ZeRO-1 takes plain DDP's steps and schedule, and its checkpoint holds every rank's optimizer state."""
    plain, _ = runs("plain", "trainer.devices=2")
    zero, _ = runs("zero", "trainer.devices=2", ZERO)
    saved_plain, saved_zero = checkpoint(plain), checkpoint(zero)
    assert saved_zero["global_step"] == STEPS
    difference = max_difference(saved_plain["state_dict"], saved_zero["state_dict"])
    print(f"ZeRO-1 vs plain DDP after {STEPS} steps on 2 processes: max |parameter difference| {difference:.3g}")
    assert difference <= 1e-6
    # The checkpoint holds the whole state, consolidated from both ranks: every parameter's buffer.
    assert momentum(saved_zero).keys() == momentum(saved_plain).keys() == set(range(6))
    assert max_difference(momentum(saved_plain), momentum(saved_zero)) <= 1e-6
    # The one-cycle schedule ran on the sharded optimizer: the same rates, step by step.
    rates = {
        name: read_scalars(run / "tensorboard", steps=True)["train/lr"] for name, run in (("p", plain), ("z", zero))
    }
    assert len(rates["z"]) == STEPS and rates["z"] == rates["p"]
    assert saved_zero["lr_schedulers"] == saved_plain["lr_schedulers"]


def test_zero_splits_the_optimizer_state_over_the_ranks_and_nothing_else(runs):
    """ZeRO-1 halves each rank's optimizer state and leaves parameters, gradients and buckets whole."""
    plain, _ = runs("plain", "trainer.devices=2")
    zero, _ = runs("zero", "trainer.devices=2", ZERO)
    whole = memory(plain)[0]["optimizer_state"]
    shares = [rank["optimizer_state"] for rank in memory(zero)]
    print(f"optimizer state per rank (bytes): plain {whole} on each rank, ZeRO-1 {shares}")
    # One momentum buffer per parameter: the plain state is the parameters' size; the shares add up to it.
    assert whole == memory(plain)[0]["parameters"] and sum(shares) == whole
    assert max(shares) <= 0.6 * whole
    for snapshot in ("first_step", "peak"):
        for plain_rank, zero_rank in zip(memory(plain, snapshot), memory(zero, snapshot)):
            assert {key: zero_rank[key] for key in TENSORS[:3]} == {key: plain_rank[key] for key in TENSORS[:3]}
    scalars = read_scalars(zero / "tensorboard", steps=True)
    assert [scalars[f"memory/rank_{r}/optimizer_state_mib"][0] for r in (0, 1)] == [(0, s / 2**20) for s in shares]
    # ddp.json names the snapshots by their TensorBoard steps, train/loss's: the first step's and the last's.
    snapshots = json.loads((zero / "ddp.json").read_text())["memory"]
    losses = [step for step, _ in scalars["train/loss"]]
    assert [snapshots[name]["step"] for name in ("first_step", "peak")] == [losses[0], losses[-1]] == [0, STEPS - 1]
    assert [step for step, _ in scalars["memory/rank_0/optimizer_state_mib"]] == [0, STEPS - 1]


def test_ddp_json_and_the_log_say_whether_the_optimizer_is_sharded(runs):
    """ddp.json and the DDP settings line of train.log say whether the optimizer is sharded."""
    plain, _ = runs("plain", "trainer.devices=2")
    zero, _ = runs("zero", "trainer.devices=2", ZERO)
    for run_dir, sharded in ((plain, False), (zero, True)):
        assert json.loads((run_dir / "ddp.json").read_text())["optimizer_sharding"] is sharded
        lines = (run_dir / "train.log").read_text().splitlines()
        (line,) = [line for line in lines if "DDP settings in effect" in line]
        assert f"optimizer_sharding={sharded}," in line


def test_a_zero_run_killed_mid_epoch_resumes_in_place_bit_identically(runs, killed):
    """A ZeRO-1 run killed inside an epoch and resumed in place ends bit-identical to the uninterrupted one."""
    run_dir, saved = killed
    zero, _ = runs("zero", "trainer.devices=2", ZERO)
    assert torch.load(saved, weights_only=True)["global_step"] == KILL_AT // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    runs("in_place", f"hydra.run.dir={run_dir}", "ckpt_path=last", "+callbacks.kill.kill_step=-1", in_place=run_dir)
    resumed, full = checkpoint(run_dir), checkpoint(zero)
    assert resumed["global_step"] == STEPS
    for key, value in full["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key
    for index, buffer in momentum(full).items():
        assert torch.equal(momentum(resumed)[index], buffer), index
    # TensorBoard, as its app shows it (read_scalars checks both readers): each step once, the steps
    # after the checkpoint from the resume, so the uninterrupted run's points.
    losses = read_scalars(run_dir / "tensorboard", steps=True)["train/loss"]
    assert losses == read_scalars(zero / "tensorboard", steps=True)["train/loss"]
    assert [step for step, _ in losses] == list(range(STEPS))
    # The resumed fit's first step is the one after the checkpoint: logged at the checkpoint's step.
    first_step = json.loads((run_dir / "ddp.json").read_text())["memory"]["first_step"]["step"]
    assert first_step == torch.load(saved, weights_only=True)["global_step"]


def test_a_zero_checkpoint_resumes_exactly_on_three_processes(runs, killed):
    """A 2-process ZeRO-1 checkpoint resumes on 3 processes as plain DDP resumes it, bit for bit."""
    _, saved = killed
    plain, _ = runs("plain", "trainer.devices=2")
    resumed, _ = runs("on3", "trainer.devices=3", ZERO, f"ckpt_path={saved}")
    # The same checkpoint resumed by plain DDP on 3 processes, which loads the whole state on every
    # rank: the same arithmetic from there on, so a ZeRO resume that restored each of the 3 ranks'
    # share of the 2-process state exactly ends bit-identical to it.
    unsharded, _ = runs("plain_on3", "trainer.devices=3", f"ckpt_path={saved}")
    final, reference = checkpoint(resumed), checkpoint(unsharded)
    assert final["global_step"] == reference["global_step"] == STEPS
    for key, value in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    for index, buffer in momentum(reference).items():
        assert torch.equal(momentum(final)[index], buffer), index
    # And within float rounding of the uninterrupted 2-process run (3-way sums in another order).
    difference = max_difference(checkpoint(plain)["state_dict"], final["state_dict"])
    print(f"ZeRO-1 2 -> 3 processes from step {torch.load(saved, weights_only=True)['global_step']}: {difference:.3g}")
    assert difference < PARAM_ATOL
    assert len(memory(resumed)) == 3
