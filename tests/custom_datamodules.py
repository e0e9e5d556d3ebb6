"""DataModules of one's own, for the conformance check's tests (tests/data/test_conformance.py):
one that keeps the template's guarantees and faulty ones that each break one. The check's worker
processes import them by name (``_target_: custom_datamodules.<class>``); tests/ is on their
``sys.path`` as it is on pytest's."""

import torch
from ddp_engine.data.sharded import collate_for
from ddp_engine.vision.classification import ClassificationDataModule
from ddp_engine.vision.spec import DataSpec
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from typing_extensions import override

#: Repeated at the end of the train split: equal samples, which the check must count as two.
DUPLICATES = 5


class PixelDataset(Dataset):
    """A per-sample dataset over in-memory tensors: ``dataset[i]`` is ``((C, H, W) uint8, int label)``,
    stacked by torch's ``default_collate`` (not the template's whole-batch ``GatherDataset``)."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])


class TensorDataModule(ClassificationDataModule):
    """Random 3-class 1x8x8 uint8 images made in memory from ``seed``: ``train_size`` training
    samples (the last :data:`DUPLICATES` repeat the first ones), ``val_size`` and ``test_size``
    others. Odd split sizes leave remainders on 2 and 3 processes. The base class's arguments come
    through ``**kwargs`` (``global_batch_size`` 12 unless given)."""

    def __init__(self, train_size: int = 245, val_size: int = 61, test_size: int = 47, seed: int = 0, **kwargs) -> None:
        # The base class's arguments (global_batch_size, num_workers, ...) through **kwargs, as
        # docs/customizing.md writes a DataModule of one's own: its YAML starts from data/image.yaml.
        super().__init__(**{"global_batch_size": 12, **kwargs})
        self.sizes, self.seed = (train_size, val_size, test_size), seed

    @override
    def describe(self) -> DataSpec:
        return DataSpec(("a", "b", "c"), (1, 8, 8), (0.5,), (0.29,))

    @override
    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        count = sum(self.sizes) - DUPLICATES
        images = torch.randint(0, 256, (count, 1, 8, 8), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, 3, (count,), generator=generator)
        train, val, test = self.sizes
        unique = train - DUPLICATES
        train_images = torch.cat([images[:unique], images[:DUPLICATES]])
        train_labels = torch.cat([labels[:unique], labels[:DUPLICATES]])
        self.train_set = PixelDataset(train_images, train_labels)
        self.val_set = PixelDataset(images[unique : unique + val], labels[unique : unique + val])
        self.test_set = PixelDataset(images[unique + val :], labels[unique + val :])


class WholeSetOnEveryRank(TensorDataModule):
    """Faulty: a plain shuffled DataLoader for training, so every rank trains the whole train split."""

    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.per_device_batch_size, shuffle=True)


class PaddedValidation(TensorDataModule):
    """Faulty: validation through torch's DistributedSampler, which pads the last shard with repeated
    samples (61 samples on 2 ranks: one is evaluated twice)."""

    @override
    def val_dataloader(self) -> DataLoader:
        sampler = DistributedSampler(
            self.val_set, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False
        )
        return DataLoader(self.val_set, batch_size=6, sampler=sampler, collate_fn=collate_for(self.val_set))


class FailsOnRankOne(TensorDataModule):
    """Faulty: ``setup`` raises in global rank 1 only, while rank 0 goes on into the fit's collectives."""

    @override
    def setup(self, stage: str) -> None:
        if self.trainer is not None and self.trainer.global_rank == 1:
            raise ValueError("no data for rank 1")
        super().setup(stage)


class NotResumable(TensorDataModule):
    """Faulty: its own torch ``DistributedSampler`` for training, which shards and reshuffles rightly but
    has no position in the epoch to save, so a resumed epoch starts over from its first batch."""

    @override
    def train_dataloader(self) -> DataLoader:
        sampler = DistributedSampler(
            self.train_set, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, drop_last=True
        )
        return DataLoader(self.train_set, batch_size=self.per_device_batch_size, sampler=sampler)


class PermutesByWorldSize(TensorDataModule):
    """Faulty on another world size only: each world size shuffles with a seed of its own, so every
    check on one world size passes, but a checkpoint's position means other samples on another."""

    @override
    def train_dataloader(self) -> DataLoader:
        self.shuffle_seed = self.trainer.world_size
        return super().train_dataloader()


class ShufflesAnewEachFit(TensorDataModule):
    """Faulty: every fit shuffles with another seed (the same on every rank of it), so a resumed fit
    cannot continue the interrupted one's order."""

    fits = 0

    @override
    def train_dataloader(self) -> DataLoader:
        ShufflesAnewEachFit.fits += 1  # once per fit in each process
        self.shuffle_seed = ShufflesAnewEachFit.fits
        return super().train_dataloader()


class MissingFile(TensorDataModule):
    """Its ``describe()`` reads a file that is not there, and raises what the reading raises."""

    @override
    def describe(self) -> DataSpec:
        open("/nonexistent/images.npz", "rb")  # raises FileNotFoundError
        raise AssertionError("unreachable")
