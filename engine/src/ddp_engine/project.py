"""The project that runs the engine: what the engine learns from it before a config exists.

The engine knows no project by name: a project's entry points hand it their :class:`Project`
(``entry_point(PROJECT, "config", ...)``, :mod:`ddp_engine.config.command_line`), which
:func:`register` keeps for this process and, through :data:`PROJECT_ENV`, for the processes it
starts (a job's workers print the command that resumes their run). What a run's config holds
(the objective, the metrics, the task's callbacks and commands) is the config's ``task`` group,
not this.
"""

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore

#: The import package of the project registered in this process, for the processes it starts; its
#: module ``<package>.project`` holds the project as ``PROJECT``.
PROJECT_ENV = "DDP_ENGINE_PROJECT"


def _no_schemas(store: ConfigStore) -> None:
    """A project without config schemas of its own: its YAML is checked against the engine's alone."""


@dataclass(frozen=True)
class Project:
    """A project's facts the engine needs before it composes a config.

    Attributes:
        package: the project's import package; its commands are ``python -m <package>.<config name>``
            (``train``, ``eval``, ...), as the engine prints them (the resume command) and starts
            them (a parallel sweep's jobs). Its module ``<package>.project`` holds this object as ``PROJECT``.
        config_dir: the folder of the project's Hydra configs (``conf/``).
        register_schemas: stores the project's own config schemas in Hydra's ConfigStore (its
            primary configs' and data sets' schemas, named in its YAML's defaults lists).
        data_schema_targets: the class each of the project's data set schemas describes: a ``data``
            node typed by one of them builds that class (a mismatch is refused in one line).
        moved_modules: ``_target_`` modules of runs saved by earlier versions -> where they are now
            (``old.module`` -> ``new.module``), so that ``eval`` of an old checkpoint still builds.
        moved_classes: the same for classes that left their module apart from the rest of it.
    """

    package: str
    config_dir: Path
    register_schemas: Callable[[ConfigStore], None] = _no_schemas
    data_schema_targets: Mapping[type, str] = field(default_factory=dict)
    moved_modules: Mapping[str, str] = field(default_factory=dict)
    moved_classes: Mapping[str, str] = field(default_factory=dict)


_registered: Project | None = None


def register(project: Project) -> None:
    """Make ``project`` the one this process and the processes it starts run."""
    global _registered
    _registered = project
    os.environ[PROJECT_ENV] = project.package


def current() -> Project:
    """The project registered in this process, or, in a process a registered one started (a worker),
    ``<package>.project.PROJECT`` of the package in :data:`PROJECT_ENV`.

    Raises:
        RuntimeError: when no project was registered: the engine runs through a project's entry
            points (``python -m <package>.train``), or a test registers one first.
    """
    global _registered
    if _registered is None:
        package = os.environ.get(PROJECT_ENV)
        if not package:
            raise RuntimeError(
                "No project is registered with the engine: run a project's command (python -m <package>.train), "
                "or call ddp_engine.project.register(PROJECT) first."
            )
        _registered = importlib.import_module(f"{package}.project").PROJECT
    return _registered
