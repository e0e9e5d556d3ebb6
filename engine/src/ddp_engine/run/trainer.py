"""The DDP Trainer, built from the composed config (checked before launch: :mod:`ddp_engine.config.checks`)."""

from collections.abc import Sequence
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from ddp_engine.callbacks.exact_resume import ExactResume
from ddp_engine.callbacks.objective import ObjectiveLogged
from ddp_engine.core.environment import resumes_in_place
from ddp_engine.distributed.layout import (
    data_parallel_layout,
    resolve_devices,
)
from ddp_engine.distributed.resume_points import resume_point
from ddp_engine.loggers.trackers import build_loggers


def build_trainer(
    cfg: DictConfig,
    extra_callbacks: Sequence[L.Callback] = (),
    loggers: Sequence[Logger] | None = None,
    evaluation: bool = False,
) -> tuple[L.Trainer, dict[str, int]]:
    """Instantiate the Trainer with its strategy, loggers and callbacks from ``cfg`` (``callbacks``,
    then the task's own: ``task.callbacks``), plus ``extra_callbacks`` (those built from more than
    their own config node). ``loggers``: those
    built already (:func:`ddp_engine.loggers.trackers.build_loggers`), else built here from
    ``cfg.logger`` as for a new run (default); with no logger (``logger=[]``) the learning rate
    monitor is left out. With ``trainer.enable_progress_bar=false`` the progress bar callback is
    left out. A training Trainer also gets :class:`~ddp_engine.callbacks.exact_resume.ExactResume`,
    first, so that a refused resume stops before any other callback's ``on_fit_start`` writes, and
    :class:`~ddp_engine.callbacks.objective.ObjectiveLogged` for ``task.objective``. With
    ``evaluation`` (default False) the Trainer only evaluates: the global batch need not split
    evenly over the processes (:func:`~ddp_engine.distributed.layout.per_device_eval_batch_size`).

    Nothing is launched here: the DDP processes start in ``trainer.fit`` / ``trainer.test``.

    Returns:
        The Trainer, and the data-parallel layout: ``world_size``, ``global_batch_size``,
        ``per_device_batch_size``, ``accumulate_grad_batches``.

    The options were checked before launch, in every process that runs the job
    (:func:`ddp_engine.config.checks.check_jobs`): they are not checked again here.

    Raises:
        BatchSizeError: for a global batch that does not split evenly over the processes (in
            training), from the layout.
    """
    accelerator, devices = resolve_devices(cfg.trainer.accelerator, cfg.trainer.devices)
    nodes = [*cfg.get("callbacks", {}).values(), *cfg.task.callbacks.values()]
    callbacks = [*(instantiate(node) for node in nodes if node is not None), *extra_callbacks]
    if not evaluation:
        callbacks = [ExactResume(), *callbacks, ObjectiveLogged(cfg.task.objective)]
    if not cfg.trainer.enable_progress_bar:
        # Lightning refuses a progress bar callback beside enable_progress_bar=False; the flag wins.
        callbacks = [callback for callback in callbacks if not isinstance(callback, ProgressBar)]
    if loggers is None:
        loggers = build_loggers(cfg.logger, Path(cfg.paths.output_dir), Path(cfg.paths.log_dir))
    if not loggers:
        # logger=[]: Lightning refuses a LearningRateMonitor without a logger to write to.
        callbacks = [callback for callback in callbacks if not isinstance(callback, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        accelerator=accelerator,
        devices=devices,
        strategy=instantiate(cfg.strategy),
        logger=list(loggers),
        callbacks=callbacks,
    )
    return trainer, data_parallel_layout(trainer, cfg.data.global_batch_size, evaluation)


def checkpoint_to_resume(ckpt_path: str | None, trainer: L.Trainer) -> str | None:
    """What ``trainer.fit`` resumes from: ``ckpt_path`` when given, ``last`` being the run's
    :func:`~ddp_engine.distributed.resume_points.resume_point` (its newest complete checkpoint);
    otherwise, when the launcher has restarted this job (torchrun ``--max-restarts``, a SLURM
    requeue) or it runs in a Kubeflow TrainJob's pod (:func:`resumes_in_place`), that resume point
    too (``"last"`` where it has none: Lightning then starts afresh). The run directory is the same across restarts
    (:func:`ddp_engine.core.environment.run_stamp`), so that is this run's own latest checkpoint; a
    job that died before its first checkpoint starts afresh (Lightning warns). A checkpoint saved by
    Lightning's SLURM auto-requeue (SIGUSR1, ``hpc_ckpt_<n>.ckpt`` in the run directory) is newer:
    then None, and Lightning resumes from it.
    """
    if ckpt_path != "last" and (ckpt_path is not None or not resumes_in_place()):
        return ckpt_path
    if ckpt_path is None and any(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt")):
        return None
    point = resume_point(trainer.default_root_dir)
    return "last" if point is None else str(point)
