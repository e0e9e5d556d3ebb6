"""Check a command line before Hydra creates a run directory or any process starts.

Hydra makes the run directory before it calls the task function, and Lightning starts the DDP
processes in ``trainer.fit``. A bad command line is refused before both, as one line that names
the key, what is wrong, and what is allowed. For each job of the command line (a ``-m`` sweep
expands into several):

1. the config is composed: unknown keys, wrong types, values outside a choice, unknown group
   options, required values (``???``) left unset;
2. the objects that are cheap to build are built, so that their own checks run: DataModule,
   model, strategy, callbacks;
3. the data-parallel layout is checked: device count (GPUs this machine has), the launcher's
   process count (torchrun, SLURM), global batch vs processes, options the devices cannot run
   (backend, SyncBatchNorm, precision);
4. the log folder is checked to be writable.
"""

import dataclasses
import difflib
import inspect
import itertools
import json
import logging
import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, InstantiationException, MissingConfigException
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from mnist_ddp.cli.job import METRICS_FILE, launcher_rank, launcher_restarts
from mnist_ddp.cli.resume import in_place_run_dir, resume_arguments
from mnist_ddp.cli.saved_run import data_set_of_run, saved_run_config
from mnist_ddp.cli.schema import CONFIG_DIR, TrainerConfig, register_configs
from mnist_ddp.cli.sweep_summary import failed_jobs
from mnist_ddp.distributed.checkpoint_io import check_checkpoint
from mnist_ddp.distributed.launch import check_rendezvous_address, launched_externally
from mnist_ddp.distributed.layout import (
    check_device_options,
    check_gpu_devices,
    device_count,
    per_device_batch_size,
    resolve_devices,
)
from mnist_ddp.errors import ConfigValueError, UsageError, first_line

log = logging.getLogger(__name__)


def run_entry_point(main: Callable[[], object], config_name: str) -> None:
    """What ``python -m mnist_ddp.<train|eval>`` does.

    The command line is checked first: a bad one exits with status 1 and one line on stderr.
    ``hydra.run.dir=<a run> ckpt_path=last`` is completed with that run's overrides
    (:mod:`mnist_ddp.cli.resume`).
    Then ``main`` (Hydra's entry point) runs the job(s); a job whose process failed exits with
    status 1 and its error, a sweep with a failed job with status 1 after its summary.
    """
    # Warnings go through logging: tagged with the rank, kept in the job's log file.
    logging.captureWarnings(True)
    if launcher_rank() > 0:
        # torchrun / srun start every process with the same command: global rank 0 writes the
        # job's .hydra/ config, the others must not write it again at the same time.
        sys.argv.append("hydra.output_subdir=null")
    try:
        if (run_dir := in_place_run_dir(sys.argv[1:])) is not None:
            # The run's .hydra/ (its config and overrides) stays as the run wrote it.
            sys.argv = [sys.argv[0], *resume_arguments(run_dir, sys.argv[1:]), "hydra.output_subdir=null"]
        sys.argv = [sys.argv[0], *with_trainer_arguments(sys.argv[1:])]
        check_command_line(config_name, sys.argv[1:])
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C while the command is being checked: nothing has started
        sys.exit(128 + signal.SIGINT)
    main()
    if failed_jobs():
        sys.exit(1)


def check_command_line(config_name: str, args: Sequence[str]) -> None:
    """Compose and check every job that ``args`` (Hydra's command-line arguments) would run.

    Flags other than ``-m`` / ``--multirun`` (``--help``, ``--cfg``, ``--config-name`` ...) are
    Hydra's own business: such command lines are left to Hydra unchecked.

    Raises:
        UsageError: the first problem found, as one line.
    """
    flags = [arg for arg in args if arg.startswith("-")]
    if any(flag not in ("-m", "--multirun") for flag in flags):
        return
    overrides = with_trainer_arguments([arg for arg in args if not arg.startswith("-")])
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if any(arg.split("=", 1) == [key, ""] for arg in overrides):
            raise ConfigValueError(f"{key} is empty (an unset shell variable?): give a folder, or leave {key} out.")
    register_configs()
    if not launched_externally():
        check_rendezvous_address()
    multirun = bool(flags)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        defaults = compose(config_name)
        for job in sweep_jobs(overrides) if multirun else [overrides]:
            cfg, output_dir = _compose(config_name, job, defaults, multirun)
            model = check_job(cfg, training=config_name != "eval")
            if config_name == "eval":  # the model and the data set of the checkpoint's run
                run = saved_run_config(Path(cfg.ckpt_path))
                data_set_of_run(cfg.data, run, Path(cfg.ckpt_path), job)
                model = instantiate(run.model) if run is not None else model
            if cfg.get("ckpt_path") not in (None, "last"):  # "last": Lightning finds the run's own
                check_checkpoint(cfg.ckpt_path, model)
    resume = cfg.get("ckpt_path") == "last"
    if resume and not multirun:
        check_resume_in_place(output_dir)
    check_output_dir(output_dir, multirun, resume)


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of the jobs a ``-m`` sweep runs (Hydra's basic sweeper: the cartesian
    product of every ``a,b`` / ``range()`` / ``choice()``). Sweeps that cannot be enumerated
    (``interval()`` for Optuna, ``glob()``) are left out: their jobs are checked with the
    configured value."""
    choices = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices.append([f"{key}={override.get_value_element_as_str()}"])
        elif override.is_discrete_sweep() and override.value_type.name != "GLOB_CHOICE_SWEEP":
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return [list(job) for job in itertools.product(*choices)]


def _compose(config_name: str, overrides: list[str], defaults: DictConfig, multirun: bool) -> tuple[DictConfig, Path]:
    """The job's config (without its ``hydra`` node), and the directory Hydra will write it into
    (the sweep's directory under ``-m``)."""
    try:
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as error:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        allowed = ", ".join(error.options or [])
        raise UsageError(f"{group}={option}: no such option in conf/{group}/ (available: {allowed}).") from None
    except (ConfigCompositionException, HydraException, OmegaConfBaseException) as error:
        raise UsageError(_describe(error, defaults)) from None
    # Interpolations such as ${hydra:runtime.cwd} resolve against this job's Hydra config.
    HydraConfig.instance().set_config(cfg)
    output_dir = Path(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir)
    # What Hydra will set: ${paths.output_dir} in the callbacks' folders resolves as in the run.
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    if unknown := unknown_keys(cfg):
        raise UsageError(_unknown_key(unknown[0], cfg))
    missing = missing_values(cfg)
    if missing:
        raise UsageError(
            f"Missing value{'s' * (len(missing) > 1)} (???) for {', '.join(missing)}: set "
            f"{'them' if len(missing) > 1 else 'it'} in the config file or on the command line ({missing[0]}=...)."
        )
    return cfg, output_dir


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

    Raises:
        ConfigValueError: when ``run_dir`` holds no ``checkpoints/last.ckpt``, or holds a run that
            completed (its ``metrics.json`` says so).
    """
    if launcher_restarts() > 0:
        return
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        where = (
            "does not exist" if not run_dir.exists() else "holds no checkpoints/last.ckpt (stopped before its first)"
        )
        raise ConfigValueError(
            f"ckpt_path=last resumes the run in hydra.run.dir={run_dir}, which {where}. Give the run's "
            "directory (hydra.run.dir=logs/runs/<run> ckpt_path=last), a checkpoint file (ckpt_path=<file>.ckpt), "
            "or start a new run (without ckpt_path)."
        )
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and json.loads(metrics.read_text()).get("status") == "completed":
        raise ConfigValueError(
            f"ckpt_path=last: the run in {run_dir} completed (its {METRICS_FILE}), so there is nothing to resume. "
            f"Evaluate its checkpoints with python -m mnist_ddp.eval ckpt_path={run_dir}/checkpoints/<file>.ckpt, "
            "or train further in a new run."
        )


def check_output_dir(output_dir: Path, multirun: bool, resume: bool) -> None:
    """Refuse to start a run into the directory of an earlier one, before anything is written: it
    would overwrite that run's checkpoints and metrics and add a second series to its TensorBoard
    run. Resuming that run in place (``ckpt_path=last``) and a launcher's restart of the job
    (torchrun ``--max-restarts``, a SLURM requeue) are the exceptions; so are the processes other
    than global rank 0 under torchrun or SLURM (rank 0 checks, before any of them writes).

    Raises:
        ConfigValueError: naming the directory and the ways on.
    """
    if resume or launcher_restarts() > 0 or launcher_rank() > 0 or not holds_a_run(output_dir):
        return
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    raise ConfigValueError(
        f"{key}={output_dir} already holds a run: starting another there would overwrite its checkpoints and "
        f"metrics. Start it in another directory ({key}=<new folder>, or leave {key} unset for a fresh one), "
        "or resume that run in place with ckpt_path=last and the same directory."
    )


def missing_values(node: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """The dotted keys under ``node`` whose value is ``???``.

    ``OmegaConf.missing_keys`` would do, but it resolves every interpolation on its way, and
    ``${hydra:runtime.output_dir}`` has no value before Hydra creates the run directory.
    """
    found = []
    for key in range(len(node)) if isinstance(node, ListConfig) else node:
        full_key = f"{prefix}{key}" if isinstance(key, str) else f"{prefix[:-1]}[{key}]"
        child = node._get_node(key)
        if OmegaConf.is_missing(node, key):
            found.append(full_key)
        elif isinstance(child, DictConfig | ListConfig) and not child._is_interpolation():
            found.extend(missing_values(child, f"{full_key}."))
    return found


#: The arguments of ``lightning.pytorch.Trainer``: any of them is a known ``trainer`` key, also
#: one the schema leaves out (``trainer.max_time=...`` needs no ``+``: :func:`with_trainer_arguments`).
TRAINER_ARGUMENTS = frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


def with_trainer_arguments(args: Sequence[str]) -> list[str]:
    """``args`` with ``trainer.<name>=...`` written ``+trainer.<name>=...`` where ``name`` is an
    argument of Lightning's Trainer that the schema (:class:`~mnist_ddp.cli.schema.TrainerConfig`)
    leaves out: Hydra adds a key only with ``+``, and a Trainer argument is no unknown key."""
    schema = {field.name for field in dataclasses.fields(TrainerConfig)}
    rewritten = []
    for arg in args:
        key = arg.split("=", 1)[0]
        name = key.removeprefix("trainer.")
        if key.startswith("trainer.") and "=" in arg and name in TRAINER_ARGUMENTS and name not in schema:
            arg = f"+{arg}"
        rewritten.append(arg)
    return rewritten


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The dotted keys under ``node`` that its schema (a dataclass of :mod:`mnist_ddp.cli.schema`)
    does not have: added with ``+``, by a typo or for an option that does not exist. The nodes the
    schema leaves open on purpose (typed ``Any`` or ``dict``: ``callbacks``, ``model.net``,
    ``model.optimizer`` and ``model.scheduler``, whose keyword arguments their classes check when
    they are built, ``launcher.env``) are not looked into; under ``trainer`` every argument of
    Lightning's Trainer is known (:data:`TRAINER_ARGUMENTS`)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    known = {field.name for field in dataclasses.fields(schema)}
    if schema is TrainerConfig:
        known |= TRAINER_ARGUMENTS
    found = []
    for key in node:
        if key not in known:
            found.append(f"{prefix}{key}")
        elif isinstance(child := node._get_node(key), DictConfig) and not child._is_interpolation():
            found.extend(unknown_keys(child, f"{prefix}{key}."))
    return found


def _unknown_key(key: str, cfg: DictConfig) -> str:
    """The message for ``key``, which ``cfg`` (its schema) does not have: the keys it could be."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if parent == "trainer":
        keys = sorted(TRAINER_ARGUMENTS)
        allowed = "trainer takes the arguments of lightning.pytorch.Trainer"
    else:
        if dataclasses.is_dataclass(schema):
            keys = sorted(field.name for field in dataclasses.fields(schema))
        else:
            keys = sorted(str(known) for known in node if known != name) if isinstance(node, DictConfig) else []
        allowed = f"keys of {parent or 'the config'}: {', '.join(keys) or 'none'}"
    close = difflib.get_close_matches(name, keys, n=1)
    hint = f" Did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    return f"Unknown key {key} ({allowed}).{hint}"


def _describe(error: Exception, defaults: DictConfig) -> str:
    cause = error.__cause__ or error
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        return _unknown_key(cause.full_key, defaults)
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"{cause.full_key}: {first_line(cause)}."
    return first_line(error)


def check_job(cfg: DictConfig, training: bool = True) -> L.LightningModule:
    """Build the cheap parts of one job and check its layout (for ``training``, also that the
    global batch splits evenly over the processes: evaluation takes no optimizer step).

    Returns:
        The model it built, for the checkpoint's check.

    Raises:
        UsageError: the first problem found, as one line.
    """
    built = {}
    for group in ("data", "model", "strategy", "callbacks"):
        try:
            built[group] = instantiate(cfg[group])
        except InstantiationException as error:
            if isinstance(error.__cause__, UsageError):
                raise error.__cause__ from None
            hint = _unexpected_argument_hint(cfg[group], group, error.__cause__)
            raise UsageError(f"{group}: {error.__cause__ or error}{hint}") from None
    if training:
        check_schedule(cfg.trainer, built["model"])
    accelerator, devices = resolve_devices(cfg.trainer.accelerator, cfg.trainer.devices)
    devices = OmegaConf.to_container(devices) if OmegaConf.is_list(devices) else devices
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if cfg.trainer.num_nodes < 1:
        raise ConfigValueError(f"trainer.num_nodes={cfg.trainer.num_nodes} must be at least 1.")
    if cfg.trainer.num_nodes > 1 and not launched_externally():
        raise ConfigValueError(
            f"trainer.num_nodes={cfg.trainer.num_nodes}: a run on several machines needs a launcher on each, "
            "torchrun or SLURM (README: Scaling out). On one machine, leave trainer.num_nodes=1."
        )
    if cuda:
        check_gpu_devices(accelerator, devices, torch.cuda.device_count())
    devices_per_node = device_count(devices, cuda)
    check_launch_environment(cfg.trainer.num_nodes, devices_per_node)
    world_size = cfg.trainer.num_nodes * devices_per_node
    if training:
        per_device_batch_size(cfg.data.global_batch_size, world_size, cfg.trainer.accumulate_grad_batches)
    check_device_options(
        "cuda" if cuda else "cpu", cfg.strategy.process_group_backend, cfg.trainer.sync_batchnorm, cfg.trainer.precision
    )
    check_writable("paths.log_dir", Path(cfg.paths.log_dir))
    return built["model"]


def check_schedule(trainer: DictConfig, model: L.LightningModule) -> None:
    """Refuse a run that would train nothing, and build ``model``'s optimizer and scheduler once, as
    ``configure_optimizers`` will in every process, so that the values torch refuses (a negative
    learning rate) are one line here instead of an error in every process after they started.

    Raises:
        ConfigValueError: naming the key and torch's reason.
    """
    if trainer.max_epochs == 0 or trainer.max_epochs < -1:
        raise ConfigValueError(
            f"trainer.max_epochs={trainer.max_epochs} trains nothing: set at least 1 (or -1 with trainer.max_steps)."
        )
    try:
        optimizer = model.build_optimizer()
    except (ValueError, TypeError) as error:
        raise ConfigValueError(f"model.optimizer: {error}") from None
    try:
        model.build_scheduler(optimizer, total_steps=1)  # the run's step count is known only once it runs
    except (ValueError, TypeError) as error:
        raise ConfigValueError(f"model.scheduler: {error}") from None


def _unexpected_argument_hint(node: DictConfig, path: str, error: BaseException | None) -> str:
    """For ``TypeError: ... unexpected keyword argument 'x'``: which ``_target_`` node sets ``x``, and
    how to drop it. (A preset written for one class, such as ``experiment=fast`` setting
    ``model.net.batch_norm`` for the CNN, meets another, ``model=mlp``.)"""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(error)) if isinstance(error, TypeError) else None
    if match is None:
        return ""
    argument = match[1]
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_interpolation():
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
    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if not environment.detect():
            continue
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
        return


def check_writable(key: str, folder: Path) -> None:
    """Refuse an output folder this process cannot create or write into, before anything is written.

    Nothing is created: the check writes a temporary file into ``folder``, or into its nearest
    existing parent when it does not exist yet, and removes it.

    Raises:
        ConfigValueError: naming ``key``, the folder and the reason.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigValueError(
            f"{key}={folder} cannot be written (creating a file in {existing}: {reason}). "
            f"Point {key} at a folder you can write, e.g. {key}=$HOME/logs."
        ) from None
