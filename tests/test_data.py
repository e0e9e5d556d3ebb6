"""The DataModule on synthetic IDX files: loading, the split, and sharding over simulated ranks.

Ranks are simulated by attaching a stand-in for the Trainer that reports ``world_size`` and
``global_rank`` (what a real DDP Trainer reports in each process); the real DDP runs are in
test_train_cli.py.
"""

import gzip
import hashlib
import http.server
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchvision.datasets import MNIST

from mnist_ddp.data.datamodule import MNIST_MEAN, MNIST_STD, MNISTDataModule
from mnist_ddp.data.idx import MNIST_FILES
from mnist_ddp.errors import ConfigValueError, DataNotAvailableError

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


def test_setup_loads_normalized_float_images_and_int_labels(synthetic_data_dir):
    dm = datamodule_on_rank(synthetic_data_dir, 1, 0)
    raw = MNIST(synthetic_data_dir, train=True)
    images, labels = dm.train_set.tensors
    assert images.shape == (1200 - VAL_SIZE, 1, 28, 28) and images.dtype == torch.float32
    assert labels.shape == (1200 - VAL_SIZE,) and labels.dtype == torch.int64
    assert len(dm.val_set) == VAL_SIZE and len(dm.test_set) == 300
    # Pixel value 255 maps to (1 - mean) / std and 0 to -mean / std.
    assert images.max().item() == pytest.approx((1 - MNIST_MEAN) / MNIST_STD)
    assert images.min().item() == pytest.approx(-MNIST_MEAN / MNIST_STD)

    # Train and val together are exactly the training file, each image with its own label.
    def pairs(images, labels):
        pixels = (images * MNIST_STD + MNIST_MEAN).mul(255).round().byte()
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
    assert {t.device.type for split in (dm.train_set, dm.val_set, dm.test_set) for t in split.tensors} == {"cpu"}
    assert len(dm.train_set) == 1200 - VAL_SIZE and len(dm.test_set) == 300


def test_on_device_with_dataloader_workers_is_refused_by_name(synthetic_data_dir):
    dm = MNISTDataModule(str(synthetic_data_dir), global_batch_size=8, on_device=True, num_workers=2)
    with pytest.raises(ConfigValueError, match=r"data.on_device=true .* set data.num_workers=0 \(not 2\)"):
        dm.setup("fit")


def test_prepare_data_with_files_present_does_not_download(synthetic_data_dir, monkeypatch):
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # would fail if a download were tried
    before = {p: p.stat().st_mtime_ns for p in (synthetic_data_dir / "MNIST" / "raw").iterdir()}
    MNISTDataModule(str(synthetic_data_dir)).prepare_data()
    assert {p: p.stat().st_mtime_ns for p in (synthetic_data_dir / "MNIST" / "raw").iterdir()} == before


def test_prepare_data_without_files_or_network_names_folder_and_files(tmp_path, monkeypatch):
    # No network: point torchvision's mirrors at a closed local port (connection refused at once),
    # so this test behaves the same on a machine that has internet access.
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])
    data_dir = tmp_path / "data"
    with pytest.raises(DataNotAvailableError) as error:
        MNISTDataModule(str(data_dir)).prepare_data()
    message = str(error.value)
    assert str(data_dir / "MNIST" / "raw") in message
    assert all(name in message for name in MNIST_FILES.values())
    assert "data.data_dir" in message
    assert not data_dir.exists(), f"left behind: {list(data_dir.rglob('*'))}"


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; the file named by ``cut_off`` is cut off half-way, as a dropped connection
    cuts a transfer: the full Content-Length is announced, half the bytes sent, the connection closed."""

    cut_off: str | None = None

    def do_GET(self) -> None:
        if self.cut_off is None or not self.path.endswith(self.cut_off):
            return super().do_GET()
        data = (Path(self.directory) / self.cut_off).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def mirror(tmp_path, monkeypatch, synthetic_data_dir):
    """The synthetic files served as an MNIST mirror over HTTP on 127.0.0.1, gzipped as the real
    mirrors serve them, with their MD5s patched into torchvision's resource list in this process:
    the real download path runs offline. Yields the mirror's URL and its handler class (whose
    ``cut_off`` cuts a file's transfer off)."""
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    resources = []
    for name in MNIST_FILES.values():
        archive = mirror_dir / f"{name}.gz"
        archive.write_bytes(gzip.compress((synthetic_data_dir / "MNIST" / "raw" / name).read_bytes()))
        resources.append((archive.name, hashlib.md5(archive.read_bytes()).hexdigest()))
    handler = type("Handler", (MirrorHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(mirror_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(MNIST, "resources", resources)
    try:
        yield f"http://127.0.0.1:{server.server_port}/", handler
    finally:
        server.shutdown()


def assert_synthetic_files_in_place(data_dir: Path, synthetic_data_dir: Path) -> None:
    raw = data_dir / "MNIST" / "raw"
    assert sorted(os.listdir(raw)) == sorted(MNIST_FILES.values())
    for name in MNIST_FILES.values():
        assert (raw / name).read_bytes() == (synthetic_data_dir / "MNIST" / "raw" / name).read_bytes()
    assert os.listdir(data_dir / "MNIST") == ["raw"], "the temporary download folder must be gone"


def test_prepare_data_moves_a_complete_download_into_place(tmp_path, monkeypatch, mirror, synthetic_data_dir):
    monkeypatch.setattr(MNIST, "mirrors", [mirror[0]])
    data_dir = tmp_path / "data"
    MNISTDataModule(str(data_dir)).prepare_data()
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
    with pytest.raises(DataNotAvailableError, match="could not be downloaded: File not found or corrupted"):
        MNISTDataModule(str(data_dir)).prepare_data()
    assert not data_dir.exists(), "no partial file may be taken for a good one later, no empty folder left"
    handler.cut_off = None  # the network is back
    MNISTDataModule(str(data_dir)).prepare_data()
    assert_synthetic_files_in_place(data_dir, synthetic_data_dir)


def test_download_command_fetches_from_the_given_mirror(tmp_path, mirror, synthetic_data_dir):
    # The command's main() in a subprocess, with its real arguments; --mirror points it at the local
    # server. torchvision checks each archive against its MD5 list, so the child gets the synthetic
    # archives' sums patched in first, as the fixture does in this process.
    data_dir = tmp_path / "data"
    wrapper = (
        "import sys; from torchvision.datasets import MNIST; "
        f"MNIST.resources = {MNIST.resources!r}; "
        "from mnist_ddp.download import main; main(sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapper, "--data-dir", str(data_dir), "--mirror", mirror[0].rstrip("/")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"MNIST is in {data_dir / 'MNIST' / 'raw'}; train with data.data_dir={data_dir}"
    assert_synthetic_files_in_place(data_dir, synthetic_data_dir)


def test_download_command_without_network_is_one_line_and_status_1(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mnist_ddp.download", "--data-dir", str(tmp_path / "data"), "--mirror",
         "http://127.0.0.1:9/"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: MNIST is missing from {tmp_path / 'data' / 'MNIST' / 'raw'}")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
