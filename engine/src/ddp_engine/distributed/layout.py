"""How one run is laid out across processes: device count and the batch each replica sees.

In data parallelism every process (replica) holds the whole model and trains on its own shard
of each global batch; gradients are averaged with AllReduce, so the optimizer step sees

    global_batch_size = per_device_batch_size * world_size * accumulate_grad_batches

samples. The user sets the global batch size (what the learning rate is tuned for); this
module derives the per-device batch size and refuses a global batch that does not split evenly.
"""

import math
import os
from typing import Any

import torch
from lightning.fabric.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import OmegaConf

from ddp_engine.core.errors import BatchSizeError, ConfigValueError
from ddp_engine.distributed.options import LRScaling

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


def uses_cuda(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` (after :func:`resolve_devices`) runs on CUDA devices."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def processes_per_node(accelerator: str, devices: Any) -> int:
    """The worker processes one node runs for ``trainer.accelerator`` / ``trainer.devices`` as
    configured (after :func:`resolve_devices`), counted by Lightning's own accelerators
    (``CUDAAccelerator.parse_devices``, ``CPUAccelerator.parse_devices``), so that the count is the
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
        try:
            return CPUAccelerator.parse_devices(devices)
        except TypeError:
            raise ConfigValueError(f"trainer.devices={devices} is not a positive process count on CPU.") from None
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
        raise ConfigValueError(
            f"trainer.devices={devices} is not a positive GPU count, a list of GPU indices, -1 or auto (every GPU)."
        )
    return len(gpus)


def per_device_batch_size(
    global_batch_size: int, world_size: int, accumulate_grad_batches: int = 1, resume: bool = False
) -> int:
    """Samples one process puts through the model per forward/backward pass (one micro-batch).

    Args:
        global_batch_size: samples per optimizer step, summed over all processes (``data.global_batch_size``).
        world_size: number of processes (replicas) in the process group, ``num_nodes * devices``.
        accumulate_grad_batches: micro-batches accumulated per optimizer step (``trainer.accumulate_grad_batches``).
        resume: whether the run resumes from a checkpoint (``ckpt_path``; default False): the message
            then also names the world sizes that split the global batch, which a resume in place keeps.

    Raises:
        BatchSizeError: (a ValueError) if any argument is not an integer or is below 1 (a data config
            without a schema types none of its keys), or ``global_batch_size`` is not divisible by
            ``world_size * accumulate_grad_batches``; the message names the nearest valid sizes (and
            with ``resume`` the world sizes that split ``global_batch_size``).
    """
    for name, value in [
        ("data.global_batch_size", global_batch_size),
        ("world_size", world_size),
        ("trainer.accumulate_grad_batches", accumulate_grad_batches),
    ]:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BatchSizeError(f"{name}={value} must be a whole number of samples (at least 1).")
        if value < 1:
            raise BatchSizeError(f"{name} must be at least 1, got {value}.")
    split = world_size * accumulate_grad_batches
    if global_batch_size % split:
        lower = max(split, global_batch_size // split * split)
        problem = (
            f"data.global_batch_size={global_batch_size} does not split evenly over world_size={world_size} "
            f"processes x trainer.accumulate_grad_batches={accumulate_grad_batches}: it must be a multiple of {split}."
        )
        fix = f"Use data.global_batch_size={lower} or {lower + split}"
        if not resume:
            raise BatchSizeError(f"{problem} {fix}.")
        # A resume in place keeps the run's global batch and accumulation (config/resume.py): then
        # only the world size can change.
        fits = [
            size
            for size in range(1, global_batch_size + 1)
            if global_batch_size % (size * accumulate_grad_batches) == 0
        ]
        sizes = ", ".join(map(str, fits[:8])) + (", ..." if len(fits) > 8 else "")
        raise BatchSizeError(
            f"{problem} {fix}, or, to resume a run in place (it keeps its global batch), a world size "
            f"(trainer.num_nodes x trainer.devices) of {sizes}."
        )
    return global_batch_size // split


def per_device_eval_batch_size(global_batch_size: int, world_size: int) -> int:
    """Samples one process evaluates per batch: ``ceil(global_batch_size / world_size)``.

    Evaluation takes no optimizer step, so the global batch need not split evenly over the
    processes (and each sample is evaluated once whatever the batch size: the unpadded sampler of
    :class:`~ddp_engine.data.sharded.ShardedDataModule`). In training, where the global batch
    splits evenly, it is the training micro-batch times ``accumulate_grad_batches``.

    Raises:
        BatchSizeError: if either argument is below 1.
    """
    for name, value in [("data.global_batch_size", global_batch_size), ("world_size", world_size)]:
        if value < 1:
            raise BatchSizeError(f"{name} must be at least 1, got {value}.")
    return -(-global_batch_size // world_size)


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


def scale_learning_rate(
    lr: float | None, global_batch_size: int, reference_batch_size: int | None, rule: str
) -> float | None:
    """The learning rate for ``global_batch_size``, given ``lr`` (``model.optimizer.lr``; None for a
    model config without one) tuned at ``reference_batch_size`` (None: not known); ``lr`` itself for
    ``rule`` ``none``.

    Raises:
        ConfigValueError: if ``rule`` is not an :class:`LRScaling`, or scales a rate or from a batch
            that is not known, or ``reference_batch_size < 1``.
    """
    try:
        rule = LRScaling(rule)
    except ValueError:
        raise ConfigValueError(f"lr_scaling.rule={rule} is not one of: none, linear, sqrt.") from None
    if rule is LRScaling.none:
        return lr
    if lr is None:
        raise ConfigValueError(f"lr_scaling.rule={rule.value} scales model.optimizer.lr, which this model has not.")
    if reference_batch_size is None:
        raise ConfigValueError(
            f"lr_scaling.rule={rule.value} scales model.optimizer.lr from the global batch it was tuned at: "
            "set lr_scaling.reference_batch_size (in the task's conf/config.yaml or on the command line)."
        )
    if reference_batch_size < 1:
        raise ConfigValueError(f"lr_scaling.reference_batch_size={reference_batch_size} must be at least 1.")
    ratio = global_batch_size / reference_batch_size
    return lr * {LRScaling.linear: ratio, LRScaling.sqrt: math.sqrt(ratio)}[rule]


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
