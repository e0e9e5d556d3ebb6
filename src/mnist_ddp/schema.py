"""The task's config schemas: its data sets' (``conf/data/idx.yaml``, ``folder.yaml``) and those of
its commands ``predict`` and ``export`` (``conf/predict.yaml``, ``conf/export.yaml``), beside the
engine's (:mod:`ddp_engine.config.schema`). :data:`mnist_ddp.task.TASK` hands them to the
engine, which stores them in Hydra's ConfigStore before it composes a config.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

from ddp_engine import api
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


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
    (:func:`ddp_engine.config.compose.unknown_keys`).
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

    builds: ClassVar[str] = "mnist_ddp.data.datamodule.MNISTDataModule"
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

    builds: ClassVar[str] = "mnist_ddp.data.folder.ImageFolderDataModule"
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


@dataclass
class PredictConfig(api.PredictConfig):
    """``python -m <project>.predict`` (``conf/predict.yaml``): the engine's keys, and ``input``, a
    folder of PNG or JPEG images, one such image, or an IDX images file (``.gz`` too)
    (:mod:`mnist_ddp.data.inputs`); ``resize`` converts inputs of another shape instead of refusing
    them. The image shape, normalization and class names come from the checkpoint; the data set's
    files are not read."""

    input: str = MISSING
    resize: bool = MISSING


@dataclass
class ExportConfig(api.ExportConfig):
    """``python -m <project>.export`` (``conf/export.yaml``): the engine's keys, and ``format``, one
    the export writes (``check_export_paths`` refuses another), and ``output``, the file to write, or
    None for one beside the checkpoint. The data set's normalization goes into the exported model,
    and its test images check the file."""

    format: str = MISSING
    output: str | None = MISSING


def register_schemas(store: ConfigStore) -> None:
    """Store the task's schemas in ``store``, under the names its YAML's defaults lists give them."""
    store.store(name="predict_schema", node=PredictConfig)
    store.store(name="export_schema", node=ExportConfig)
    store.store(group="data", name="idx_schema", node=IDXDataConfig)
    store.store(group="data", name="folder_schema", node=FolderDataConfig)
