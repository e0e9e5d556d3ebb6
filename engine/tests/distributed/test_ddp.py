"""Distributed correctness, proven with real gloo processes started through the real command line.

Every run below trains the same deterministic configuration (runs.DETERMINISTIC: no dropout, SGD
with momentum, a one-cycle schedule) of the test task, the regression, on the same windows for two
epochs, and differs only in how the work is spread: 1, 2, 3 or 4 processes, gradient accumulation,
DDP options, or a gradient communication hook. Data parallelism is correct when each of them takes
the optimizer steps that one process with the same global batch takes.

Sizes: 1,008 training windows, 21 global batches of 48 per epoch for 1, 2, 3 and 4 processes alike;
191 validation and 301 test windows (divisible by neither 2 nor 3).
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from harness import HERE, cli_command, cli_env, free_port, max_difference, params, ranks_in_log, read_scalars
from runs import DETERMINISTIC, GLOBAL_BATCH, TRAIN, TRAIN_SIZE

from ddp_engine.callbacks.step_anatomy import PARTS
from sensor_task.regression import CHANNELS, LENGTH, SensorNet

pytestmark = pytest.mark.processes

# Float32 parameters after 42 SGD steps: AllReduce sums gradients in another order than one
# process does, so replicas and the single process agree to rounding, not bit for bit. The
# regression's 385 parameters and short sums round less than a large network's: 1.5e-7 at most
# measured on 2, 3 and 4 processes. A change that takes effect (a compression hook, another rate)
# must move them by many times this.
PARAM_ATOL = 1e-6
# The targets' variance is about 3.6: a model that learned nothing has an MSE near it. Their noise
# (standard deviation 0.1) keeps any model's MSE above 0.01, so a sample counted twice would show.
LEARNED_MSE = 0.5

# 64-byte gradient buckets (2**-14 MiB, a whole number of bytes).
BUCKET_CAP_MB = 2**-14

RUNS = {
    "ws1": ["trainer.devices=1"],
    "ws2": ["trainer.devices=2"],
    "ws3": ["trainer.devices=3"],
    "ws4": ["trainer.devices=4"],
    "ws2_accumulate": ["trainer.devices=2", "trainer.accumulate_grad_batches=2"],
    # DDP constructor and process-group options that do not change the arithmetic, and linear
    # LR scaling (global 48 vs reference 24: twice the configured rate, which the one-cycle schedule
    # then peaks at: its max_lr is the deterministic runs' rate, here given as the optimizer's).
    "ws2_options": [
        "trainer.devices=2", "strategy.static_graph=true", "strategy.gradient_as_bucket_view=true",
        f"strategy.bucket_cap_mb={BUCKET_CAP_MB}", "strategy.broadcast_buffers=false", "strategy.timeout.seconds=123",
        "strategy.process_group_backend=gloo", "lr_scaling.rule=linear", "lr_scaling.reference_batch_size=24",
        "model.scheduler.max_lr=${model.optimizer.lr}",
    ],
    "ws2_fp16": ["trainer.devices=2", "strategy.comm_hook=fp16", "strategy.find_unused_parameters=true"],
    "ws2_powersgd": ["trainer.devices=2", "strategy.comm_hook=powersgd", "strategy.powersgd_start_iter=2"],
    # Where a step's time goes, on a network 8 times wider (a 5 to 6 ms step on 2 processes, not 2 to
    # 4 ms): Lightning's own work between the parts is about a millisecond whatever the network, a
    # share of the step that only a step of some size keeps small.
    "ws1_wide": ["trainer.devices=1", "model.net.hidden=128"],
    "ws2_wide": ["trainer.devices=2", "model.net.hidden=128"],
    "ws3_wide": ["trainer.devices=3", "model.net.hidden=128"],
}  # fmt: skip


@pytest.fixture(scope="module")
def run(deterministic_run):
    """``run(name)``: the run directory of RUNS[name] (trained once per session, on first use)."""
    return lambda name: deterministic_run(name, *RUNS[name])


def ddp_settings(run_dir):
    return json.loads((run_dir / "ddp.json").read_text())


# --- gradient equivalence -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ws2", "ws3", "ws4"])
def test_replicas_take_the_single_process_step(run, name):
    """2, 3 and 4 replicas end with the parameters of one process at the same global batch."""
    single, replicated = params(run("ws1")), params(run(name))
    difference = max_difference(single, replicated)
    print(f"{name} vs ws1: max |parameter difference| = {difference:.3g}")
    assert difference < PARAM_ATOL
    assert json.loads((run(name) / "ddp.json").read_text())["world_size"] == int(name[2])
    # Every worker logs into the job's one train.log, tagged with its rank.
    assert ranks_in_log(run(name)) == set(range(int(name[2])))
    # The runs really trained: the parameters moved far more than the tolerance from the init.
    assert read_scalars(run(name) / "tensorboard")["val/mse"][-1] < LEARNED_MSE


def test_accumulation_takes_the_same_step_with_half_the_micro_batch(run):
    """Accumulating 2 micro-batches per step takes the steps of one batch twice their size."""
    difference = max_difference(params(run("ws2")), params(run("ws2_accumulate")))
    print(f"accumulate_grad_batches=2 vs 1: max |parameter difference| = {difference:.3g}")
    assert difference < PARAM_ATOL
    # Same number of optimizer steps, twice the micro-batches.
    assert torch.load(run("ws2_accumulate") / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 42


# --- exact evaluation ------------------------------------------------------------------------


def expected_metrics(run_dir, checkpoint, windows, targets):
    """MSE and MAE of a checkpoint over a whole split, computed here in one process, in float64 as
    the task's metrics sum them."""
    net = SensorNet(CHANNELS, LENGTH, 1, dropout=0)
    net.load_state_dict({key.removeprefix("net."): value for key, value in params(run_dir, checkpoint).items()})
    with torch.no_grad():
        errors = net.eval()(torch.from_numpy(windows)).double() - torch.from_numpy(targets).double()
    return errors.square().mean().item(), errors.abs().mean().item()


def test_val_and_test_metrics_count_every_sample_once_for_1_2_and_3_processes(run, deterministic_data):
    """The logged MSE and MAE of 1, 2 and 3 processes are those of the whole split, each window once."""
    with np.load(deterministic_data) as arrays:
        splits = {split: (arrays[f"{split}_x"], arrays[f"{split}_y"]) for split in ("val", "test")}
    logged = {}
    for name in ("ws1", "ws2", "ws3"):
        scalars = read_scalars(run(name) / "tensorboard")
        (best,) = [p.name for p in (run(name) / "checkpoints").glob("epoch_*.ckpt")]
        # After fit, the best checkpoint is validated and tested once more: the last values logged.
        for split, (windows, targets) in splits.items():
            mse, mae = expected_metrics(run(name), best, windows, targets)
            # A window counted twice or missed moves the MSE by about |its squared error - MSE| / 191 (0.5%
            # of it for a typical window) and the MAE likewise: far beyond float32 rounding (1e-7).
            assert scalars[f"{split}/mse"][-1] == pytest.approx(mse, rel=1e-6), (name, split)
            assert scalars[f"{split}/mae"][-1] == pytest.approx(mae, rel=1e-6), (name, split)
        logged[name] = (scalars["val/mse"][-1], scalars["test/mse"][-1])
    print("(val/mse, test/mse) per run:", logged)
    assert 0.01 < logged["ws1"][1] < LEARNED_MSE, "the targets' noise keeps the MSE above 0: double counting shows"
    # The runs' parameters agree to PARAM_ATOL (test above), so their metrics to float rounding.
    for name in ("ws2", "ws3"):
        assert logged[name] == pytest.approx(logged["ws1"], rel=1e-5), name


# --- sharding --------------------------------------------------------------------------------


def trained_indices(run_dir, world_size, epoch):
    """Per rank, the train-split indices it trained on in ``epoch``, in order (probes.SampleRecorder)."""
    return [
        [i for line in (run_dir / "samples" / f"rank{r}_epoch{epoch}.jsonl").read_text().splitlines()
         for i in json.loads(line)["indices"]]
        for r in range(world_size)
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "world_size"), [("ws2", 2), ("ws3", 3), ("ws4", 4)])
def test_each_epoch_the_ranks_train_on_disjoint_shards_covering_the_split(run, name, world_size):
    """Each epoch, the ranks' shards are disjoint, equal, cover the training split, and reshuffle."""
    orders = []
    for epoch in (0, 1):
        shards = trained_indices(run(name), world_size, epoch)
        assert all(len(shard) == TRAIN_SIZE // world_size for shard in shards)
        union = set().union(*shards)
        assert len(union) == TRAIN_SIZE, "shards overlap or miss samples"  # 1,008 divides by 2, 3, 4: no remainder
        assert union == set(range(TRAIN_SIZE))
        orders.append(shards)
    assert orders[0] != orders[1], "the order must change between epochs"


def test_the_same_seed_gives_the_same_shards_in_separate_runs(run):
    """Two runs with the same seed give each rank the same samples in the same order."""
    for epoch in (0, 1):
        reference = trained_indices(run("ws2"), 2, epoch)
        assert trained_indices(run("ws2_accumulate"), 2, epoch) == reference


# --- DDP options and communication hooks, each shown in effect -----------------------------


def test_default_ddp_settings_in_effect(run):
    """ddp.json reads back the default DDP settings from the process group and the DDP wrapper."""
    settings = ddp_settings(run("ws2"))
    assert settings["backend"] == "gloo" and settings["world_size"] == 2
    assert settings["comm_hook"] == "none" and settings["timeout_s"] == 1800
    assert settings["bucket_cap_mb"] == 25 and len(settings["bucket_sizes_bytes"]) == 1  # 1,540 bytes in one bucket
    assert not settings["find_unused_parameters"] and not settings["static_graph"]
    assert not settings["gradient_as_bucket_view"] and settings["broadcast_buffers"]
    assert settings["optimizer_sharding"] is False  # a plain optimizer: ZeRO's run is in test_zero.py


def test_configured_ddp_options_take_effect(run):
    """Each configured DDP option is the one in effect, read back from the run."""
    settings = ddp_settings(run("ws2_options"))
    assert settings["backend"] == "gloo" and settings["timeout_s"] == 123
    assert settings["static_graph"] and settings["gradient_as_bucket_view"] and not settings["broadcast_buffers"]
    assert settings["bucket_cap_mb"] == pytest.approx(BUCKET_CAP_MB, rel=1e-3)
    # 64-byte buckets split the 1,540 bytes of gradients into several AllReduce calls (a bucket
    # closes once it reaches the cap), where the default 25 MiB cap makes one.
    buckets = settings["bucket_sizes_bytes"]
    print(f"bucket sizes (bytes) with bucket_cap_mb={BUCKET_CAP_MB}:", buckets)
    assert len(buckets) >= 3 and sum(buckets) == sum(ddp_settings(run("ws2"))["bucket_sizes_bytes"])
    assert ddp_settings(run("ws2_fp16"))["find_unused_parameters"] is True


def test_linear_lr_scaling_doubles_the_rate_for_twice_the_reference_batch(run):
    """Linear scaling at twice the reference batch runs the same schedule at twice the rate."""
    scaled = read_scalars(run("ws2_options") / "tensorboard")["train/lr"]
    plain = read_scalars(run("ws2") / "tensorboard")["train/lr"]
    # The same one-cycle schedule, at twice the rate at every logged step.
    assert len(scaled) == len(plain) > 0
    assert all(a == pytest.approx(2 * b) for a, b in zip(scaled, plain))
    assert json.loads((run("ws2_options") / "metrics.json").read_text())["global_batch_size"] == GLOBAL_BATCH
    # Twice the rate: not the default run's steps.
    assert max_difference(params(run("ws2")), params(run("ws2_options"))) > 100 * PARAM_ATOL


@pytest.mark.parametrize(
    ("name", "hook", "at_most"),
    [
        # bf16 takes the same path (strategy.py: one of torch's compress hooks), in another dtype.
        ("ws2_fp16", "fp16_compress_hook", 1e-2),
        ("ws2_powersgd", "powerSGD_hook", None),
    ],
)
def test_communication_hooks_run_on_gloo(run, name, hook, at_most):
    """fp16 and PowerSGD hooks run on gloo, change the steps as compression does, and still learn."""
    assert ddp_settings(run(name))["comm_hook"] == hook
    difference = max_difference(params(run("ws2")), params(run(name)))
    print(f"{name} vs plain AllReduce: max |parameter difference| = {difference:.3g}")
    # Compressed gradients change the steps: were the hook ignored, the runs would agree to PARAM_ATOL.
    assert difference > 10 * PARAM_ATOL
    if at_most is not None:
        assert difference < at_most
    assert read_scalars(run(name) / "tensorboard")["val/mse"][-1] < LEARNED_MSE, "still learns"


# --- where a step's time goes, and the bytes it sends ----------------------------------------


def test_the_allreduce_bytes_per_step_are_the_gradients_bytes_and_half_with_fp16(run):
    """ddp.json's AllReduce bytes per step are the gradients' float32 bytes, half with fp16."""
    gradient_bytes = 4 * sum(p.numel() for p in SensorNet(CHANNELS, LENGTH, 1, dropout=0).parameters())  # float32
    plain, fp16 = ddp_settings(run("ws2")), ddp_settings(run("ws2_fp16"))
    assert plain["allreduce_bytes_per_step"] == gradient_bytes
    assert fp16["allreduce_bytes_per_step"] == gradient_bytes // 2
    # A ring AllReduce sends 2 (W - 1) / W of the buffer from each rank: the buffer itself at W = 2, 4/3 at W = 3.
    assert plain["allreduce_sent_bytes_per_rank"] == gradient_bytes
    assert ddp_settings(run("ws3"))["allreduce_sent_bytes_per_rank"] == round(4 / 3 * gradient_bytes)
    assert ddp_settings(run("ws2_powersgd"))["allreduce_bytes_per_step"] is None, "not a fixed share of the buckets"


@pytest.mark.parametrize("name", ["ws1_wide", "ws2_wide", "ws3_wide"])
def test_every_rank_logs_where_its_step_goes_and_the_parts_add_up_to_the_step(run, name):
    """Each rank logs its step's parts every 10 steps; they fit inside the step and account for most of it."""
    world_size = int(name[2])
    scalars = read_scalars(run(name) / "tensorboard", steps=True)
    windows = [9, 19, 29, 39]  # every log_every_n_steps=10 of 42 optimizer steps, at train/loss's steps
    for rank in range(world_size):
        shares = []
        parts = {part: scalars[f"step/rank_{rank}/{part}_ms"] for part in PARTS}
        assert {part: [step for step, _ in points] for part, points in parts.items()} == dict.fromkeys(PARTS, windows)
        for window in range(len(windows)):
            ms = {part: points[window][1] for part, points in parts.items()}
            assert min(ms.values()) >= 0 and ms["exposed_comm"] <= ms["allreduce"], ms
            # Between a step's start and end (the host clock), DDP's parts and the optimizer's:
            # what is left is Lightning's own work between them (the training step's call, the closure).
            inside = ms["forward"] + ms["backward_compute"] + ms["exposed_comm"] + ms["optimizer"]
            assert inside <= ms["step"] * 1.001, ms
            shares.append(inside / ms["step"])
        # Most of the step, in the best window: on a loaded machine (the other test worker's processes)
        # a window's waits for a core, in Lightning's own work between the parts, only add to the rest.
        assert max(shares) >= 0.8, f"the parts account for at least 80% of the step: {shares}"
    slowest, fastest = scalars["step/slowest_ms"], scalars["step/fastest_ms"]
    for window, step in enumerate(windows):
        steps = [scalars[f"step/rank_{rank}/step_ms"][window][1] for rank in range(world_size)]
        assert slowest[window] == (step, pytest.approx(max(steps)))
        assert fastest[window] == (step, pytest.approx(min(steps)))
    averages = ddp_settings(run(name))["step_anatomy_ms"]
    assert averages["windows"] == len(windows)
    assert set(averages) == {"windows", *(f"rank_{rank}" for rank in range(world_size))}
    for rank in range(world_size):
        mean = averages[f"rank_{rank}"]
        inside = mean["forward"] + mean["backward_compute"] + mean["exposed_comm"] + mean["optimizer"]
        print(f"{name} rank {rank}: parts {inside:.2f} ms of a {mean['step']:.2f} ms step; {mean}")
        assert inside <= mean["step"], mean
        if world_size == 1:  # no other rank: DDP still copies the gradients into its bucket and back
            # and runs a one-rank AllReduce, not nothing, but little. The best window: on a loaded
            # machine (the other test worker's processes) a window's waits for a core only add to it.
            exposed, step = (scalars[f"step/rank_{rank}/{part}_ms"] for part in ("exposed_comm", "step"))
            shares = [part / whole for (_, part), (_, whole) in zip(exposed, step)]
            assert min(shares) < 0.1, shares


# --- several nodes ---------------------------------------------------------------------------


def test_two_torchrun_nodes_train_exactly_like_one_node_with_four_processes(run, deterministic_data, tmp_path):
    """Two torchrun nodes of 2 processes give the ranks, shards, parameters and metrics of one node of 4."""
    # Two torchrun agents on 127.0.0.1 play two nodes of 2 processes each, meeting at a c10d
    # rendezvous: world_size 4 over gloo, the way two machines would (only the network is local).
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=two-nodes"]  # fmt: skip
    train = cli_command(
        TRAIN, f"data.path={deterministic_data}", *DETERMINISTIC, "trainer.devices=2", "trainer.num_nodes=2",
        "+callbacks.ranks._target_=probes.RankRecorder", "+callbacks.ranks.out_dir=${paths.output_dir}/ranks",
        log_dir=tmp_path,
    )[1:]  # fmt: skip
    nodes = [
        subprocess.Popen(
            [*torchrun, *train], cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # fmt: skip
        for _ in range(2)
    ]
    for node, output in [(node, node.communicate(timeout=600)[0]) for node in nodes]:
        assert node.returncode == 0, output[-5000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name == "torchrun-two-nodes", "both nodes write one run directory"
    ranks = [json.loads((run_dir / "ranks" / f"rank{rank}.json").read_text()) for rank in range(4)]
    assert [(r["node_rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 4), (0, 1, 4), (1, 0, 4), (1, 1, 4)
    ], "global rank = node_rank x 2 + local_rank"  # fmt: skip
    one_node = run("ws4")
    for epoch in (0, 1):
        assert trained_indices(run_dir, 4, epoch) == trained_indices(one_node, 4, epoch), "the same shard per rank"
    # The same four replicas, the same AllReduce: bit-identical parameters and metrics.
    assert max_difference(params(run_dir), params(one_node)) == 0
    metrics, reference = (json.loads((d / "metrics.json").read_text()) for d in (run_dir, one_node))
    assert (metrics["test/mse"], metrics["val/mse"]) == (reference["test/mse"], reference["val/mse"])
