"""The config schema: typed dataclasses that Hydra checks every composed config against.

The values live in ``conf/`` (one YAML group per concern); this module only says which keys
exist and what type each has. Hydra merges every YAML file and every command-line override
into these dataclasses, so a mistyped key (``data.global_batchsize=64``) or a wrong type
(``trainer.max_epochs=three``) is refused while the config is composed, before any process
or DDP process group exists.

A task adds the schemas of its own configs (its data sets', its commands'):
:attr:`ddp_engine.task.Task.schemas`.

Every field is ``MISSING`` here: the values are in ``conf/``, one place per default (a test,
``engine/tests/config/test_engine_defaults.py``, keeps it so and compares the YAML with the signatures of the
template's own classes).
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from ddp_engine.core.environment import run_stamp
from ddp_engine.core.objective import Mode
from ddp_engine.distributed.options import CommHook, LRScaling
from ddp_engine.task import current


@dataclass
class TaskCommandConfig:
    """``task.predict``, ``task.export``: a command of the task's own, each ``module:function``.

    ``run``: what each process of a prediction does with the job's config (``run(cfg) -> dict``),
    or the export, in the command's own process; ``check_paths``: ``(cfg) -> None``, called before
    torch is imported (its module must import none), refuses paths that name nothing; ``check_job``:
    ``(cfg, model, world_size) -> None``, called once the job's model is built for its checkpoint,
    before any process starts. Each check raises a :class:`~ddp_engine.core.errors.UsageError`.
    """

    run: str = MISSING
    check_paths: str | None = MISSING
    check_job: str | None = MISSING


@dataclass
class TaskConfig:
    """``task``: the facts of the task (:class:`ddp_engine.task.Task`, which fills this node), each
    of which a command line may change (``task.objective=val/loss``): ``objective``, ``mode``
    (:class:`~ddp_engine.core.objective.Mode`), ``metrics``, ``callbacks`` (a Hydra node each, given to
    every Trainer beside ``callbacks``), ``predict`` and ``export`` (:class:`TaskCommandConfig`, or None
    for a task that has none: refused in one line)."""

    objective: str = MISSING
    mode: Mode = MISSING
    metrics: list[str] = MISSING
    callbacks: dict[str, Any] = MISSING
    predict: TaskCommandConfig | None = MISSING
    export: TaskCommandConfig | None = MISSING


@dataclass
class TrainerConfig:
    """``trainer`` group: the subset of ``lightning.pytorch.Trainer`` arguments this template sets.

    ``devices``, ``fast_dev_run``, ``overfit_batches``, ``profiler`` and the ``limit_*`` /
    ``val_check_interval`` fields are ``Any`` because Lightning takes an int, a float, a str or an
    object there and OmegaConf 2.3 has no Union of primitives.
    ``devices`` is ``"auto"``, a process count, or a list of device indices; ``"auto"`` means
    every GPU when CUDA is available, else 2 CPU processes (see
    :func:`ddp_engine.distributed.layout.resolve_devices`).
    """

    _target_: str = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING
    num_nodes: int = MISSING
    precision: str = MISSING
    max_epochs: int = MISSING
    max_steps: int = MISSING
    accumulate_grad_batches: int = MISSING
    gradient_clip_val: float | None = MISSING
    check_val_every_n_epoch: int = MISSING
    val_check_interval: Any = MISSING
    limit_train_batches: Any = MISSING
    limit_val_batches: Any = MISSING
    limit_test_batches: Any = MISSING
    num_sanity_val_steps: int = MISSING
    log_every_n_steps: int = MISSING
    sync_batchnorm: bool = MISSING
    deterministic: bool | None = MISSING
    benchmark: bool | None = MISSING
    fast_dev_run: Any = MISSING
    overfit_batches: Any = MISSING
    profiler: Any = MISSING
    enable_progress_bar: bool = MISSING
    enable_model_summary: bool = MISSING
    use_distributed_sampler: bool = MISSING
    enable_checkpointing: bool = MISSING
    default_root_dir: str | None = MISSING


@dataclass
class StrategyConfig:
    """``strategy`` group: arguments of :class:`ddp_engine.distributed.strategy.CommHookDDPStrategy`.

    Values come from ``ddp_engine/conf/strategy/*.yaml``; engine/docs/distributed.md's table gives each one's meaning.
    ``process_group_backend`` ``None`` lets Lightning choose: NCCL on CUDA devices, gloo on CPU.
    ``timeout`` is a ``datetime.timedelta`` node (``_target_``), so Hydra builds it; so is
    ``checkpoint_io`` (a Lightning ``CheckpointIO``; None: Lightning's own).
    """

    _target_: str = MISSING
    process_group_backend: str | None = MISSING
    timeout: Any = MISSING
    find_unused_parameters: bool = MISSING
    static_graph: bool = MISSING
    gradient_as_bucket_view: bool = MISSING
    bucket_cap_mb: float = MISSING
    broadcast_buffers: bool = MISSING
    comm_hook: CommHook = MISSING
    powersgd_rank: int = MISSING
    powersgd_start_iter: int = MISSING
    optimizer_sharding: bool = MISSING
    checkpoint_io: Any = MISSING


@dataclass
class LRScalingConfig:
    """``lr_scaling``: ``model.optimizer.lr`` is the rate at ``reference_batch_size`` (the task's; None:
    not known, and a ``rule`` other than ``none`` is refused); see
    :func:`ddp_engine.distributed.layout_rules.scale_learning_rate`."""

    rule: LRScaling = MISSING
    reference_batch_size: int | None = MISSING


@dataclass
class TensorBoardLoggerConfig:
    """``logger.tensorboard``: arguments of :class:`ddp_engine.loggers.tensorboard_logger.TensorBoardLogger`
    (Lightning's)."""

    _target_: str = MISSING
    save_dir: str = MISSING
    name: str | None = MISSING
    version: str = MISSING
    default_hp_metric: bool = MISSING
    log_graph: bool = MISSING


@dataclass
class CSVLoggerConfig:
    """``logger.csv``: arguments of :class:`ddp_engine.loggers.csv_logger.CSVLogger` (Lightning's)."""

    _target_: str = MISSING
    save_dir: str = MISSING
    name: str = MISSING
    version: str = MISSING


@dataclass
class MLFlowLoggerConfig:
    """``logger.mlflow``: arguments of ``lightning.pytorch.loggers.MLFlowLogger``; ``run_name``
    null names the run by its run directory (:func:`ddp_engine.loggers.trackers.build_loggers`)."""

    _target_: str = MISSING
    experiment_name: str = MISSING
    run_name: str | None = MISSING
    tracking_uri: str = MISSING
    artifact_location: str | None = MISSING
    tags: dict[str, str] = MISSING
    log_model: bool = MISSING


@dataclass
class WandbLoggerConfig:
    """``logger.wandb``: arguments of ``lightning.pytorch.loggers.WandbLogger``; ``name`` null names
    the run by its run directory."""

    _target_: str = MISSING
    project: str = MISSING
    name: str | None = MISSING
    save_dir: str = MISSING
    offline: bool = MISSING
    log_model: bool = MISSING


@dataclass
class LoggerConfig:
    """``logger`` group: one key per logger, several at once (``logger=[tensorboard,mlflow]``);
    ``logger=[]``: none."""

    tensorboard: TensorBoardLoggerConfig | None = None
    csv: CSVLoggerConfig | None = None
    mlflow: MLFlowLoggerConfig | None = None
    wandb: WandbLoggerConfig | None = None


@dataclass
class KubeflowConfig:
    """``launcher.kubeflow`` (``launcher=kubeflow``): the Kubeflow TrainJob that runs the command on a
    Kubernetes cluster instead of this machine (:mod:`ddp_engine.launch.kubeflow`)."""

    name: str = MISSING
    image: str | None = MISSING
    volume: str | None = MISSING
    mount_path: str = MISSING
    log_dir: str = MISSING
    runtime: str = MISSING
    namespace: str | None = MISSING
    gpus_per_node: int | None = MISSING
    cpu_per_node: str | None = MISSING
    memory_per_node: str | None = MISSING
    manifest: str = MISSING
    submit: bool = MISSING


@dataclass
class LauncherConfig:
    """``launcher``: the supervisor of a run's processes on one machine (:mod:`ddp_engine.launch.supervisor`);
    with ``launcher=kubeflow``, its TrainJob on a Kubernetes cluster instead."""

    rendezvous_timeout: float = MISSING
    shutdown_timeout: float = MISSING
    env: dict[str, str] = MISSING
    kubeflow: KubeflowConfig | None = None


@dataclass
class PathsConfig:
    """``paths`` group: where data and run outputs go (absolute after resolution)."""

    root_dir: str = MISSING
    data_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class JobConfig:
    """What every entry point's config holds: the task's facts, the groups that build the DataModule,
    model and DDP Trainer. ``callbacks`` maps a name to a Lightning callback's ``_target_`` node.
    ``data`` is typed by its data set's own schema where the task gives one, else checked against its
    class's signature; so is ``model`` (the task's LightningModule: the engine reads its
    ``optimizer``, where it has one: the learning-rate scaling, the check before launch).
    ``trusted_targets``: what this command lets a run folder's saved files build beyond the trusted
    modules (:mod:`ddp_engine.config.trust`)."""

    task: TaskConfig = MISSING
    data: Any = MISSING
    model: Any = MISSING
    trainer: TrainerConfig = MISSING
    strategy: StrategyConfig = MISSING
    logger: LoggerConfig = MISSING
    callbacks: dict[str, Any] = MISSING
    paths: PathsConfig = MISSING
    launcher: LauncherConfig = MISSING
    seed: int = MISSING
    trusted_targets: list[str] = MISSING


@dataclass
class Config(JobConfig):
    """The composed config of ``python -m <project>.train`` (``conf/config.yaml``).

    ``ckpt_path`` resumes ``trainer.fit`` from a checkpoint when set.
    """

    lr_scaling: LRScalingConfig = MISSING
    ckpt_path: str | None = MISSING


@dataclass
class EvalConfig(JobConfig):
    """The composed config of ``python -m <project>.eval`` (``conf/eval.yaml``).

    ``ckpt_path`` is required. The model is rebuilt from the checkpoint's own run config
    (``<run>/.hydra/config.yaml``) when it exists; ``model`` is used only when it does not.
    """

    ckpt_path: str = MISSING


@dataclass
class PredictConfig(JobConfig):
    """The composed config of ``python -m <package>.predict``: the engine's keys; a task's predict adds
    its own (its inputs) with a schema of its own under the same name, ``predict_schema``.
    ``ckpt_path`` is required: as for eval, the model comes from the checkpoint's run."""

    ckpt_path: str = MISSING


@dataclass
class PlanSettings:
    """``plan``: what ``python -m <package>.plan`` plans for, beyond the training's own keys.

    ``global_rank``: the rank it runs as (of ``trainer.num_nodes`` x ``trainer.devices``); ``device``:
    a GPU whose memory it knows (``h100``: :data:`~ddp_engine.distributed.device_memory.DEVICE_MEMORY_GIB`),
    or ``device_memory_gib``, which wins; ``network_gbps``: the bandwidth each rank sends AllReduce's
    bytes at (Gbit/s); ``step_seconds``: a measured compute time per optimizer step (None: not known).
    """

    global_rank: int = MISSING
    device: str | None = MISSING
    device_memory_gib: float | None = MISSING
    network_gbps: float | None = MISSING
    step_seconds: float | None = MISSING


@dataclass
class PlanConfig(Config):
    """The composed config of ``python -m <package>.plan`` (``conf/plan.yaml``): the training's, whose
    layout it plans, and ``plan``."""

    plan: PlanSettings = MISSING


@dataclass
class ExportConfig:
    """The composed config of ``python -m <package>.export``: one process, no Trainer (so no
    ``trainer``, ``strategy``, ``logger``, ``callbacks`` or ``launcher``); a task's export adds its own
    keys (its format, its output) with a schema of its own under the same name, ``export_schema``.
    ``data`` and ``model`` are the checkpoint's run's, as for eval."""

    task: TaskConfig = MISSING
    data: Any = MISSING
    model: Any = MISSING
    paths: PathsConfig = MISSING
    seed: int = MISSING
    ckpt_path: str = MISSING
    trusted_targets: list[str] = MISSING


def register_configs() -> None:
    """Store the schemas and the task in Hydra's ConfigStore: the engine's schemas (``config_schema``,
    ``eval_schema``, ``predict_schema``, ``export_schema``, ``plan_schema``: ``conf/engine/``), then the task's own
    (:attr:`~ddp_engine.task.Task.schemas`, which may replace the last two), and the task's facts as
    ``task/default`` (:meth:`~ddp_engine.task.Task.config_node`); and register the resolvers
    ``${run_stamp:}``, the run directory names (:func:`ddp_engine.core.environment.run_stamp`), and
    ``${project_name:}``, the task's package with ``-`` for ``_`` (the W&B project and MLflow
    experiment of ``ddp_engine/conf/logger/``).

    Raises:
        RuntimeError: when no task is registered (:func:`ddp_engine.task.current`).
    """
    if not OmegaConf.has_resolver("run_stamp"):
        # Cached, like Hydra's ${now:}: every job of a sweep resolves the sweep's directory alike.
        OmegaConf.register_new_resolver("run_stamp", run_stamp, use_cache=True)
    if not OmegaConf.has_resolver("project_name"):
        OmegaConf.register_new_resolver("project_name", lambda: current().package.replace("_", "-"))
    store = ConfigStore.instance()
    for name, schema in (
        ("config", Config),
        ("eval", EvalConfig),
        ("predict", PredictConfig),
        ("export", ExportConfig),
        ("plan", PlanConfig),
    ):
        store.store(name=f"{name}_schema", node=schema)
    current().schemas(store)
    store.store(group="task", name="default", package="_global_", node=current().config_node())
