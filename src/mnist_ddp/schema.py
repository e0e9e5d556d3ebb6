"""The schema of this task's data sets (``conf/data/idx.yaml``: MNIST's file format), beside the image
machinery's (:mod:`ddp_engine.vision.schema`: a folder of images, predict's and export's keys).
:data:`mnist_ddp.task.TASK` hands :func:`register_schemas` to the engine, which stores them in
Hydra's ConfigStore before it composes a config.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddp_engine.vision import schema as vision_schema
from ddp_engine.vision.idx_format import LABELS_KIND, check_idx_file, find_idx_file
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from mnist_ddp.splits import check_val_size


@dataclass
class IDXFilesConfig:
    """``data.files``: the four IDX file names of a data set in MNIST's file format."""

    train_images: str = MISSING
    train_labels: str = MISSING
    test_images: str = MISSING
    test_labels: str = MISSING


@dataclass
class IDXDataConfig(vision_schema.DataConfig):
    """``data=mnist``, ``data=fashion_mnist`` (``conf/data/idx.yaml``): arguments of
    :class:`mnist_ddp.data.MNISTDataModule`."""

    builds: ClassVar[str] = "mnist_ddp.data.MNISTDataModule"
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

    @staticmethod
    def check_values(node: DictConfig) -> None:
        """Refuse ``data.val_size`` against the training split's size in its labels file's header,
        before torch is imported; nothing when the file is not there yet (it is downloaded, then
        checked, later: :meth:`mnist_ddp.data.MNISTDataModule.check_splits`).

        Raises:
            ConfigValueError: naming ``data.val_size`` and the training split's size.
            DataNotAvailableError, DataFormatError: for a labels file that cannot be read or is broken.
        """
        try:
            labels = find_idx_file(Path(node.data_dir) / node.subdir, node.files.train_labels)
            present = labels.is_file()
        except PermissionError:  # an unreadable folder: named when the files are checked
            return
        if present:
            (train_count,) = check_idx_file(labels, 1, LABELS_KIND)
            check_val_size(node.val_size, train_count)


def register_schemas(store: ConfigStore) -> None:
    """Store the task's schemas in ``store``, and the image machinery's, under the names its YAML's
    defaults lists give them."""
    vision_schema.register_schemas(store)
    store.store(group="data", name="idx_schema", node=IDXDataConfig)
