"""The datasets a DataLoader worker unpickles, and their collate functions: torch only, so that the
forkserver the workers are forked from imports torch and nothing heavier
(:mod:`ddp_engine.data.loader_workers`).
"""

import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset, default_collate, default_convert


class GatherDataset(TensorDataset):
    """A ``TensorDataset`` that serves a whole batch as one gather: ``(images[indices], labels[indices])``.

    torch's DataLoader hands a batch's indices (from its sampler, here the ``DistributedSampler``)
    to ``__getitems__`` when a dataset has it; with ``collate_fn=default_convert`` the result
    is the batch as is (:class:`ClassificationDataModule` chooses it for this class). Without
    it, the DataLoader calls ``dataset[i]`` once per sample and stacks the samples in
    ``default_collate``: Python work per sample, which on 2 CPU cores costs more than the gather
    itself (``python -m benchmarks.run`` measures both). Lightning's own loader rewrites
    (``trainer.overfit_batches``) keep the dataset, batch size and collate function, so they
    keep this path.
    """

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, ...]:
        """``indices``: the batch's ``B`` sample indices -> each tensor's rows at them, ``(B, ...)``."""
        index = torch.as_tensor(indices, dtype=torch.int64, device=self.tensors[0].device)
        # index_select, not tensor[index]: the same rows, but advanced indexing splits a batch's
        # gather over torch's threads and waits for the slowest, milliseconds per batch on busy cores
        # instead of microseconds (python -m benchmarks.pipeline; the figures are in the CHANGELOG).
        return tuple(tensor.index_select(0, index) for tensor in self.tensors)

    def with_indices(self) -> "GatherDataset":
        """The same samples, each batch with a third tensor: the samples' indices ``(B,)`` int64."""
        images = self.tensors[0]
        return GatherDataset(*self.tensors, torch.arange(len(images), device=images.device))

    def to(self, device: torch.device | str) -> "GatherDataset":
        """A copy with every tensor on ``device``."""
        return GatherDataset(*(tensor.to(device) for tensor in self.tensors))


class WithIndices(Dataset):
    """A per-sample dataset whose samples carry their index: ``dataset[i] + (i,)``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple:
        return (*self.dataset[index], index)


def collate_for(dataset: Dataset):
    """The DataLoader's ``collate_fn`` for ``dataset``: none to do for a :class:`GatherDataset`
    (its batches come whole), torch's ``default_collate`` (stack the samples) for any other."""
    return default_convert if isinstance(dataset, GatherDataset) else default_collate
