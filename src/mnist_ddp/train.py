"""Entry point: ``python -m mnist_ddp.train [key=value ...]``.

Composes the config from ``conf/``, builds the DataModule, model, callbacks, logger and DDP
Trainer from it, trains, then tests the best checkpoint on the official 10,000-image test set.

With ``trainer.devices=N`` Lightning's DDP strategy starts N - 1 more processes that re-run this
command; each of them composes the same config, builds the same objects and joins the process
group. All of them write into the one Hydra run directory of the first process.
"""

import logging
import sys

import hydra
import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from mnist_ddp.config import CONFIG_DIR, register_configs
from mnist_ddp.distributed import check_device_options, per_device_batch_size, resolve_devices, scale_learning_rate
from mnist_ddp.errors import UsageError

log = logging.getLogger(__name__)
# Every process runs this file; messages about the whole run come from global rank 0 only.
info = rank_zero_only(log.info)

register_configs()


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and test one run; returns the final test metrics (``test/loss``, ``test/acc``).

    Raises:
        UsageError: for a config value or data folder the user must fix (message says how).
    """
    L.seed_everything(cfg.seed, workers=True)

    base_lr = cfg.model.optimizer.lr
    cfg.model.optimizer.lr = scale_learning_rate(
        base_lr, cfg.data.global_batch_size, cfg.lr_scaling.reference_batch_size, cfg.lr_scaling.rule
    )

    # Build everything before any process launches, so a bad argument fails here, once.
    datamodule: L.LightningDataModule = instantiate(cfg.data)
    model: L.LightningModule = instantiate(cfg.model)
    accelerator, devices = resolve_devices(cfg.trainer.accelerator, cfg.trainer.devices)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        accelerator=accelerator,
        devices=devices,
        strategy=instantiate(cfg.strategy),
        logger=instantiate(cfg.logger),
        callbacks=[instantiate(callback) for callback in cfg.callbacks.values()],
    )
    check_device_options(
        trainer.strategy.root_device.type, cfg.strategy.process_group_backend, cfg.trainer.sync_batchnorm
    )
    world_size = trainer.num_nodes * trainer.num_devices
    layout = {
        "world_size": world_size,
        "global_batch_size": cfg.data.global_batch_size,
        "per_device_batch_size": per_device_batch_size(
            cfg.data.global_batch_size, world_size, trainer.accumulate_grad_batches
        ),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "effective_lr": cfg.model.optimizer.lr,
    }
    info(
        "Data parallel: world_size={world_size}, global batch {global_batch_size} = "
        "{per_device_batch_size} per device x {world_size} processes x {accumulate_grad_batches} "
        "accumulated micro-batches".format(**layout)
    )
    info(
        f"Learning rate {cfg.model.optimizer.lr:g} (model.optimizer.lr={base_lr:g} at batch "
        f"{cfg.lr_scaling.reference_batch_size}, lr_scaling.rule={cfg.lr_scaling.rule.value})"
    )
    info(f"Run directory: {cfg.paths.output_dir}")
    if not trainer.strategy.cluster_environment.creates_processes_externally:
        # Lightning will start the other processes itself, so this one is alone for now: fetch
        # the data here, and missing data fails before any process launches. (fit calls
        # prepare_data again, on local rank 0 of each node; a no-op once the files are there.)
        datamodule.prepare_data()
    trainer.logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), **layout})

    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    (metrics,) = trainer.test(model, datamodule=datamodule, ckpt_path="best")

    info(
        f"Test accuracy {metrics['test/acc']:.4f}, test loss {metrics['test/loss']:.4f} "
        f"(best checkpoint {trainer.checkpoint_callback.best_model_path})"
    )
    info(f"Run directory: {cfg.paths.output_dir}")
    return metrics


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, float]:
    """Hydra's entry point: :func:`train`, with usage errors reported as one line and exit status 1."""
    try:
        return train(cfg)
    except UsageError as error:
        # Lightning has already stopped the other processes when this comes out of fit/test.
        log.error(f"{type(error).__name__}: {error}")
        sys.exit(1)


if __name__ == "__main__":
    main()
