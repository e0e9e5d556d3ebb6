"""The value checks that need neither torch nor Lightning, run first: right after a command line's
keys (:mod:`ddp_engine.config.compose`) and paths, before those imports (seconds), so that a value
these rules refuse is one line in about a second.

For each job: the layout (``trainer.num_nodes``, a ``trainer.devices`` refused on any machine, the
global batch's split where the config alone tells the world size), the epochs, the optimizer's
values as torch's constructors check them, and the data set's values its schema checks
(``check_values``). :mod:`ddp_engine.config.checks` checks every job again, with the objects built.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ddp_engine.config.compose import Job
from ddp_engine.config.saved_run import CHECKPOINT_USES
from ddp_engine.core.environment import launched_externally
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.device_memory import device_memory_gib
from ddp_engine.distributed.layout_rules import (
    check_devices,
    known_world_size,
    per_device_batch_size,
    planned_world_size,
)
from ddp_engine.launch.kubeflow import check_train_job

#: The launcher that submits a sweep's jobs to SLURM (hydra/launcher=slurm): they run on other machines.
SLURM_LAUNCHER = "hydra_plugins.ddp_engine_slurm_launcher.SlurmSweepLauncher"
#: The command that plans a training's layout (``python -m <package>.plan``): its devices are a cluster's.
PLAN = "plan"


def submitted_to_slurm(jobs: Sequence[Job]) -> bool:
    """Whether ``jobs`` are a sweep's that ``hydra/launcher=slurm`` submits: their processes run on the
    cluster's nodes, whose devices are not this machine's (read before the jobs' hydra node is dropped)."""
    return bool(jobs) and jobs[0].multirun and jobs[0].cfg.hydra.launcher.get("_target_") == SLURM_LAUNCHER


def submitted_to_kubeflow(cfg: DictConfig) -> bool:
    """Whether a job's config writes its Kubeflow TrainJob (``launcher=kubeflow``) instead of running here."""
    return OmegaConf.select(cfg, "launcher.kubeflow") is not None


def submitted_to_cluster(jobs: Sequence[Job]) -> bool:
    """Whether the processes of ``jobs`` run on a cluster's nodes, not this machine's: a SLURM sweep's
    (:func:`submitted_to_slurm`) or a Kubeflow TrainJob's (:func:`submitted_to_kubeflow`)."""
    return submitted_to_slurm(jobs) or (bool(jobs) and submitted_to_kubeflow(jobs[0].cfg))


def check_jobs_early(config_name: str, jobs: Sequence[Job]) -> None:
    """Check the values of each of ``jobs`` (of ``python -m <package>.<config_name>``) that need
    neither torch nor Lightning (:func:`check_job_early`).

    Raises:
        UsageError: the first problem found, as one line.
    """
    if config_name == PLAN and jobs and jobs[0].multirun:
        raise ConfigValueError(
            "A plan is of one layout: run python -m <package>.plan once per layout, with the same overrides as its "
            "training (without -m)."
        )
    submitted = submitted_to_cluster(jobs)
    for job in jobs:
        HydraConfig.instance().set_config(job.cfg)  # a value's ${hydra:runtime.cwd} resolves as in the job
        if submitted_to_kubeflow(job.cfg) and config_name != PLAN:  # a plan runs here, whatever the launcher
            check_train_job(
                job.cfg.launcher.kubeflow, job.cfg.trainer.devices, job.multirun, job.cfg.trainer.accelerator
            )
        check_job_early(config_name, job.cfg, submitted)


def check_job_early(config_name: str, cfg: DictConfig, submitted: bool = False) -> None:
    """One job's torch-free value checks, in the order :mod:`ddp_engine.config.checks` meets them:
    its layout (not for an export, one process), then for a training its epochs, its optimizer's
    values (:func:`check_optimizer`) and its data set's (:func:`check_data_values`; where the command
    itself prepares the data: not under torchrun or SLURM). Eval, predict and export take the model
    and data set of their checkpoint's run, checked with it later.

    Raises:
        UsageError: the first problem found, as one line.
    """
    training = config_name not in CHECKPOINT_USES
    if config_name == PLAN:
        check_plan(cfg, check_planned_layout(cfg))
    elif config_name != "export":
        check_layout(cfg, training, submitted)
    if not training:
        return
    check_max_epochs(cfg.trainer.max_epochs)
    model = cfg.get("model")
    if isinstance(model, DictConfig) and isinstance(optimizer := model.get("optimizer"), DictConfig):
        check_optimizer(optimizer)
    if not launched_externally() and not submitted:
        check_data_values(cfg.data)


def check_layout(cfg: DictConfig, training: bool, submitted: bool) -> None:
    """``trainer.num_nodes`` (:func:`check_num_nodes`), a ``trainer.devices`` that no machine runs
    (:func:`~ddp_engine.distributed.layout_rules.check_devices`; a SLURM job's:
    :func:`check_submitted_devices`), and for ``training`` the global batch's split over the world
    size where the config alone tells it (:func:`~ddp_engine.distributed.layout_rules.known_world_size`).

    Raises:
        ConfigValueError: naming the key and what is allowed.
    """
    trainer = cfg.trainer
    check_num_nodes(trainer.num_nodes, submitted)
    if (devices := plain_value(trainer, "devices")) is UNKNOWN:
        return
    if submitted:
        check_submitted_devices(devices)
        world_size = trainer.num_nodes * devices
    else:
        check_devices(trainer.accelerator, devices)
        world_size = known_world_size(trainer.accelerator, devices, trainer.num_nodes)
    global_batch_size = plain_value(cfg.data, "global_batch_size")
    if training and world_size is not None and global_batch_size is not UNKNOWN:
        resume = bool(cfg.get("ckpt_path"))
        per_device_batch_size(global_batch_size, world_size, trainer.accumulate_grad_batches, resume)


def check_planned_layout(cfg: DictConfig) -> int:
    """The layout of a plan (``python -m <package>.plan``), checked as a training's on the cluster it
    names: any number of nodes, ``trainer.devices`` a count
    (:func:`~ddp_engine.distributed.layout_rules.planned_world_size`), the global batch's split.

    Returns:
        The world size.

    Raises:
        ConfigValueError: naming the key and what is allowed (a split's: the training's refusal).
    """
    trainer = cfg.trainer
    check_num_nodes(trainer.num_nodes, submitted=True)
    world_size = planned_world_size(trainer.accelerator, plain_value(trainer, "devices"), trainer.num_nodes)
    per_device_batch_size(plain_value(cfg.data, "global_batch_size"), world_size, trainer.accumulate_grad_batches)
    return world_size


def check_plan(cfg: DictConfig, world_size: int) -> None:
    """The ``plan`` keys of a plan of ``world_size`` processes: its rank, its device's memory, the
    network's bandwidth and the step time it is given.

    Raises:
        ConfigValueError: naming the key and what is allowed.
    """
    plan = cfg.plan
    if not 0 <= plan.global_rank < world_size:
        raise ConfigValueError(
            f"plan.global_rank={plan.global_rank} is not a rank of world_size={world_size}: use 0 to {world_size - 1}."
        )
    if plan.device is not None and plan.device_memory_gib is not None:
        raise ConfigValueError(
            f"plan.device={plan.device} and plan.device_memory_gib={plan.device_memory_gib} both give the device's "
            "memory: keep one of them."
        )
    if plan.device is not None and cfg.trainer.accelerator == "cpu":
        raise ConfigValueError(
            f"plan.device={plan.device} is a GPU, but trainer.accelerator=cpu: plan the GPUs' run with "
            "trainer.accelerator=gpu, or leave plan.device out."
        )
    device_memory_gib(plan.device, plan.device_memory_gib)
    for key in ("network_gbps", "step_seconds"):
        if (value := plan[key]) is not None and not value > 0:
            raise ConfigValueError(f"plan.{key}={value} must be positive (or null: not known).")


def check_num_nodes(num_nodes: int, submitted: bool) -> None:
    """Refuse ``trainer.num_nodes`` below 1, or above 1 for a run that no launcher starts on each node
    (torchrun, SLURM; ``submitted``: a job that ``hydra/launcher=slurm`` or ``launcher=kubeflow`` submits).

    Raises:
        ConfigValueError: naming the value and the way on.
    """
    if num_nodes < 1:
        raise ConfigValueError(f"trainer.num_nodes={num_nodes} must be at least 1.")
    if num_nodes > 1 and not launched_externally() and not submitted:
        raise ConfigValueError(
            f"trainer.num_nodes={num_nodes}: a run on several machines needs a launcher on each, "
            "torchrun, SLURM or Kubernetes (launcher=kubeflow; engine/docs/scaling-out.md). On one machine, "
            "leave trainer.num_nodes=1."
        )


def check_submitted_devices(devices: Any) -> None:
    """Refuse a ``trainer.devices`` that is not a number for a job that ``hydra/launcher=slurm``
    submits: its tasks per node.

    Raises:
        ConfigValueError: naming the value and the fix.
    """
    if not isinstance(devices, int) or devices < 1:
        raise ConfigValueError(
            f"trainer.devices={devices}: hydra/launcher=slurm submits each job with trainer.devices "
            "tasks per node, a number: set trainer.devices=<GPUs per node> (or processes per CPU node)."
        )


def check_max_epochs(max_epochs: int) -> None:
    """Refuse a ``trainer.max_epochs`` that trains nothing (0, or below -1: -1 is no limit).

    Raises:
        ConfigValueError: naming the value and what is allowed.
    """
    if max_epochs == 0 or max_epochs < -1:
        raise ConfigValueError(
            f"trainer.max_epochs={max_epochs} trains nothing: set at least 1 (or -1 with trainer.max_steps)."
        )


@dataclass(frozen=True)
class OptimizerRule:
    """One check of a torch optimizer's constructor: it refuses ``argument`` (its element ``index``,
    or with ``pair`` the pair itself, for ``betas``) where ``refuses(value)``, with ``message``
    (torch's words; ``{}``: the value)."""

    argument: str
    refuses: Callable[[Any], bool]
    message: str
    index: int | None = None
    pair: bool = False


def _not_at_least_zero(value: Any) -> bool:
    return not 0.0 <= value  # so NaN is refused


def _below_zero(value: Any) -> bool:
    return value < 0.0  # SGD's: NaN passes


def _not_in_unit_interval(value: Any) -> bool:
    return not 0.0 <= value < 1.0


def _not_in_closed_unit_interval(value: Any) -> bool:
    return not 0.0 <= value <= 1.0


def _not_two_floats(pair: list) -> bool:
    return not (isinstance(pair[0], float) and isinstance(pair[1], float))  # an int is refused too


_LR = OptimizerRule("lr", _not_at_least_zero, "Invalid learning rate: {}")
_EPS = OptimizerRule("eps", _not_at_least_zero, "Invalid epsilon value: {}")
_BETAS = tuple(
    OptimizerRule("betas", _not_in_unit_interval, f"Invalid beta parameter at index {index}: {{}}", index)
    for index in (0, 1)
)
_WEIGHT_DECAY = OptimizerRule("weight_decay", _not_at_least_zero, "Invalid weight_decay value: {}")
_MOMENTUM = OptimizerRule("momentum", _not_at_least_zero, "Invalid momentum value: {}")
_ADAMAX = (_LR, _EPS, *_BETAS, _WEIGHT_DECAY)
_ADAM = (
    *_ADAMAX,
    OptimizerRule("betas", _not_two_floats, "betas must be either both floats or both Tensors", pair=True),
)

#: What the constructors of torch.optim's classes refuse, by class, in the order they check it
#: (torch/optim/<class>.py; a test checks each rule against torch itself).
OPTIMIZER_RULES: dict[str, tuple[OptimizerRule, ...]] = {
    "Adam": _ADAM,
    "AdamW": _ADAM,
    "Adamax": _ADAMAX,
    "RAdam": _ADAMAX,
    "NAdam": (*_ADAMAX, OptimizerRule("momentum_decay", _not_at_least_zero, "Invalid momentum_decay value: {}")),
    "SGD": (
        OptimizerRule("lr", _below_zero, _LR.message),
        OptimizerRule("momentum", _below_zero, _MOMENTUM.message),
        OptimizerRule("weight_decay", _below_zero, _WEIGHT_DECAY.message),
    ),
    "RMSprop": (
        _LR,
        _EPS,
        _MOMENTUM,
        _WEIGHT_DECAY,
        OptimizerRule("alpha", _not_at_least_zero, "Invalid alpha value: {}"),
    ),
    "Adagrad": (
        _LR,
        OptimizerRule("lr_decay", _not_at_least_zero, "Invalid lr_decay value: {}"),
        _WEIGHT_DECAY,
        OptimizerRule("initial_accumulator_value", _not_at_least_zero, "Invalid initial_accumulator_value value: {}"),
        _EPS,
    ),
    "Adadelta": (_LR, OptimizerRule("rho", _not_in_closed_unit_interval, "Invalid rho value: {}"), _EPS, _WEIGHT_DECAY),
    "ASGD": (_LR, _WEIGHT_DECAY),
}


def optimizer_rules(target: Any) -> tuple[OptimizerRule, ...]:
    """The rules of ``model.optimizer._target_`` (``torch.optim.AdamW`` or ``torch.optim.adamw.AdamW``);
    none for another class."""
    if not isinstance(target, str):
        return ()
    module, _, name = target.rpartition(".")
    return OPTIMIZER_RULES.get(name, ()) if module in ("torch.optim", f"torch.optim.{name.lower()}") else ()


def check_optimizer(node: DictConfig) -> None:
    """Refuse the values of ``model.optimizer`` (``node``) that its torch.optim class's constructor
    refuses (:data:`OPTIMIZER_RULES`), with torch's words (:func:`optimizer_refusal`). A value that is
    not a number ends the check: torch's own check, later, names it.

    Raises:
        ConfigValueError: naming the key, torch's reason and the optimizer's arguments.
    """
    for rule in optimizer_rules(plain_value(node, "_target_")):
        if rule.argument not in node:
            continue
        value = plain_value(node, rule.argument)
        if rule.index is not None or rule.pair:
            if not isinstance(value, list) or len(value) < 2:
                return
            value = value if rule.pair else value[rule.index]
        if not rule.pair and not isinstance(value, int | float):
            return
        if rule.refuses(value):
            raise optimizer_refusal(node, rule.message.format(value))


def optimizer_refusal(node: DictConfig, reason: object) -> ConfigValueError:
    """The refusal of ``model.optimizer`` (``node``) for torch's ``reason`` ("Invalid learning rate:
    -1"), with the keys it was given."""
    given = ", ".join(f"model.optimizer.{key}={value}" for key, value in node.items() if key[0] != "_")
    return ConfigValueError(f"model.optimizer: {reason} (its arguments: {given}).")


def check_data_values(data: DictConfig) -> None:
    """The ``check_values(node)`` of the data set's schema (the dataclass that types ``data``), where
    it has one: its torch-free checks of the values, a file header's counts among them
    (engine/docs/tasks.md).

    Raises:
        UsageError: the schema's, as one line.
    """
    check = getattr(OmegaConf.get_type(data), "check_values", None) if isinstance(data, DictConfig) else None
    if check is None:
        return
    try:
        check(data)
    except OmegaConfBaseException:  # a value that resolves once the run directory is known: checked then
        return


#: A value that cannot be read before the objects are built (an interpolation that does not resolve).
UNKNOWN = object()


def plain_value(node: DictConfig, key: str) -> Any:
    """``node[key]`` resolved, a list or mapping as plain Python; :data:`UNKNOWN` where it is missing or
    does not resolve (the later checks name it)."""
    try:
        value = node[key]
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value
    except OmegaConfBaseException:
        return UNKNOWN
