"""How one run is laid out across processes: device count and the batch each replica sees.

In data parallelism every process (replica) holds the whole model and trains on its own shard
of each global batch; gradients are averaged with AllReduce, so the optimizer step sees

    global_batch_size = per_device_batch_size * world_size * accumulate_grad_batches

samples. The user sets the global batch size (what the learning rate is tuned for); this
module derives the per-device batch size and refuses a global batch that does not split evenly.
The rules that need neither torch nor Lightning are :mod:`ddp_engine.distributed.layout_rules`'s,
imported here; this module adds what needs them (this machine's GPUs, a Trainer).
"""

import os
from typing import Any

import torch
from lightning.fabric.accelerators import CUDAAccelerator
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import OmegaConf

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.layout_rules import (
    CPU_PROCESSES_WHEN_AUTO,
    not_a_gpu_count,
    parse_cpu_devices,
    per_device_batch_size,
    per_device_eval_batch_size,
    scale_learning_rate,
)

__all__ = [
    "CPU_PROCESSES_WHEN_AUTO",
    "check_device_options",
    "data_parallel_layout",
    "per_device_batch_size",
    "per_device_eval_batch_size",
    "processes_per_node",
    "resolve_devices",
    "scale_learning_rate",
    "uses_cuda",
]


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


def uses_cuda(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` (after :func:`resolve_devices`) runs on CUDA devices."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def processes_per_node(accelerator: str, devices: Any) -> int:
    """The worker processes one node runs for ``trainer.accelerator`` / ``trainer.devices`` as
    configured (after :func:`resolve_devices`), counted by Lightning's own rules
    (``CUDAAccelerator.parse_devices``; on CPU :func:`~ddp_engine.distributed.layout_rules.parse_cpu_devices`,
    Lightning's ``CPUAccelerator.parse_devices`` without its import), so that the count is the
    one the Trainer will use, and refused here, before any process starts, where they would refuse it.

    Raises:
        ConfigValueError: for a value Lightning does not take (0, a negative count other than -1,
            an empty or repeated list, a list on CPU), for GPUs without CUDA, and for GPUs this
            machine does not show (``torch.cuda.device_count()``, which honours
            ``CUDA_VISIBLE_DEVICES``).
    """
    accelerator, devices = resolve_devices(accelerator, devices)
    devices = OmegaConf.to_container(devices) if OmegaConf.is_list(devices) else devices
    if not uses_cuda(accelerator):
        return parse_cpu_devices(devices)
    visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{torch.cuda.device_count()} visible" + (
        f" (CUDA_VISIBLE_DEVICES={visible_devices})" if visible_devices is not None else ""
    )
    if torch.cuda.device_count() == 0:
        raise ConfigValueError(
            f"trainer.accelerator={accelerator} needs GPUs, but this machine has none: {seen}. "
            "Use trainer.accelerator=cpu, or auto (GPUs when there are any)."
        )
    try:
        gpus = CUDAAccelerator.parse_devices(-1 if devices == "auto" else devices)
    except MisconfigurationException as error:  # Lightning: "You requested gpu: [..] But your machine only has: [..]"
        raise ConfigValueError(
            f"trainer.devices={devices}: {' '.join(str(error).split())} ({seen}). Use trainer.devices=auto (every "
            "GPU) or fewer, or more nodes with trainer.num_nodes."
        ) from None
    except TypeError:
        gpus = None
    if not gpus:
        raise not_a_gpu_count(devices)
    return len(gpus)


def data_parallel_layout(trainer: Any, global_batch_size: int, evaluation: bool = False) -> dict[str, int]:
    """The data-parallel layout of ``trainer`` (a ``lightning.Trainer``): ``world_size``,
    ``global_batch_size``, ``per_device_batch_size``, ``accumulate_grad_batches`` (samples per
    optimizer step = per-device batch x world_size x accumulated micro-batches). With
    ``evaluation``: ``world_size``, ``global_batch_size`` and the per-device evaluation batch
    (:func:`per_device_eval_batch_size`).

    Raises:
        BatchSizeError: for a global batch that does not split evenly over the processes (training).
    """
    world_size = trainer.num_nodes * trainer.num_devices
    if evaluation:
        return {
            "world_size": world_size,
            "global_batch_size": global_batch_size,
            "per_device_batch_size": per_device_eval_batch_size(global_batch_size, world_size),
        }
    accumulate = trainer.accumulate_grad_batches
    return {
        "world_size": world_size,
        "global_batch_size": global_batch_size,
        "per_device_batch_size": per_device_batch_size(global_batch_size, world_size, accumulate),
        "accumulate_grad_batches": accumulate,
    }


#: ``trainer.precision`` values that need CUDA: fp16 automatic mixed precision (its GradScaler).
#: Lightning replaces them with bf16-mixed on CPU with a warning; here they are refused instead,
#: so that a run never trains in another precision than its config says.
CUDA_ONLY_PRECISIONS = ("16-mixed", "16")


def check_device_options(
    device_type: str, process_group_backend: str | None, sync_batchnorm: bool, precision: str = "32-true"
) -> None:
    """Refuse, before any process launches, options that cannot work on this kind of device.

    Args:
        device_type: ``"cuda"`` or ``"cpu"``, the type of the Trainer's root device.
        process_group_backend: ``strategy.process_group_backend`` (None: Lightning's choice).
        sync_batchnorm: ``trainer.sync_batchnorm``.
        precision: ``trainer.precision`` (default ``"32-true"``).

    Raises:
        ConfigValueError: NCCL without CUDA devices, SyncBatchNorm without CUDA devices (torch's
            SyncBatchNorm refuses CPU tensors in training), or a :data:`CUDA_ONLY_PRECISIONS`
            precision without CUDA devices.
    """
    if str(precision) in CUDA_ONLY_PRECISIONS and device_type != "cuda":
        raise ConfigValueError(
            f"trainer.precision={precision} (fp16 mixed precision) needs CUDA devices, and this run is on "
            f"{device_type}. Use trainer.precision=bf16-mixed (mixed precision on CPU) or 32-true."
        )
    if process_group_backend == "nccl" and device_type != "cuda":
        raise ConfigValueError(
            f"strategy.process_group_backend=nccl needs CUDA devices, but this run is on {device_type}. "
            "Use strategy.process_group_backend=null (gloo on CPU), or run on GPUs with trainer.accelerator=gpu."
        )
    if sync_batchnorm and device_type != "cuda":
        raise ConfigValueError(
            f"trainer.sync_batchnorm=true needs GPUs: torch's SyncBatchNorm runs only on CUDA tensors, and this run "
            f"is on {device_type}. Set trainer.sync_batchnorm=false (each process then normalizes with the "
            "statistics of its own micro-batch)."
        )
