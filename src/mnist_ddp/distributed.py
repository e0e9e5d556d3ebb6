"""How one run is laid out across processes: device count and the batch each replica sees.

In data parallelism every process (replica) holds the whole model and trains on its own shard
of each global batch; gradients are averaged with AllReduce, so the optimizer step sees

    global_batch_size = per_device_batch_size * world_size * accumulate_grad_batches

samples. The user sets the global batch size (what the learning rate is tuned for); this
module derives the per-device batch size and refuses a global batch that does not split evenly.
"""

from typing import Any

import torch

from mnist_ddp.errors import BatchSizeError

#: Processes started on a machine without CUDA when ``trainer.devices=auto``, so that the default
#: command runs real DDP (two gloo processes) on any machine.
CPU_PROCESSES_WHEN_AUTO = 2


def resolve_devices(accelerator: str, devices: Any) -> tuple[str, Any]:
    """Turn ``trainer.accelerator`` / ``trainer.devices`` from config into what the Trainer gets.

    ``devices="auto"`` means every GPU when CUDA is available (Lightning's own ``"auto"``), and
    otherwise :data:`CPU_PROCESSES_WHEN_AUTO` CPU processes (Lightning's ``"auto"`` would give one).
    ``accelerator="auto"`` without CUDA becomes ``"cpu"``: DDP needs CUDA or CPU devices, not MPS.
    Any other value is passed through unchanged for Lightning to check.

    Returns:
        ``(accelerator, devices)`` for ``lightning.pytorch.Trainer``.
    """
    cuda = torch.cuda.is_available()
    if accelerator == "auto" and not cuda:
        accelerator = "cpu"
    if devices == "auto" and accelerator == "cpu":
        devices = CPU_PROCESSES_WHEN_AUTO
    return accelerator, devices


def per_device_batch_size(global_batch_size: int, world_size: int, accumulate_grad_batches: int = 1) -> int:
    """Samples one process puts through the model per forward/backward pass (one micro-batch).

    Args:
        global_batch_size: samples per optimizer step, summed over all processes (``data.global_batch_size``).
        world_size: number of processes (replicas) in the process group, ``num_nodes * devices``.
        accumulate_grad_batches: micro-batches accumulated per optimizer step (``trainer.accumulate_grad_batches``).

    Raises:
        BatchSizeError: (a ValueError) if any argument is below 1, or ``global_batch_size`` is not divisible by
            ``world_size * accumulate_grad_batches``; the message names the nearest valid sizes.
    """
    for name, value in [
        ("data.global_batch_size", global_batch_size),
        ("world_size", world_size),
        ("trainer.accumulate_grad_batches", accumulate_grad_batches),
    ]:
        if value < 1:
            raise BatchSizeError(f"{name} must be at least 1, got {value}.")
    split = world_size * accumulate_grad_batches
    if global_batch_size % split:
        lower = max(split, global_batch_size // split * split)
        raise BatchSizeError(
            f"data.global_batch_size={global_batch_size} does not split evenly over world_size={world_size} "
            f"processes x trainer.accumulate_grad_batches={accumulate_grad_batches}: it must be a multiple of "
            f"{split}. Use data.global_batch_size={lower} or {lower + split}."
        )
    return global_batch_size // split
