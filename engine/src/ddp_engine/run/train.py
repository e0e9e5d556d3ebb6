"""Training: what ``python -m <project>.train`` does with each job.

Every process of the job runs :func:`fit_and_test`: it builds the DataModule, model, callbacks,
logger and DDP Trainer from the config, trains, then evaluates the best checkpoint on the
validation split and on the data set's test split;
global rank 0 writes both to ``metrics.json`` in the run directory.
"""

import hashlib
import logging
from pathlib import Path

import lightning as L
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from ddp_engine.callbacks.run_summary import RunSummary
from ddp_engine.callbacks.signals import stop_on_signals
from ddp_engine.core.environment import launcher_restarts, trainjob_name
from ddp_engine.core.objective import metrics_line
from ddp_engine.data.sharded import ShardedDataModule
from ddp_engine.distributed.layout import scale_learning_rate
from ddp_engine.distributed.options import LRScaling
from ddp_engine.distributed.resume_points import in_place_resume_step
from ddp_engine.loggers.trackers import build_loggers, record_tracker_runs
from ddp_engine.models.build import build_model
from ddp_engine.models.optimization import optimizer_lr
from ddp_engine.run.cuda_check import check_cuda_through_runtime
from ddp_engine.run.host_memory import keep_freed_host_memory
from ddp_engine.run.trainer import build_trainer, checkpoint_to_resume

log = logging.getLogger(__name__)
# Every process runs this file; messages about the whole run come from global rank 0 only.
info = rank_zero_only(log.info)


def fit_and_test(cfg: DictConfig) -> dict:
    """One process's part of a training job: fit, then validate and test the best checkpoint.

    Returns:
        The metrics the module logged in its validation and test of the best checkpoint (``val/mse``,
        ``test/mse`` for a regression), the checkpoint and the
        data-parallel layout, the same on every rank; global rank 0 also writes them to
        ``metrics.json``.
    """
    keep_freed_host_memory()  # in every process: see host_memory.py
    check_cuda_through_runtime()  # after Lightning's import: see cuda_check.py
    # On every rank: each process reads the job's config, and they must agree.
    log.info(f"Composed config sha256 {config_fingerprint(cfg)}")
    L.seed_everything(cfg.seed, workers=True)

    base_lr = optimizer_lr(cfg.model)
    rule = LRScaling(cfg.lr_scaling.rule)
    effective_lr = scale_learning_rate(base_lr, cfg.data.global_batch_size, cfg.lr_scaling.reference_batch_size, rule)
    # HPARAMS and the config text show the config as composed (the lr a sweep set), plus the rate in use.
    run_dir = Path(cfg.paths.output_dir)
    run_summary = RunSummary(
        cfg, overrides=job_overrides(run_dir), extra_hparams={"effective_lr": effective_lr}, metrics=cfg.task.metrics
    )
    if base_lr is not None:
        cfg.model.optimizer.lr = effective_lr

    datamodule: L.LightningDataModule = instantiate(cfg.data)
    if isinstance(datamodule, ShardedDataModule):
        datamodule.start_loader_forkserver()  # its imports overlap the model's building and DDP's set-up
    # The model is built for its data (the DataModule's model_arguments: an image shape, classes).
    model = build_model(cfg.model, datamodule)
    if hasattr(datamodule, "summary") and (summary := datamodule.summary()):
        info(f"Data set: {summary}")
    # A resume in place continues the run's tracker runs; TensorBoard and CSV drop the points
    # logged after its checkpoint, which the resumed run logs again.
    purge_step = in_place_resume_step(run_dir, cfg.ckpt_path)
    loggers = build_loggers(cfg.logger, run_dir, Path(cfg.paths.log_dir), purge_step)
    trainer, layout = build_trainer(cfg, extra_callbacks=[run_summary], loggers=loggers)
    record_tracker_runs(cfg.logger, loggers, run_dir)
    info(
        "Data parallel: world_size={world_size}, global batch {global_batch_size} = "
        "{per_device_batch_size} per device x {world_size} processes x {accumulate_grad_batches} "
        "accumulated micro-batches".format(**layout)
    )
    if base_lr is not None:
        info(
            f"Learning rate {effective_lr:g} (model.optimizer.lr={base_lr:g} tuned at reference batch "
            f"{cfg.lr_scaling.reference_batch_size}, lr_scaling.rule={rule.value})"
        )
    ckpt_path = checkpoint_to_resume(cfg.ckpt_path, trainer)
    if restarts := launcher_restarts():
        resume = {None: "Lightning's SLURM requeue checkpoint", "last": "the run's latest checkpoint (none yet)"}
        if cfg.ckpt_path in (None, "last") and ckpt_path not in resume:
            resume[ckpt_path] = f"the run's latest checkpoint, {ckpt_path}"
        info(f"Restart {restarts} of this job by its launcher: fit resumes from {resume.get(ckpt_path, ckpt_path)}")
    elif (trainjob := trainjob_name()) is not None and cfg.ckpt_path is None and ckpt_path != "last":
        info(f"TrainJob {trainjob} started again: fit resumes from the run's latest checkpoint, {ckpt_path}")

    with stop_on_signals(trainer):
        # weights_only: tensors and plain values only, so that a checkpoint cannot run code when loaded.
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        # The best checkpoint by task.objective; without one (fast_dev_run saves none) the final weights.
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        (val,) = trainer.validate(model, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
        (test,) = trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=True)

    metrics = {**val, **test, "checkpoint": best or None, **layout}
    info(f"Results: {metrics_line(metrics, cfg.task.metrics)} (checkpoint {best or 'final weights'})")
    info(f"Run directory: {run_dir}")
    return metrics


def job_overrides(run_dir: Path) -> list[str]:
    """The job's command-line overrides: Hydra's own record in a process that ran Hydra (every
    process under torchrun or SLURM), else as Hydra saved them in ``<run_dir>/.hydra/overrides.yaml``
    (none if it is missing), which the supervisor's Hydra wrote before it started this worker.

    Under torchrun only global rank 0 writes that file, while the other processes may already read
    it: they take Hydra's record instead."""
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    path = run_dir / ".hydra" / "overrides.yaml"
    # Read as YAML text, not through OmegaConf, which would resolve an override's own
    # interpolation (out_dir=${paths.output_dir}/samples) against the list.
    return [str(override) for override in yaml.safe_load(path.read_text())] if path.is_file() else []


def config_fingerprint(cfg: DictConfig) -> str:
    """First 12 hex digits of the SHA-256 of the resolved config as YAML: equal on every rank of a job."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()[:12]
