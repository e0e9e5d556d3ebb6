"""Batch-size arithmetic, device defaults, LR scaling and strategy options (no processes needed)."""

import inspect

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.layout import resolve_devices
from ddp_engine.distributed.layout_rules import CPU_PROCESSES_WHEN_AUTO, per_device_batch_size, scale_learning_rate
from ddp_engine.distributed.options import CommHook
from ddp_engine.distributed.strategy import CommHookDDPStrategy


@pytest.mark.parametrize(
    ("global_batch", "world_size", "accumulate", "expected"),
    [(128, 1, 1, 128), (128, 2, 1, 64), (128, 4, 1, 32), (128, 2, 2, 32), (96, 3, 1, 32), (6, 3, 2, 1)],
)
def test_per_device_batch_size_splits_the_global_batch(global_batch, world_size, accumulate, expected):
    assert per_device_batch_size(global_batch, world_size, accumulate) == expected
    assert expected * world_size * accumulate == global_batch


def test_non_divisible_global_batch_is_refused_with_the_nearest_valid_sizes():
    with pytest.raises(ValueError) as error:
        per_device_batch_size(100, 3, 2)
    message = str(error.value)
    assert "data.global_batch_size=100" in message
    assert "world_size=3" in message and "trainer.accumulate_grad_batches=2" in message
    assert "multiple of 6" in message and "data.global_batch_size=96 or 102" in message


def test_a_resume_that_does_not_split_the_global_batch_names_the_world_sizes_that_do():
    # A resume in place keeps the run's global batch (64): another global batch would be refused there.
    with pytest.raises(ValueError) as error:
        per_device_batch_size(64, 3, 1, resume=True)
    assert str(error.value).endswith(
        "Use data.global_batch_size=63 or 66, or, to resume a run in place (it keeps its global batch), a world "
        "size (trainer.num_nodes x trainer.devices) of 1, 2, 4, 8, 16, 32, 64."
    )
    with pytest.raises(ValueError, match=r"a world size \(trainer.num_nodes x trainer.devices\) of 1, 5, 25\.$"):
        per_device_batch_size(100, 3, 4, resume=True)


def test_global_batch_smaller_than_the_process_count_is_refused():
    with pytest.raises(ValueError, match="data.global_batch_size=4 or 8"):
        per_device_batch_size(2, 4)


@pytest.mark.parametrize(("name", "args"), [("data.global_batch_size", (0, 2, 1)), ("world_size", (8, 0, 1)),
                                            ("trainer.accumulate_grad_batches", (8, 2, -1))])  # fmt: skip
def test_values_below_one_are_refused(name, args):
    with pytest.raises(ValueError, match=f"{name} must be at least 1"):
        per_device_batch_size(*args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; this machine has CUDA")
def test_auto_devices_without_cuda_give_two_cpu_processes():
    assert resolve_devices("auto", "auto") == ("cpu", CPU_PROCESSES_WHEN_AUTO) == ("cpu", 2)
    assert resolve_devices("cpu", "auto") == ("cpu", 2)


def test_explicit_devices_pass_through():
    assert resolve_devices("cpu", 4) == ("cpu", 4)
    assert resolve_devices("gpu", [0, 1]) == ("gpu", [0, 1])
    assert resolve_devices("cpu", 1) == ("cpu", 1)


def test_auto_devices_with_cuda_use_every_gpu(monkeypatch):
    # No GPU exists here: pretend CUDA is available to check that "auto" is left to Lightning
    # (every visible GPU) instead of becoming the CPU process count.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_devices("auto", "auto") == ("auto", "auto")
    assert resolve_devices("gpu", "auto") == ("gpu", "auto")
    assert resolve_devices("cpu", "auto") == ("cpu", 2)


@pytest.mark.parametrize(
    ("rule", "global_batch", "expected"),
    [("none", 512, 0.1), ("linear", 512, 0.4), ("linear", 64, 0.05), ("sqrt", 512, 0.2), ("sqrt", 32, 0.05)],
)
def test_learning_rate_follows_the_global_batch(rule, global_batch, expected):
    assert scale_learning_rate(0.1, global_batch, 128, rule) == pytest.approx(expected)


def test_bad_lr_scaling_is_refused():
    with pytest.raises(ConfigValueError, match="lr_scaling.rule=cubic is not one of: none, linear, sqrt"):
        scale_learning_rate(0.1, 128, 128, "cubic")
    with pytest.raises(ConfigValueError, match="lr_scaling.reference_batch_size=0 must be at least 1"):
        scale_learning_rate(0.1, 128, 0, "linear")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"comm_hook": "fp32"}, "strategy.comm_hook=fp32 is not one of: none, fp16, bf16, powersgd"),
        ({"comm_hook": "powersgd", "powersgd_start_iter": 1}, "strategy.powersgd_start_iter=1 must be at least 2"),
        ({"comm_hook": "powersgd", "powersgd_rank": 0}, "strategy.powersgd_rank=0 must be at least 1"),
        ({"bucket_cap_mb": -1}, r"strategy.bucket_cap_mb=-1 must be a positive size in MiB \(torch's default: 25\)"),
        ({"bucket_cap_mb": 0}, "strategy.bucket_cap_mb=0 must be a positive size"),
        ({"comm_hook": "fp16", "process_group_backend": "mpi"}, "supported here on the gloo and nccl backends"),
        ({"ddp_comm_hook": print}, "strategy.ddp_comm_hook: this strategy registers its hook by name"),
    ],
)
def test_bad_communication_hook_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigValueError, match=message):
        CommHookDDPStrategy(**kwargs)


def test_communication_hook_settings_are_kept():
    strategy = CommHookDDPStrategy(comm_hook="powersgd", powersgd_rank=4, powersgd_start_iter=100, bucket_cap_mb=5)
    assert (strategy.comm_hook, strategy.powersgd_rank, strategy.powersgd_start_iter) == (CommHook.powersgd, 4, 100)
    assert strategy.ddp_options == {"bucket_cap_mb": 5}  # DistributedDataParallel's own options pass through


def test_broadcast_buffers_reaches_ddp_under_the_name_this_torch_uses():
    strategy = CommHookDDPStrategy(broadcast_buffers=False)
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    assert strategy.ddp_options == ({"forward_sync_buffers": False} if renamed else {"broadcast_buffers": False})
