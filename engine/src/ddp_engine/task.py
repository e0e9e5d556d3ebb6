"""What a task tells the engine, in one object: :class:`Task`, declared in the task's package as
``<package>.task.TASK`` and handed to the engine by its entry points (``entry_point(TASK, ...)``).

The engine keeps it for this process (:func:`register`) and, through :data:`TASK_ENV`, for the
processes it starts; any engine module asks :func:`current` for it. Its facts reach every command's
config as the ``task`` node (with the task's ``data`` and ``model`` as the defaults of those groups),
where the command line may still change them (``task.objective=val/loss``).
"""

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

#: The import package of the task registered in this process, for the processes it starts; its
#: module ``<package>.task`` holds the task as ``TASK``.
TASK_ENV = "DDP_ENGINE_TASK"


def _no_schemas(store: ConfigStore) -> None:
    """A task without config schemas of its own: its YAML is checked against its classes' signatures."""


@dataclass(frozen=True)
class TaskCommand:
    """``predict`` or ``export`` of a task, each function a ``module:function``.

    Attributes:
        run: what each process of a prediction does with the job's config (``run(cfg) -> dict``),
            or the export, in the command's own process; global rank 0's dict is the job's results,
            which the engine writes to ``metrics.json``.
        check_paths: ``(cfg) -> None``, called before torch is imported (its module must import
            none): refuses paths that name nothing. None: nothing to check.
        check_job: ``(cfg, model, world_size) -> None``, called once the job's model is built for its
            checkpoint, before any process starts. None: nothing to check.
    """

    run: str
    check_paths: str | None = None
    check_job: str | None = None


@dataclass(frozen=True)
class Task:
    """A task as the engine runs it: every fact the engine reads from a task, each declared once.

    Attributes:
        package: the task's import package; its commands are ``python -m <package>.<command>``
            (``train``, ``eval``, ``predict``, ``export``), as the engine prints them (the resume
            command) and starts them.
        data: the option of its ``conf/data/`` that builds its DataModule (a ``ShardedDataModule``)
            unless a command chooses another (``data=<option>``).
        model: the option of its ``conf/model/`` that builds its LightningModule, likewise.
        objective: the metric (a tag its LightningModule logs in validation) that chooses the best
            checkpoint and that a sweep optimizes; a metric never logged is refused at the first validation.
        mode: ``max`` or ``min``: whether the objective is better higher (an accuracy) or lower (a loss).
        metrics: the metrics worth a glance, in order: the final lines of train and eval, the columns
            of a sweep's ``summary.csv``, TensorBoard's HPARAMS.
        callbacks: the task's own Lightning callbacks, given to every Trainer (train, eval, predict):
            a name each, mapped to its Hydra node (``{"_target_": <class>, <argument>: <value>}``);
            a command removes one with ``~task.callbacks.<name>``.
        predict: what ``python -m <package>.predict`` runs with a checkpoint of the task, or None
            for a task that has none (the command refuses it in one line).
        export: the same for ``python -m <package>.export``.
        schemas: stores the task's own config schemas in Hydra's ConfigStore (its data sets', its
            commands'), under the names its YAML's defaults lists give them.
        trusted_modules: modules of other libraries that its configs build from (``timm.models``): a
            run folder's saved config may build what they define, besides the task's package and
            :data:`ddp_engine.config.trust.TRUSTED_MODULES`.
        config_dir: the folder of its Hydra configs; None (default): ``conf/`` beside the package
            where a wheel put it, else the repository's ``conf/`` (two folders above a ``src/`` package).
    """

    package: str
    data: str
    model: str
    objective: str
    mode: str
    metrics: Sequence[str]
    callbacks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    predict: TaskCommand | None = None
    export: TaskCommand | None = None
    schemas: Callable[[ConfigStore], None] = _no_schemas
    trusted_modules: Sequence[str] = ()
    config_dir: Path | None = None

    def configs(self) -> Path:
        """:attr:`config_dir`, or where the task's package keeps its configs (see there)."""
        if self.config_dir is not None:
            return Path(self.config_dir)
        spec = importlib.util.find_spec(self.package)
        package_dir = Path(spec.origin).parent
        return package_dir / "conf" if (package_dir / "conf").is_dir() else package_dir.parents[1] / "conf"

    def config_node(self) -> dict[str, Any]:
        """The task as a config: its data and model as the defaults of those groups, then its ``task`` node."""
        commands = {name: None if command is None else vars(command)
                    for name, command in (("predict", self.predict), ("export", self.export))}  # fmt: skip
        task = {"objective": self.objective, "mode": self.mode, "metrics": list(self.metrics),
                "callbacks": {name: dict(node) for name, node in self.callbacks.items()}, **commands}  # fmt: skip
        return {"defaults": [{"/data": self.data}, {"/model": self.model}, "_self_"], "task": task}


_registered: Task | None = None


def register(task: Task) -> None:
    """Make ``task`` the one this process and the processes it starts run."""
    global _registered
    _registered = task
    os.environ[TASK_ENV] = task.package


def current() -> Task:
    """The task registered in this process, or, in a process a registered one started (a worker),
    ``<package>.task.TASK`` of the package in :data:`TASK_ENV`.

    Raises:
        RuntimeError: when no task was registered: the engine runs through a task's entry points
            (``python -m <package>.train``), or a test registers one first.
    """
    global _registered
    if _registered is None:
        package = os.environ.get(TASK_ENV)
        if not package:
            raise RuntimeError(
                "No task is registered with the engine: run a task's command (python -m <package>.train), "
                "or call ddp_engine.api.register(TASK) first."
            )
        _registered = importlib.import_module(f"{package}.task").TASK
    return _registered


def imported(function: str) -> Callable:
    """The function ``module:function`` names, its module imported."""
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)
