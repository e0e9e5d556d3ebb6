"""Broken data files: one error that names the file and what to do, before any DDP process
launches, and never a corrupt or mismatched file trained on.

Each case corrupts a copy of the synthetic MNIST-format files the way it happens in practice: a
copy cut short, the wrong file under the name, an archive not decompressed, splits that do not
belong together. (The missing-files and interrupted-download cases are in test_data.py and
test_train_cli.py; another image size in test_data_swap.py.)
"""

import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ranks_in_log, run_cli, write_idx

from mnist_ddp.data.datamodule import MNISTDataModule
from mnist_ddp.errors import DataFormatError

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"


def copy_data(synthetic_data_dir: Path, folder: Path) -> Path:
    """A copy of the synthetic data set (1,200 training and 300 test images); returns its raw/ folder."""
    shutil.copytree(synthetic_data_dir, folder)
    return folder / "MNIST" / "raw"


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
    "still gzipped": (TEST_IMAGES, gzip_in_place, f"{TEST_IMAGES} is gzip-compressed: decompress it in place "
                     f"(mv {TEST_IMAGES} {TEST_IMAGES}.gz && gunzip {TEST_IMAGES}.gz)."),
    "bytes after the data": (TEST_IMAGES, append_bytes, "has 10 bytes more than the 300 x 28 x 28 values"),
    "counts disagree": (TEST_LABELS, other_labels, "holds 300 images but"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_broken_file_is_refused_naming_it(synthetic_data_dir, tmp_path, case):
    name, corrupt, message = CASES[case]
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    corrupt(raw / name)
    with pytest.raises(DataFormatError, match=re.escape(message)) as error:
        MNISTDataModule(str(tmp_path / "data")).prepare_data()  # what runs before any process launches
    assert str(raw / name) in str(error.value)
    # setup, which every DDP process runs, refuses it too.
    datamodule = MNISTDataModule(str(tmp_path / "data"), val_size=100)
    with pytest.raises(DataFormatError, match=re.escape(message)):
        datamodule.setup("fit" if name.startswith("train") else "test")


def test_a_truncated_file_stops_the_command_before_any_process_launches(synthetic_data_dir, tmp_path):
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    truncate(raw / TRAIN_IMAGES)
    result = run_cli(f"data.data_dir={tmp_path / 'data'}", "trainer.accelerator=cpu", "trainer.devices=2",
                     log_dir=tmp_path / "logs")  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert f"DataFormatError: {raw / TRAIN_IMAGES} is truncated" in output and "Traceback" not in output
    (run,) = (tmp_path / "logs" / "runs").iterdir()
    assert ranks_in_log(run) == {0}, "a second process was launched"
    assert not (run / "checkpoints").exists()


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root needs setpriv to drop rights")
def test_an_unreadable_data_folder_is_named_with_the_fix(synthetic_data_dir):
    # Permission bits do not stop root: as root (CI), the command runs as user nobody (setpriv).
    top = Path(tempfile.mkdtemp(prefix="unreadable-"))  # not under pytest's tmp_path, which is private to root
    try:
        top.chmod(0o755)
        raw = copy_data(synthetic_data_dir, top / "data")
        raw.chmod(0o000)
        home = top / "home"  # writable for the user, for matplotlib's cache
        home.mkdir()
        command = [sys.executable, "-m", "mnist_ddp.download", "--data-dir", str(top / "data")]
        if os.geteuid() == 0:
            os.chown(home, 65534, 65534)
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        env = {**os.environ, "HOME": str(home), "MPLCONFIGDIR": str(home)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"Error: {raw} cannot be read: permission denied. Make it readable for this user (chmod a+rx on the "
            "folders, a+r on the files), or point data.data_dir at a readable copy.\n"
        )
    finally:
        (top / "data" / "MNIST" / "raw").chmod(0o755)
        shutil.rmtree(top)
