"""DataModules of one's own on the engine's base (:class:`~ddp_engine.data.sharded.ShardedDataModule`),
for the tests of the conformance check and of a DataModule's keys: one that keeps the engine's
guarantees and faulty ones that each break one. Their samples are float sensor windows with a float
target, served one sample at a time (not the engine's whole-batch ``GatherDataset``), which the
test task's regression (``model=regressor``) takes. The check's worker processes and the commands
import them by name (``_target_: custom_datamodules.<class>``): engine/tests is on their ``sys.path``
as it is on pytest's."""

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from typing_extensions import override

from ddp_engine.api import ShardedDataModule, collate_for

#: Repeated at the end of the train split: equal samples, which the check must count as two.
DUPLICATES = 5
#: Channels and length of one window.
CHANNELS, LENGTH = 3, 16


class WindowDataset(Dataset):
    """A per-sample dataset over in-memory tensors: ``dataset[i]`` is ``((C, L) float32, (1,) float32)``,
    stacked by torch's ``default_collate``."""

    def __init__(self, windows: Tensor, targets: Tensor) -> None:
        self.windows, self.targets = windows, targets

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.windows[index], self.targets[index]


class TensorDataModule(ShardedDataModule):
    """Random float32 windows ``(3, 16)`` and targets ``(1,)`` made in memory from ``seed``:
    ``train_size`` training samples (the last :data:`DUPLICATES` repeat the first ones), ``val_size``
    and ``test_size`` others. Odd split sizes leave remainders on 2 and 3 processes. The base class's
    arguments come through ``**kwargs`` (``global_batch_size`` 12 unless given)."""

    def __init__(self, train_size: int = 245, val_size: int = 61, test_size: int = 47, seed: int = 0, **kwargs) -> None:
        # The base class's arguments (global_batch_size, num_workers, ...) through **kwargs, as a
        # DataModule of one's own takes them: its YAML starts from the engine's data/sharded.yaml.
        super().__init__(**{"global_batch_size": 12, **kwargs})
        self.sizes, self.seed = (train_size, val_size, test_size), seed

    def describe(self) -> dict[str, int]:
        """The shape of a sample and of its target: what the network is built for."""
        return {"channels": CHANNELS, "length": LENGTH, "outputs": 1}

    @override
    def model_arguments(self) -> dict[str, Any]:
        return {"net": self.describe()}

    @override
    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        count = sum(self.sizes) - DUPLICATES
        windows = torch.randn(count, CHANNELS, LENGTH, generator=generator)
        targets = torch.randn(count, 1, generator=generator)
        train, val, test = self.sizes
        unique = train - DUPLICATES
        train_windows = torch.cat([windows[:unique], windows[:DUPLICATES]])
        train_targets = torch.cat([targets[:unique], targets[:DUPLICATES]])
        self.train_set = WindowDataset(train_windows, train_targets)
        self.val_set = WindowDataset(windows[unique : unique + val], targets[unique : unique + val])
        self.test_set = WindowDataset(windows[unique + val :], targets[unique + val :])


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
    def describe(self) -> dict[str, int]:
        open("/nonexistent/images.npz", "rb")  # raises FileNotFoundError
        raise AssertionError("unreachable")
