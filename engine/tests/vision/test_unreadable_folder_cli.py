"""A folder of images this user cannot read is named, with the fix, as one line before any run
directory or process exists (through the real command line of the image test task)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from harness import HERE, cli_command, cli_env

pytestmark = pytest.mark.processes


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root needs setpriv to drop rights")
def test_an_unreadable_image_folder_is_named_with_the_fix(image_folder):
    # Permission bits do not stop root: as root (CI), the command runs as user nobody (setpriv).
    top = Path(tempfile.mkdtemp(prefix="unreadable-"))  # not under pytest's tmp_path, which is private to root
    try:
        top.chmod(0o755)
        images = top / "images"
        shutil.copytree(image_folder, images)
        for folder in (images, *images.rglob("*")):
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        (images / "train").chmod(0o000)
        home = top / "home"  # writable for the user, for matplotlib's cache
        home.mkdir()
        logs = home / "logs"  # writable for the user, as a log folder must be
        command = cli_command("vision_task.train", f"data.root={images}", "trainer.accelerator=cpu",
                              "trainer.devices=2", "trainer.max_epochs=1", log_dir=logs)  # fmt: skip
        if os.geteuid() == 0:
            os.chown(home, 65534, 65534)
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        env = cli_env(HOME=str(home), MPLCONFIGDIR=str(home))
        result = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
        assert result.stderr == f"Error: {images / 'train'} cannot be read: permission denied (chmod a+rx).\n"
        assert not (logs / "runs").exists(), "no run directory, no process"
    finally:
        (top / "images" / "train").chmod(0o755)
        shutil.rmtree(top)
