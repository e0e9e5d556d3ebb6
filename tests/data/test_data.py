"""The DataModule on synthetic IDX files: loading, the split, and sharding over simulated ranks;
and on the real MNIST files gzipped as they ship.

Ranks are simulated by attaching a stand-in for the Trainer that reports ``world_size`` and
``global_rank`` (what a real DDP Trainer reports in each process); the real DDP runs are in
run/test_train_cli.py.
"""

import contextlib
import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ddp_engine.core.errors import ConfigValueError, DataFormatError, DataNotAvailableError
from ddp_engine.vision.idx import MNIST_FILES
from helpers import assert_synthetic_files_in_place, copy_data, write_idx
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
    assert torch.equal(batch, (images.float() / 255 - MNIST_MEAN) / MNIST_STD), "the formula of earlier versions"

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


def test_prepare_data_with_files_present_does_not_download(synthetic_data_dir, monkeypatch):
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # would fail if a download were tried
    before = {p: p.stat().st_mtime_ns for p in (synthetic_data_dir / "MNIST" / "raw").iterdir()}
    MNISTDataModule(str(synthetic_data_dir), val_size=VAL_SIZE).prepare_data()
    assert {p: p.stat().st_mtime_ns for p in (synthetic_data_dir / "MNIST" / "raw").iterdir()} == before


def test_prepare_data_without_files_or_network_names_folder_and_files(tmp_path, monkeypatch):
    # No network: point torchvision's mirrors at a closed local port (connection refused at once),
    # so this test behaves the same on a machine that has internet access.
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])
    data_dir = tmp_path / "data"
    with pytest.raises(DataNotAvailableError) as error:
        MNISTDataModule(str(data_dir), val_size=VAL_SIZE).prepare_data()
    message = str(error.value)
    assert str(data_dir / "MNIST" / "raw") in message
    assert all(name in message for name in MNIST_FILES.values())
    assert "data.data_dir" in message
    assert not data_dir.exists(), f"left behind: {list(data_dir.rglob('*'))}"


def test_prepare_data_moves_a_complete_download_into_place(tmp_path, monkeypatch, mirror, synthetic_data_dir):
    monkeypatch.setattr(MNIST, "mirrors", [mirror[0]])
    data_dir = tmp_path / "data"
    MNISTDataModule(str(data_dir), val_size=VAL_SIZE).prepare_data()
    assert_synthetic_files_in_place(data_dir, synthetic_data_dir)
    raw = data_dir / "MNIST" / "raw"
    assert np.frombuffer((raw / "t10k-labels-idx1-ubyte").read_bytes()[8:], np.uint8).size == 300


def test_a_download_cut_off_half_way_leaves_no_file_and_the_next_one_completes(
    tmp_path, monkeypatch, mirror, synthetic_data_dir
):
    url, handler = mirror
    monkeypatch.setattr(MNIST, "mirrors", [url])
    handler.cut_off = "train-images-idx3-ubyte.gz"  # the first and largest file
    data_dir = tmp_path / "data"
    # torchvision keeps the bytes that came, and its MD5 check of the archive refuses them.
    # torchvision's own reason follows ("File not found or corrupted."): not its words.
    with pytest.raises(DataNotAvailableError, match="could not be downloaded: "):
        MNISTDataModule(str(data_dir), val_size=VAL_SIZE).prepare_data()
    assert not data_dir.exists(), "no partial file may be taken for a good one later, no empty folder left"
    handler.cut_off = None  # the network is back
    MNISTDataModule(str(data_dir), val_size=VAL_SIZE).prepare_data()
    assert_synthetic_files_in_place(data_dir, synthetic_data_dir)


# --- broken data files: one error naming the file and what to do ---------------------------------

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def replace_magic(path: Path) -> None:
    path.write_bytes(bytes([0, 0, 0x09, 0x01]) + path.read_bytes()[4:])  # int8 instead of uint8


def gzip_in_place(path: Path) -> None:
    path.write_bytes(gzip.compress(path.read_bytes()))


def append_bytes(path: Path) -> None:
    path.write_bytes(path.read_bytes() + bytes(10))


def other_labels(path: Path) -> None:
    write_idx(path, np.zeros(299))  # another split's labels: 299 instead of 300


CASES = {
    "truncated": (TRAIN_IMAGES, truncate,
                  "is truncated: its header announces 1200 x 28 x 28 values (940,816 bytes with the header), "
                  "the file has 470,408 bytes. Copy or download it again"),
    "wrong magic number": (TRAIN_LABELS, replace_magic,
                           "is not an IDX file of uint8 labels (N,): it starts with 0x00000901 instead of the "
                           "magic number 0x00000801 (uint8, 1 dimension)."),
    "bytes after the data": (TEST_IMAGES, append_bytes, "has 10 bytes more than the 300 x 28 x 28 values"),
    "counts disagree": (TEST_LABELS, other_labels, "holds 300 images but"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_broken_file_is_refused_naming_it(synthetic_data_dir, tmp_path, case):
    name, corrupt, message = CASES[case]
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    corrupt(raw / name)
    with pytest.raises(DataFormatError, match=re.escape(message)) as error:
        # What runs before any process launches.
        MNISTDataModule(str(tmp_path / "data"), val_size=VAL_SIZE).prepare_data()
    assert str(raw / name) in str(error.value)
    # setup, which every DDP process runs, refuses it too.
    datamodule = MNISTDataModule(str(tmp_path / "data"), val_size=100)
    with pytest.raises(DataFormatError, match=re.escape(message)):
        datamodule.setup("fit" if name.startswith("train") else "test")


def test_a_gzipped_file_under_the_uncompressed_name_is_read(synthetic_data_dir, tmp_path):
    # Compression is told by the first bytes, not the name: a file gzipped in place is read as is.
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    gzip_in_place(raw / TEST_IMAGES)
    datamodule = MNISTDataModule(str(tmp_path / "data"), val_size=VAL_SIZE)
    datamodule.prepare_data()
    datamodule.setup("test")
    expected = datamodule_on_rank(synthetic_data_dir, 1, 0).test_set.tensors
    assert all(torch.equal(a, b) for a, b in zip(datamodule.test_set.tensors, expected))


def test_a_validation_split_as_large_as_the_training_split_is_refused_before_launch(synthetic_data_dir):
    # The training command checks it once before any process launches; setup, in every process, too.
    datamodule = MNISTDataModule(str(synthetic_data_dir), val_size=1200)
    datamodule.prepare_data()  # what eval runs too: it has no validation split
    with pytest.raises(ConfigValueError, match=r"data.val_size=1200 must be between 1 and 1199 \(the training split"):
        datamodule.check_splits()


# --- files as shipped: the real MNIST gzipped, read without a decompressed copy ------------------

NOBODY = 65534  # user and group nobody


def folder_nobody_can_enter() -> Path:
    """A new folder under the system's temporary folder, not pytest's ``tmp_path``: that one is
    private to root, and :func:`read_only` reads as user nobody when the tests run as root."""
    folder = Path(tempfile.mkdtemp(prefix="mnist-gz-"))
    folder.chmod(0o755)
    return folder


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only (0o555) for the block. Permission bits do not stop root: as root (CI),
    the block runs with the effective user and group nobody (the real ones stay root's, which
    switches back after)."""
    folder.chmod(0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            os.setegid(NOBODY)
            os.seteuid(NOBODY)
        yield
    finally:
        if as_root:
            os.seteuid(0)
            os.setegid(0)
        folder.chmod(0o755)


@pytest.fixture(scope="module")
def shipped_mnist(mnist_data_dir) -> Iterator[Path]:
    """A data root whose ``MNIST/raw`` holds the real MNIST files as they ship, ``<name>.gz`` only
    (compresslevel 1: about 1.5 s for the four, once for this file's tests)."""
    root = folder_nobody_can_enter()
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES.values():
        with gzip.open(raw / f"{name}.gz", "wb", compresslevel=1) as archive:
            archive.write((mnist_data_dir / "MNIST" / "raw" / name).read_bytes())
    yield root
    shutil.rmtree(root)


def loaded(data_dir: Path) -> MNISTDataModule:
    """A DataModule on ``data_dir`` through a run's path: ``prepare_data`` (before any process
    launches), then ``setup`` of training and test (in every process)."""
    datamodule = MNISTDataModule(str(data_dir))
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    return datamodule


@pytest.fixture(scope="module")
def uncompressed(mnist_data_dir) -> MNISTDataModule:
    """The real MNIST read from its uncompressed files: what the gzipped ones must give."""
    return loaded(mnist_data_dir)


def assert_same_data(datamodule: MNISTDataModule, expected: MNISTDataModule) -> None:
    for split in ("train_set", "val_set", "test_set"):
        for tensor, reference in zip(getattr(datamodule, split).tensors, getattr(expected, split).tensors):
            assert torch.equal(tensor, reference), split


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if torchvision is asked to download. This machine has no network; the mock
    makes the test say the same on one that has."""
    monkeypatch.setattr(MNIST, "download", lambda self: pytest.fail("torchvision was asked to download"))


def tree(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_gzipped_files_read_as_the_uncompressed_ones_from_a_read_only_folder(shipped_mnist, uncompressed, no_download):
    raw = shipped_mnist / "MNIST" / "raw"
    before = tree(shipped_mnist)
    with read_only(raw):
        datamodule = loaded(shipped_mnist)
    assert len(datamodule.train_set) + len(datamodule.val_set) == 60_000 and len(datamodule.test_set) == 10_000
    assert_same_data(datamodule, uncompressed)
    assert tree(shipped_mnist) == before, "nothing written: no decompressed copy, no temporary file"
    assert sorted(os.listdir(raw)) == sorted(f"{name}.gz" for name in MNIST_FILES.values())


def test_a_folder_of_plain_and_gzipped_files_reads_the_plain_one_where_both_are(
    shipped_mnist, mnist_data_dir, uncompressed, tmp_path, no_download
):
    # Links, not copies: the same bytes without writing 60 MB.
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (TRAIN_IMAGES, TEST_LABELS):
        (raw / name).symlink_to(mnist_data_dir / "MNIST" / "raw" / name)
    for name in (TRAIN_LABELS, TEST_IMAGES):
        (raw / f"{name}.gz").symlink_to(shipped_mnist / "MNIST" / "raw" / f"{name}.gz")
    # Beside an uncompressed file, a .gz that cannot be read: the uncompressed one is read.
    (raw / f"{TEST_LABELS}.gz").write_bytes(b"\x1f\x8b not a gzip stream")
    assert_same_data(loaded(tmp_path), uncompressed)


def cut_short(data: bytes) -> bytes:
    return data[: len(data) // 2]


def flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    # zlib's reason for a changed byte depends on what the byte was: any, in the same message.
    [(cut_short, "Compressed file ended before the end-of-stream marker was reached"), (flip_a_byte, ".+")],
    ids=["cut short", "a byte changed"],
)
def test_a_truncated_or_corrupt_gzip_file_is_one_error_naming_it(shipped_mnist, tmp_path, corrupt, reason):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES.values():
        (raw / f"{name}.gz").symlink_to(shipped_mnist / "MNIST" / "raw" / f"{name}.gz")
    broken = raw / f"{TEST_IMAGES}.gz"
    data = broken.read_bytes()
    broken.unlink()
    broken.write_bytes(corrupt(data))
    message = (
        re.escape(f"{broken} is a truncated or corrupt gzip file (")
        + reason
        + re.escape("). Copy or download it again (with data.download set, delete it and the next run downloads it).")
    )
    with pytest.raises(DataFormatError) as error:
        MNISTDataModule(str(tmp_path)).prepare_data()  # before any process launches
    assert re.fullmatch(message, str(error.value)), error.value
    with pytest.raises(DataFormatError) as error:
        MNISTDataModule(str(tmp_path)).setup("test")  # in every process
    assert re.fullmatch(message, str(error.value)), error.value


@pytest.mark.parametrize("raw_exists", [True, False], ids=["folder read-only", "parent read-only"])
def test_missing_files_are_not_downloaded_into_a_folder_that_cannot_be_written(shipped_mnist, no_download, raw_exists):
    root = folder_nobody_can_enter()
    try:
        raw = root / "MNIST" / "raw"
        if raw_exists:  # the test labels missing
            raw.mkdir(parents=True)
            for name in (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES):
                (raw / f"{name}.gz").symlink_to(shipped_mnist / "MNIST" / "raw" / f"{name}.gz")
        unwritable = raw if raw_exists else root
        missing = [TEST_LABELS] if raw_exists else list(MNIST_FILES.values())
        before = tree(root)
        with read_only(unwritable), pytest.raises(DataNotAvailableError) as error:
            MNISTDataModule(str(root)).prepare_data()
        assert str(error.value) == (
            f"{', '.join(missing)} not found in {raw} (nor as .gz), and they cannot be downloaded there: "
            f"{unwritable} cannot be written (Permission denied). Put the files {', '.join(MNIST_FILES.values())} "
            f"(uncompressed or .gz) into {raw}, or point data.data_dir at a folder you can write."
        )
        assert tree(root) == before
    finally:
        shutil.rmtree(root)
