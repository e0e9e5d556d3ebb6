"""The engine's public module: all that a task imports from the engine (``from ddp_engine.api import
...``), and the one place a task may import it from (the project's import-linter contract).

A name is imported on first use, so that an entry point that imports :func:`entry_point` does not
import torch and Lightning (seconds) before its command line is checked.
"""

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names and their modules, read by __getattr__ from this source
    from ddp_engine.callbacks.signals import stop_on_signals
    from ddp_engine.config.command_line import entry_point
    from ddp_engine.config.schema import ExportConfig, JobConfig, PathsConfig, PredictConfig, TaskConfig
    from ddp_engine.core.errors import (
        ConfigValueError,
        DataFormatError,
        DataNotAvailableError,
        ExportError,
        UsageError,
        first_line,
    )
    from ddp_engine.core.files import atomic_path, check_writable, write_csv, write_json
    from ddp_engine.core.run_dir import METRICS_FILE
    from ddp_engine.data.conformance import check_conformance
    from ddp_engine.data.gather import GatherDataset, collate_for
    from ddp_engine.data.sharded import ShardedDataModule, unrepeated_loader
    from ddp_engine.loggers.media import log_figure, media_loggers
    from ddp_engine.models.build import build_model
    from ddp_engine.models.optimization import build_lr_scheduler, needs_total_steps
    from ddp_engine.models.step_logging import logs_this_step
    from ddp_engine.run.host_memory import keep_freed_host_memory
    from ddp_engine.run.trainer import build_trainer
    from ddp_engine.task import Task, TaskCommand, register
    from ddp_engine.testing import TaskGuarantees


def _exports() -> dict[str, str]:
    """``{name: module}`` of every name imported above, read from this file's source."""
    tree = ast.parse(Path(__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


#: Where each public name is defined.
EXPORTS = _exports()
__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> object:
    if name not in EXPORTS:
        raise AttributeError(f"ddp_engine.api has no {name}: the engine's public names are {', '.join(__all__)}")
    value = getattr(importlib.import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
