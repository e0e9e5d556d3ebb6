"""The MNIST DataModule on synthetic IDX files: loading, the split, and sharding over simulated
ranks; its files checked and read through the engine's IDX functions (whose own tests, finding,
downloading, broken and gzipped files, are engine/tests/vision/test_idx_files.py).

Ranks are simulated by attaching a stand-in for the Trainer that reports ``world_size`` and
``global_rank`` (what a real DDP Trainer reports in each process); the real DDP runs are in
run/test_train_cli.py.
"""

import gzip
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ddp_engine.core.errors import ConfigValueError, DataFormatError
from helpers import copy_data
from torchvision.datasets import MNIST

from mnist_ddp.data import MNIST_MEAN, MNIST_STD, MNISTDataModule

VAL_SIZE = 150  # of 1,200 synthetic training images; divides by neither 7 nor 8


def datamodule_on_rank(data_dir: Path, world_size: int, rank: int, global_batch_size: int = 56, **kwargs):
    dm = MNISTDataModule(str(data_dir), global_batch_size=global_batch_size, val_size=VAL_SIZE, **kwargs)
    dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank, accumulate_grad_batches=1)
    dm.setup("fit")
    dm.setup("test")
    return dm


def sample_ids(loader) -> list[int]:
    """Identify each served sample by its raw bytes' hash (images are unique in the synthetic set)."""
    return [hash(image.numpy().tobytes()) for images, _ in loader for image in images]


def test_setup_loads_uint8_images_that_batches_normalize_and_int_labels(synthetic_data_dir):
    dm = datamodule_on_rank(synthetic_data_dir, 1, 0)
    raw = MNIST(synthetic_data_dir, train=True)
    images, labels = dm.train_set.tensors
    assert images.shape == (1200 - VAL_SIZE, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (1200 - VAL_SIZE,) and labels.dtype == torch.int64
    assert len(dm.val_set) == VAL_SIZE and len(dm.test_set) == 300
    # A batch is normalized on its device: pixel value 255 maps to (1 - mean) / std and 0 to -mean / std.
    batch, batch_labels = dm.on_after_batch_transfer((images, labels), 0)
    assert batch.dtype == torch.float32 and torch.equal(batch_labels, labels)
    assert batch.max().item() == pytest.approx((1 - MNIST_MEAN) / MNIST_STD)
    assert batch.min().item() == pytest.approx(-MNIST_MEAN / MNIST_STD)
    assert torch.equal(batch, (images.float() / 255 - MNIST_MEAN) / MNIST_STD), "(pixel / 255 - mean) / std"

    # Train and val together are exactly the training file, each image with its own label.
    def pairs(pixels, labels):
        return sorted((image.numpy().tobytes(), int(label)) for image, label in zip(pixels, labels))

    loaded = pairs(torch.cat([images, dm.val_set.tensors[0]]), torch.cat([labels, dm.val_set.tensors[1]]))
    assert loaded == sorted(
        (image.numpy().tobytes(), int(label)) for image, label in zip(raw.data.unsqueeze(1), raw.targets)
    )


def test_split_is_identical_on_every_rank_and_stage(synthetic_data_dir):
    reference = datamodule_on_rank(synthetic_data_dir, 1, 0)
    for world_size, rank in [(2, 1), (4, 3), (3, 0)]:
        dm = datamodule_on_rank(synthetic_data_dir, world_size, rank, shuffle_seed=world_size)
        assert torch.equal(dm.val_set.tensors[0], reference.val_set.tensors[0])
        assert torch.equal(dm.train_set.tensors[1], reference.train_set.tensors[1])
    other_split = datamodule_on_rank(synthetic_data_dir, 1, 0, split_seed=1)
    assert not torch.equal(other_split.val_set.tensors[0], reference.val_set.tensors[0])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_train_shards_are_disjoint_complete_and_reshuffled_each_epoch(synthetic_data_dir, world_size):
    global_batch = 8 * 7 * world_size
    ranks = [
        datamodule_on_rank(synthetic_data_dir, world_size, r, global_batch_size=global_batch) for r in range(world_size)
    ]
    n_train = 1200 - VAL_SIZE
    epochs = []
    for epoch in (0, 1):
        shards = []
        for dm in ranks:
            loader = dm.train_dataloader()
            loader.sampler.set_epoch(epoch)  # what Lightning's fit loop does at each epoch start
            assert loader.batch_size == global_batch // world_size
            shards.append(sample_ids(loader))
        sizes = {len(shard) for shard in shards}
        assert sizes == {n_train // world_size}, "every rank trains on the same number of samples"
        union = set().union(*shards)
        assert len(union) == sum(len(s) for s in shards), "shards overlap"
        assert len(union) == n_train - n_train % world_size, "only the drop_last remainder is left out"
        epochs.append(shards)
    assert epochs[0][0] != epochs[1][0], "the order must change between epochs"
    # Same seed -> same order, in a fresh DataModule (as after a restart).
    again = datamodule_on_rank(synthetic_data_dir, world_size, 0, global_batch_size=global_batch).train_dataloader()
    again.sampler.set_epoch(1)
    assert sample_ids(again) == epochs[1][0]


def test_another_shuffle_seed_gives_another_order(synthetic_data_dir):
    first = sample_ids(datamodule_on_rank(synthetic_data_dir, 2, 0, shuffle_seed=0).train_dataloader())
    second = sample_ids(datamodule_on_rank(synthetic_data_dir, 2, 0, shuffle_seed=1).train_dataloader())
    assert first != second


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_val_and_test_serve_each_sample_exactly_once(synthetic_data_dir, world_size):
    ranks = [
        datamodule_on_rank(synthetic_data_dir, world_size, r, global_batch_size=8 * world_size)
        for r in range(world_size)
    ]
    for split, size in (("val", VAL_SIZE), ("test", 300)):
        served = [sample_ids(getattr(dm, f"{split}_dataloader")()) for dm in ranks]
        flat = [sample for shard in served for sample in shard]
        assert len(flat) == size, f"{split}: {len(flat)} samples served for {size} (padding would repeat some)"
        assert len(set(flat)) == size


def test_non_divisible_global_batch_is_refused_by_the_loader(synthetic_data_dir):
    dm = datamodule_on_rank(synthetic_data_dir, 3, 0, global_batch_size=64)
    with pytest.raises(ValueError, match="multiple of 3"):
        dm.train_dataloader()


def test_each_batch_is_the_shards_samples_in_order(synthetic_data_dir):
    dm = datamodule_on_rank(synthetic_data_dir, 2, 1, global_batch_size=64)
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(3)
    shard = list(loader.sampler)
    images, labels = dm.train_set.tensors
    served = list(loader)
    assert len(served) == len(loader) == -(-len(shard) // 32)
    assert len(served[-1][0]) == (len(shard) % 32 or 32)
    for i, (batch_images, batch_labels) in enumerate(served):
        indices = shard[32 * i : 32 * (i + 1)]
        assert torch.equal(batch_images, images[indices]) and torch.equal(batch_labels, labels[indices])


def test_on_device_moves_every_split_to_the_strategys_device(synthetic_data_dir):
    dm = MNISTDataModule(str(synthetic_data_dir), global_batch_size=8, val_size=VAL_SIZE, on_device=True)
    # CPU is the only device here; the GPU case is the same .to(root_device) (not run: no GPU).
    dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1,
                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))  # fmt: skip
    dm.setup("fit")
    dm.setup("test")
    # Moved when its loader is first made (the strategy's device is known by then).
    loaders = (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader())
    assert [loader.dataset.tensors[0].device.type for loader in loaders] == ["cpu"] * 3
    assert {t.device.type for split in (dm.train_set, dm.val_set, dm.test_set) for t in split.tensors} == {"cpu"}
    assert len(dm.train_set) == 1200 - VAL_SIZE and len(dm.test_set) == 300


def test_on_device_with_dataloader_workers_is_refused_by_name(synthetic_data_dir):
    dm = MNISTDataModule(str(synthetic_data_dir), global_batch_size=8, val_size=VAL_SIZE, on_device=True, num_workers=2)
    dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1)
    dm.setup("fit")
    with pytest.raises(ConfigValueError, match=r"data.on_device=true .* set data.num_workers=0 \(not 2\)"):
        dm.train_dataloader()


def test_a_validation_split_as_large_as_the_training_split_is_refused_before_launch(synthetic_data_dir):
    # The training command checks it once before any process launches; setup, in every process, too.
    datamodule = MNISTDataModule(str(synthetic_data_dir), val_size=1200)
    datamodule.prepare_data()  # what eval runs too: it has no validation split
    with pytest.raises(ConfigValueError, match=r"data.val_size=1200 must be between 1 and 1199 \(the training split"):
        datamodule.check_splits()


def test_its_files_are_checked_before_launch_and_read_in_every_process(synthetic_data_dir, tmp_path):
    """The DataModule reaches the engine's IDX checks (engine/tests/vision/test_idx_files.py): a broken
    file is refused by ``prepare_data`` and by ``setup``, naming it; a gzipped one is read as is."""
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    raw.joinpath("t10k-images-idx3-ubyte").write_bytes(gzip.compress((raw / "t10k-images-idx3-ubyte").read_bytes()))
    truncated = raw / "train-images-idx3-ubyte"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    with pytest.raises(DataFormatError, match=f"^{re.escape(str(truncated))} is truncated: "):
        MNISTDataModule(str(tmp_path / "data"), val_size=VAL_SIZE).prepare_data()
    with pytest.raises(DataFormatError, match=f"^{re.escape(str(truncated))} is truncated: "):
        MNISTDataModule(str(tmp_path / "data"), val_size=VAL_SIZE).setup("fit")
    datamodule = MNISTDataModule(str(tmp_path / "data"), val_size=VAL_SIZE)
    datamodule.setup("test")
    expected = datamodule_on_rank(synthetic_data_dir, 1, 0).test_set.tensors
    assert all(torch.equal(a, b) for a, b in zip(datamodule.test_set.tensors, expected))
