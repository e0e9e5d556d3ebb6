"""This project as the engine sees it (:class:`ddp_engine.project.Project`): its package, its configs'
folder and schemas, and where earlier versions kept the classes its saved runs name.

Its entry points (:mod:`mnist_ddp.train`, ``eval``, ``predict``, ``export``) hand :data:`PROJECT` to
the engine; so do the tests that compose a config in their own process (``tests/conftest.py``).
"""

from pathlib import Path

from ddp_engine.project import Project

from mnist_ddp.schema import DATA_SCHEMA_TARGETS, register_schemas

#: ``conf/``, where the entry points read their configs. An installed wheel (``pip install .``) has it
#: as the package data ``mnist_ddp/conf/``, which pyproject.toml maps the repository's top-level
#: ``conf/`` onto; a source checkout (the editable install of ``make``) has no such folder and reads
#: the repository's ``conf/`` itself, so that an edit there takes effect at once.
_PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = _PACKAGE_DIR / "conf" if (_PACKAGE_DIR / "conf").is_dir() else _PACKAGE_DIR.parents[1] / "conf"

#: The engine's modules that the configs name, which were this package's until the engine became a
#: package of its own (``ddp_engine``, version 0.1.0 of both).
_ENGINE_MODULES = (
    "callbacks.ddp_report", "callbacks.memory", "callbacks.progress_bar", "callbacks.run_summary",
    "callbacks.signals", "callbacks.step_anatomy", "callbacks.throughput", "core.log_filters",
    "distributed.checkpoint_io", "distributed.strategy", "launch.sweep_summary", "launch.job",
    "loggers.csv_logger", "loggers.tensorboard_logger", "data.sharding",
)  # fmt: skip
#: Where the modules of a saved run's ``_target_``s are now: those of version 0.1's one flat package
#: (before the layout by concern), then the engine's (see :func:`ddp_engine.config.schema.upgrade_targets`).
MOVED_MODULES = {
    "mnist_ddp.data": "mnist_ddp.data.datamodule",
    "mnist_ddp.sharding": "ddp_engine.data.sharding",
    "mnist_ddp.model": "mnist_ddp.models.classifier",
    "mnist_ddp.run_summary": "ddp_engine.callbacks.run_summary",
    "mnist_ddp.throughput": "ddp_engine.callbacks.throughput",
    "mnist_ddp.misclassified": "mnist_ddp.callbacks.misclassified",
    "mnist_ddp.ddp_report": "ddp_engine.callbacks.ddp_report",
    "mnist_ddp.interrupts": "ddp_engine.callbacks.signals",
    "mnist_ddp.strategy": "ddp_engine.distributed.strategy",
    "mnist_ddp.checkpoint_io": "ddp_engine.distributed.checkpoint_io",
    "mnist_ddp.job": "ddp_engine.launch.job",
    "mnist_ddp.sweep_summary": "ddp_engine.launch.sweep_summary",
    **{f"mnist_ddp.{module}": f"ddp_engine.{module}" for module in _ENGINE_MODULES},
}
#: Classes that left their old module for another one than the rest of it.
MOVED_CLASSES = {
    "mnist_ddp.model.CNN": "mnist_ddp.models.networks.CNN",
    "mnist_ddp.model.MLP": "mnist_ddp.models.networks.MLP",
}

PROJECT = Project(
    package=__package__,
    config_dir=CONFIG_DIR,
    register_schemas=register_schemas,
    data_schema_targets=DATA_SCHEMA_TARGETS,
    moved_modules=MOVED_MODULES,
    moved_classes=MOVED_CLASSES,
)
