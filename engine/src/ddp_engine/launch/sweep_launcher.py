"""The Hydra launcher of ``-m`` sweeps: Hydra's basic launcher (one job after another), which also
continues a sweep run again into its own directory.

The same sweep command again with ``hydra.sweep.dir=<that sweep>`` continues it (the check before
launch refuses a command whose sweep differs from the one recorded there:
:func:`ddp_engine.config.checks.check_sweep_dir`). Each job's directory says what is left to do:

- a job that completed is kept: not run again, its files untouched, its row in the summary;
- a job that failed is kept as failed, unless ``hydra.launcher.rerun_failed=true``;
- a job with a ``last.ckpt`` that did not complete (stopped by a signal or a kill, or failed and
  run again) resumes in place from it, exactly as ``ckpt_path=last`` resumes a single run;
- a job stopped before its first checkpoint starts again; what it wrote is moved aside to
  ``<sweep>/.stopped/<job>.<n>/`` (kept, out of TensorBoard's and the summary's way);
- a job never started runs.

Job numbers and directories are those of the first command: Hydra numbers the jobs of the same
sweep alike.
"""

import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict
from typing_extensions import override

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.core.run_dir import LAST_CHECKPOINT, SWEEP_DIR_ENV, read_metrics, run_status
from ddp_engine.launch.job_slots import DevicePool, cpu_slot_size, jobs_at_a_time, visible_gpus
from ddp_engine.launch.parallel_jobs import JobProcess, ParallelJobs
from ddp_engine.launch.sweep_summary import RESUMED

log = logging.getLogger(__name__)

#: Where a job stopped before its first checkpoint has its earlier outputs moved, in the sweep's directory.
STOPPED_DIR = ".stopped"


class JobPlan(Enum):
    """What a continued sweep does with one job, by what its directory holds (:func:`plan_job`)."""

    #: Not run: it completed (or failed, and failed jobs are not run again).
    KEEP = "kept"
    #: Resumed in place from its ``last.ckpt``.
    RESUME = "resumed"
    #: Started again: it stopped before its first checkpoint (its outputs moved aside first).
    RESTART = "started again"
    #: Run: nothing of it is there.
    RUN = "run"


def plan_job(job_dir: Path, rerun_failed: bool) -> JobPlan:
    """What to do with the job whose directory is ``job_dir`` (see the module's docstring)."""
    status = run_status(job_dir)
    if status == "completed" or (status == "failed" and not rerun_failed):
        return JobPlan.KEEP
    if any((job_dir / LAST_CHECKPOINT.parent).glob("*.ckpt")):  # resume_point: the newest of them
        return JobPlan.RESUME
    return JobPlan.RESTART if job_dir.exists() else JobPlan.RUN


def move_aside(job_dir: Path) -> Path:
    """Move the outputs of a job stopped before its first checkpoint to ``<sweep>/.stopped/<job>.<n>``
    (the first free ``n``), so that the job starts again in an empty directory. Returns where."""
    stopped = job_dir.parent / STOPPED_DIR
    stopped.mkdir(exist_ok=True)
    number = 0
    while (target := stopped / f"{job_dir.name}.{number}").exists():
        number += 1
    shutil.move(job_dir, target)
    return target


#: The sweep directories this process holds (:func:`hold_sweep`).
_held: set[Path] = set()


@contextmanager
def hold_sweep(sweep_dir: Path) -> Iterator[None]:
    """Hold ``sweep_dir`` for this command: another command running the same sweep meanwhile is
    refused. An advisory lock (``flock``) on the directory itself, so that it adds no file to the
    sweep; the kernel releases it when this process ends, however it ends. Held already by this
    process (a search holds its sweep across the launches of its trials), it is held on.

    Raises:
        ConfigValueError: when another process holds it.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    key = sweep_dir.resolve()
    if key in _held:  # a second flock of this process's own, on another descriptor, would refuse it
        yield
        return
    descriptor = os.open(sweep_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigValueError(
                f"{sweep_dir} is in use by another command running this sweep: wait for it to end, or start this "
                "one in another directory (hydra.sweep.dir=<new folder>)."
            ) from None
        _held.add(key)
        yield
    finally:
        _held.discard(key)
        os.close(descriptor)


@dataclass
class PlannedJob:
    """One job of the sweep to run: its number, overrides (``ckpt_path=last`` added for a resume),
    composed config and run directory."""

    index: int
    overrides: list[str]
    config: DictConfig
    job_dir: Path


class ResumableLauncher(Launcher):
    """Runs a sweep's jobs, several at once where the machine holds them, and continues a sweep that
    its directory already holds (see the module's docstring).

    Args:
        rerun_failed: run the jobs that failed again (from their ``last.ckpt`` where they have one)
            when the sweep is continued (default False: they are kept as failed, and the command
            exits with status 1 after the summary, as the first one did).
        n_jobs: the most jobs running at once (default None: as many as the machine holds, each
            on its own GPUs, ``floor(GPUs / trainer.devices)``, or on CPU its own cores,
            ``floor(cores / trainer.devices)``; :mod:`ddp_engine.launch.parallel_jobs`). 1 runs them
            one after another in this process, as Hydra's basic launcher does.
    """

    def __init__(self, rerun_failed: bool = False, n_jobs: int | None = None) -> None:
        super().__init__()
        self.rerun_failed, self.n_jobs = rerun_failed, n_jobs

    @override
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def job_config(self, overrides: list[str], index: int) -> DictConfig:
        """The config of job number ``index`` with ``overrides``, as Hydra's basic launcher composes it."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = index
        return config

    @override
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # One command at a time runs a sweep: a second one continuing it meanwhile would run its jobs twice.
        with hold_sweep(Path(str(self.config.hydra.sweep.dir))):
            return self._launch(job_overrides, initial_job_idx)

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # Hydra's BasicLauncher.launch, with a plan per job: its loop has no place to skip or change one.
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        log.info(f"Launching {len(job_overrides)} jobs locally")
        # The jobs' processes (and, in parallel, their own commands) name the sweep in their resume hints.
        os.environ[SWEEP_DIR_ENV] = str(self.config.hydra.sweep.dir)
        runs, planned = plan_jobs(job_overrides, initial_job_idx, self.job_config, self.rerun_failed)
        parallel = parallel_jobs(planned, self.n_jobs)
        if parallel is not None:
            parallel.run()
            runs |= {job.index: job_return(job) for job in planned}
        for job in planned if parallel is None else []:
            runs[job.index] = run_job(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=job.config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return [runs[index] for index in sorted(runs)]


def plan_jobs(
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    job_config: Callable[[list[str], int], DictConfig],
    rerun_failed: bool,
) -> tuple[dict[int, JobReturn], list[PlannedJob]]:
    """The plan of each job of a sweep (:func:`plan_job`; see the module's docstring), for a launcher
    that continues sweeps: the ``JobReturn`` of each job kept, by job number, and the jobs to run
    (a resumed one with ``ckpt_path=last`` added, a restarted one with its outputs moved aside first).

    Args:
        job_overrides: each job's overrides, as Hydra's sweeper gives them to a launcher.
        initial_job_idx: the number of the first job.
        job_config: the composed config of a job, from its overrides and number.
        rerun_failed: run the failed jobs again (see :class:`ResumableLauncher`).
    """
    runs, planned = {}, []
    for index, overrides in enumerate(job_overrides, start=initial_job_idx):
        overrides = list(overrides)
        config = job_config(overrides, index)
        job_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        plan = plan_job(job_dir, rerun_failed)
        log.info(f"\t#{index} : {' '.join(filter_overrides(overrides))}")
        if plan is JobPlan.KEEP:
            again = " (hydra.launcher.rerun_failed=true runs it again)" if run_status(job_dir) == "failed" else ""
            log.info(f"\t#{index} {run_status(job_dir)} in an earlier run of this sweep ({job_dir}): kept{again}")
            # Its objective again, for a sweeper that asks (Optuna's, telling a trial left in flight).
            runs[index] = job_return(PlannedJob(index, overrides, config, job_dir))
            continue
        if plan is JobPlan.RESUME:
            from ddp_engine.distributed.resume_points import resume_point  # torch: only for a resume

            log.info(f"\t#{index} resumes in place from {resume_point(job_dir)}")
            overrides = [*overrides, RESUMED]
            config = job_config(overrides, index)
        elif plan is JobPlan.RESTART:
            log.info(f"\t#{index} stopped before its first checkpoint: starts again ({move_aside(job_dir)} kept)")
        planned.append(PlannedJob(index, overrides, config, job_dir))
    return runs, planned


def parallel_jobs(planned: Sequence[PlannedJob], n_jobs: int | None) -> ParallelJobs | None:
    """The jobs of ``planned`` as :class:`~ddp_engine.launch.parallel_jobs.ParallelJobs`, when more
    than one of them can run at once (``n_jobs``: see :class:`ResumableLauncher`); None to run them
    one after another here: a single job, ``n_jobs=1``, a machine that holds one job, jobs on GPUs
    and on CPU in one sweep, GPUs named by index (``trainer.devices=[0,3]``), or a process started
    by torchrun or SLURM (where each process runs the job). A job of an app without a ``trainer``
    (any Hydra app) is one process on CPU."""
    # torch (seconds to import) only now: Hydra imports this module whenever it looks for plugins.
    from ddp_engine.core.environment import launched_externally
    from ddp_engine.distributed.layout import processes_per_node, resolve_devices, uses_cuda

    if len(planned) < 2 or n_jobs == 1 or launched_externally():
        why = (
            "one job" if len(planned) < 2
            else "hydra.launcher.n_jobs=1" if n_jobs == 1
            else "each process of torchrun or SLURM runs every job in turn"
        )  # fmt: skip
        log.info(f"\tJobs one after another, in this process: {why}.")
        return None
    trainers = [job.config.get("trainer") or OmegaConf.create(ONE_CPU_PROCESS) for job in planned]
    cuda = {uses_cuda(resolve_devices(trainer.accelerator, trainer.devices)[0]) for trainer in trainers}
    if len(cuda) > 1 or (cuda == {True} and any(OmegaConf.is_list(trainer.devices) for trainer in trainers)):
        log.info("\tJobs one after another, in this process: the sweep mixes GPU and CPU jobs, or names GPUs by index.")
        return None
    processes = [processes_per_node(trainer.accelerator, trainer.devices) for trainer in trainers]
    if cuda == {True}:
        import torch

        pool = DevicePool(visible_gpus(torch.cuda.device_count()))
        at_a_time, needs = jobs_at_a_time(n_jobs, len(pool.free), max(processes)), processes
    else:
        pool = DevicePool(sorted(os.sched_getaffinity(0)))
        at_a_time = jobs_at_a_time(n_jobs, len(pool.free), max(processes))
        needs = [cpu_slot_size(len(pool.free), at_a_time)] * len(planned)
    log.info(f"\t{how_jobs_share(at_a_time, n_jobs, max(processes), len(pool.free), cuda == {True})}")
    if at_a_time < 2:
        return None
    grace = max(OmegaConf.select(job.config, "launcher.shutdown_timeout", default=0) for job in planned) + 30
    command = this_command()
    jobs = [
        JobProcess(job.index, job.job_dir, job.overrides,
                   [*command, *job.overrides, *carried_hydra_overrides(job.config), f"hydra.run.dir={job.job_dir}"],
                   need, cuda == {True}, count)
        for job, need, count in zip(planned, needs, processes)
    ]  # fmt: skip
    sweep_dir = planned[0].job_dir.parent
    hint = (
        f"Continue the sweep with the same command and hydra.sweep.dir={sweep_dir}: the completed jobs are kept, "
        "the stopped ones resume from their last.ckpt, the others run."
    )
    return ParallelJobs(jobs, pool, at_a_time, grace, hint)


def how_jobs_share(at_a_time: int, n_jobs: int | None, processes: int, devices: int, gpus: bool) -> str:
    """The line that says how many jobs of a sweep run at a time on this machine, and why: each job's
    ``processes`` (its GPUs, or on CPU its processes) against the machine's ``devices``, or ``n_jobs``
    (``hydra.launcher.n_jobs``) when it was given."""
    kind = "GPUs" if gpus else "CPU cores"
    need = f"each job runs {processes} process{'es' if processes > 1 else ''} and this machine has {devices} {kind}"
    if n_jobs is not None:
        need = f"hydra.launcher.n_jobs={n_jobs}; {need}"
    if at_a_time < 2:
        more = "" if n_jobs is not None else " (hydra.launcher.n_jobs=2 shares them anyway)"
        return f"Jobs one after another, in this process: {need}{more}."
    return f"{at_a_time} jobs at a time, each on its own {kind}: {need}."


#: The ``trainer`` of a job whose app has none: one process on CPU.
ONE_CPU_PROCESS = {"accelerator": "cpu", "devices": 1}


def this_command() -> list[str]:
    """The command line that started this process, less its arguments, with this interpreter:
    ``[python, -m, <package>.train]``, ``[python, app.py]`` or ``[python, <console script>]``, as the
    sweep's own command runs each of its jobs again (``sys.orig_argv``: the interpreter's options too)."""
    arguments = len(sys.argv) - 1
    return [sys.executable, *sys.orig_argv[1 : len(sys.orig_argv) - arguments]]


#: The sweep command's Hydra overrides that its jobs' own commands leave out: the sweep's, its
#: sweeper's and launcher's, the mode and the run directory (each job is a single run of its own).
SWEEP_ONLY = ("hydra.sweep", "hydra/sweeper", "hydra.launcher", "hydra/launcher", "hydra.mode", "hydra.run.")


def carried_hydra_overrides(config: DictConfig) -> list[str]:
    """The Hydra overrides of the sweep's command that each job's own command takes too (a job run
    in a process of its own composes its config again): ``hydra.searchpath`` (configs outside
    ``conf/``), ``hydra.job.*``, ``hydra.verbose``..., not the :data:`SWEEP_ONLY` ones."""
    return [
        override for override in config.hydra.overrides.hydra
        if not override.lstrip("+~").split("=", 1)[0].startswith(SWEEP_ONLY)
    ]  # fmt: skip


def job_return(job: PlannedJob) -> JobReturn:
    """What Hydra's sweeper gets for a job run in its own process, or kept from an earlier run of the
    sweep: its ``metrics.json``'s objective (``task.objective`` of a training) as the return value, or None
    for a job that did not complete."""
    metrics = read_metrics(job.job_dir)
    value = metrics.get(metrics.get("objective", "")) if run_status(job.job_dir) == "completed" else None
    returned = JobReturn(overrides=job.overrides, cfg=job.config, status=JobStatus.COMPLETED)
    returned.return_value = value
    return returned
