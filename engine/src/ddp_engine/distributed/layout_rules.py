"""The layout's rules that need neither torch nor Lightning: the CPU process count, the world size
when the config alone tells it, the global batch's split over the processes, the learning rate's
scaling. Checked before those imports (:mod:`ddp_engine.config.early_checks`) and again by
:mod:`ddp_engine.distributed.layout`, which imports them from here.

In data parallelism every process (replica) trains on its own shard of each global batch:

    global_batch_size = per_device_batch_size * world_size * accumulate_grad_batches
"""

import math
from typing import Any

from ddp_engine.core.errors import BatchSizeError, ConfigValueError
from ddp_engine.distributed.options import LRScaling

#: Processes started on a machine without CUDA when ``trainer.devices=auto``, so that the default
#: command runs real DDP (two gloo processes) on any machine.
CPU_PROCESSES_WHEN_AUTO = 2


def parse_cpu_devices(devices: Any) -> int:
    """The CPU processes of one node for ``trainer.devices`` (a plain value, not a config node):
    Lightning's own rule (``CPUAccelerator.parse_devices``), a positive int or a string of digits.

    Raises:
        ConfigValueError: for any other value (0, -1, a list, a fraction, a word).
    """
    count = int(devices) if isinstance(devices, str) and devices.strip().isdigit() else devices
    if not isinstance(count, int) or count <= 0:
        raise ConfigValueError(f"trainer.devices={devices} is not a positive process count on CPU.")
    return count


def not_a_gpu_count(devices: Any) -> ConfigValueError:
    """The refusal of a ``trainer.devices`` that names no GPU (0, an empty list) on a CUDA accelerator."""
    return ConfigValueError(
        f"trainer.devices={devices} is not a positive GPU count, a list of GPU indices, -1 or auto (every GPU)."
    )


def check_devices(accelerator: str, devices: Any) -> None:
    """Refuse a ``trainer.devices`` (a plain value) that no accelerator runs, and, for
    ``trainer.accelerator=cpu``, one that Lightning's CPU rule refuses (:func:`parse_cpu_devices`):
    what is decidable without knowing this machine's GPUs.

    Raises:
        ConfigValueError: naming the value and what is allowed.
    """
    if accelerator == "cpu":
        if devices != "auto":
            parse_cpu_devices(devices)
        return
    # Refused on CPU and by Lightning's GPU parser alike: a count of none or below -1, a fraction, an empty
    # list, a word (on GPUs a string is a count, -1 or comma-separated indices).
    word = isinstance(devices, str) and devices.strip() != "auto" and not _gpu_string(devices)
    none = isinstance(devices, int) and not isinstance(devices, bool) and (devices == 0 or devices < -1)
    if word or none or isinstance(devices, float) or devices == [] or str(devices).strip() == "0":
        if accelerator in ("gpu", "cuda"):
            raise not_a_gpu_count(devices)
        raise ConfigValueError(
            f"trainer.devices={devices} is neither a positive process count (on CPU) nor a GPU count, a list of "
            "GPU indices, -1 or auto (every GPU)."
        )


def _gpu_string(devices: str) -> bool:
    """Whether Lightning's GPU parser reads ``devices`` as a number or comma-separated numbers."""
    try:
        [int(part.strip()) for part in devices.split(",") if part]
    except ValueError:
        return False
    return True


def known_world_size(accelerator: str, devices: Any, num_nodes: int) -> int | None:
    """``trainer.num_nodes`` x the processes per node where the config alone tells them (a positive
    count, a list of indices, ``auto`` on CPU: :data:`CPU_PROCESSES_WHEN_AUTO`); None where they
    depend on this machine's GPUs (``auto``, ``-1``) or the value is refused elsewhere."""
    if accelerator == "cpu" and devices == "auto":
        per_node = CPU_PROCESSES_WHEN_AUTO
    elif isinstance(devices, list) and accelerator != "cpu":
        per_node = len(devices)
    elif isinstance(devices, str) and devices.strip().isdigit():
        per_node = int(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool):
        per_node = devices
    else:
        return None
    return num_nodes * per_node if per_node > 0 and isinstance(num_nodes, int) and num_nodes > 0 else None


def planned_world_size(accelerator: str, devices: Any, num_nodes: int) -> int:
    """The world size of a planned layout (``python -m <package>.plan``): ``trainer.num_nodes`` x the
    processes per node, which its config must tell (:func:`known_world_size`), as its devices are
    the cluster's, not this machine's.

    Raises:
        ConfigValueError: for a ``trainer.devices`` that counts this machine's GPUs (``auto``, ``-1``),
            or that no accelerator runs (:func:`check_devices`).
    """
    check_devices(accelerator, devices)
    world_size = known_world_size(accelerator, devices, num_nodes)
    if world_size is None:
        raise ConfigValueError(
            f"trainer.devices={devices} counts this machine's GPUs, and a plan is for the cluster's: set "
            "trainer.devices=<GPUs per node> (and trainer.num_nodes=<nodes>)."
        )
    return world_size


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
