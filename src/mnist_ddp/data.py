"""MNIST as a LightningDataModule with explicit, exact sharding across DDP processes.

- ``prepare_data`` (local rank 0 of each node) makes sure the four IDX files are on disk.
- ``setup`` loads them once into tensors: images ``(N, 1, 28, 28)`` float32, normalized;
  labels ``(N,)`` int64.
- Training: a ``DistributedSampler`` gives each process a disjoint shard of the train split,
  reshuffled every epoch (Lightning calls ``set_epoch``) and reproducible for a seed.
- Validation and test: an unpadded sampler gives each sample to exactly one process, so
  metrics synced over all processes do not depend on the number of processes.
- Every batch is one index gather from those tensors (:class:`GatherDataset`): no
  per-sample ``__getitem__`` and no per-sample collate.
"""

import os
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset, default_convert
from torchvision.datasets import MNIST

from mnist_ddp.distributed import per_device_batch_size
from mnist_ddp.errors import ConfigValueError, DataNotAvailableError

#: The four files of the original data set (http://yann.lecun.com/exdb/mnist/), uncompressed,
#: as torchvision expects them in ``<data_dir>/MNIST/raw/``.
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

#: Mean and standard deviation of the MNIST training pixels on a 0..1 scale (over all 60,000
#: training images; the figures used by PyTorch's examples/mnist).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


def ensure_mnist_files(data_dir: Path) -> Path:
    """Make sure ``data_dir/MNIST/raw/`` holds :data:`MNIST_FILES`, downloading them if needed.

    The download goes through torchvision (which checks each archive's MD5) into a temporary
    folder beside the target; the files are moved into place only once all four are complete,
    so an interrupted or failed download never leaves a partial file behind.

    Returns:
        The ``MNIST/raw`` folder.

    Raises:
        DataNotAvailableError: if files are missing and the download fails (no network, or the
            folder is not writable). The message names the folder and the four files.
    """
    raw = Path(data_dir) / "MNIST" / "raw"
    missing = [name for name in MNIST_FILES if not (raw / name).is_file()]
    if not missing:
        return raw
    try:
        raw.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=raw.parent) as tmp:
            MNIST(tmp, train=True, download=True)
            raw.mkdir(exist_ok=True)
            for name in MNIST_FILES:
                os.replace(Path(tmp) / "MNIST" / "raw" / name, raw / name)
    except (OSError, RuntimeError) as err:
        raise DataNotAvailableError(
            f"MNIST is missing from {raw} ({', '.join(missing)} not found) and could not be downloaded: "
            f"{str(err).strip().splitlines()[-1]}\n"
            f"Put the four uncompressed IDX files {', '.join(MNIST_FILES)} into {raw}, "
            f"or point data.data_dir at a folder that has them in MNIST/raw/, "
            f"or run once on a machine with internet access."
        ) from err
    return raw


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


def load_mnist(data_dir: Path, train: bool) -> GatherDataset:
    """Read one MNIST split from its IDX files into memory.

    Returns:
        ``GatherDataset(images, labels)``: images ``(N, 1, 28, 28)`` float32, normalized with
        :data:`MNIST_MEAN` / :data:`MNIST_STD`; labels ``(N,)`` int64 in 0..9.
    """
    split = MNIST(data_dir, train=train, download=False)
    images = (split.data.unsqueeze(1).float() / 255.0 - MNIST_MEAN) / MNIST_STD
    return GatherDataset(images, split.targets.long())


class MNISTDataModule(L.LightningDataModule):
    """MNIST, held in memory, sharded explicitly across the DDP process group.

    Args:
        data_dir: folder holding (or receiving) ``MNIST/raw/<the four IDX files>``.
        global_batch_size: samples per optimizer step summed over all processes; each process
            loads ``global_batch_size / (world_size * accumulate_grad_batches)`` per step.
        val_size: images taken from the 60,000 training images for validation (default 5,000).
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

    Raises:
        ConfigValueError: from :meth:`setup` when ``val_size`` leaves no training images, or
            when ``on_device`` is combined with ``num_workers`` > 0 (worker processes cannot
            serve tensors that live on a GPU).
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
    ) -> None:
        super().__init__()
        # Hyperparameters are logged once for the whole composed config by the entry point.
        self.save_hyperparameters(logger=False)
        self.prepare_data_per_node = prepare_data_per_node  # read by Lightning
        self.data_dir = Path(data_dir)
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def prepare_data(self) -> None:
        ensure_mnist_files(self.data_dir)

    def setup(self, stage: str) -> None:
        if self.hparams.on_device and self.hparams.num_workers > 0:
            raise ConfigValueError(
                f"data.on_device=true keeps the data on the GPU, which DataLoader workers cannot serve from: "
                f"set data.num_workers=0 (not {self.hparams.num_workers}) or data.on_device=false."
            )
        if stage in ("fit", "validate") and self.train_set is None:
            full = load_mnist(self.data_dir, train=True)
            val_size = self.hparams.val_size
            if not 0 < val_size < len(full):
                raise ConfigValueError(f"data.val_size={val_size} must be between 1 and {len(full) - 1}.")
            # Same generator seed on every rank and every stage -> the same split everywhere.
            order = torch.randperm(len(full), generator=torch.Generator().manual_seed(self.hparams.split_seed))
            images, labels = full.tensors
            self.val_set = GatherDataset(images[order[:val_size]], labels[order[:val_size]])
            self.train_set = GatherDataset(images[order[val_size:]], labels[order[val_size:]])
        if stage == "test" and self.test_set is None:
            self.test_set = load_mnist(self.data_dir, train=False)
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
        # the train split are left out of each epoch (a different few each epoch).
        sampler = DistributedSampler(
            self.train_set,
            num_replicas=self.trainer.world_size,
            rank=self.trainer.global_rank,
            shuffle=True,
            seed=self.hparams.shuffle_seed,
            drop_last=True,
        )
        return self._loader(self.train_set, sampler)

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
        return DataLoader(
            dataset,
            batch_size=self.per_device_batch_size,
            sampler=sampler,
            # The dataset returns whole batches (GatherDataset.__getitems__): nothing to stack.
            collate_fn=default_convert,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )
