"""The task's own commands (``task.predict``, ``task.export``) and the functions a config names
(``module:function``), as the engine finds them."""

import importlib
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf


def task_command(cfg: DictConfig, config_name: str) -> DictConfig | None:
    """The task's own command ``config_name`` (``task.predict``, ``task.export``:
    :class:`~ddp_engine.config.schema.TaskCommandConfig`), or None: not a command of the task, or
    one the task has none of."""
    return cfg.task.get(config_name) if "task" in cfg and config_name in cfg.task else None


def task_function(cfg: DictConfig, task: str) -> str | None:
    """``task`` when it is ``module:function``, else what ``cfg`` holds at the key ``task`` names
    (``task.predict.run``: the task's own ``module:function``, None when the task has no predict)."""
    return task if ":" in task else OmegaConf.select(cfg, task)


def imported(function: str) -> Callable:
    """The function ``module:function`` names, its module imported."""
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)
