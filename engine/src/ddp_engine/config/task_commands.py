"""The task's own commands (``task.predict``, ``task.export``) and the functions a config names
(``module:function``), as the engine finds them."""

from omegaconf import DictConfig, OmegaConf

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.task import current

#: The commands that run a function of the task's own (:class:`~ddp_engine.task.TaskCommand`).
TASK_COMMANDS = ("predict", "export")


def check_task_has(config_name: str, cfg: DictConfig | None = None) -> None:
    """Refuse ``python -m <package>.<config_name>`` (``predict``, ``export``) for a task that has no
    such command: its :class:`~ddp_engine.task.Task` declares none, or ``cfg``'s ``task`` node says
    none (``task.predict=null``). Called before the command line is composed, and with each job.

    Raises:
        ConfigValueError: naming the task and where to declare the command.
    """
    if config_name not in TASK_COMMANDS:
        return
    if getattr(current(), config_name) is None or (cfg is not None and task_command(cfg, config_name) is None):
        package = current().package
        raise ConfigValueError(
            f"{config_name}: the task {package} has no {config_name}: declare one in its Task ({package}.task.TASK: "
            f"{config_name}=TaskCommand(...); engine/docs/tasks.md)."
        )


def task_command(cfg: DictConfig, config_name: str) -> DictConfig | None:
    """The task's own command ``config_name`` (``task.predict``, ``task.export``:
    :class:`~ddp_engine.config.schema.TaskCommandConfig`), or None: not a command of the task, or
    one the task has none of."""
    return cfg.task.get(config_name) if "task" in cfg and config_name in cfg.task else None


def task_function(cfg: DictConfig, task: str) -> str | None:
    """``task`` when it is ``module:function``, else what ``cfg`` holds at the key ``task`` names
    (``task.predict.run``: the task's own ``module:function``, None when the task has no predict)."""
    return task if ":" in task else OmegaConf.select(cfg, task)
