"""The config schema: typed dataclasses that Hydra checks every composed config against.

The values live in ``conf/`` (one YAML group per concern); this module only says which keys
exist and what type each has. Hydra merges every YAML file and every command-line override
into these dataclasses, so a mistyped key (``data.global_batchsize=64``) or a wrong type
(``trainer.max_epochs=three``) is refused while the config is composed, before any process
or DDP process group exists.

Every field is ``MISSING`` here: the values are in ``conf/``, one place per default (a test,
``tests/config/test_defaults.py``, keeps it so and compares the YAML with the signatures of the
template's own classes).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from mnist_ddp.core.environment import run_stamp
from mnist_ddp.core.objective import Mode
from mnist_ddp.distributed.options import CommHook, LRScaling

#: ``conf/``, where the entry points read their configs. An installed wheel (``pip install .``) has it
#: as the package data ``mnist_ddp/conf/``, which pyproject.toml maps the repository's top-level
#: ``conf/`` onto; a source checkout (the editable install of ``make``) has no such folder and reads
#: the repository's ``conf/`` itself, so that an edit there takes effect at once.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONFIG_DIR = _PACKAGE_DIR / "conf" if (_PACKAGE_DIR / "conf").is_dir() else _PACKAGE_DIR.parents[1] / "conf"

#: Where the modules of version 0.1 (one flat package) moved in the layout by concern: a run saved
#: before names the old paths in its config's ``_target_``s (see :func:`upgrade_targets`).
MOVED_MODULES = {
    "mnist_ddp.data": "mnist_ddp.data.datamodule",
    "mnist_ddp.sharding": "mnist_ddp.data.sharding",
    "mnist_ddp.model": "mnist_ddp.models.classifier",
    "mnist_ddp.run_summary": "mnist_ddp.callbacks.run_summary",
    "mnist_ddp.throughput": "mnist_ddp.callbacks.throughput",
    "mnist_ddp.misclassified": "mnist_ddp.callbacks.misclassified",
    "mnist_ddp.ddp_report": "mnist_ddp.callbacks.ddp_report",
    "mnist_ddp.interrupts": "mnist_ddp.callbacks.signals",
    "mnist_ddp.strategy": "mnist_ddp.distributed.strategy",
    "mnist_ddp.checkpoint_io": "mnist_ddp.distributed.checkpoint_io",
    "mnist_ddp.job": "mnist_ddp.launch.job",
    "mnist_ddp.sweep_summary": "mnist_ddp.launch.sweep_summary",
}
#: Classes that left their old module for another one than the rest of it.
MOVED_CLASSES = {
    "mnist_ddp.model.CNN": "mnist_ddp.models.networks.CNN",
    "mnist_ddp.model.MLP": "mnist_ddp.models.networks.MLP",
}


@dataclass
class IDXFilesConfig:
    """``data.files``: the four IDX file names of a data set in MNIST's file format."""

    train_images: str = MISSING
    train_labels: str = MISSING
    test_images: str = MISSING
    test_labels: str = MISSING


@dataclass
class DataConfig:
    """The ``data`` keys every DataModule of the template takes: the arguments of
    :class:`mnist_ddp.data.base.ClassificationDataModule` (``conf/data/base.yaml``).

    Each data set's schema adds its own keys (:class:`IDXDataConfig`, :class:`FolderDataConfig`;
    its YAML names it in its defaults list, ``idx_schema`` / ``folder_schema``). A data set of your
    own needs no schema: its keys are checked against its class's signature
    (:func:`mnist_ddp.config.compose.unknown_keys`).
    """

    _target_: str = MISSING
    global_batch_size: int = MISSING
    num_workers: int = MISSING
    shuffle_seed: int = MISSING
    crop_padding: int = MISSING
    horizontal_flip: bool = MISSING
    prepare_data_per_node: bool = MISSING
    on_device: bool = MISSING


@dataclass
class IDXDataConfig(DataConfig):
    """``data=mnist``, ``data=fashion_mnist`` (``conf/data/idx.yaml``): arguments of
    :class:`mnist_ddp.data.datamodule.MNISTDataModule`."""

    data_dir: str = MISSING
    val_size: int = MISSING
    split_seed: int = MISSING
    subdir: str = MISSING
    files: IDXFilesConfig = MISSING
    download: str | None = MISSING
    class_names: list[str] = MISSING
    image_size: list[int] = MISSING
    mean: float = MISSING
    std: float = MISSING


@dataclass
class FolderDataConfig(DataConfig):
    """``data=folder`` (``conf/data/folder.yaml``): arguments of
    :class:`mnist_ddp.data.folder.ImageFolderDataModule`."""

    root: str = MISSING
    val_size: float = MISSING
    split_seed: int = MISSING
    image_size: list[int] | None = MISSING
    channels: int | None = MISSING
    #: One value for every channel, a list of one per channel, or null (computed).
    mean: Any = MISSING
    std: Any = MISSING
    in_memory_limit_mib: int = MISSING
    cache_dir: str | None = MISSING


#: The class each data set schema describes: a ``data`` node typed by one of them builds that class.
DATA_SCHEMA_TARGETS = {
    IDXDataConfig: "mnist_ddp.data.datamodule.MNISTDataModule",
    FolderDataConfig: "mnist_ddp.data.folder.ImageFolderDataModule",
}


@dataclass
class ModelConfig:
    """``model`` group: arguments of :class:`mnist_ddp.models.classifier.MNISTClassifier`.

    ``net``, ``optimizer`` and ``scheduler`` are Hydra ``_target_`` nodes; their keys are
    checked when they are instantiated (still before any process launches).
    """

    _target_: str = MISSING
    net: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = MISSING
    scheduler_interval: str = MISSING
    compile: bool = MISSING


@dataclass
class TaskCommandConfig:
    """``task.predict``, ``task.export``: a command of the task's own, each ``module:function``.

    ``run``: what each process of a prediction does with the job's config (``run(cfg) -> dict``),
    or the export, in the command's own process; ``check_paths``: ``(cfg) -> None``, called before
    torch is imported (its module must import none), refuses paths that name nothing; ``check_job``:
    ``(cfg, model, world_size) -> None``, called once the job's model is built for its checkpoint,
    before any process starts. Each check raises a :class:`~mnist_ddp.core.errors.UsageError`.
    """

    run: str = MISSING
    check_paths: str | None = MISSING
    check_job: str | None = MISSING


@dataclass
class TaskConfig:
    """``task`` group: what the engine learns from the task (``conf/task/classification.yaml``).

    ``objective``: the metric (a tag the LightningModule logs in validation) that chooses the best
    checkpoint and that a sweep optimizes; ``mode``: :class:`~mnist_ddp.core.objective.Mode`;
    ``metrics``: the tags shown in the final lines, ``summary.csv`` and HPARAMS; ``callbacks``: the
    task's own callbacks (figures), a name each, given to every Trainer beside ``callbacks``;
    ``predict`` and ``export``: what ``python -m mnist_ddp.predict`` / ``export`` run with a
    checkpoint of the task (:class:`TaskCommandConfig`), or None for a task that has none (refused
    in one line).
    """

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
    :func:`mnist_ddp.distributed.layout.resolve_devices`).
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
    """``strategy`` group: arguments of :class:`mnist_ddp.distributed.strategy.CommHookDDPStrategy`.

    Values come from ``conf/strategy/*.yaml``; docs/distributed.md's table gives each one's meaning.
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
    """``lr_scaling``: ``model.optimizer.lr`` is the rate at ``reference_batch_size``; see
    :func:`mnist_ddp.distributed.layout.scale_learning_rate`."""

    rule: LRScaling = MISSING
    reference_batch_size: int = MISSING


@dataclass
class TensorBoardLoggerConfig:
    """``logger.tensorboard``: arguments of :class:`mnist_ddp.loggers.tensorboard_logger.TensorBoardLogger`
    (Lightning's)."""

    _target_: str = MISSING
    save_dir: str = MISSING
    name: str | None = MISSING
    version: str = MISSING
    default_hp_metric: bool = MISSING
    log_graph: bool = MISSING


@dataclass
class CSVLoggerConfig:
    """``logger.csv``: arguments of :class:`mnist_ddp.loggers.csv_logger.CSVLogger` (Lightning's)."""

    _target_: str = MISSING
    save_dir: str = MISSING
    name: str = MISSING
    version: str = MISSING


@dataclass
class MLFlowLoggerConfig:
    """``logger.mlflow``: arguments of ``lightning.pytorch.loggers.MLFlowLogger``; ``run_name``
    null names the run by its run directory (:func:`mnist_ddp.loggers.trackers.build_loggers`)."""

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
class LauncherConfig:
    """``launcher``: the supervisor of a run's processes on one machine (:mod:`mnist_ddp.launch.supervisor`)."""

    rendezvous_timeout: float = MISSING
    shutdown_timeout: float = MISSING
    env: dict[str, str] = MISSING


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
    model and DDP Trainer. ``callbacks`` maps a name to a Lightning callback's ``_target_`` node. ``data`` is
    typed by its data set's own schema (a :class:`DataConfig`), or by none for a DataModule of
    your own."""

    task: TaskConfig = MISSING
    data: Any = MISSING
    model: ModelConfig = MISSING
    trainer: TrainerConfig = MISSING
    strategy: StrategyConfig = MISSING
    logger: LoggerConfig = MISSING
    callbacks: dict[str, Any] = MISSING
    paths: PathsConfig = MISSING
    launcher: LauncherConfig = MISSING
    seed: int = MISSING


@dataclass
class Config(JobConfig):
    """The composed config of ``python -m mnist_ddp.train`` (``conf/config.yaml``).

    ``ckpt_path`` resumes ``trainer.fit`` from a checkpoint when set.
    """

    lr_scaling: LRScalingConfig = MISSING
    ckpt_path: str | None = MISSING


@dataclass
class EvalConfig(JobConfig):
    """The composed config of ``python -m mnist_ddp.eval`` (``conf/eval.yaml``).

    ``ckpt_path`` is required. The model is rebuilt from the checkpoint's own run config
    (``<run>/.hydra/config.yaml``) when it exists; ``model`` is used only when it does not.
    """

    ckpt_path: str = MISSING


@dataclass
class PredictConfig(JobConfig):
    """The composed config of ``python -m mnist_ddp.predict`` (``conf/predict.yaml``).

    ``ckpt_path`` and ``input`` are required: the checkpoint, and a folder of PNG or JPEG images,
    one such image, or an IDX images file (``.gz`` too) (:mod:`mnist_ddp.data.inputs`); ``resize``
    converts inputs of another shape instead of refusing them. As for eval, the model comes from
    the checkpoint's run (``model`` only when the run left no config), the image shape,
    normalization and class names from the checkpoint. The data set's files are not read.
    """

    ckpt_path: str = MISSING
    input: str = MISSING
    resize: bool = MISSING


@dataclass
class ExportConfig:
    """The composed config of ``python -m mnist_ddp.export`` (``conf/export.yaml``): one process, no
    Trainer, so no ``trainer``, ``strategy``, ``logger``, ``callbacks`` or ``launcher``.

    ``data`` is the data set of the checkpoint's run (as for eval): its normalization goes into the
    exported model, and its test images check the file. ``model`` is used only when the run left no
    config; ``seed`` only feeds ``data.shuffle_seed``. ``ckpt_path`` is required; ``format`` is one
    the task's export writes (its ``check_paths`` refuses another); ``output`` is the file to write,
    or None for one beside the checkpoint.
    """

    task: TaskConfig = MISSING
    data: Any = MISSING
    model: ModelConfig = MISSING
    paths: PathsConfig = MISSING
    seed: int = MISSING
    ckpt_path: str = MISSING
    format: str = MISSING
    output: str | None = MISSING


def upgrade_targets(node: Any) -> Any:
    """``node`` (a config read from a run's ``.hydra/config.yaml``, or any part of one) with every
    ``_target_`` that names a class where an earlier version of this template had it renamed to
    where it is now (:data:`MOVED_MODULES`, :data:`MOVED_CLASSES`), in place; returns ``node``."""
    if isinstance(node, DictConfig):
        for key, value in node.items_ex(resolve=False):  # unresolved: ${hydra:...} has no value here
            if key == "_target_" and isinstance(value, str):
                module, _, name = value.rpartition(".")
                node[key] = MOVED_CLASSES.get(value) or (
                    f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else value
                )
            else:
                upgrade_targets(value)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            if not OmegaConf.is_interpolation(node, index):  # unresolved, as above
                upgrade_targets(node[index])
    return node


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (named in ``conf/config.yaml``, ``conf/eval.yaml``,
    ``conf/predict.yaml``, ``conf/export.yaml`` and ``conf/data/``), and register the ``${run_stamp:}`` resolver of
    the run directory names (:func:`mnist_ddp.core.environment.run_stamp`)."""
    if not OmegaConf.has_resolver("run_stamp"):
        # Cached, like Hydra's ${now:}: every job of a sweep resolves the sweep's directory alike.
        OmegaConf.register_new_resolver("run_stamp", run_stamp, use_cache=True)
    ConfigStore.instance().store(name="config_schema", node=Config)
    ConfigStore.instance().store(name="eval_schema", node=EvalConfig)
    ConfigStore.instance().store(name="predict_schema", node=PredictConfig)
    ConfigStore.instance().store(name="export_schema", node=ExportConfig)
    # The data sets' schemas, named in the defaults of conf/data/idx.yaml and folder.yaml.
    ConfigStore.instance().store(group="data", name="idx_schema", node=IDXDataConfig)
    ConfigStore.instance().store(group="data", name="folder_schema", node=FolderDataConfig)
