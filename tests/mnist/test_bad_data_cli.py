"""The data from the command line: a data folder this user cannot read is named with the fix, a
validation split the training labels file's header rules out is refused before torch is imported,
and ``python -m mnist_ddp.download`` fetches from a mirror or says in one line that it cannot.

(Broken files, missing files and interrupted downloads are checked in process: data/test_data.py;
the download command's fetch from a mirror: data/test_download_cli.py.)
"""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO, cli_command, cli_env, copy_data, run_cli

pytestmark = pytest.mark.processes


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


def test_download_command_without_network_is_one_line_and_status_1(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mnist_ddp.download", "--data-dir", str(tmp_path / "data"), "--mirror",
         "http://127.0.0.1:9/"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: MNIST is missing from {tmp_path / 'data' / 'MNIST' / 'raw'}")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_missing_data_without_network_is_one_error_before_anything_is_written(tmp_path):
    # No network, on any machine: urllib sends every download through this closed local proxy port.
    no_network = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
    data_dir = tmp_path / "data"
    result = run_cli(f"data.data_dir={data_dir}", "trainer.accelerator=cpu", "trainer.devices=2",
                     log_dir=tmp_path / "logs", env=no_network)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: MNIST is missing from {data_dir / 'MNIST' / 'raw'}"), output
    assert "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte" in output
    assert "Traceback" not in output
    assert not data_dir.exists(), "no partial file or empty folder may be left"
    assert not (tmp_path / "logs").exists(), "checked with the command line: no run directory, no process"


@pytest.mark.parametrize("gzipped", [False, True], ids=["uncompressed", "gzipped"])
def test_a_validation_split_larger_than_the_labels_file_holds_is_refused_before_torch_is_imported(
    synthetic_data_dir, tmp_path, gzipped
):
    # The training labels file's header holds the count (1,200 here): the data set's schema reads it
    # before torch and Lightning are imported (IDXDataConfig.check_values).
    raw = copy_data(synthetic_data_dir, tmp_path / "data")
    if gzipped:
        labels = raw / "train-labels-idx1-ubyte"
        (raw / f"{labels.name}.gz").write_bytes(gzip.compress(labels.read_bytes()))
        labels.unlink()
    log_dir = tmp_path / "logs"
    command = cli_command(f"data.data_dir={tmp_path / 'data'}", "data.val_size=1200", log_dir=log_dir)
    command[1:1] = ["-X", "importtime"]  # Python lists every module it imports on stderr
    result = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "hydra" in imported and "torch" not in imported and "lightning" not in imported
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 1
    assert errors == ["Error: data.val_size=1200 must be between 1 and 1199 (the training split has 1200 images)."]
    assert not log_dir.exists(), "nothing written"
