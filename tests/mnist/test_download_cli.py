"""``python -m mnist_ddp.download`` through its real command line: it fetches the four files from a
mirror (a local HTTP server, ``conftest.mirror``) into place. (Its refusal without network:
refusals/test_bad_data_cli.py; prepare_data's download, cut-off transfers included, in process:
data/test_data.py.)
"""

import subprocess
import sys

import pytest
from helpers import assert_synthetic_files_in_place
from torchvision.datasets import MNIST

pytestmark = pytest.mark.processes


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
