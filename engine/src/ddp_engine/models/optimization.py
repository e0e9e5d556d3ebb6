"""The optimizer and learning-rate scheduler built from the ``model.optimizer`` and ``model.scheduler``
partials: the one rule that the LightningModule's ``configure_optimizers`` and the check before
launch (:func:`ddp_engine.config.checks.check_schedule`) share."""

import inspect
from collections.abc import Callable

import torch
from omegaconf import DictConfig, OmegaConf

#: A ``model.scheduler`` partial (Hydra ``_partial_: true``): a ``torch.optim.lr_scheduler`` class
#: missing only the optimizer (and, for ``OneCycleLR``, maybe ``total_steps``).
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


def needs_total_steps(scheduler: SchedulerFactory | None) -> bool:
    """Whether ``scheduler`` takes ``total_steps`` (``OneCycleLR``) and the config leaves it to the
    run: only the Trainer knows the run's number of optimizer steps."""
    if scheduler is None:
        return False
    bound = getattr(scheduler, "keywords", {})
    return "total_steps" in inspect.signature(scheduler).parameters and "total_steps" not in bound


def build_lr_scheduler(
    scheduler: SchedulerFactory | None, optimizer: torch.optim.Optimizer, total_steps: int | None
) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate scheduler of ``optimizer`` from the ``scheduler`` partial; a constant one
    when None, so that LearningRateMonitor logs the rate as ``train/lr`` either way.

    Args:
        scheduler: the ``model.scheduler`` partial, or None (constant learning rate).
        optimizer: the optimizer it schedules.
        total_steps: the run's optimizer steps, passed when :func:`needs_total_steps`.

    Raises:
        ValueError, TypeError: as torch's scheduler refuses its arguments.
    """
    if scheduler is None:
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    kwargs = {"total_steps": total_steps} if needs_total_steps(scheduler) else {}
    return scheduler(optimizer=optimizer, **kwargs)


def optimizer_lr(model: DictConfig) -> float | None:
    """``model.optimizer.lr`` of a ``model`` config, or None where it has no optimizer node or no rate
    (a LightningModule that builds its optimizer itself)."""
    return OmegaConf.select(model, "optimizer.lr", default=None)
