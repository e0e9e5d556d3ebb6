"""The command line of ``python -m <package>.<train|eval|predict|export|plan>``: checked, then run.

The check comes in two steps, both before Hydra creates a run directory and before any process
starts. First the keys and types (:mod:`ddp_engine.config.compose`) and the values that need
neither torch nor Lightning (:mod:`ddp_engine.config.early_checks`), with Hydra and OmegaConf alone:
torch and Lightning take seconds to import, and a typo or a value those rules refuse is refused in
about a second. Then the values that need objects built (:mod:`ddp_engine.config.checks`), once
those imports are done.
"""

import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ddp_engine.config.compose import Job, composed_jobs, with_trainer_arguments
from ddp_engine.config.early_checks import check_jobs_early
from ddp_engine.config.resume import in_place_run_dir, override_key, resume_arguments
from ddp_engine.config.saved_run import CHECKPOINT_USES, apply_run_settings, run_data_option
from ddp_engine.config.schema import register_configs
from ddp_engine.config.task_commands import check_task_has, task_command, task_function
from ddp_engine.config.trust import check_saved_overrides, trusted_targets
from ddp_engine.core.compat import tell_hydra_the_mode
from ddp_engine.core.console import drop_output_when_closed
from ddp_engine.core.environment import launched_externally, launcher_rank
from ddp_engine.core.errors import UsageError, exit_on_usage_error
from ddp_engine.core.lifetime import end_at_once_on_stop_signals, end_with_parent, exit_without_teardown
from ddp_engine.core.run_dir import check_checkpoint_file
from ddp_engine.launch.parallel_jobs import SWEEP_ENV
from ddp_engine.launch.sweep_summary import failed_jobs
from ddp_engine.task import Task, imported, register

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Command:
    """One of the engine's commands, as :func:`entry_point` runs it.

    Attributes:
        config_name: its top-level config in the task's ``conf/`` (which starts from ``engine/<command>``).
        function: ``module:function`` of what one process of a job does, or the config key that holds
            it (``task.predict.run``: the task's own; :func:`task_function`); imported by ``main``
            only, so that a bad command line is refused before torch and Lightning are imported.
        result: the key of the job's metrics that ``main`` returns; None: the task's objective
            (``task.objective``: what a sweeper optimizes), which the job also records in ``metrics.json``.
        in_process: run in the command's own process, with no process group (export).
    """

    config_name: str
    function: str
    result: str | None = None
    in_process: bool = False


#: The commands of every task: ``python -m <package>.<name>``.
COMMANDS = {
    "train": Command("config", "ddp_engine.run.train:fit_and_test"),
    "eval": Command("eval", "ddp_engine.run.evaluate:evaluate", result="checkpoint"),
    "predict": Command("predict", "task.predict.run", result="predictions"),
    "export": Command("export", "task.export.run", result="output", in_process=True),
    "plan": Command("plan", "ddp_engine.run.plan:plan", result="plan", in_process=True),
}


def entry_point(task: Task, command: str) -> tuple[Callable[[], object], Callable[[], None]]:
    """The two functions of ``python -m <package>.<command>`` (a key of :data:`COMMANDS`): its ``main``
    (Hydra's entry point, which runs each job) and ``cli`` (what the module and its console script
    run: :func:`run_entry_point`, then, unless the command runs in this process, the process's end
    without the interpreter's teardown: :func:`~ddp_engine.core.lifetime.exit_without_teardown`).

    Args:
        task: the task whose command this is (:func:`ddp_engine.task.register`s it).
        command: ``train``, ``eval``, ``predict``, ``export`` or ``plan``.
    """
    register(task)
    register_configs()
    config_name, function, result, in_process = vars(COMMANDS[command]).values()

    @hydra.main(config_path=str(task.configs()), config_name=config_name, version_base="1.3")
    @exit_on_usage_error
    def main(cfg: DictConfig) -> object:
        objective = cfg.task.objective if result is None else None
        return run_command(cfg, config_name, function, in_process, objective=objective).get(result or objective)

    def cli() -> None:
        if in_process:
            # The task (an export) wrote the user's files in this process: it ends through the normal
            # exit, whose teardown finalizes, and so flushes and closes, every object still holding one.
            run_entry_point(main, config_name)
            return
        exit_without_teardown(lambda: run_entry_point(main, config_name, function))

    return main, cli


def run_command(cfg: DictConfig, config_name: str, task: str, in_process: bool, objective: str | None = None) -> dict:
    """Run one Hydra job of a command: for eval, predict and export first take the model and data
    set of the checkpoint's run (:func:`ddp_engine.config.saved_run.apply_run_settings`), then run
    ``task`` in the job's processes (:func:`ddp_engine.launch.job.run_job`; ``objective``: the
    metric a sweeper optimizes, recorded in ``metrics.json``).

    Returns:
        The job's metrics (``status: failed`` and no metrics for a failed job of a sweep).

    Raises:
        UsageError: for a value, data file or checkpoint the user must fix (reported as one line).
        JobFailedError: a process of a single run failed (reported as one line).
    """
    # torch (seconds to import) only now: the command line was checked before.
    from ddp_engine.launch.job import run_job

    rank_zero = launcher_rank() == 0  # every process runs this under torchrun or SLURM
    if rank_zero:
        log.info(f"Run directory: {cfg.paths.output_dir}")
    if config_name in CHECKPOINT_USES:
        apply_run_settings(cfg, HydraConfig.get().overrides.task, config_name, log_them=rank_zero)
    return run_job(task_function(cfg, task), cfg, in_process=in_process, objective=objective)


def run_entry_point(main: Callable[[], object], config_name: str, task: str | None = None) -> None:
    """What ``python -m <package>.<train|eval|predict|export>`` does.

    The command line is checked first (:func:`check_command_line`): a bad one exits with status 1
    and one line on stderr; a stop signal before the job's own handlers are installed ends the
    command at once (:func:`~ddp_engine.core.lifetime.end_at_once_on_stop_signals`). Once its keys
    are right, the forkserver of a single run's workers starts importing the module of the job's
    ``task`` (:func:`task_function`; None for an export, which runs in this process) while this process
    checks the values. ``hydra.run.dir=<a run>
    ckpt_path=last`` is completed with that run's overrides (:mod:`ddp_engine.config.resume`).
    Then ``main`` (Hydra's entry point) runs the job(s), told their ``hydra.mode`` by the check
    (:func:`~ddp_engine.core.compat.tell_hydra_the_mode`); a job whose process failed exits with
    status 1 and its error, a sweep with a failed job with status 1 after its summary.
    """
    # Before logging is configured: its console handler keeps the stream it is given.
    drop_output_when_closed()
    # Until the job's own handlers take over (the supervisor's launch, a task's stop_on_signals).
    end_at_once_on_stop_signals("before the run started: no process trained")
    # Warnings go through logging: tagged with the rank, kept in the job's log file.
    logging.captureWarnings(True)
    # A log line that cannot be written (a full disk) is lost, not printed as a traceback of its own.
    logging.raiseExceptions = False
    if SWEEP_ENV in os.environ:  # a job of a parallel sweep: it ends with the sweep's command
        end_with_parent(int(os.environ[SWEEP_ENV]), "sweep")
    try:
        if (run_dir := in_place_run_dir(sys.argv[1:])) is not None:
            # The run's .hydra/ (its config and overrides) stays as the run wrote it.
            sys.argv = [sys.argv[0], *resume_arguments(run_dir, sys.argv[1:]), "hydra.output_subdir=null"]
        sys.argv = [sys.argv[0], *with_trainer_arguments(sys.argv[1:])]
        if config_name in CHECKPOINT_USES:
            sys.argv = [sys.argv[0], *with_data_set_of_run(sys.argv[1:])]
        if (checked := check_command_line(config_name, sys.argv[1:], task)) is not None:
            tell_hydra_the_mode(checked.mode)  # Hydra's main would compose the config once more to read it
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)

    if launcher_rank() > 0:
        # torchrun / srun start every process with the same command: global rank 0 writes the
        # job's .hydra/ config, the others must not write it again at the same time.
        sys.argv.append("hydra.output_subdir=null")
    main()
    if failed_jobs():
        sys.exit(1)


def with_data_set_of_run(args: Sequence[str]) -> list[str]:
    """``args`` of eval / predict / export, with the data set of the checkpoint's run in front when
    they choose no ``data`` option: its option and its ``data.*`` overrides (``.hydra/``), those that
    ``args`` set again left out. The command's ``data`` node then composes as the run's did (its
    required keys set; ``data.root=`` of a folder data set that moved is a known key, and wins).
    The values of the data set are the run's in any case (:func:`ddp_engine.config.saved_run.data_set_of_run`)."""
    values = dict(arg.split("=", 1) for arg in args if "=" in arg and not arg.startswith("-"))
    if "data" in values or not values.get("ckpt_path"):
        return list(args)
    checkpoint = Path(values["ckpt_path"].strip("'\""))
    option = run_data_option(checkpoint)
    saved = checkpoint.parent.parent / ".hydra" / "overrides.yaml"
    if option is None or not saved.is_file():
        return list(args)
    given = {override_key(arg) for arg in args if not arg.startswith("-")}
    check_saved_overrides(saved, trusted_targets(args), given)
    # As written: an override may hold an interpolation for the job to resolve.
    run_overrides = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    data = [
        override for override in run_overrides
        if override_key(override).startswith("data.") and override_key(override) not in given
    ]  # fmt: skip
    return [f"data={option}", *data, *args]


@dataclass(frozen=True)
class CheckedCommand:
    """What the check of a command line found that Hydra's main needs."""

    #: The jobs' ``hydra.mode`` (``RunMode.RUN`` / ``MULTIRUN``; None when unset: ``-m`` decides).
    mode: Any


def check_command_line(config_name: str, args: Sequence[str], task: str | None = None) -> CheckedCommand | None:
    """Check every job that ``args`` (Hydra's command-line arguments) would run: its keys and
    types here (:func:`composed_jobs`), its paths (:func:`check_paths`) and the values that need
    neither torch nor Lightning (:func:`~ddp_engine.config.early_checks.check_jobs_early`), then its
    values with the objects built (:func:`ddp_engine.config.checks.check_jobs`). For a single run
    that starts its workers on this machine, those are checked in a process forked from the
    workers' forkserver, which this starts importing the module of ``task`` (:func:`task_function`;
    :func:`_checked_in_forkserver`); otherwise here (a sweep's launcher starts the forkserver with
    its first job's workers, when its jobs run in this process).

    Returns:
        What the check found that Hydra's main needs, or None for a command line left to Hydra
        (``--help``, ``--cfg``: no job).

    Raises:
        UsageError: the first problem found, as one line.
    """
    check_task_has(config_name)  # before its keys, which a task without the command does not have
    jobs = composed_jobs(config_name, args)
    # Read before the checks, which drop each job's hydra node (as the jobs' own configs have none).
    checked = CheckedCommand(mode=jobs[0].cfg.hydra.get("mode")) if jobs else None
    named_run_dir = _named_run_dir(jobs)
    for job in jobs:
        check_paths(config_name, job.cfg)
    check_jobs_early(config_name, jobs)
    function = task_function(jobs[0].cfg, task) if task is not None and jobs else None
    single_run_here = function is not None and len(jobs) == 1 and not jobs[0].multirun and not launched_externally()
    if not (single_run_here and _checked_in_forkserver(function, config_name, jobs)):
        # torch and Lightning, which take seconds to import, only now: the keys are known to be right.
        from ddp_engine.config.checks import check_jobs

        check_jobs(config_name, jobs)
    if named_run_dir is not None and config_name not in ("export", "plan"):  # they run in this process, with no lock
        from ddp_engine.launch.supervisor import hold_run_dir

        hold_run_dir(named_run_dir)  # before Hydra writes its config there
    return checked


def _checked_in_forkserver(function: str, config_name: str, jobs: Sequence[Job]) -> bool:
    """Start the forkserver of the job's workers, importing the module of ``function`` (the job's
    task: torch, Lightning), and check the values in a process forked from it (:func:`check_values`),
    so that this process, which trains nothing, never imports Lightning (seconds of CPU). False,
    nothing checked, where the forkserver does not run (the workers' launch will say why).

    Raises:
        UsageError: the first problem found, as one line.
    """
    from ddp_engine.launch.supervisor import ForkserverUnavailable, preload_workers, run_in_forkserver

    preload_workers(function.partition(":")[0])
    from ddp_engine.launch.job import import_supervision  # with torch: meanwhile, on the other core

    import_supervision()
    try:
        run_in_forkserver(f"{__name__}:{check_values.__name__}", config_name, jobs)
    except ForkserverUnavailable:
        return False
    return True


def check_values(config_name: str, jobs: Sequence[Job]) -> None:
    """:func:`ddp_engine.config.checks.check_jobs` in a process forked from the workers' forkserver,
    which has the task's module but not necessarily the command's: Hydra's resolvers
    (``${hydra:...}``, ``${now:...}``) and the engine's (``${run_stamp:}``) are registered first."""
    from hydra.core.utils import setup_globals

    from ddp_engine.config.checks import check_jobs

    setup_globals()
    register_configs()
    check_jobs(config_name, jobs)


def _named_run_dir(jobs: Sequence[Job]) -> Path | None:
    """The directory of a single run that this process will supervise, when the command line names
    it as a plain path (``hydra.run.dir=<folder>``, a resume in place): the one Hydra will write
    into, and the only kind two commands can share (the default, ``${run_stamp:}``, differs by the
    microsecond). None otherwise: a sweep, a run under torchrun or SLURM, a directory that
    interpolates (``${now:...}`` could resolve otherwise in Hydra's main)."""
    if len(jobs) != 1 or jobs[0].multirun or launched_externally():
        return None
    run = jobs[0].cfg.hydra.run
    return None if OmegaConf.is_interpolation(run, "dir") else Path(run.dir)


def check_paths(config_name: str, cfg: DictConfig) -> None:
    """Refuse, before torch and Lightning are imported (seconds), the paths of a job of
    ``python -m <package>.<config_name>`` that need no torch to refuse: a checkpoint that names no
    file, and, for a command of the task's own (predict, export), what its ``check_paths`` refuses
    (a prediction's ``input`` that names nothing, an export's output that exists). What is in the
    files is checked with the values (:func:`ddp_engine.config.checks.check_jobs`).

    Raises:
        UsageError: the first problem found, as one line.
    """
    HydraConfig.instance().set_config(cfg)  # a path's ${hydra:runtime.cwd} resolves as in the job
    checkpoint = cfg.get("ckpt_path")
    if checkpoint not in (None, "last"):
        check_checkpoint_file(checkpoint)
    if (command := task_command(cfg, config_name)) is not None and command.check_paths:
        imported(command.check_paths)(cfg)
