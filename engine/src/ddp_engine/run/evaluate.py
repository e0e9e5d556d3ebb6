"""Evaluation: what ``python -m <project>.eval`` does with each job.

Every process of the job runs :func:`evaluate`: it tests the checkpoint on its shard of the data
set's test split, and global rank 0 writes the test metrics (``test/mse`` and ``test/mae`` for a
regression) to ``metrics.json`` in the job's own run directory (``logs/evals/``).
Each test sample is evaluated exactly once whatever the number of processes, so the metrics
equal those of the training run's own test of the same checkpoint. The model and the data set
are those of the checkpoint's training run.
"""

import logging
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from ddp_engine.callbacks.signals import stop_on_signals
from ddp_engine.core.objective import metrics_line
from ddp_engine.data.sharded import ShardedDataModule
from ddp_engine.models.build import build_model
from ddp_engine.run.host_memory import keep_freed_host_memory
from ddp_engine.run.trainer import build_trainer

log = logging.getLogger(__name__)
info = rank_zero_only(log.info)


def evaluate(cfg: DictConfig) -> dict:
    """One process's part of the evaluation: test the checkpoint on its shard of the test set.

    Returns:
        The test metrics the module logged (``test/mse``, ``test/mae`` for a regression), the
        checkpoint and the data-parallel layout; global rank 0 also writes them to ``metrics.json``.
    """
    checkpoint = Path(cfg.ckpt_path).resolve()
    keep_freed_host_memory()  # in every process: see host_memory.py
    L.seed_everything(cfg.seed, workers=True)

    datamodule: L.LightningDataModule = instantiate(cfg.data)
    if isinstance(datamodule, ShardedDataModule):
        datamodule.start_loader_forkserver()  # its imports overlap the model's building and DDP's set-up
    model = build_model(cfg.model, datamodule)
    trainer, layout = build_trainer(cfg, evaluation=True)

    with stop_on_signals(trainer):
        # weights_only: tensors and plain values only, so that a checkpoint cannot run code when loaded.
        (metrics,) = trainer.test(model, datamodule=datamodule, ckpt_path=str(checkpoint), weights_only=True)

    metrics = {**metrics, "checkpoint": str(checkpoint), **layout}
    info(f"Results: {metrics_line(metrics, cfg.task.metrics)} ({checkpoint})")
    return metrics
