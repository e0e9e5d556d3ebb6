"""The input pipeline alone: how many samples/s one process's train loader serves, with no model.

Three loaders over 55,000 training images (the train split's size), per-device batch 32 (the fast recipe's
global batch 64 over 2 processes), shuffled, one process, ``num_workers=0``:

- ``template``: the DataModule's own train loader (in-memory tensors, one gather per batch:
  ``GatherDataset``);
- ``tensor_dataset``: a ``TensorDataset`` of the same tensors with ``DataLoader(batch_size=32)``,
  as the hand-written reference loads it (per-sample ``__getitem__`` and ``default_collate``);
- ``pil``: torchvision's ``MNIST`` dataset with ``ToTensor`` and ``Normalize``: a PIL image per
  sample, the path of most MNIST examples.
"""

import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from torch.utils.data import DataLoader, Subset, TensorDataset
from torchvision import transforms
from torchvision.datasets import MNIST

from mnist_ddp.data.datamodule import MNIST_MEAN, MNIST_STD, MNISTDataModule

PER_DEVICE_BATCH = 32
PASSES = 5


def samples_per_second(loader: Iterable, samples: int) -> float:
    """Samples/s of iterating ``loader`` until ``samples`` samples are served (whole batches)."""
    served, start = 0, time.perf_counter()
    for images, _ in loader:
        served += len(images)
        if served >= samples:
            break
    return served / (time.perf_counter() - start)


def measure_input_pipelines(data_dir: Path, samples: int | None = None, passes: int = PASSES) -> dict[str, float]:
    """Median samples/s over ``passes`` passes of each loader (see the module docstring).

    Args:
        data_dir: folder with ``MNIST/raw/<four IDX files>``.
        samples: samples per pass (default: one epoch, 55,000, for the in-memory loaders; 10,000
            for the PIL path, which is far slower: its rate does not change over an epoch).
    """
    datamodule = MNISTDataModule(str(data_dir), global_batch_size=PER_DEVICE_BATCH)
    # One process: the DataModule reads world size and rank from its Trainer.
    datamodule.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1)
    datamodule.setup("fit")
    train_set = datamodule.train_set
    pil = MNIST(data_dir, train=True, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
    ))  # fmt: skip
    pil_train = Subset(pil, range(len(train_set)))  # as many images as the train split
    loaders = {
        "template": (datamodule.train_dataloader(), samples or len(train_set)),
        "tensor_dataset": (
            DataLoader(TensorDataset(*train_set.tensors), batch_size=PER_DEVICE_BATCH, shuffle=True),
            samples or len(train_set),
        ),
        "pil": (DataLoader(pil_train, batch_size=PER_DEVICE_BATCH, shuffle=True), min(samples or 10_000, 10_000)),
    }
    return {
        name: statistics.median(samples_per_second(loader, n) for _ in range(passes))
        for name, (loader, n) in loaders.items()
    }
