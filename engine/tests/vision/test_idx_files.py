"""IDX files (``ddp_engine.vision.idx``), as an IDX DataModule uses them: the four files found or
downloaded (offline, from a local mirror), checked before any process launches and read in every
process; every broken file refused in one error naming it; gzipped files (as MNIST and its family
ship) read without a decompressed copy, from a read-only folder too.

The files are synthetic, MNIST-shaped: 1,200 training and 300 test images of 28x28 random pixels.
"""

import contextlib
import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.datasets import MNIST

from ddp_engine.core.errors import DataFormatError, DataNotAvailableError
from ddp_engine.vision.idx import MNIST_FILES, check_idx_split, ensure_idx_files, find_idx_file, read_idx_split
from ddp_engine.vision.mirror import local_mirror

TRAIN_IMAGES, TRAIN_LABELS = MNIST_FILES["train_images"], MNIST_FILES["train_labels"]
TEST_IMAGES, TEST_LABELS = MNIST_FILES["test_images"], MNIST_FILES["test_labels"]
N_TRAIN, N_TEST, CLASSES = 1200, 300, 10


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format (big-endian header, magic 0x08 0x0N)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def idx_data_dir(tmp_path_factory) -> Path:
    """A data root whose ``MNIST/raw`` holds the four files, uncompressed, as torchvision lays them out."""
    root = tmp_path_factory.mktemp("idx")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, count in (("train", N_TRAIN), ("test", N_TEST)):
        write_idx(raw / MNIST_FILES[f"{split}_images"], rng.integers(0, 256, (count, 28, 28)))
        write_idx(raw / MNIST_FILES[f"{split}_labels"], rng.integers(0, CLASSES, count))
    return root


def split_files(raw: Path, split: str) -> tuple[Path, Path]:
    """The images and labels files of ``split``, each ``<name>`` or ``<name>.gz``."""
    return tuple(find_idx_file(raw, MNIST_FILES[f"{split}_{kind}"]) for kind in ("images", "labels"))


def prepare(data_dir: Path) -> None:
    """What an IDX DataModule runs before any process launches: the files found (or downloaded),
    then both splits' files checked."""
    raw = ensure_idx_files(data_dir / "MNIST" / "raw", list(MNIST_FILES.values()))
    for split in ("train", "test"):
        check_idx_split(*split_files(raw, split), CLASSES, image_size=(28, 28))


def read_split(data_dir: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What every process runs in ``setup``: one split's images and labels read."""
    return read_idx_split(*split_files(data_dir / "MNIST" / "raw", split), CLASSES)


def read_all(data_dir: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {split: read_split(data_dir, split) for split in ("train", "test")}


def assert_same_data(data: dict, expected: dict) -> None:
    for split, tensors in data.items():
        for tensor, reference in zip(tensors, expected[split]):
            assert torch.equal(tensor, reference), split


def copy_data(data_dir: Path, folder: Path) -> Path:
    """A copy of the data set; returns its raw/ folder."""
    shutil.copytree(data_dir, folder)
    return folder / "MNIST" / "raw"


@pytest.fixture
def mirror(tmp_path, monkeypatch, idx_data_dir):
    """The files served as an MNIST mirror over HTTP on 127.0.0.1, gzipped as the real mirrors serve
    them, with their MD5s patched into torchvision's resource list in this process: the real download
    path runs offline. Yields the mirror's URL and its handler class (whose ``cut_off`` cuts a file's
    transfer off)."""
    with local_mirror(idx_data_dir / "MNIST" / "raw", MNIST_FILES.values(), tmp_path / "mirror") as served:
        url, handler, resources = served
        monkeypatch.setattr(MNIST, "resources", resources)
        yield url, handler


def assert_files_in_place(data_dir: Path, idx_data_dir: Path) -> None:
    raw = data_dir / "MNIST" / "raw"
    assert sorted(os.listdir(raw)) == sorted(MNIST_FILES.values())
    for name in MNIST_FILES.values():
        assert (raw / name).read_bytes() == (idx_data_dir / "MNIST" / "raw" / name).read_bytes()
    assert os.listdir(data_dir / "MNIST") == ["raw"], "the temporary download folder must be gone"


# Finding and downloading.


def test_files_present_are_not_downloaded(idx_data_dir, monkeypatch):
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # would fail if a download were tried
    before = {p: p.stat().st_mtime_ns for p in (idx_data_dir / "MNIST" / "raw").iterdir()}
    prepare(idx_data_dir)
    assert {p: p.stat().st_mtime_ns for p in (idx_data_dir / "MNIST" / "raw").iterdir()} == before


def test_missing_files_without_network_are_refused_naming_the_folder_and_the_files(tmp_path, monkeypatch):
    # No network: point torchvision's mirrors at a closed local port (connection refused at once),
    # so this test behaves the same on a machine that has internet access.
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])
    data_dir = tmp_path / "data"
    with pytest.raises(DataNotAvailableError) as error:
        prepare(data_dir)
    message = str(error.value)
    assert str(data_dir / "MNIST" / "raw") in message
    assert all(name in message for name in MNIST_FILES.values())
    assert "data.data_dir" in message
    assert not data_dir.exists(), f"left behind: {list(data_dir.rglob('*'))}"


def test_a_complete_download_is_moved_into_place(tmp_path, monkeypatch, mirror, idx_data_dir):
    monkeypatch.setattr(MNIST, "mirrors", [mirror[0]])
    data_dir = tmp_path / "data"
    prepare(data_dir)
    assert_files_in_place(data_dir, idx_data_dir)
    raw = data_dir / "MNIST" / "raw"
    assert np.frombuffer((raw / TEST_LABELS).read_bytes()[8:], np.uint8).size == N_TEST


def test_a_download_cut_off_half_way_leaves_no_file_and_the_next_one_completes(
    tmp_path, monkeypatch, mirror, idx_data_dir
):
    url, handler = mirror
    monkeypatch.setattr(MNIST, "mirrors", [url])
    handler.cut_off = f"{TRAIN_IMAGES}.gz"  # the first and largest file
    data_dir = tmp_path / "data"
    # torchvision keeps the bytes that came, and its MD5 check of the archive refuses them.
    # torchvision's own reason follows ("File not found or corrupted."): not its words.
    with pytest.raises(DataNotAvailableError, match="could not be downloaded: "):
        prepare(data_dir)
    assert not data_dir.exists(), "no partial file may be taken for a good one later, no empty folder left"
    handler.cut_off = None  # the network is back
    prepare(data_dir)
    assert_files_in_place(data_dir, idx_data_dir)


# Broken files: one error naming the file and what to do.


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
def test_a_broken_file_is_refused_naming_it(idx_data_dir, tmp_path, case):
    name, corrupt, message = CASES[case]
    raw = copy_data(idx_data_dir, tmp_path / "data")
    corrupt(raw / name)
    with pytest.raises(DataFormatError, match=re.escape(message)) as error:
        prepare(tmp_path / "data")  # before any process launches
    assert str(raw / name) in str(error.value)
    # Reading the split, which every DDP process does, refuses it too.
    with pytest.raises(DataFormatError, match=re.escape(message)):
        read_split(tmp_path / "data", "train" if name.startswith("train") else "test")


def test_a_gzipped_file_under_the_uncompressed_name_is_read(idx_data_dir, tmp_path):
    # Compression is told by the first bytes, not the name: a file gzipped in place is read as is.
    raw = copy_data(idx_data_dir, tmp_path / "data")
    gzip_in_place(raw / TEST_IMAGES)
    prepare(tmp_path / "data")
    images, labels = read_split(tmp_path / "data", "test")
    expected_images, expected_labels = read_split(idx_data_dir, "test")
    assert images.shape == (N_TEST, 28, 28) and images.dtype == torch.uint8
    assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


# Files as shipped: gzipped, read without a decompressed copy.

NOBODY = 65534  # user and group nobody


def folder_nobody_can_enter() -> Path:
    """A new folder under the system's temporary folder, not pytest's ``tmp_path``: that one is
    private to root, and :func:`read_only` reads as user nobody when the tests run as root."""
    folder = Path(tempfile.mkdtemp(prefix="idx-gz-"))
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
def shipped(idx_data_dir) -> Iterator[Path]:
    """A data root whose ``MNIST/raw`` holds the four files as they ship, ``<name>.gz`` only."""
    root = folder_nobody_can_enter()
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES.values():
        with gzip.open(raw / f"{name}.gz", "wb") as archive:
            archive.write((idx_data_dir / "MNIST" / "raw" / name).read_bytes())
    yield root
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def uncompressed(idx_data_dir) -> dict:
    """Both splits read from the uncompressed files: what the gzipped ones must give."""
    return read_all(idx_data_dir)


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if torchvision is asked to download. This machine may have no network; the mock
    makes the test say the same on one that has."""
    monkeypatch.setattr(MNIST, "download", lambda self: pytest.fail("torchvision was asked to download"))


def tree(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_gzipped_files_read_as_the_uncompressed_ones_from_a_read_only_folder(shipped, uncompressed, no_download):
    raw = shipped / "MNIST" / "raw"
    before = tree(shipped)
    with read_only(raw):
        prepare(shipped)
        data = read_all(shipped)
    assert len(data["train"][0]) == N_TRAIN and len(data["test"][0]) == N_TEST
    assert_same_data(data, uncompressed)
    assert tree(shipped) == before, "nothing written: no decompressed copy, no temporary file"
    assert sorted(os.listdir(raw)) == sorted(f"{name}.gz" for name in MNIST_FILES.values())


def test_a_folder_of_plain_and_gzipped_files_reads_the_plain_one_where_both_are(
    shipped, idx_data_dir, uncompressed, tmp_path, no_download
):
    # Links, not copies: the same bytes without writing them again.
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (TRAIN_IMAGES, TEST_LABELS):
        (raw / name).symlink_to(idx_data_dir / "MNIST" / "raw" / name)
    for name in (TRAIN_LABELS, TEST_IMAGES):
        (raw / f"{name}.gz").symlink_to(shipped / "MNIST" / "raw" / f"{name}.gz")
    # Beside an uncompressed file, a .gz that cannot be read: the uncompressed one is read.
    (raw / f"{TEST_LABELS}.gz").write_bytes(b"\x1f\x8b not a gzip stream")
    prepare(tmp_path)
    assert_same_data(read_all(tmp_path), uncompressed)


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
def test_a_truncated_or_corrupt_gzip_file_is_one_error_naming_it(shipped, tmp_path, corrupt, reason):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES.values():
        (raw / f"{name}.gz").symlink_to(shipped / "MNIST" / "raw" / f"{name}.gz")
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
        prepare(tmp_path)  # before any process launches
    assert re.fullmatch(message, str(error.value)), error.value
    with pytest.raises(DataFormatError) as error:
        read_split(tmp_path, "test")  # in every process
    assert re.fullmatch(message, str(error.value)), error.value


@pytest.mark.parametrize("raw_exists", [True, False], ids=["folder read-only", "parent read-only"])
def test_missing_files_are_not_downloaded_into_a_folder_that_cannot_be_written(shipped, no_download, raw_exists):
    root = folder_nobody_can_enter()
    try:
        raw = root / "MNIST" / "raw"
        if raw_exists:  # the test labels missing
            raw.mkdir(parents=True)
            for name in (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES):
                (raw / f"{name}.gz").symlink_to(shipped / "MNIST" / "raw" / f"{name}.gz")
        unwritable = raw if raw_exists else root
        missing = [TEST_LABELS] if raw_exists else list(MNIST_FILES.values())
        before = tree(root)
        with read_only(unwritable), pytest.raises(DataNotAvailableError) as error:
            prepare(root)
        assert str(error.value) == (
            f"{', '.join(missing)} not found in {raw} (nor as .gz), and they cannot be downloaded there: "
            f"{unwritable} cannot be written (Permission denied). Put the files {', '.join(MNIST_FILES.values())} "
            f"(uncompressed or .gz) into {raw}, or point data.data_dir at a folder you can write."
        )
        assert tree(root) == before
    finally:
        shutil.rmtree(root)
