"""What the callbacks that report every rank's figures share: a host clock that waits for the GPU,
one gather of each rank's row of numbers to every rank, and rank 0's write of the tags."""

import time

import lightning as L
import torch
from torch import Tensor


def clock(device: torch.device, synchronize: bool) -> float:
    """``time.perf_counter()`` (seconds); with ``synchronize`` (a CUDA ``device``), once the work
    queued on it so far has finished, so that the time covers it."""
    if synchronize:
        torch.cuda.synchronize(device)
    return time.perf_counter()


def gather_rows(trainer: L.Trainer, pl_module: L.LightningModule, values: Tensor) -> Tensor:
    """Every rank's ``(K,)`` values as ``(world_size, K)``, row ``r`` from global rank ``r`` (one
    ``all_gather``: every rank must call it at the same point)."""
    # A single-device strategy returns the tensor itself, without the leading world_size dim.
    return pl_module.all_gather(values).reshape(trainer.world_size, -1)


def logged_step(trainer: L.Trainer) -> int:
    """The step at which the optimizer step just taken is logged: its index, ``global_step - 1``
    once it is taken, the step at which Lightning logs that step's ``train/loss`` (counted from 0:
    the first optimizer step is logged at 0, the 100th at 99)."""
    return trainer.global_step - 1


def log_on_rank_zero(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Write ``metrics`` to every logger from global rank 0, at :func:`logged_step`, where Lightning
    logs ``train/loss``."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=logged_step(trainer))
