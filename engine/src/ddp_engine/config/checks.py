"""Check a command line's values before Hydra creates a run directory or any process starts.

Hydra makes the run directory before it calls the task function, and the job's processes start
after that. A bad command line is refused before both, as one line that names the key, what is
wrong, and what is allowed. Its keys and types are checked first, without torch or Lightning
(:mod:`ddp_engine.config.compose`), and so are the paths that name nothing
(:func:`ddp_engine.config.command_line.check_paths`) and the values that need neither torch nor
Lightning (:mod:`ddp_engine.config.early_checks`, whose rules this module applies again); then, for
each job of the command line (a ``-m`` sweep expands into several):

1. the objects that are cheap to build are built, so that their own checks run: DataModule,
   model (and its optimizer and scheduler), strategy, callbacks;
2. the data-parallel layout is checked: device count (GPUs this machine has), the launcher's
   process count (torchrun, SLURM), global batch vs processes, options the devices cannot run
   (backend, SyncBatchNorm, precision);
3. the checkpoint (``ckpt_path``), the data set (fetched first when missing), the log folder
   (writable) and the run directory (not an earlier run's) are checked; so are a prediction's
   inputs (every image decoded) and an export's output folder (writable).
"""

import functools
import io
import os
import pickle
import re
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import lightning as L
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ddp_engine.config.compose import Job, child_config, sweep_jobs, task_overrides
from ddp_engine.config.early_checks import (
    PLAN,
    check_max_epochs,
    check_num_nodes,
    check_submitted_devices,
    optimizer_refusal,
    submitted_to_cluster,
)
from ddp_engine.config.saved_run import CHECKPOINT_USES, apply_run_settings
from ddp_engine.config.task_commands import check_task_has, task_command
from ddp_engine.core.environment import (
    external_launcher,
    launched_externally,
    launcher_rank,
    launcher_restarts,
    resumes_in_place,
    trainjob_name,
)
from ddp_engine.core.errors import ConfigValueError, UsageError, first_line
from ddp_engine.core.files import check_writable
from ddp_engine.core.run_dir import LAST_CHECKPOINT, METRICS_FILE, restart_hint, run_status
from ddp_engine.distributed.checkpoint_io import check_checkpoint
from ddp_engine.distributed.layout import check_device_options, processes_per_node, resolve_devices, uses_cuda
from ddp_engine.distributed.layout_rules import per_device_batch_size, planned_world_size, scale_learning_rate
from ddp_engine.launch.supervisor import check_rendezvous_address, check_run_dir_free
from ddp_engine.launch.sweep_launcher import hold_sweep
from ddp_engine.loggers.trackers import check_tracker_packages
from ddp_engine.models.build import build_model
from ddp_engine.models.optimization import build_lr_scheduler, optimizer_lr
from ddp_engine.task import current, imported

T = TypeVar("T")

#: The entry points that apply a training run's checkpoint instead of training, with what each
#: does with it (for the messages): they take the model and the data set of the checkpoint's run.


def check_jobs(config_name: str, jobs: Sequence[Job]) -> None:
    """Check the values of the ``jobs`` of a command line of ``python -m <project>.<config_name>``
    (their keys are checked: :func:`ddp_engine.config.compose.composed_jobs`): for eval, predict and
    export first the data set and model of the checkpoint's run
    (:func:`~ddp_engine.config.saved_run.apply_run_settings`);
    each job's objects and layout (:func:`check_job`; an export, one process with no Trainer:
    :func:`check_export_job`), its model built for its data (:func:`check_model`), the checkpoint, a
    prediction's inputs and the run directory; last, once per data set, the data
    (:func:`check_data`; not for a prediction, which reads no data set files).

    Raises:
        UsageError: the first problem found, as one line.
    """
    if not jobs:  # a command line left to Hydra (--help, --cfg ...)
        return
    training = config_name not in CHECKPOINT_USES
    data_sets: list[tuple[dict, L.LightningDataModule]] = []  # each data set once: its resolved node, its DataModule
    # Before _output_dir drops the hydra node.
    sweeper = OmegaConf.to_container(jobs[0].cfg.hydra.sweeper, resolve=False)
    # hydra/launcher=slurm, launcher=kubeflow: the jobs run on the cluster's nodes, where SLURM or
    # Kubeflow Trainer starts their processes.
    submitted = submitted_to_cluster(jobs)
    for job in jobs:
        output_dir = _output_dir(job)
        cfg = job.cfg
        if not training:  # the checkpoint's run's model and data set, as the entry point applies them
            apply_run_settings(cfg, job.overrides, config_name)
        check_task_has(config_name, cfg)
        if config_name == "export":
            datamodule = check_export_job(cfg)
        else:
            datamodule = check_job(cfg, training=training, submitted=submitted, planned=config_name == PLAN)
        model = check_model(cfg, cfg.model, datamodule, config_name)
        if cfg.get("ckpt_path") not in (None, "last"):  # "last": Lightning finds the run's own
            check_checkpoint(cfg.ckpt_path, model)
        if (command := task_command(cfg, config_name)) is not None and command.check_job:
            # A prediction's inputs (instead of the data set's files), an export's output folder.
            world_size = (
                1 if config_name == "export"
                else cfg.trainer.num_nodes * processes_per_node(cfg.trainer.accelerator, cfg.trainer.devices)
            )  # fmt: skip
            imported(command.check_job)(cfg, model, world_size)
        if config_name == "predict":  # its inputs instead of the data set's files, checked above
            continue
        if (data := OmegaConf.to_container(cfg.data, resolve=True)) not in [node for node, _ in data_sets]:
            data_sets.append((data, datamodule))  # the one built (and described) in its job: not scanned again
    # An export forms no process group, a plan a fake one.
    if not launched_externally() and not submitted and config_name not in ("export", PLAN):
        check_rendezvous_address()
    resume = cfg.get("ckpt_path") == "last"
    if job.multirun:
        check_sweep_dir(output_dir, task_overrides(job.command), resume, sweeper)
    else:
        check_run_dir_free(output_dir)  # a running command's: before Hydra logs into it
        if resume:
            check_resume_in_place(output_dir)
        check_output_dir(output_dir, resume)
    # Under torchrun or SLURM (also for the jobs a SLURM sweep submits) Lightning prepares the data on each node.
    if not launched_externally() and not submitted:
        for _, datamodule in data_sets:
            check_data(datamodule, training=training)


def check_model(
    cfg: DictConfig, model_cfg: DictConfig, datamodule: L.LightningDataModule, config_name: str
) -> L.LightningModule:
    """Build the job's model for its data, as every process will (the DataModule's
    ``model_arguments()``; for a prediction, the data its checkpoint keeps: it reads no data set
    files). A checkpoint to apply must have been trained on that data (the DataModule's
    ``check_checkpoint``); a training run's optimizer and schedule are built once (:func:`check_schedule`).

    Returns:
        The model.

    Raises:
        UsageError: the first problem found, as one line.
    """
    checkpoint = cfg.get("ckpt_path")
    applied = config_name in CHECKPOINT_USES
    # A prediction reads no data set files: its model is built for the data its checkpoint keeps.
    data = None
    if config_name == "predict" and hasattr(datamodule, "model_arguments_of"):
        data = _call_data(datamodule, lambda: datamodule.model_arguments_of(Path(checkpoint)))
    if data is None:
        data = datamodule
        if applied and hasattr(datamodule, "check_checkpoint"):
            _call_data(datamodule, lambda: datamodule.check_checkpoint(Path(checkpoint)))
    try:
        model = _call_data(datamodule, lambda: build_model(model_cfg, data))
    except InstantiationException as error:
        raise _one_line("model", model_cfg, error) from None
    if config_name not in CHECKPOINT_USES:
        check_schedule(cfg, model, model_cfg)
        for group, module in (("model", model), ("data", datamodule)):
            check_saved_hyperparameters(group, module)
    return model


def check_saved_hyperparameters(group: str, module: L.LightningModule | L.LightningDataModule) -> None:
    """Refuse a LightningModule or DataModule whose ``save_hyperparameters()`` keeps values that a
    checkpoint loaded with ``torch.load(weights_only=True)`` cannot hold (Hydra's ``_partial_``
    optimizer, a network): Lightning writes ``module.hparams`` into every checkpoint, and the
    template loads every checkpoint that way (so that a checkpoint cannot run code), so the run
    would fail only after its first epoch, when it tests its best checkpoint.

    Raises:
        ConfigValueError: naming the class, the keys and the fix.
    """
    refused = []
    for key, value in dict(module.hparams).items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
        except (pickle.PickleError, AttributeError, TypeError, RuntimeError):
            refused.append(key)
    if refused:
        raise ConfigValueError(
            f"{group}: {type(module).__name__}.save_hyperparameters() keeps {', '.join(refused)} in every checkpoint, "
            "which then no longer loads with torch.load(weights_only=True), as the template loads checkpoints. Leave "
            f"them out (save_hyperparameters(ignore={refused})); the run's .hydra/config.yaml records how it was built."
        )


def _call_data(datamodule: L.LightningDataModule, call: Callable[[], T]) -> T:
    """``call()``, with any error of a method of ``datamodule`` (a DataModule of one's own may raise
    what its reading raises: a missing file's ``FileNotFoundError``) as one line naming the method.
    Errors raised elsewhere (the model's constructors) pass through.

    Raises:
        UsageError: the DataModule's own, or its other error naming the class and the method.
    """
    try:
        return call()
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - a user's DataModule may raise anything; one line, not a traceback
        methods = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)
                   if frame.f_locals.get("self") is datamodule]  # fmt: skip
        if not methods:
            raise
        raise UsageError(f"data: {type(datamodule).__name__}.{methods[-1]}() failed: {type(error).__name__}: "
                         f"{first_line(error)}") from None  # fmt: skip


def _output_dir(job: Job) -> Path:
    """Make ``job.cfg`` resolve as in its run (``${hydra:...}``, ``${paths.output_dir}``), and drop
    its ``hydra`` node. Returns the directory Hydra will write the job into (the sweep's under ``-m``)."""
    cfg = job.cfg
    # Interpolations such as ${hydra:runtime.cwd} resolve against this job's Hydra config.
    HydraConfig.instance().set_config(cfg)
    output_dir = Path(cfg.hydra.sweep.dir if job.multirun else cfg.hydra.run.dir)
    # What Hydra will set: ${paths.output_dir} in the callbacks' folders resolves as in the run.
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return output_dir


def holds_a_run(folder: Path) -> bool:
    """Whether ``folder`` is (or, for a sweep's folder, holds) the directory of an earlier run with
    results a new run would overwrite or mix with: checkpoints, ``metrics.json``, TensorBoard
    events. (A run stopped before it wrote any is not one: starting again there is safe.)"""
    marks = ("checkpoints", "metrics.json", "tensorboard")
    return any((folder / mark).exists() for mark in marks) or any(
        (job / mark).exists() for job in folder.glob("*/") for mark in marks
    )


def check_resume_in_place(run_dir: Path) -> None:
    """``ckpt_path=last`` resumes the run in ``run_dir`` (``hydra.run.dir``): refuse, before anything
    is written, when there is nothing there to resume, instead of training afresh with a warning
    deep in the log (Lightning's behaviour for a ``last`` it cannot find). A launcher's restart of
    the job is not checked: it resumes what its first attempt left, or starts it.

    The resume continues from the run's newest complete checkpoint, ``last.ckpt`` or an epoch's
    (:func:`~ddp_engine.distributed.resume_points.resume_point`).

    Raises:
        ConfigValueError: when ``run_dir`` does not exist, holds no checkpoint (naming the way on:
            another directory), or holds a run that completed (its ``metrics.json`` says so).
    """
    if resumes_in_place():
        return
    if not run_dir.exists():
        raise ConfigValueError(
            f"ckpt_path=last resumes the run in hydra.run.dir={run_dir}, which does not exist. Give the run's "
            "directory (hydra.run.dir=logs/runs/<run> ckpt_path=last), a checkpoint file (ckpt_path=<file>.ckpt), "
            "or start a new run (without ckpt_path)."
        )
    if not _holds_checkpoints(run_dir):
        raise ConfigValueError(
            f"ckpt_path=last resumes the run in hydra.run.dir={run_dir}, which holds no checkpoint (checkpoints/"
            f"*.ckpt): it stopped before its first. {restart_hint(run_dir)}"
        )
    if run_status(run_dir) == "completed":
        raise ConfigValueError(
            f"ckpt_path=last: the run in {run_dir} completed (its {METRICS_FILE}), so there is nothing to resume. "
            f"Evaluate its checkpoints with python -m {current().package}.eval "
            f"ckpt_path={run_dir}/checkpoints/<file>.ckpt, "
            "or train further in a new run."
        )


def _holds_checkpoints(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds any checkpoint (``last.ckpt`` or an epoch's; a save in progress is a
    hidden ``.tmp`` file)."""
    return any((run_dir / LAST_CHECKPOINT.parent).glob("*.ckpt"))


def check_output_dir(output_dir: Path, resume: bool) -> None:
    """Refuse to start a single run (a sweep: :func:`check_sweep_dir`) into the directory of an
    earlier one, before anything is written: it would overwrite that run's checkpoints and metrics
    and add a second series to its TensorBoard run (one that stopped before its first checkpoint:
    its logs). Resuming that run in place (``ckpt_path=last``) and a launcher's restart of the job
    (torchrun ``--max-restarts``, a SLURM requeue, a Kubeflow TrainJob's pod started again) are the
    exceptions, except for a TrainJob whose run completed (its name submitted again); so are the
    processes other than global rank 0 under torchrun or SLURM (rank 0 checks, before any of them writes).

    Raises:
        ConfigValueError: naming the directory and the ways on.
    """
    if (trainjob := trainjob_name()) is not None and launcher_rank() == 0 and run_status(output_dir) == "completed":
        raise ConfigValueError(
            f"TrainJob {trainjob}: its run {output_dir} completed, so there is nothing to resume. Submit a new run "
            "under another name (launcher.kubeflow.name=<new name>)."
        )
    if resume or resumes_in_place() or launcher_rank() > 0 or not holds_a_run(output_dir):
        return
    status = run_status(output_dir)  # None: killed before it recorded one
    if status != "completed" and not _holds_checkpoints(output_dir):
        ended = "failed" if status == "failed" else "stopped"
        raise ConfigValueError(
            f"hydra.run.dir={output_dir} holds a run that {ended} before its first checkpoint: starting another "
            f"there would overwrite the logs that say why. {restart_hint(output_dir)}"
        )
    elsewhere = (
        "Start it in another directory (hydra.run.dir=<new folder>, or leave hydra.run.dir unset for a fresh one)"
    )
    if status == "completed":  # nothing to resume (check_resume_in_place refuses it)
        raise ConfigValueError(
            f"hydra.run.dir={output_dir} holds a completed run: starting another there would overwrite its "
            f"checkpoints and metrics. {elsewhere}."
        )
    raise ConfigValueError(
        f"hydra.run.dir={output_dir} already holds a run: starting another there would overwrite its checkpoints "
        f"and metrics. {elsewhere}, or resume that run in place with ckpt_path=last and the same directory."
    )


@functools.cache
def basic_sweeper() -> str:
    """The ``_target_`` of Hydra's basic sweeper (``hydra/sweeper: basic``), whose sweeps can be
    continued job for job (its jobs are known before they run): read from the config Hydra stores
    for it (ConfigStore's ``hydra/sweeper/basic``, stored when Hydra loads its core plugins), as the
    class lives in a private module of Hydra's that a release may move."""
    Plugins.instance()  # loads Hydra's core plugins, which store their configs
    return ConfigStore.instance().load("hydra/sweeper/basic.yaml").node["_target_"]


#: The sweeper whose searches can be continued (conf/hparams_search/optuna.yaml): its study holds its trials.
SEARCH_SWEEPER = "hydra_plugins.ddp_engine_sweeper.ResumableOptunaSweeper"
#: The settings of a search that a continued search may change: how many trials in all, and at once.
SEARCH_EXTENT = ("n_trials", "n_jobs")


def check_sweep_dir(sweep_dir: Path, overrides: Sequence[str], resume: bool, sweeper: dict) -> None:
    """A ``-m`` sweep into ``sweep_dir`` (``hydra.sweep.dir``) with the task ``overrides`` (a sweep's
    as given: :func:`~ddp_engine.config.compose.task_overrides`) and the settings ``sweeper`` (its
    ``hydra.sweeper`` node, unresolved): a new sweep, or the same sweep as the one recorded there
    (Hydra's ``multirun.yaml``), which continues (:mod:`ddp_engine.launch.sweep_launcher`; a search
    by Optuna: :mod:`ddp_engine.launch.optuna_search`, which may ask for more or fewer trials in all,
    ``hydra.sweeper.n_trials``). Not checked in the processes other than global rank 0 under torchrun
    or SLURM, nor in a launcher's restart.

    Raises:
        ConfigValueError: for ``ckpt_path=last`` on a sweep (a sweep continues without it); for a
            folder that holds another sweep (naming the overrides or search settings that differ) or files but
            no sweep, or whose sweep another command is running now; for a search whose
            study was kept in memory, or by a sweeper other than Hydra's basic one and the template's
            Optuna one.
    """
    if resume:
        raise ConfigValueError(
            "ckpt_path=last: a sweep is continued without it. Run the same sweep command again with "
            "hydra.sweep.dir=<its directory>: completed jobs are kept, interrupted ones resume from their own "
            "last.ckpt, the others run (engine/docs/usage.md#continue-an-interrupted-sweep)."
        )
    if launcher_restarts() > 0 or launcher_rank() > 0 or not sweep_dir.is_dir():
        return
    record = sweep_dir / "multirun.yaml"
    if not record.is_file() and any(sweep_dir.iterdir()):
        # A sweep writes its multirun.yaml before any job: these are not its files, which it would move aside.
        raise ConfigValueError(
            f"hydra.sweep.dir={sweep_dir} holds files but no sweep (no multirun.yaml): a sweep there would move "
            "or overwrite them. Start the sweep in another directory (hydra.sweep.dir=<new folder>, or leave it unset)."
        )
    if not holds_a_run(sweep_dir):
        return
    with hold_sweep(sweep_dir):  # another command running this sweep now holds it (the launcher's lock)
        pass
    elsewhere = "Start it in another directory (hydra.sweep.dir=<new folder>, or leave it unset)."
    if sweeper["_target_"] not in (basic_sweeper(), SEARCH_SWEEPER):
        name = sweeper["_target_"].rsplit(".", 1)[-1]
        raise ConfigValueError(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep, and a search by {name} cannot be continued: its "
            f"trials are chosen as it runs. {elsewhere}"
        )
    # As given: an override may hold an interpolation (${paths.output_dir}) for the job to resolve.
    saved = OmegaConf.to_container(OmegaConf.load(record).hydra, resolve=False)
    saved_overrides, saved_sweeper = saved["overrides"]["task"], saved["sweeper"]
    if sweeper["_target_"] == SEARCH_SWEEPER and saved_sweeper["_target_"] == SEARCH_SWEEPER:
        if saved_sweeper.get("storage") is None:
            raise ConfigValueError(
                f"hydra.sweep.dir={sweep_dir} holds a search whose study was kept in memory "
                f"(hydra.sweeper.storage=null), and is lost: it cannot be continued. {elsewhere}"
            )
        ours, theirs = _settings(sweeper), _settings(saved_sweeper)
        if differ := [key for key in {**theirs, **ours} if ours.get(key) != theirs.get(key)]:
            ours = " ".join(f"{key}={ours.get(key)}" for key in differ)
            theirs = " ".join(f"{key}={theirs.get(key)}" for key in differ)
            raise _another_sweep(sweep_dir, f"this command sets {ours}, that search set {theirs}", record)
        # The trials are the study's: only the overrides themselves must agree, in any order.
        if set(saved_overrides) != set(overrides):
            raise _another_sweep(sweep_dir, _differing(overrides, saved_overrides), record)
        return
    if sweeper["_target_"] != saved_sweeper["_target_"]:
        kinds = {basic_sweeper(): "a sweep of the values given", SEARCH_SWEEPER: "a search by Optuna"}
        theirs = kinds.get(saved_sweeper["_target_"], saved_sweeper["_target_"])
        raise _another_sweep(sweep_dir, f"this command runs {kinds[sweeper['_target_']]}, that was {theirs}", record)
    # The same jobs in the same order (their numbers): the order of a job's own overrides does not matter.
    if [set(job) for job in sweep_jobs(saved_overrides)] == [set(job) for job in sweep_jobs(overrides)]:
        return
    raise _another_sweep(sweep_dir, _differing(overrides, saved_overrides), record)


def _settings(sweeper: dict, prefix: str = "hydra.sweeper.") -> dict:
    """The settings of a search that define its trials (not :data:`SEARCH_EXTENT`), by dotted key
    (``hydra.sweeper.params.model.optimizer.lr``)."""
    settings = {}
    for key, value in sweeper.items():
        if isinstance(value, dict) and value:
            settings |= _settings(value, f"{prefix}{key}.")
        elif prefix != "hydra.sweeper." or key not in SEARCH_EXTENT:
            settings[f"{prefix}{key}"] = value
    return settings


def _differing(overrides: Sequence[str], saved: Sequence[str]) -> str:
    """What differs between a command's task ``overrides`` and a recorded sweep's (``saved``), in words."""
    ours = " ".join(o for o in overrides if o not in saved) or "nothing else"
    theirs = " ".join(o for o in saved if o not in overrides) or "nothing else"
    if set(overrides) != set(saved):
        return f"this command sets {ours}, that sweep set {theirs}"
    return "the same values in another order, which would number its jobs otherwise"


def _another_sweep(sweep_dir: Path, difference: str, record: Path) -> ConfigValueError:
    """The refusal of a sweep into ``sweep_dir`` that holds another one (``difference``: how it differs)."""
    return ConfigValueError(
        f"hydra.sweep.dir={sweep_dir} holds another sweep: {difference}. Its results would be reported under this "
        f"command's values. Continue that sweep with its own overrides (hydra.overrides.task in {record}), or start "
        "this one in another directory (hydra.sweep.dir=<new folder>, or leave it unset)."
    )


def check_data(datamodule: L.LightningDataModule, training: bool) -> None:
    """Fetch the data set of ``datamodule`` when it is missing (``data.download``) and check its
    files, once, here: missing or broken data is one line before any run directory or process
    exists. For ``training``, also check that the splits leave training samples (evaluation
    has no validation split).

    Raises:
        UsageError: the data's own errors (raised by its DataModule), each one line; any other error
            of its methods as one line naming the method (:func:`_call_data`).
    """
    _call_data(datamodule, datamodule.prepare_data)
    if training and hasattr(datamodule, "check_splits"):
        _call_data(datamodule, datamodule.check_splits)


def check_job(
    cfg: DictConfig, training: bool = True, submitted: bool = False, planned: bool = False
) -> L.LightningDataModule:
    """Build the cheap parts of one job (its model: :func:`check_model`) and check its layout (for
    ``training``, also that the global batch splits evenly over the processes: evaluation takes no
    optimizer step). A job ``submitted`` to a SLURM cluster (``hydra/launcher=slurm``; default False)
    runs on other machines: their devices are not this machine's (its GPUs are not counted, several
    nodes are allowed), and its process count is ``trainer.devices`` per node; so is a ``planned``
    one's (``python -m <package>.plan``), whose devices are the cluster's it plans for.

    Returns:
        The DataModule it built, for the model's check.

    Raises:
        UsageError: the first problem found, as one line.
    """
    built = build_groups(cfg, ("data", "strategy", "callbacks"))
    accelerator, _ = resolve_devices(cfg.trainer.accelerator, cfg.trainer.devices)
    cuda = uses_cuda(accelerator)
    check_num_nodes(cfg.trainer.num_nodes, submitted or planned)
    if submitted:
        check_submitted_devices(cfg.trainer.devices)
        devices_per_node = cfg.trainer.devices
    elif planned:
        nodes = cfg.trainer.num_nodes
        devices_per_node = planned_world_size(cfg.trainer.accelerator, cfg.trainer.devices, nodes) // nodes
    else:
        devices_per_node = processes_per_node(cfg.trainer.accelerator, cfg.trainer.devices)
        check_launch_environment(cfg.trainer.num_nodes, devices_per_node)
    world_size = cfg.trainer.num_nodes * devices_per_node
    if training:
        resume = bool(cfg.get("ckpt_path"))
        per_device_batch_size(cfg.data.global_batch_size, world_size, cfg.trainer.accumulate_grad_batches, resume)
    check_device_options(
        "cuda" if cuda else "cpu", cfg.strategy.process_group_backend, cfg.trainer.sync_batchnorm, cfg.trainer.precision
    )
    check_writable("paths.log_dir", Path(cfg.paths.log_dir))
    check_tracker_packages(cfg.logger)
    return built["data"]


def build_groups(cfg: DictConfig, groups: Sequence[str]) -> dict[str, object]:
    """Instantiate the config groups ``groups`` of ``cfg``, so that their classes' own argument
    checks run before any process starts.

    Returns:
        Each group's object, by the group's name.

    Raises:
        UsageError: a class's own :class:`UsageError`, or its other error as one line naming the
            group (with the key to drop for an unexpected keyword argument).
    """
    built = {}
    for group in groups:
        try:
            built[group] = instantiate(cfg[group])
        except InstantiationException as error:
            raise _one_line(group, cfg[group], error) from None
    return built


def _one_line(group: str, node: DictConfig, error: InstantiationException) -> UsageError:
    """The :class:`UsageError` for a config group whose class refused its arguments: the class's own
    usage error, or its other error as one line naming the group (with the key to drop for an
    unexpected keyword argument)."""
    if isinstance(error.__cause__, UsageError):
        return error.__cause__
    return UsageError(f"{group}: {error.__cause__ or error}{_unexpected_argument_hint(node, group, error.__cause__)}")


def check_export_job(cfg: DictConfig) -> L.LightningDataModule:
    """Build the data set of one export job (:func:`build_groups`; its model: :func:`check_model`)
    and check that ``paths.log_dir`` is writable (its output is the task's export's to check:
    ``task.export.check_paths`` and ``check_job``).

    Returns:
        The DataModule it built, for the model's check.

    Raises:
        UsageError: the first problem found, as one line.
    """
    built = build_groups(cfg, ("data",))
    check_writable("paths.log_dir", Path(cfg.paths.log_dir))
    return built["data"]


def check_schedule(cfg: DictConfig, model: L.LightningModule, model_cfg: DictConfig) -> None:
    """Refuse a run that would train nothing or a learning-rate scaling that cannot apply, and build
    the optimizer over ``model``'s parameters and its scheduler once from ``model_cfg`` (the ``model``
    node, where it has them), as ``configure_optimizers`` will in every process, so that the values
    torch refuses (a negative learning rate) are one line here instead of an error in every process
    after they started.

    Raises:
        ConfigValueError: naming the key and torch's reason.
    """
    check_max_epochs(cfg.trainer.max_epochs)
    lr = optimizer_lr(model_cfg)
    scale_learning_rate(lr, cfg.data.global_batch_size, cfg.lr_scaling.reference_batch_size, cfg.lr_scaling.rule)
    if model_cfg.get("optimizer") is None:
        return
    # The partials were built with the model (build_model), so only torch's own checks can fail here.
    try:
        optimizer = instantiate(model_cfg.optimizer)(params=model.parameters())
    except (ValueError, TypeError) as error:
        # torch names the argument in its own words ("Invalid learning rate: -1"): show the keys too.
        raise optimizer_refusal(model_cfg.optimizer, error) from None
    try:
        scheduler = instantiate(model_cfg.scheduler) if model_cfg.get("scheduler") is not None else None
        build_lr_scheduler(scheduler, optimizer, total_steps=1)  # the run's step count is known only once it runs
    except (ValueError, TypeError) as error:
        raise ConfigValueError(f"model.scheduler: {error}") from None


def _unexpected_argument_hint(node: DictConfig, path: str, error: BaseException | None) -> str:
    """For ``TypeError: ... unexpected keyword argument 'x'``: which ``_target_`` node sets ``x``, and
    how to drop it. (A preset written for one class, such as ``experiment=long`` setting
    ``model.net.batch_norm`` for the CNN, meets another, ``model=mlp``.)"""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(error)) if isinstance(error, TypeError) else None
    if match is None:
        return ""
    argument = match[1]
    for key in node:
        if isinstance(child := child_config(node, key), DictConfig):
            if hint := _unexpected_argument_hint(child, f"{path}.{key}", error):
                return hint
    if "_target_" in node and argument in node:
        return (
            f". {path}.{argument} is set (on the command line or by a preset such as experiment=...), and "
            f"{node._target_} does not take it: drop it with ~{path}.{argument}"
        )
    return ""


def check_launch_environment(num_nodes: int, devices_per_node: int) -> None:
    """Under torchrun or SLURM the launcher has already decided how many processes there are:
    ``trainer.num_nodes`` and ``trainer.devices`` must say the same, checked in every process
    before the process group forms.

    Lightning's own check (its cluster environment's ``validate_settings``, which Lightning runs
    only later, in the Trainer), chosen in Lightning's order; plus, under torchrun, the processes
    per node, which that check leaves out (2 nodes x 2 processes passes it as 1 x 4).

    Raises:
        ConfigValueError: the launcher's figures and the settings that must match them.
    """
    environment = external_launcher()
    if environment is not None:
        launcher = {TorchElasticEnvironment: "torchrun --nnodes / --nproc-per-node",
                    SLURMEnvironment: "sbatch --nodes / --ntasks-per-node"}[environment]  # fmt: skip
        hint = f"Set trainer.num_nodes and trainer.devices to the launcher's nodes and processes per node ({launcher})."
        try:
            environment().validate_settings(devices_per_node, num_nodes)
        except ValueError as error:
            raise ConfigValueError(f"{str(error).replace('`', '')} {hint}") from None
        local = os.environ.get("LOCAL_WORLD_SIZE")
        if environment is TorchElasticEnvironment and local is not None and int(local) != devices_per_node:
            raise ConfigValueError(
                f"trainer.devices={devices_per_node} processes per node, but torchrun started {local} per node "
                f"(LOCAL_WORLD_SIZE). {hint}"
            )
