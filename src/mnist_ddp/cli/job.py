"""One Hydra job: run its task on this machine's DDP processes, or, under torchrun or SLURM, here.

Hydra calls an entry point's task function once per job (once, or once per job of a ``-m``
sweep). :func:`run_job` then either supervises the job's worker processes
(:mod:`mnist_ddp.distributed.launch`), or, when torchrun or SLURM started this process as one of the job's
processes, runs the task in it. Either way, global rank 0 ends with ``metrics.json`` in the
run directory: the task's metrics, the job's overrides and its status.

Under torchrun or SLURM every process is started by the launcher with the same command line;
what they need is a run directory whose name every process computes alike (:func:`mnist_ddp.cli.outputs.run_stamp`)
and a resume after the launcher restarts the job (:func:`launcher_restarts`).
"""

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from mnist_ddp.cli.outputs import write_json
from mnist_ddp.cli.resume import resume_command
from mnist_ddp.distributed.launch import (
    JobInterrupted,
    collect_stacks,
    launch,
    launched_externally,
    remove_stacks,
    run_dir_lock,
    write_job_file,
)
from mnist_ddp.distributed.layout import processes_per_node
from mnist_ddp.errors import JobFailedError

log = logging.getLogger(__name__)

#: The metrics file of a job, in its run directory.
METRICS_FILE = "metrics.json"


def run_job(task: Callable[[DictConfig], dict], cfg: DictConfig) -> dict:
    """Run ``task(cfg)`` in every process of this job and return global rank 0's metrics.

    Args:
        task: the job's work in one process, a module-level function (the workers import it by
            name); global rank 0 writes its metrics to ``metrics.json`` and returns them.
        cfg: the job's composed config.

    Returns:
        The metrics, plus ``status`` (``completed`` or ``failed``) and ``overrides`` (this job's
        command-line overrides). In a ``-m`` sweep a failed job returns ``status: failed``, the
        failed ``rank`` and its ``error``, and no metrics, so that the next job runs.

    Raises:
        JobFailedError: a process of a single run failed (every process has ended).
        SystemExit: 128 + the signal when SIGINT, SIGTERM or SIGHUP stopped the run (or the sweep).
    """
    run_dir = Path(cfg.paths.output_dir)
    overrides = list(HydraConfig.get().overrides.task)
    # Before the process group forms: the workers inherit them; under torchrun this process is one.
    os.environ.update(cfg.launcher.env)
    if launched_externally():
        metrics = task(cfg)
    else:
        with run_dir_lock(run_dir):
            metrics = supervise(task, cfg)
        if metrics.get("status") == "failed":  # a failed job of a sweep: recorded as it is
            return metrics
    metrics = {"status": "completed", "overrides": overrides, **metrics}
    if rank_zero_only.rank == 0:
        write_json(run_dir / METRICS_FILE, metrics)
    return metrics


def supervise(task: Callable[[DictConfig], dict], cfg: DictConfig) -> dict:
    """:func:`run_job` on this machine: write the job file, run the workers, and read
    rank 0's metrics; a failure or a stop is recorded in ``metrics.json`` (see :func:`run_job`)."""
    run_dir, overrides = Path(cfg.paths.output_dir), list(HydraConfig.get().overrides.task)
    # Run with python -m, the entry point's module is __main__; the workers import it by its name.
    module = task.__module__ if task.__module__ != "__main__" else sys.modules["__main__"].__spec__.name
    job_file = write_job_file(run_dir, f"{module}:{task.__name__}", cfg, HydraConfig.get().job_logging)
    try:
        launch(
            job_file,
            processes_per_node(cfg.trainer.accelerator, cfg.trainer.devices),
            cfg.launcher.rendezvous_timeout,
            cfg.launcher.shutdown_timeout,
        )
    except JobInterrupted as stopped:
        remove_stacks(run_dir)
        write_json(run_dir / METRICS_FILE, {"status": "stopped", "signal": stopped.signum.name, "overrides": overrides})
        log.warning(f"Run {run_dir} {stopped}: every process has ended.")
        sys.exit(128 + stopped.signum)
    except JobFailedError as failed:
        if hangs := collect_stacks(run_dir, failed):
            log.error(
                f"A collective timed out after strategy.timeout. Every rank's Python stack: "
                f"{', '.join(str(path) for path in hangs)} (the rank that was not waiting in the collective "
                "is the one to look at)."
            )
        record = {"status": "failed", "rank": failed.rank, "error": failed.error, "overrides": overrides}
        write_json(run_dir / METRICS_FILE, record)
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            if (last := run_dir / "checkpoints" / "last.ckpt").is_file():
                log.warning(
                    f"Last complete checkpoint: {last}. Once the cause is fixed, resume this run in place with: "
                    f"{resume_command(run_dir)}"
                )
            raise
        log.error(f"Job {run_dir} failed: {failed}. The sweep goes on with the next job.")
        return record
    remove_stacks(run_dir)
    return json.loads((run_dir / METRICS_FILE).read_text())


def launcher_rank() -> int:
    """This process's global rank when torchrun or SLURM started it (``RANK`` / ``SLURM_PROCID``), else 0."""
    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect():
            return environment().global_rank()
    return 0


def launcher_restarts() -> int:
    """How many times the launcher has restarted this job: torchrun's ``TORCHELASTIC_RESTART_COUNT``
    (``--max-restarts``), SLURM's ``SLURM_RESTART_COUNT`` (requeues); 0 otherwise."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or 0)


class RankFilter(logging.Filter):
    """Adds ``record.rank``: this process's global rank (0 before the process group exists)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = rank_zero_only.rank
        return True


class RankZeroWarningsFilter(logging.Filter):
    """Drops Python warnings (logger ``py.warnings``) on global ranks other than 0.

    Every DDP process imports the same libraries and runs the same code, so each one would print
    the same deprecation or usage warning: on the console, rank 0's copy is enough. The log file
    keeps every rank's (its handler does not have this filter).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "py.warnings" or rank_zero_only.rank == 0
