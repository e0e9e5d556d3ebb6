"""What tells one run from another in TensorBoard, and what the model is fed: HPARAMS, the
config as text, and one input batch as an image."""

import json
from collections.abc import Iterator, Mapping, Sequence

import lightning as L
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard.summary import hparams

from mnist_ddp.callbacks.figures import digit_grid, tensorboard_writers
from mnist_ddp.cli.trainer import data_parallel_layout


class RunSummary(L.Callback):
    """Writes a run's settings and first input batch into its TensorBoard event file (global rank 0).

    When fit starts:

    - HPARAMS tab: the composed config flattened to dotted keys (see :func:`flatten_config`),
      plus ``world_size``, ``num_nodes``, ``backend`` (read from the process group: ``nccl`` or
      ``gloo``), ``per_device_batch_size``, ``global_batch_size`` and ``accumulate_grad_batches``.
      Its metric columns are ``metrics``; TensorBoard fills them with the last point of those
      scalar tags, which the entry point logs last from the best checkpoint (``val/acc``) and
      the test set (``test/acc``). Every job of a sweep is one row.
    - Text ``config``: the composed config as YAML, interpolations resolved.

    At the first training step (not again when a run resumes from a checkpoint):

    - Image ``train/input_batch``: up to ``max_images`` digits of global rank 0's first batch,
      un-normalized, each titled with its class name (a wrong label or a blank image shows here),
      from the DataModule's ``class_names`` and ``hparams.mean`` / ``hparams.std``.

    Only a :class:`~lightning.pytorch.loggers.TensorBoardLogger` gets these.

    Args:
        config: the job's composed config.
        extra_hparams: more HPARAMS columns, such as values derived from the config (default none).
        metrics: scalar tags shown as HPARAMS metrics (default ``("val/acc", "test/acc")``).
        max_images: digits in the input batch image (default 64).
    """

    def __init__(
        self,
        config: DictConfig,
        extra_hparams: Mapping[str, int | float | str] | None = None,
        metrics: Sequence[str] = ("val/acc", "test/acc"),
        max_images: int = 64,
    ) -> None:
        self.hparams = {**flatten_config(config), **(extra_hparams or {})}
        self.config_yaml = OmegaConf.to_yaml(config, resolve=True)
        self.global_batch_size = config.data.global_batch_size
        self.metrics = tuple(metrics)
        self.max_images = max_images

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        run = {
            **data_parallel_layout(trainer, self.global_batch_size),
            "num_nodes": trainer.num_nodes,
            "backend": dist.get_backend() if dist.is_initialized() else "none",
        }
        # Not TensorBoardLogger.log_hyperparams: given metrics, it logs them as placeholder points
        # at step 0 of the real val/acc and test/acc charts. The hparams plugin's summaries below
        # name the metrics without a value, and TensorBoard reads the values from those charts.
        summaries = hparams({**self.hparams, **run}, {metric: 0.0 for metric in self.metrics})[:2]
        for writer in tensorboard_writers(trainer):
            for summary in summaries:  # the experiment (columns) and this session's values
                writer._get_file_writer().add_summary(summary)
            writer.add_text("config", f"```yaml\n{self.config_yaml}```", global_step=0)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step != 0 or batch_idx != 0 or trainer.current_epoch != 0 or not trainer.is_global_zero:
            return
        images, labels = batch[0][: self.max_images], batch[1][: self.max_images]
        for writer in tensorboard_writers(trainer):
            data = trainer.datamodule
            titles = [data.class_names[label] for label in labels.tolist()]
            figure = digit_grid(images, titles, data.hparams.mean, data.hparams.std, heading="label")
            writer.add_figure("train/input_batch", figure, global_step=0)


def flatten_config(config: DictConfig) -> dict[str, int | float | str]:
    """The config as ``{"model.optimizer.lr": 0.003, ...}``, interpolations resolved.

    HPARAMS takes numbers and strings only (it would show a boolean as 0/1 and drop a null), so
    booleans, nulls and lists become their JSON text: ``true``, ``null``, ``[32, 64]``. The keys
    are Hydra's override syntax, ready to copy onto a command line.
    """

    def leaves(node: object, path: str) -> Iterator[tuple[str, object]]:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                yield from leaves(value, f"{path}.{key}" if path else str(key))
        else:
            yield path, node

    container = OmegaConf.to_container(config, resolve=True, enum_to_str=True)
    return {
        key: value if isinstance(value, int | float | str) and not isinstance(value, bool) else json.dumps(value)
        for key, value in leaves(container, "")
    }
