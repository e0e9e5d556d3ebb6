"""The parts of ``python -m <package>.plan`` that need no command line (its command line:
tests/mnist/test_plan_cli.py): torch's fake process group as one rank of any world size and ZeRO-1's
partition read over it, the activations a forward keeps counted against a known layer, the known
devices' memory, the one-line refusal of a layout that does not fit, and a plan without a fake
process group (an older torch: its private module hidden), which runs no step and says so."""

import logging
import sys

import pytest
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from private_api import hidden_private_api, lost_lines
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp_engine.config.early_checks import check_plan, check_planned_layout
from ddp_engine.core import compat
from ddp_engine.core.compat import init_fake_process_group, zero_partition
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.device_memory import device_memory_gib
from ddp_engine.distributed.footprint import SavedActivations
from ddp_engine.distributed.strategy import CommHookDDPStrategy
from ddp_engine.run.plan import GIB, PlanFigures, _fit

IN, OUT, BATCH = 300, 70, 8


@pytest.fixture
def fake_rank():
    """Global rank 5 of 8 over torch's fake process group, in this process; destroyed after the test."""
    assert init_fake_process_group(5, 8)
    yield
    dist.destroy_process_group()


def test_the_fake_process_group_is_any_rank_of_any_world_size_and_zero1_partitions_over_it(
    fake_rank, monkeypatch, caplog
):
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (5, 8, "fake")
    layers = [nn.Linear(IN, OUT) for _ in range(4)]
    params = [param for layer in layers for param in layer.parameters()]
    zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.1)
    partition = zero_partition(zero)
    assert len(partition) == 8 and sorted(map(id, sum(partition, []))) == sorted(map(id, params))
    # This rank's share is what its local optimizer steps (public: zero.optim).
    assert [id(p) for p in partition[5]] == [id(p) for group in zero.optim.param_groups for p in group["params"]]
    # Without torch's partition the plan gives no largest share, and says so.
    monkeypatch.setattr(compat, "_LOST", set())  # said once per process: not yet in this one
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    monkeypatch.setattr(compat, "_private", hidden_private_api(compat._private, {"_partition_parameters"}))
    with caplog.at_level(logging.WARNING):
        assert zero_partition(zero) is None
    assert lost_lines(caplog) == ["ZeroRedundancyOptimizer._partition_parameters"]


def test_without_torchs_fake_process_group_a_plan_runs_no_step_and_says_so(monkeypatch, caplog):
    # As an older torch: no Backend.FAKE, and no private module that registers the backend.
    monkeypatch.setattr(compat, "_LOST", set())  # said once per process: not yet in this one
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    monkeypatch.delattr(dist.Backend, "FAKE")
    monkeypatch.setitem(sys.modules, "torch.testing._internal.distributed.fake_pg", None)
    with caplog.at_level(logging.WARNING):
        assert init_fake_process_group(0, 64) is False
    assert not dist.is_initialized()
    assert "torch.distributed.Backend.FAKE is missing or changed in the installed version" in caplog.text
    cfg = plan_config()
    model = nn.Linear(IN, OUT)
    figures = PlanFigures.of(cfg, None, model, CommHookDDPStrategy(), 64, 4, 0.1, 0.1, None)
    layer_bytes = (IN * OUT + OUT) * 4
    assert (figures.parameters, figures.gradients, figures.ddp_buckets) == (layer_bytes,) * 3
    assert figures.optimizer_state is figures.activations is figures.total(zero1=False) is None
    assert figures.allreduce_bytes_per_step == layer_bytes
    assert "no training step ran: torch here has no fake process group" in figures.table(cfg)


def test_the_activations_of_a_forward_are_what_autograd_keeps_for_the_backward():
    layer, inputs = nn.Linear(IN, OUT), torch.randn(BATCH, IN)
    with SavedActivations(excluded=layer.parameters()) as saved:
        loss = torch.relu(layer(inputs)).sum()
    # The input (for the weight's gradient) and ReLU's output (for its own); not the weight, a parameter.
    assert saved.bytes == BATCH * IN * 4 + BATCH * OUT * 4
    loss.backward()


def test_a_device_is_named_or_sized():
    assert device_memory_gib("H100", None) == 80 and device_memory_gib("A100-40GB", None) == 40
    with pytest.raises(ConfigValueError, match=r"^plan.device=a100 is not a device whose memory is known .*a100-40gb"):
        device_memory_gib("a100", None)  # sold in two sizes: named with its size
    assert device_memory_gib("h100", 40) == 40  # the size given wins
    assert device_memory_gib(None, None) is None
    with pytest.raises(ConfigValueError, match=r"^plan.device=mi300x is not a device whose memory is known \(a10,"):
        device_memory_gib("mi300x", None)
    with pytest.raises(ConfigValueError, match=r"^plan.device_memory_gib=0 must be a positive size in GiB\.$"):
        device_memory_gib(None, 0)


def plan_config(sharding: bool = False):
    plan = {"global_rank": 0, "device": None, "device_memory_gib": None, "network_gbps": 100, "step_seconds": None}
    return OmegaConf.create({
        "plan": plan,
        "trainer": {"num_nodes": 8, "accumulate_grad_batches": 1}, "data": {"global_batch_size": 256},
        "strategy": {"gradient_as_bucket_view": False, "optimizer_sharding": sharding},
        "lr_scaling": {"rule": "none", "reference_batch_size": None},
    })  # fmt: skip


def figures(memory_gib: float) -> PlanFigures:
    """A replica of 1 GiB parameters, gradients and buckets, 2 GiB of Adam's state (0.5 GiB on ZeRO-1's
    largest rank), 3 GiB of activations: 8 GiB in all, 6.5 GiB with ZeRO-1."""
    return PlanFigures(
        world_size=64, num_nodes=8, global_rank=0, global_batch_size=256, per_device_batch_size=4,
        accumulate_grad_batches=1, learning_rate=0.1, base_learning_rate=0.1, step_ran=True, parameters=GIB,
        gradients=GIB, ddp_buckets=GIB, optimizer_state=2 * GIB, optimizer_state_zero1=GIB // 2,
        optimizer_state_zero1_rank=0, activations=3 * GIB, activations_batch_size=4,
        device_memory=int(memory_gib * GIB),
        bucket_count=40, allreduce_bytes_per_step=GIB, allreduce_sent_bytes_per_rank=GIB, allreduce_seconds=0.1,
        step_seconds=None,
    )  # fmt: skip


def test_the_fit_column_gives_small_shares_two_digits_and_large_ones_whole_percents():
    assert [_fit(total, 100_000) for total in (3, 9_500, 45_000, 3_125_000)] == [
        "yes 0.003%", "yes 9.5%", "yes 45%", "NO 3125%"
    ]  # fmt: skip
    assert _fit(None, 100) == "-"


def test_a_layout_that_does_not_fit_is_refused_with_what_would():
    figures(8).check_fit(plan_config())  # 8 GiB in 8 GiB: fits
    with pytest.raises(ConfigValueError) as refused:
        figures(7).check_fit(plan_config())
    assert str(refused.value) == (
        "the planned layout does not fit: each device holds 8 GiB, and it has 7 GiB (plan.device / "
        "plan.device_memory_gib): strategy.optimizer_sharding=true (ZeRO-1: 6.5 GiB) fits."
    )
    figures(7).check_fit(plan_config(sharding=True))  # sharded already: its 6.5 GiB fit
    with pytest.raises(ConfigValueError, match=r"holds 6.5 GiB, and it has 6 GiB .*: a smaller per-device batch"):
        figures(6).check_fit(plan_config(sharding=True))


def planned(**keys) -> DictConfig:
    """A plan's config of 8 nodes x 8 GPUs at global batch 512, with ``keys`` (dotted) set."""
    cfg = plan_config()
    cfg.trainer.update({"accelerator": "gpu", "devices": 8})
    cfg.data.global_batch_size = 512
    for key, value in keys.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


@pytest.mark.parametrize(
    ("keys", "refusal"),
    [
        (
            {"trainer__devices": "auto"},
            "trainer.devices=auto counts this machine's GPUs, and a plan is for the cluster's",
        ),
        ({"data__global_batch_size": 100}, "data.global_batch_size=100 does not split evenly over world_size=64"),
        ({"plan__global_rank": 64}, "plan.global_rank=64 is not a rank of world_size=64: use 0 to 63."),
        ({"plan__network_gbps": 0}, "plan.network_gbps=0 must be positive (or null: not known)."),
        ({"plan__device": "tpu"}, "plan.device=tpu is not a device whose memory is known"),
        (
            {"plan__device": "h100", "plan__device_memory_gib": 40},
            "plan.device=h100 and plan.device_memory_gib=40 both give the device's memory: keep one of them.",
        ),
        (
            {"plan__device": "h100", "trainer__accelerator": "cpu"},
            "plan.device=h100 is a GPU, but trainer.accelerator=cpu",
        ),
    ],
    ids=["devices_auto", "batch_split", "rank", "bandwidth", "device", "device_and_size", "gpu_on_cpu"],
)
def test_a_plans_keys_are_checked_before_torch_for_the_planned_cluster(keys, refusal):
    check_plan(planned(), check_planned_layout(planned()))  # 8 x 8 nodes on a machine without GPUs: planned
    with pytest.raises(ConfigValueError) as refused:
        cfg = planned(**keys)
        check_plan(cfg, check_planned_layout(cfg))
    assert str(refused.value).startswith(refusal)
