"""The loggers of a job, built from its ``logger`` config node, and their tracker runs kept across
the starts of one run.

A run resumed in place (``hydra.run.dir=<run> ckpt_path=last``) or restarted by its launcher
(torchrun ``--max-restarts``, a SLURM requeue) starts again in the same run directory. Its
trackers continue the same tracker run there instead of opening another: global rank 0 writes
each one's run id to ``<run dir>/trackers.json`` when the run first starts (:func:`record_tracker_runs`),
and every later start hands it back to the logger (:func:`build_loggers`). TensorBoard and CSV
have no run id; they continue in their folders, dropping the points the earlier start logged
after its last checkpoint (``purge_step``), since the resumed run logs those steps again
(:mod:`ddp_engine.loggers.tensorboard_logger` marks that so that every TensorBoard reader drops them).
"""

import fcntl
import importlib.util
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.core.files import write_json
from ddp_engine.loggers.csv_logger import CSVLogger

log = logging.getLogger(__name__)

#: In the run directory: ``{"mlflow": {"run_id": ...}, "wandb": {"id": ...}}``, by logger key.
TRACKER_RUNS_FILE = "trackers.json"


def build_loggers(config: DictConfig, run_dir: Path, log_dir: Path, purge_step: int | None = None) -> list[Logger]:
    """One Lightning logger per key of ``config`` (the ``logger`` node; an unset key is skipped).

    Args:
        config: ``logger``: ``{key: {_target_: <logger class>, ...}}``.
        run_dir: the job's run directory; its ``trackers.json`` (if any) names the tracker runs
            to continue.
        log_dir: ``paths.log_dir``; an MLflow or W&B run without a ``run_name`` / ``name`` is
            named by the run directory relative to it (``runs/2026-12-01_10-00-00.000000``), as
            TensorBoard names its runs.
        purge_step: the optimizer step a resume in place starts from (None: not such a resume):
            TensorBoard's and CSV's points from that step on are dropped.

    Returns:
        The loggers, in the order of ``config``; empty for ``logger=[]``.
    """
    saved = json.loads((run_dir / TRACKER_RUNS_FILE).read_text()) if (run_dir / TRACKER_RUNS_FILE).is_file() else {}
    run_name = str(run_dir.relative_to(log_dir)) if run_dir.is_relative_to(log_dir) else run_dir.name
    loggers = []
    for key, node in config.items():
        if node is None:
            continue
        cls = get_class(node._target_)
        options: dict[str, Any] = {}
        if issubclass(cls, TensorBoardLogger | CSVLogger) and purge_step is not None:
            options["purge_step"] = purge_step
        if issubclass(cls, MLFlowLogger):
            options["run_name"] = node.get("run_name") or run_name
            options["run_id"] = saved.get(key, {}).get("run_id")
        if issubclass(cls, WandbLogger):
            options["name"] = node.get("name") or run_name
            if saved_id := saved.get(key, {}).get("id"):
                options |= {"id": saved_id, "resume": "allow"}
        with _store_lock(node.get("tracking_uri")):
            loggers.append(instantiate(node, **options))
    return loggers


@contextmanager
def _store_lock(tracking_uri: str | None) -> Iterator[None]:
    """Hold an exclusive lock on ``<db>.lock`` beside an MLflow SQLite store while a client opens it.

    Every process of the job builds its loggers, and MLflow's client creates or upgrades the
    store's tables when it opens it (``MLFlowLogger.__init__``); two at once fail in MLflow's
    database migration ("Online migration expected to match one row"). So do two runs started at
    once on the same store. One at a time, the later ones find the tables made.
    """
    prefix = "sqlite:///"
    if not tracking_uri or not tracking_uri.startswith(prefix):
        yield
        return
    lock_path = Path(tracking_uri.removeprefix(prefix)).with_suffix(".db.lock")
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def tracker_runs(loggers: Mapping[str, Logger]) -> dict[str, dict[str, str]]:
    """``{key: {"run_id": ...}}`` for each MLflow logger and ``{key: {"id": ...}}`` for each W&B
    logger of ``loggers`` (by config key), starting their tracker runs (call on global rank 0)."""
    runs = {}
    for key, logger in loggers.items():
        if isinstance(logger, MLFlowLogger):
            runs[key] = {"run_id": logger.run_id, "tracking_uri": logger.experiment.tracking_uri}
        elif isinstance(logger, WandbLogger):
            runs[key] = {"id": logger.experiment.id}
    return runs


@rank_zero_only
def record_tracker_runs(config: DictConfig, loggers: list[Logger], run_dir: Path) -> None:
    """Write the tracker runs of ``loggers`` (built from ``config`` by :func:`build_loggers`) to
    ``<run_dir>/trackers.json`` (global rank 0 only; atomically), so that a later start of this
    run continues them. Nothing is written for TensorBoard and CSV only."""
    keys = [key for key, node in config.items() if node is not None]
    if runs := tracker_runs(dict(zip(keys, loggers))):
        write_json(run_dir / TRACKER_RUNS_FILE, runs)
        log.info(f"Tracker runs: {', '.join(f'{key} {next(iter(run.values()))}' for key, run in runs.items())}")


#: The package each tracker's logger needs, which this project's optional extra of the same name installs.
TRACKER_PACKAGES = {MLFlowLogger: "mlflow", WandbLogger: "wandb"}


def check_tracker_packages(config: DictConfig) -> None:
    """Check that the package of each tracker in ``config`` (the ``logger`` node) is installed.

    Raises:
        ConfigValueError: naming the first missing one and the extra that installs it.
    """
    for key, node in config.items():
        cls = None if node is None else get_class(node._target_)
        package = next((name for base, name in TRACKER_PACKAGES.items() if cls and issubclass(cls, base)), None)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigValueError(
                f"logger.{key} needs the {package} package, which is not installed: "
                f"pip install 'ddp-engine[{package}]' (or pip install {package})."
            )
