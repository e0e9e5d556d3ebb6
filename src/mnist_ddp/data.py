"""An IDX image data set (MNIST by default) as a DataModule: the four files read once into memory,
sharded across DDP processes by :class:`~ddp_engine.vision.classification.ClassificationDataModule`.

- ``prepare_data`` (local rank 0 of each node) makes sure the four IDX files are on disk.
- ``setup`` loads them once into tensors: images ``(N, 1, H, W)`` uint8, labels ``(N,)`` int64;
  every batch is one index gather from them (:class:`~ddp_engine.data.sharded.GatherDataset`), and
  is normalized on its device.

Any data set in MNIST's file format (four IDX files: ``(N, H, W)`` uint8 images and ``(N,)`` uint8
labels per split) works by configuration alone: folder, file names, class names and normalization
statistics are arguments (``conf/data/*.yaml``).
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from ddp_engine.api import ConfigValueError, GatherDataset
from ddp_engine.vision.classification import ClassificationDataModule
from ddp_engine.vision.idx import (
    LABELS_KIND,
    MNIST_FILES,
    check_idx_file,
    check_idx_split,
    ensure_idx_files,
    find_idx_file,
    import_class,
    read_idx_split,
)
from ddp_engine.vision.spec import DataSpec
from typing_extensions import override

from mnist_ddp.splits import check_val_size

#: Mean and standard deviation of the MNIST training pixels on a 0..1 scale (over all 60,000
#: training images; the figures used by PyTorch's examples/mnist).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
#: MNIST's class names: the digits.
DIGITS = tuple(str(digit) for digit in range(10))


class MNISTDataModule(ClassificationDataModule):
    """MNIST, or any data set in MNIST's file format, held in memory, sharded explicitly across the
    DDP process group.

    Args:
        data_dir: the data root; the files are in (or are downloaded into) ``data_dir/subdir``.
        global_batch_size, num_workers, shuffle_seed, crop_padding, horizontal_flip,
            prepare_data_per_node, on_device: see :class:`~ddp_engine.vision.classification.ClassificationDataModule`
            (``num_workers`` defaults to 0 here since the data is already in memory;
            ``on_device=true`` puts about 52 MiB of uint8 on the GPU for MNIST).
        val_size: images taken from the training images for validation (default 5,000).
        split_seed: seed of the train/val split; fixed by default so that validation metrics
            compare across training seeds.
        subdir: the folder under ``data_dir`` with the files (default ``MNIST/raw``, torchvision's
            layout ``<class name>/raw``; ``.`` for ``data_dir`` itself).
        files: the four IDX file names by role, keys ``train_images``, ``train_labels``,
            ``test_images``, ``test_labels`` (default :data:`~ddp_engine.vision.idx.MNIST_FILES`).
            Images ``(N, H, W)`` uint8 (``image_size``), labels ``(N,)`` uint8. Each is
            read uncompressed or as shipped, ``<name>.gz`` (the uncompressed one when both are
            there; see :func:`~ddp_engine.vision.idx_format.find_idx_file`).
        download: import path of the torchvision class that downloads missing files (default
            ``torchvision.datasets.MNIST``; ``FashionMNIST`` or ``KMNIST`` for those), or None
            for a data set that cannot be downloaded.
        class_names: one name per class, label ``i`` is ``class_names[i]`` (default the digits
            ``"0"``..``"9"``); the networks output as many classes.
        image_size: ``(H, W)`` of the images in pixels (default ``(28, 28)``, MNIST's family's):
            declared, as the class names and statistics are, so that the network can be built
            before the files are downloaded; the files' headers are checked against it.
        mean: mean of the training pixels on a 0..1 scale (default :data:`MNIST_MEAN`).
        std: their standard deviation (default :data:`MNIST_STD`). Each image is served as
            ``(pixel / 255 - mean) / std``.

    Raises:
        ConfigValueError: from the constructor when ``files`` lacks a role, ``class_names`` is
            empty, ``download`` is not an importable class, or ``std`` is not positive; from
            :meth:`setup` when ``val_size`` leaves no training images.
        DataNotAvailableError: from :meth:`prepare_data`, see :func:`~ddp_engine.vision.idx.ensure_idx_files`.
        DataFormatError: from :meth:`prepare_data`, :meth:`describe` and :meth:`setup`, see
            :func:`~ddp_engine.vision.idx.check_idx_split`.
    """

    #: The data root may move between a run and its resume or evaluation.
    loading_keys = (*ClassificationDataModule.loading_keys, "data_dir")

    def __init__(
        self,
        data_dir: str,
        global_batch_size: int = 128,
        val_size: int = 5000,
        split_seed: int = 0,
        shuffle_seed: int = 0,
        num_workers: int = 0,
        prepare_data_per_node: bool = True,
        on_device: bool = False,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        subdir: str = "MNIST/raw",
        files: Mapping[str, str] = MNIST_FILES,
        download: str | None = "torchvision.datasets.MNIST",
        class_names: Sequence[str] = DIGITS,
        image_size: Sequence[int] = (28, 28),
        mean: float = MNIST_MEAN,
        std: float = MNIST_STD,
    ) -> None:
        super().__init__(
            global_batch_size, num_workers=num_workers, shuffle_seed=shuffle_seed, crop_padding=crop_padding,
            horizontal_flip=horizontal_flip, prepare_data_per_node=prepare_data_per_node, on_device=on_device,
        )  # fmt: skip
        if sorted(files) != sorted(MNIST_FILES):
            raise ConfigValueError(f"data.files must name exactly {', '.join(MNIST_FILES)}; got {', '.join(files)}.")
        if not class_names:
            raise ConfigValueError("data.class_names is empty: name one class per label (label i is class_names[i]).")
        if download is not None:
            try:
                import_class(download)
            except (ImportError, AttributeError, ValueError) as err:
                raise ConfigValueError(
                    f"data.download={download} is not an importable class: name a torchvision data set class "
                    "of the MNIST family (torchvision.datasets.MNIST, FashionMNIST, KMNIST), or null."
                ) from err
        if not std > 0:
            raise ConfigValueError(f"data.std={std} must be positive (the training pixels' standard deviation).")
        # Plain types in the checkpoint (Hydra passes DictConfig / ListConfig), which then loads with
        # torch.load(weights_only=True); save_hyperparameters reads these locals.
        files, class_names, image_size = dict(files), list(class_names), list(image_size)
        # Hyperparameters are logged once for the whole composed config by the entry point.
        self.save_hyperparameters(logger=False)
        self.raw_dir = Path(data_dir) / subdir

    def _split_files(self, split: str) -> tuple[Path, Path]:
        """The images and labels files of ``split`` (``"train"`` or ``"test"``), each ``<name>`` or
        ``<name>.gz``."""
        files = self.hparams.files
        return tuple(find_idx_file(self.raw_dir, files[f"{split}_{kind}"]) for kind in ("images", "labels"))

    def _load(self, split: str) -> GatherDataset:
        images, labels = read_idx_split(*self._split_files(split), len(self.hparams.class_names))
        return GatherDataset(images.unsqueeze(1), labels)  # (N, 1, H, W): one channel

    @override
    def describe(self) -> DataSpec:
        """The class names, image size and normalization of the config (IDX images have one channel):
        no file is read, so that the network is built before ``prepare_data`` downloads the files."""
        hparams = self.hparams
        return DataSpec(hparams.class_names, (1, *hparams.image_size), (hparams.mean,), (hparams.std,))

    @override
    def prepare_data(self) -> None:
        ensure_idx_files(self.raw_dir, list(self.hparams.files.values()), self.hparams.download)
        # Before any DDP process launches (the entry points call this first): a corrupt or
        # mismatched file is refused here, not in every process's setup.
        for split in ("train", "test"):
            check_idx_split(
                *self._split_files(split), len(self.hparams.class_names), image_size=self.hparams.image_size
            )

    @override
    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate") and self.train_set is None:
            full = self._load("train")
            val_size = self.hparams.val_size
            self._check_split_sizes(len(full))
            # Same generator seed on every rank and every stage -> the same split everywhere.
            order = torch.randperm(len(full), generator=torch.Generator().manual_seed(self.hparams.split_seed))
            images, labels = full.tensors
            self.val_set = GatherDataset(images[order[:val_size]], labels[order[:val_size]])
            self.train_set = GatherDataset(images[order[val_size:]], labels[order[val_size:]])
        if stage == "test" and self.test_set is None:
            self.test_set = self._load("test")

    @override
    def check_splits(self) -> None:
        """Refuse a validation split that leaves no training image, with the count in the training
        labels file's header (checked against its size): the training command calls it once before
        any process starts, after :meth:`prepare_data` checked the files (``setup`` checks it again
        in every process; evaluation has no validation split).

        Raises:
            ConfigValueError: naming ``data.val_size`` and the training split's size.
            DataNotAvailableError, DataFormatError: see :func:`~ddp_engine.vision.idx_format.check_idx_file`.
        """
        (train_count,) = check_idx_file(self._split_files("train")[1], 1, LABELS_KIND)
        self._check_split_sizes(train_count)

    def _check_split_sizes(self, train_count: int) -> None:
        check_val_size(self.hparams.val_size, train_count)
