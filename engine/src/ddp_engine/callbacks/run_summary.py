"""What tells one run from another in its trackers: the settings (HPARAMS in TensorBoard) and the config as text."""

import json
from collections.abc import Iterator, Mapping, Sequence

import lightning as L
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from typing_extensions import override

from ddp_engine.distributed.layout import data_parallel_layout
from ddp_engine.loggers.media import log_settings


class RunSummary(L.Callback):
    """Writes a run's settings to its loggers (global rank 0), each the way its tool shows them
    (:mod:`ddp_engine.loggers.media`).

    When fit starts:

    - Settings: the composed config flattened to dotted keys (see :func:`flatten_config`), the
      job's own command-line overrides first (a group choice such as ``model=mlp`` as the key
      ``model``), plus ``world_size``, ``num_nodes``, ``backend`` (read from the process group:
      ``nccl`` or ``gloo``), ``per_device_batch_size``, ``global_batch_size`` and
      ``accumulate_grad_batches``. In TensorBoard, the HPARAMS table with the overrides as its
      first columns and ``metrics`` as its metric columns; TensorBoard fills those with the last
      point of the scalar tags, which the training logs last from the best checkpoint
      (``val/...``) and the test set (``test/...``). Every job of a sweep is one row. In MLflow,
      run parameters; in W&B, the run config; in CSV, ``hparams.yaml``.
    - The composed config as YAML, interpolations resolved: TensorBoard's text ``config``, MLflow's
      artifact ``config.yaml``.

    Args:
        config: the job's composed config.
        overrides: the job's command-line overrides (``key=value``, as in ``.hydra/overrides.yaml``;
            default none).
        extra_hparams: more settings, such as values derived from the config (default none).
        metrics: scalar tags shown as HPARAMS metrics (the task's, ``task.metrics``; default none).
    """

    def __init__(
        self,
        config: DictConfig,
        overrides: Sequence[str] = (),
        extra_hparams: Mapping[str, int | float | str] | None = None,
        metrics: Sequence[str] = (),
    ) -> None:
        settings = {**flatten_config(config), **(extra_hparams or {})}
        # The overrides' keys first, in the order given: a group choice (model=mlp) is not a key of
        # the config, so it gets its own, with the option chosen.
        self.overridden: dict[str, int | float | str] = {}
        for argument in overrides:
            key, _, value = argument.lstrip("+~").partition("=")
            self.overridden[key] = settings.get(key, value)
        self.hparams = {**self.overridden, **settings}
        self.config_yaml = OmegaConf.to_yaml(config, resolve=True)
        self.global_batch_size = config.data.global_batch_size
        self.metrics = tuple(metrics)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        run = {
            **data_parallel_layout(trainer, self.global_batch_size),
            "num_nodes": trainer.num_nodes,
            "backend": dist.get_backend() if dist.is_initialized() else "none",
        }
        log_settings(trainer, {**self.hparams, **run}, self.metrics, self.config_yaml, first=list(self.overridden))


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
