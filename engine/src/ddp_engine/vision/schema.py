"""The config schemas of the image machinery: the keys every image data set takes
(:class:`DataConfig`), a folder of images' (:class:`FolderDataConfig`), and the keys of an image
task's ``predict`` and ``export``. An image task stores them with :func:`register_schemas` (its
``Task.schemas``), under the names the YAMLs of ``ddp_engine/vision/conf/`` give them.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ddp_engine import api


@dataclass
class DataConfig:
    """The ``data`` keys every image DataModule takes: the arguments of
    :class:`~ddp_engine.vision.classification.ClassificationDataModule` (``conf/data/image.yaml``).
    Each data set's schema adds its own keys (:class:`FolderDataConfig`, a task's own); a data set
    without one has its keys checked against its class's signature."""

    _target_: str = MISSING
    global_batch_size: int = MISSING
    num_workers: int = MISSING
    shuffle_seed: int = MISSING
    crop_padding: int = MISSING
    horizontal_flip: bool = MISSING
    prepare_data_per_node: bool = MISSING
    on_device: bool = MISSING


@dataclass
class FolderDataConfig(DataConfig):
    """``data=folder`` (``conf/data/folder.yaml``): arguments of
    :class:`ddp_engine.vision.folder.ImageFolderDataModule`."""

    builds: ClassVar[str] = "ddp_engine.vision.folder.ImageFolderDataModule"
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
    """``python -m <project>.predict`` (the task's ``conf/predict.yaml``): the engine's keys, and ``input``, a
    folder of PNG or JPEG images, one such image, or an IDX images file (``.gz`` too)
    (:mod:`ddp_engine.vision.inputs`); ``resize`` converts inputs of another shape instead of refusing
    them. The image shape, normalization and class names come from the checkpoint; the data set's
    files are not read."""

    input: str = MISSING
    resize: bool = MISSING


@dataclass
class ExportConfig(api.ExportConfig):
    """``python -m <project>.export`` (the task's ``conf/export.yaml``): the engine's keys, and ``format``, one
    the export writes (``check_export_paths`` refuses another), and ``output``, the file to write, or
    None for one beside the checkpoint. The data set's normalization goes into the exported model,
    and its test images check the file."""

    format: str = MISSING
    output: str | None = MISSING


def register_schemas(store: ConfigStore) -> None:
    """Store the image machinery's schemas in ``store``: ``data/folder_schema``, and
    ``predict_schema`` and ``export_schema`` for an image task's commands."""
    store.store(name="predict_schema", node=PredictConfig)
    store.store(name="export_schema", node=ExportConfig)
    store.store(group="data", name="folder_schema", node=FolderDataConfig)
