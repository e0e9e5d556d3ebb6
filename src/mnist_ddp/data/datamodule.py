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

from collections.abc import Mapping, Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_convert

from mnist_ddp.data.idx import (
    LABELS_KIND,
    MNIST_FILES,
    NUM_CLASSES,
    check_idx_file,
    check_idx_split,
    ensure_idx_files,
    find_idx_file,
    import_class,
    read_idx_split,
)
from mnist_ddp.data.sharding import ResumableDataLoader, ResumableDistributedSampler
from mnist_ddp.distributed.layout import per_device_batch_size, per_device_eval_batch_size
from mnist_ddp.errors import ConfigValueError

#: Mean and standard deviation of the MNIST training pixels on a 0..1 scale (over all 60,000
#: training images; the figures used by PyTorch's examples/mnist).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


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


def normalize(images: Tensor, mean: float, std: float) -> Tensor:
    """``(N, 28, 28)`` uint8 pixels -> ``(N, 1, 28, 28)`` float32, ``(pixel / 255 - mean) / std``."""
    return (images.unsqueeze(1).float() / 255.0 - mean) / std


def unrepeated_loader(dataset: Dataset, world_size: int, global_rank: int, **options) -> DataLoader:
    """A DataLoader of this replica's shard of ``dataset`` for evaluation or prediction: every sample
    goes to exactly one of the ``world_size`` replicas, in order (replica ``r`` takes samples ``r``,
    ``r + world_size``, ...), and none is repeated; ``options`` are the DataLoader's others.

    torch's DistributedSampler pads the last shard with repeated samples, which would count them
    twice in val/test metrics (and predict them twice). Lightning's unpadded sampler, the one
    ``trainer.predict`` puts in by itself, lets shard sizes differ by one instead; this is safe
    because evaluation and prediction run no collective per batch, only at the end of the epoch.
    Each replica needs a sample: its assertion refuses a ``dataset`` smaller than ``world_size``.
    """
    sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world_size, rank=global_rank, shuffle=False)
    return DataLoader(dataset, sampler=sampler, **options)


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
            uint8, labels ``(N,)`` uint8. Each is read uncompressed or as shipped, ``<name>.gz``
            (the uncompressed one when both are there; see :func:`find_idx_file`).
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
            over the processes (see :func:`mnist_ddp.distributed.layout.per_device_batch_size`).
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
                "(mnist_ddp.data.idx.NUM_CLASSES). Name one class per label 0..9."
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
        """The images and labels files of ``split`` (``"train"`` or ``"test"``), each ``<name>`` or
        ``<name>.gz``."""
        files = self.hparams.files
        return tuple(find_idx_file(self.raw_dir, files[f"{split}_{kind}"]) for kind in ("images", "labels"))

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
            self._check_val_size(len(full))
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

    def check_val_size(self) -> None:
        """Refuse a validation split that leaves no training image, with the count in the training
        labels file's header (checked against its size): the training command calls it once before
        any process starts, after :meth:`prepare_data` checked the files (``setup`` checks it again
        in every process; evaluation has no validation split).

        Raises:
            ConfigValueError: naming ``data.val_size`` and the training split's size.
            DataNotAvailableError, DataFormatError: see :func:`~mnist_ddp.data.idx.check_idx_file`.
        """
        (train_count,) = check_idx_file(self._split_files("train")[1], 1, LABELS_KIND)
        self._check_val_size(train_count)

    def _check_val_size(self, train_count: int) -> None:
        if not 0 < self.hparams.val_size < train_count:
            raise ConfigValueError(
                f"data.val_size={self.hparams.val_size} must be between 1 and {train_count - 1} "
                f"(the training split has {train_count} images)."
            )

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
        # batch, on any world size with this global batch (mnist_ddp.data.sharding).
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
        batch_size = per_device_eval_batch_size(self.hparams.global_batch_size, self.trainer.world_size)
        return unrepeated_loader(
            dataset, self.trainer.world_size, self.trainer.global_rank, **self._loader_options(batch_size)
        )

    def test_pixels(self) -> Tensor:
        """The test split's images as stored, ``(N, 28, 28)`` uint8, not normalized (for a check of a
        model that takes raw pixels: ``python -m mnist_ddp.export``).

        Raises:
            DataNotAvailableError, DataFormatError: see :func:`~mnist_ddp.data.idx.read_idx_split`.
        """
        images, _ = read_idx_split(*self._split_files("test"), len(self.class_names))
        return images

    def _loader_options(self, batch_size: int | None = None) -> dict:
        return {
            "batch_size": batch_size or self.per_device_batch_size,
            # The dataset returns whole batches (GatherDataset.__getitems__): nothing to stack.
            "collate_fn": default_convert,
            "num_workers": self.hparams.num_workers,
            "persistent_workers": self.hparams.num_workers > 0,
            # A loader draws its workers' base seed each time it starts an epoch, from torch's global
            # generator unless it has its own. The global one also draws the dropout masks, and a
            # resume inside an epoch starts the loader once more than the uninterrupted run did
            # (after the checkpoint restored the generator): the masks would shift from there on.
            "generator": torch.Generator().manual_seed(self.hparams.shuffle_seed),
        }
