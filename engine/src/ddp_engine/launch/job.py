"""One Hydra job: run its task on this machine's DDP processes, or, under torchrun or SLURM, here;
or, with ``launcher=kubeflow``, write the Kubeflow TrainJob that runs it on Kubernetes.

Hydra calls an entry point's task function once per job (once, or once per job of a ``-m``
sweep). :func:`run_job` then either supervises the job's worker processes
(:mod:`ddp_engine.launch.supervisor`), or, when torchrun or SLURM started this process as one of the job's
processes, runs the task in it, or writes the job's TrainJob (:mod:`ddp_engine.launch.kubeflow`).
Where processes ran, global rank 0 ends with ``metrics.json`` in the
run directory: the task's metrics, the job's overrides and its status.

Under torchrun or SLURM every process is started by the launcher with the same command line;
what they need is a run directory whose name every process computes alike
(:func:`ddp_engine.core.environment.run_stamp`) and a resume after the launcher restarts the job
(:func:`launcher_restarts`).
"""

import json
import logging
import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ddp_engine.core.environment import launched_externally, launcher_rank
from ddp_engine.core.errors import JobFailedError
from ddp_engine.core.files import write_json
from ddp_engine.core.lifetime import restore_stop_signals
from ddp_engine.core.run_dir import METRICS_FILE, read_metrics, restart_hint, resume_command
from ddp_engine.distributed.resume_points import resume_point, with_global_step
from ddp_engine.launch.kubeflow import write_train_job
from ddp_engine.launch.supervisor import (
    ForkserverUnavailable,
    JobInterrupted,
    collect_stacks,
    interrupt_job_on_stop_signals,
    launch,
    preload_workers,
    remove_stacks,
    run_dir_lock,
    run_in_forkserver,
    write_job_file,
)
from ddp_engine.launch.worker import end_process_group
from ddp_engine.task import current, imported

log = logging.getLogger(__name__)


def run_job(task: str, cfg: DictConfig, in_process: bool = False, objective: str | None = None) -> dict:
    """Run ``task(cfg)`` in every process of this job and return global rank 0's metrics.

    Args:
        task: the job's work in one process, ``module:function`` (imported where it runs: a
            supervisor, which runs none, imports no Lightning); global rank 0 writes its metrics
            to ``metrics.json`` and returns them.
        cfg: the job's composed config.
        in_process: run ``task`` in this process only, with no process group (an export).
        objective: the metric a sweeper optimizes (``task.objective``), recorded as ``objective`` in
            ``metrics.json`` for a sweep that runs the job in a process of its own to read back.

    Returns:
        With ``launcher=kubeflow``: the TrainJob's record (:func:`~ddp_engine.launch.kubeflow.write_train_job`).
        Otherwise the metrics, plus ``status`` (``completed`` or ``failed``) and ``overrides`` (this job's
        command-line overrides). In a ``-m`` sweep a failed job returns ``status: failed``, the
        failed ``rank`` and its ``error``, and no metrics, so that the next job runs.

    Raises:
        JobFailedError: a process of a single run failed (every process has ended).
        SystemExit: 128 + the signal when SIGINT, SIGTERM or SIGHUP stopped the run (or the sweep).
    """
    run_dir = Path(cfg.paths.output_dir)
    overrides = list(HydraConfig.get().overrides.task)
    if not in_process and cfg.launcher.get("kubeflow") is not None and not launched_externally():  # export: no launcher
        # As typed: an override's interpolation (${paths.output_dir}) resolves in the pods, for their run.
        typed = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
        return write_train_job(cfg, f"{current().package}.{HydraConfig.get().job.name}", typed)
    if in_process:
        restore_stop_signals()  # an export removes its partial file on KeyboardInterrupt
        metrics = imported(task)(cfg)
    elif launched_externally():
        # Before the process group forms; under torchrun this process is one of the job's.
        os.environ.update(cfg.launcher.env)
        metrics = imported(task)(cfg)
        # As the supervisor's workers do: a rank that exits with its process group alive while
        # global rank 0 still draws the test figures was aborted at exit (SIGABRT, "terminate
        # called without an active exception"), and torchrun failed the whole job.
        end_process_group()
    else:
        os.environ.update(cfg.launcher.env)  # the workers inherit them
        with run_dir_lock(run_dir):
            metrics = supervise(task, cfg, objective)
        if metrics.get("status") == "failed":  # a failed job of a sweep: recorded as it is
            return metrics
    metrics = completed(metrics, overrides, objective)
    if launcher_rank() == 0:
        write_json(run_dir / METRICS_FILE, metrics)
    return metrics


def import_supervision() -> None:
    """Import what launching and supervising a job's workers needs beyond this module (with torch):
    torch's elastic agent. About a second of CPU: called while the forkserver imports
    (:func:`~ddp_engine.launch.supervisor.preload_workers`), on the other core, instead of after
    the value checks, where it would delay the workers' start by as much."""
    import torch.distributed.elastic.multiprocessing  # noqa: F401
    import torch.distributed.launcher.api  # noqa: F401


def worker_count(accelerator: str, devices: int | str) -> int:
    """The job's worker processes on this machine, counted by Lightning's rules
    (:func:`ddp_engine.distributed.layout.processes_per_node`) in a process forked from the workers'
    forkserver, which has imported Lightning; here, where the forkserver has ended (the launch
    starts another)."""
    try:
        return run_in_forkserver("ddp_engine.distributed.layout:processes_per_node", accelerator, devices)
    except ForkserverUnavailable:
        from ddp_engine.distributed.layout import processes_per_node

        return processes_per_node(accelerator, devices)


def record(run_dir: Path, metrics: dict) -> None:
    """Write a stopped or failed job's record to its ``metrics.json``; where that write fails too
    (a full disk), one line says so, and the run's own error stays the one reported."""
    try:
        write_json(run_dir / METRICS_FILE, metrics)
    except OSError as error:
        log.error(f"The run's end could not be recorded in {run_dir / METRICS_FILE}: {error}")


def completed(metrics: dict, overrides: list[str], objective: str | None) -> dict:
    """The record of a completed job in ``metrics.json``: its status, overrides and objective, then
    global rank 0's ``metrics``."""
    return {"status": "completed", "overrides": overrides, **({"objective": objective} if objective else {}), **metrics}


def supervise(task: str, cfg: DictConfig, objective: str | None = None) -> dict:
    """:func:`run_job` on this machine: write the job file, run the workers, and read
    rank 0's metrics; a failure or a stop is recorded in ``metrics.json`` (see :func:`run_job`).
    A stop that comes once global rank 0's task has returned (its metrics written) keeps them: the
    job is recorded as completed, and the command still ends with the signal's status."""
    run_dir, overrides = Path(cfg.paths.output_dir), list(HydraConfig.get().overrides.task)
    interrupt_job_on_stop_signals()  # a stop from here is the run's, recorded below
    try:
        job_file = write_job_file(run_dir, task, cfg, HydraConfig.get().job_logging)
        task_module = task.partition(":")[0]
        preload_workers(task_module)
        nproc_per_node = worker_count(cfg.trainer.accelerator, cfg.trainer.devices)
        launch(job_file, task_module, nproc_per_node, cfg.launcher.rendezvous_timeout, cfg.launcher.shutdown_timeout)
    except JobInterrupted as stopped:
        remove_stacks(run_dir)
        finished = read_metrics(run_dir)  # rank 0's own record (no status) once its task has returned
        if finished and "status" not in finished:
            record(run_dir, completed(finished, overrides, objective))
            log.warning(f"Run {run_dir} {stopped} after its task had finished: its results are kept in {METRICS_FILE}.")
            sys.exit(128 + stopped.signum)
        record(run_dir, {"status": "stopped", "signal": stopped.signum.name, "overrides": overrides})
        log.warning(f"Run {run_dir} {stopped}: every process has ended.")
        if not stopped.workers_started and HydraConfig.get().mode != RunMode.MULTIRUN:  # the workers say it otherwise
            log.warning(f"It stopped before its processes started. {restart_hint(run_dir)}")
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            this_one = (
                "this one resumes from its last.ckpt"
                if resume_point(run_dir) is not None
                else "this one starts again (it stopped before its first checkpoint)"
            )
            log.warning(
                f"Continue the sweep with the same command and hydra.sweep.dir={HydraConfig.get().sweep.dir}: "
                f"the completed jobs are kept, {this_one}, the others run."
            )
        sys.exit(128 + stopped.signum)
    except JobFailedError as failed:
        if hangs := collect_stacks(run_dir, failed):
            log.error(
                f"A collective timed out after strategy.timeout. Every rank's Python stack: "
                f"{', '.join(str(path) for path in hangs)} (the rank that was not waiting in the collective "
                "is the one to look at)."
            )
        failure = {"status": "failed", "rank": failed.rank, "error": failed.error, "overrides": overrides}
        record(run_dir, failure)
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            if (last := resume_point(run_dir)) is not None:
                log.warning(
                    f"Last complete checkpoint: {with_global_step(last)}. Once the cause is fixed, resume this run "
                    f"in place with: {resume_command(run_dir)}"
                )
            raise
        log.error(f"Job {run_dir} failed: {failed}. The sweep goes on with the next job.")
        return failure
    remove_stacks(run_dir)
    return json.loads((run_dir / METRICS_FILE).read_text())
