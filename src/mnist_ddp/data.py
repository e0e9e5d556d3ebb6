"""An IDX image data set (MNIST by default) as a LightningDataModule with explicit, exact sharding
across DDP processes.

- ``prepare_data`` (local rank 0 of each node) makes sure the four IDX files are on disk.
- ``setup`` loads them once into tensors: images ``(N, 1, 28, 28)`` float32, normalized;
  labels ``(N,)`` int64.
- Training: a ``DistributedSampler`` gives each process a disjoint shard of the train split,
  reshuffled every epoch (Lightning calls ``set_epoch``) and reproducible for a seed.
- Validation and test: an unpadded sampler gives each sample to exactly one process, so
  metrics synced over all processes do not depend on the number of processes.
- Every batch is one index gather from those tensors (:class:`GatherDataset`): no
  per-sample ``__getitem__`` and no per-sample collate.

Any data set in MNIST's file format (four IDX files: ``(N, 28, 28)`` uint8 images and ``(N,)`` uint8
labels in ``0..9`` per split) works by configuration alone: folder, file names, class names and
normalization statistics are arguments (``conf/data/*.yaml``).
"""

import importlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset, default_convert
from torchvision.datasets.mnist import read_image_file, read_label_file

from mnist_ddp.distributed import per_device_batch_size
from mnist_ddp.errors import ConfigValueError, DataFormatError, DataNotAvailableError
from mnist_ddp.model import NUM_CLASSES
from mnist_ddp.sharding import ResumableDataLoader, ResumableDistributedSampler

#: The four files of the original data set (http://yann.lecun.com/exdb/mnist/), uncompressed,
#: as torchvision expects them in ``<data_dir>/MNIST/raw/``, by the role each plays.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

#: Mean and standard deviation of the MNIST training pixels on a 0..1 scale (over all 60,000
#: training images; the figures used by PyTorch's examples/mnist).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

#: The image size every network of this template takes (``mnist_ddp.model``).
IMAGE_SIZE = (28, 28)


def import_class(path: str) -> type:
    """``"torchvision.datasets.MNIST"`` -> the class. (Hydra's ``get_class`` would do, but it logs
    an error of its own before raising.)

    Raises:
        ImportError, AttributeError, ValueError: for a path that names no class.
    """
    module, _, name = path.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise ValueError(f"{path} is not a class")
    return found


def ensure_idx_files(raw_dir: Path, files: Sequence[str], download: str | None = "torchvision.datasets.MNIST") -> Path:
    """Make sure ``raw_dir`` holds every file of ``files``, downloading them if needed.

    Args:
        raw_dir: the folder that holds, or will receive, the files.
        files: their names.
        download: import path of a torchvision data set class of the MNIST family
            (``torchvision.datasets.MNIST``, ``FashionMNIST``, ``KMNIST``) that fetches the files
            (and checks each archive's MD5), or None for a data set that cannot be downloaded.
            It downloads into a temporary folder beside ``raw_dir``; the files are moved into
            place only once all of them are complete, so an interrupted or failed download never
            leaves a partial file behind (nor the folders it created).

    Returns:
        ``raw_dir``.

    Raises:
        DataNotAvailableError: if the folder cannot be read, or files are missing and cannot be
            downloaded (no network, the folder is not writable, or ``download`` is None). The
            message names the folder and the files.
    """
    raw = Path(raw_dir)
    try:
        missing = [name for name in files if not (raw / name).is_file()]
    except PermissionError as err:
        raise DataNotAvailableError(
            f"{raw} cannot be read: permission denied. Make it readable for this user "
            "(chmod a+rx on the folders, a+r on the files), or point data.data_dir at a readable copy."
        ) from err
    if not missing:
        return raw
    if download is None:
        raise DataNotAvailableError(
            f"{', '.join(missing)} not found in {raw}, and this data set has no download (data.download=null). "
            f"Put the files {', '.join(files)} into {raw}, "
            "or point data.data_dir (and data.subdir) at a folder that has them."
        )
    dataset_class = import_class(download)
    # The outermost folder this call creates: removed again if the download fails.
    created = next((folder for folder in reversed([raw, *raw.parents]) if not folder.exists()), None)
    try:
        raw.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=raw.parent) as tmp:
            dataset_class(tmp, train=True, download=True)
            fetched = Path(tmp) / dataset_class.__name__ / "raw"  # torchvision's layout: <root>/<class>/raw
            raw.mkdir(exist_ok=True)
            for name in files:
                os.replace(fetched / name, raw / name)
    # Whatever the download raised: URLError (no network), http.client.IncompleteRead (a transfer cut
    # off), RuntimeError (an archive whose MD5 does not match), OSError (a folder not writable).
    except Exception as err:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise DataNotAvailableError(
            f"{dataset_class.__name__} is missing from {raw} ({', '.join(missing)} not found) and could not be "
            f"downloaded: {(str(err).strip() or type(err).__name__).splitlines()[-1]}\n"
            f"Put the uncompressed IDX files {', '.join(files)} into {raw}, "
            f"or point data.data_dir (and data.subdir) at a folder that has them, "
            f"or run once on a machine with internet access."
        ) from err
    return raw


def ensure_mnist_files(data_dir: Path) -> Path:
    """:func:`ensure_idx_files` for MNIST itself: the four files in ``data_dir/MNIST/raw/``."""
    return ensure_idx_files(Path(data_dir) / "MNIST" / "raw", list(MNIST_FILES.values()))


class GatherDataset(TensorDataset):
    """A ``TensorDataset`` that serves a whole batch as one gather: ``(images[indices], labels[indices])``.

    torch's DataLoader hands a batch's indices (from its sampler, here the ``DistributedSampler``)
    to ``__getitems__`` when a dataset has it; with ``collate_fn=default_convert`` the result
    is the batch as is. Without it, the DataLoader calls ``dataset[i]`` once per sample and
    stacks the samples in ``default_collate``: Python work per sample, which on 2 CPU cores
    costs more than the gather itself (``python -m benchmarks.run`` measures both). Lightning's
    own loader rewrites (``trainer.overfit_batches``) keep the dataset, batch size and
    collate function, so they keep this path. A DataLoader over it needs
    ``collate_fn=default_convert``: ``default_collate`` would try to stack the images with the labels.
    """

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, ...]:
        """``indices``: the batch's ``B`` sample indices -> each tensor's rows at them, ``(B, ...)``."""
        index = torch.as_tensor(indices, dtype=torch.int64)
        return tuple(tensor[index] for tensor in self.tensors)


IMAGES_KIND, LABELS_KIND = "uint8 images (N, 28, 28)", "uint8 labels (N,)"


def check_idx_split(images_file: Path, labels_file: Path, num_classes: int) -> Tensor:
    """Check one split's two IDX files without reading the images: their headers and sizes, the
    image size, the sample counts, and the labels (small: one byte per sample).

    Returns:
        The labels, ``(N,)`` int64 in ``0..num_classes - 1``.

    Raises:
        DataNotAvailableError: when a file cannot be read (see :func:`check_idx_file`).
        DataFormatError: naming the file, when a file is not an IDX file of the expected kind
            (images: 3 dimensions, uint8; labels: 1 dimension, uint8) or is truncated (see
            :func:`check_idx_file`), the images are not 28x28, the two files hold different
            numbers of samples, or a label is outside the classes.
    """
    count, *size = check_idx_file(images_file, 3, IMAGES_KIND)
    if tuple(size) != IMAGE_SIZE:
        raise DataFormatError(
            f"{images_file} holds {size[0]}x{size[1]} images; this template's networks take "
            f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} (resize the data set, or change the networks in mnist_ddp/model.py)."
        )
    labels = _read_idx(read_label_file, labels_file, 1, LABELS_KIND)
    if count != len(labels):
        raise DataFormatError(f"{images_file} holds {count} images but {labels_file} {len(labels)} labels.")
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise DataFormatError(
            f"{labels_file} has labels {int(labels.min())}..{int(labels.max())}; data.class_names names "
            f"{num_classes} classes (labels 0..{num_classes - 1})."
        )
    return labels


def read_idx_split(images_file: Path, labels_file: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """Read one split's images and labels from their IDX files, with torchvision's IDX reader,
    after :func:`check_idx_split` (whose errors it raises).

    Returns:
        images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 in ``0..num_classes - 1``.
    """
    labels = check_idx_split(images_file, labels_file, num_classes)
    return _read_idx(read_image_file, images_file, 3, IMAGES_KIND), labels


def check_idx_file(path: Path, ndim: int, kind: str) -> tuple[int, ...]:
    """Check an IDX file's header against the file's size, before anything reads its data.

    The IDX format (http://yann.lecun.com/exdb/mnist/, "the IDX file format"): two zero bytes, a
    type byte (0x08: uint8), the number of dimensions, one big-endian uint32 size per dimension,
    then the values. torchvision's reader checks the header with ``assert`` and a truncated file
    only fails in its final reshape, so these checks come first and say what is wrong.

    Args:
        path: the file.
        ndim: the dimensions it must have (3: images ``(N, 28, 28)``, 1: labels ``(N,)``).
        kind: what it holds, for the messages (``"uint8 images (N, 28, 28)"``).

    Returns:
        The shape its header announces.

    Raises:
        DataNotAvailableError: when the file cannot be read (permissions).
        DataFormatError: for another magic number (another type, another number of dimensions, a
            gzip archive), a file shorter than its header announces (truncated) or longer (not one
            IDX file).
    """
    expected_magic = bytes([0, 0, 0x08, ndim])
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            header = file.read(4 + 4 * ndim)
    except PermissionError as err:
        raise DataNotAvailableError(
            f"{path} cannot be read: permission denied. Make it readable for this user (chmod a+r), "
            "or point data.data_dir at a readable copy."
        ) from err
    if header[:2] == b"\x1f\x8b":
        name = path.name
        raise DataFormatError(
            f"{path} is gzip-compressed: decompress it in place (mv {name} {name}.gz && gunzip {name}.gz)."
        )
    if len(header) < 4 or header[:4] != expected_magic:
        raise DataFormatError(
            f"{path} is not an IDX file of {kind}: it starts with 0x{header[:4].hex()} instead of the magic "
            f"number 0x{expected_magic.hex()} (uint8, {ndim} dimension{'s' * (ndim > 1)})."
        )
    if len(header) < 4 + 4 * ndim:
        raise DataFormatError(f"{path} is truncated: {size} bytes, less than its own header.")
    shape = tuple(int.from_bytes(header[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    announced = 4 + 4 * ndim + math.prod(shape)
    if size != announced:
        what = f"{' x '.join(map(str, shape))} values ({announced:,} bytes with the header)"
        if size < announced:
            raise DataFormatError(
                f"{path} is truncated: its header announces {what}, the file has {size:,} bytes. "
                "Copy or download it again (with data.download set, delete it and the next run downloads it)."
            )
        raise DataFormatError(f"{path} has {size - announced:,} bytes more than the {what} its header announces.")
    return shape


def _read_idx(reader: Callable[[str], Tensor], path: Path, ndim: int, kind: str) -> Tensor:
    check_idx_file(path, ndim, kind)
    try:
        return reader(str(path))
    # What the header check cannot see: torchvision's reader checks the header with assert and
    # the dtype and dimensions with TypeError / ValueError.
    except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as err:
        raise DataFormatError(f"{path} is not an IDX file of {kind}: {err or type(err).__name__}") from err


def normalize(images: Tensor, mean: float, std: float) -> Tensor:
    """``(N, 28, 28)`` uint8 pixels -> ``(N, 1, 28, 28)`` float32, ``(pixel / 255 - mean) / std``."""
    return (images.unsqueeze(1).float() / 255.0 - mean) / std


class MNISTDataModule(L.LightningDataModule):
    """MNIST, or any data set in MNIST's file format, held in memory, sharded explicitly across the
    DDP process group.

    Args:
        data_dir: the data root; the files are in (or are downloaded into) ``data_dir/subdir``.
        global_batch_size: samples per optimizer step summed over all processes; each process
            loads ``global_batch_size / (world_size * accumulate_grad_batches)`` per step.
        val_size: images taken from the training images for validation (default 5,000).
        split_seed: seed of the train/val split; fixed by default so that validation metrics
            compare across training seeds.
        shuffle_seed: seed of the training sampler's per-epoch permutation.
        num_workers: DataLoader worker processes per DDP process; 0 (default) since the data is
            already in memory.
        prepare_data_per_node: True (default): ``prepare_data`` (the download, if the files are
            missing) runs on local rank 0 of every node, for a ``data_dir`` on node-local disks.
            False: on global rank 0 only, for a ``data_dir`` on a filesystem all nodes share.
        on_device: False (default): the tensors stay in host memory and Lightning copies each
            batch to the device. True: :meth:`setup` moves the whole data set to the process's
            device once (about 220 MiB of float32 for MNIST), and each batch is an index gather
            there, with no host-to-device copy per step. For GPUs; on CPU it changes nothing.
        subdir: the folder under ``data_dir`` with the files (default ``MNIST/raw``, torchvision's
            layout ``<class name>/raw``; ``.`` for ``data_dir`` itself).
        files: the four IDX file names by role, keys ``train_images``, ``train_labels``,
            ``test_images``, ``test_labels`` (default :data:`MNIST_FILES`). Images ``(N, 28, 28)``
            uint8, labels ``(N,)`` uint8.
        download: import path of the torchvision class that downloads missing files (default
            ``torchvision.datasets.MNIST``; ``FashionMNIST`` or ``KMNIST`` for those), or None
            for a data set that cannot be downloaded.
        class_names: one name per class, label ``i`` is ``class_names[i]`` (default the digits
            ``"0"``..``"9"``); used in TensorBoard's figures. The networks output 10 classes.
        mean: mean of the training pixels on a 0..1 scale (default :data:`MNIST_MEAN`).
        std: their standard deviation (default :data:`MNIST_STD`). Each image is served as
            ``(pixel / 255 - mean) / std``.

    Raises:
        ConfigValueError: from the constructor when ``files`` lacks a role, ``class_names`` does
            not name 10 classes, ``download`` is not an importable class, or ``std`` is not
            positive; from :meth:`setup` when ``val_size`` leaves no training images, or when
            ``on_device`` is combined with ``num_workers`` > 0 (worker processes cannot serve
            tensors that live on a GPU).
        DataNotAvailableError: from :meth:`prepare_data`, see :func:`ensure_idx_files`.
        DataFormatError: from :meth:`prepare_data` and :meth:`setup`, see :func:`check_idx_split`.
        BatchSizeError: from the dataloaders, for a global batch that does not split evenly
            over the processes (see :func:`mnist_ddp.distributed.per_device_batch_size`).
    """

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
        subdir: str = "MNIST/raw",
        files: Mapping[str, str] = MNIST_FILES,
        download: str | None = "torchvision.datasets.MNIST",
        class_names: Sequence[str] = tuple(str(digit) for digit in range(10)),
        mean: float = MNIST_MEAN,
        std: float = MNIST_STD,
    ) -> None:
        super().__init__()
        if sorted(files) != sorted(MNIST_FILES):
            raise ConfigValueError(f"data.files must name exactly {', '.join(MNIST_FILES)}; got {', '.join(files)}.")
        if len(class_names) != NUM_CLASSES:
            raise ConfigValueError(
                f"data.class_names has {len(class_names)} names; the networks output {NUM_CLASSES} classes "
                "(mnist_ddp.model.NUM_CLASSES). Name one class per label 0..9."
            )
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
        files, class_names = dict(files), list(class_names)
        # Hyperparameters are logged once for the whole composed config by the entry point.
        self.save_hyperparameters(logger=False)
        self.prepare_data_per_node = prepare_data_per_node  # read by Lightning
        self.raw_dir = Path(data_dir) / subdir
        self.class_names = class_names
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        # Where a resumed epoch continues (load_state_dict), until the training loader is built.
        self._train_position: dict | None = None

    def _split_files(self, split: str) -> tuple[Path, Path]:
        """The images and labels files of ``split`` (``"train"`` or ``"test"``)."""
        files = self.hparams.files
        return self.raw_dir / files[f"{split}_images"], self.raw_dir / files[f"{split}_labels"]

    def _load(self, split: str) -> GatherDataset:
        images, labels = read_idx_split(*self._split_files(split), len(self.class_names))
        return GatherDataset(normalize(images, self.hparams.mean, self.hparams.std), labels)

    def prepare_data(self) -> None:
        ensure_idx_files(self.raw_dir, list(self.hparams.files.values()), self.hparams.download)
        # Before any DDP process launches (the entry points call this first): a corrupt or
        # mismatched file is refused here, not in every process's setup.
        for split in ("train", "test"):
            check_idx_split(*self._split_files(split), len(self.class_names))

    def setup(self, stage: str) -> None:
        if self.hparams.on_device and self.hparams.num_workers > 0:
            raise ConfigValueError(
                f"data.on_device=true keeps the data on the GPU, which DataLoader workers cannot serve from: "
                f"set data.num_workers=0 (not {self.hparams.num_workers}) or data.on_device=false."
            )
        if stage in ("fit", "validate") and self.train_set is None:
            full = self._load("train")
            val_size = self.hparams.val_size
            if not 0 < val_size < len(full):
                raise ConfigValueError(f"data.val_size={val_size} must be between 1 and {len(full) - 1}.")
            # Same generator seed on every rank and every stage -> the same split everywhere.
            order = torch.randperm(len(full), generator=torch.Generator().manual_seed(self.hparams.split_seed))
            images, labels = full.tensors
            self.val_set = GatherDataset(images[order[:val_size]], labels[order[:val_size]])
            self.train_set = GatherDataset(images[order[val_size:]], labels[order[val_size:]])
        if stage == "test" and self.test_set is None:
            self.test_set = self._load("test")
        if self.hparams.on_device:
            device = self.trainer.strategy.root_device
            for name in ("train_set", "val_set", "test_set"):
                if (split := getattr(self, name)) is not None:
                    setattr(self, name, GatherDataset(*(t.to(device) for t in split.tensors)))

    @property
    def per_device_batch_size(self) -> int:
        """Micro-batch size of one process under the attached Trainer."""
        return per_device_batch_size(
            self.hparams.global_batch_size, self.trainer.world_size, self.trainer.accumulate_grad_batches
        )

    def train_dataloader(self) -> DataLoader:
        # drop_last on the sampler: every rank gets the same number of samples, so no rank waits
        # in an AllReduce for a batch another rank never runs; at most world_size - 1 samples of
        # the train split are left out of each epoch (a different few each epoch). The loader's
        # position in the epoch goes into checkpoints, so a resume continues at the next global
        # batch, on any world size with this global batch (mnist_ddp.sharding).
        sampler = ResumableDistributedSampler(
            self.train_set,
            num_replicas=self.trainer.world_size,
            rank=self.trainer.global_rank,
            seed=self.hparams.shuffle_seed,
        )
        loader = ResumableDataLoader(
            self.train_set,
            sampler=sampler,
            # Lightning's count of this epoch's batches, read when a checkpoint is saved.
            trained_batches=lambda: self.trainer.fit_loop.epoch_loop.batch_progress.current.processed,
            global_batch_size=self.hparams.global_batch_size,
            **self._loader_options(),
        )
        if self._train_position:
            loader.load_state_dict(self._train_position)
            self._train_position = None
        return loader

    def state_dict(self) -> dict:
        # The training position, restored by load_state_dict before the loader exists. Lightning
        # also saves the loader's state itself, but restores it only when the loader is built after
        # the checkpoint's loops are loaded; a one-cycle schedule's length (configure_optimizers,
        # Trainer.estimated_stepping_batches) builds it earlier, and Lightning's copy is never used.
        loader = self.trainer.train_dataloader if self.trainer is not None else None
        return {"train_position": loader.state_dict()} if isinstance(loader, ResumableDataLoader) else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._train_position = state_dict.get("train_position")

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        # torch's DistributedSampler pads the last shard with repeated samples, which would count
        # them twice in val/test metrics. Lightning's unpadded sampler lets shard sizes differ
        # by one instead; this is safe because evaluation runs no collective per batch, only the
        # metric sync at the end of the epoch.
        sampler = UnrepeatedDistributedSampler(
            dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False
        )
        return self._loader(dataset, sampler)

    def _loader(self, dataset: Dataset, sampler: DistributedSampler) -> DataLoader:
        return DataLoader(dataset, sampler=sampler, **self._loader_options())

    def _loader_options(self) -> dict:
        return {
            "batch_size": self.per_device_batch_size,
            # The dataset returns whole batches (GatherDataset.__getitems__): nothing to stack.
            "collate_fn": default_convert,
            "num_workers": self.hparams.num_workers,
            "persistent_workers": self.hparams.num_workers > 0,
        }
