"""A full disk says so and loses nothing: on a small file system of its own (a tmpfs, which needs
root to mount), a write that finds no space fails in one line that names the cause, the path and
the bytes it needed; the run's ``metrics.json`` records it; a resume in place, once space is freed,
continues from the newest complete checkpoint, whatever its kind."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from harness import only, run_cli
from runs import TRAIN

from ddp_engine.core.files import NoSpaceError, write_json
from ddp_engine.distributed.checkpoint_io import AtomicCheckpointIO
from ddp_engine.distributed.resume_points import resume_point

pytestmark = pytest.mark.processes

#: 2 processes, last.ckpt every 2 optimizer steps (13 per epoch), TensorBoard only.
RUN = (
    "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2", "logger=tensorboard",
    "callbacks.last_checkpoint.train_time_interval=null", "callbacks.last_checkpoint.every_n_train_steps=2",
)  # fmt: skip


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MB tmpfs at ``tmp_path/fs``, unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"a small file system of its own needs root to mount: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(folder: Path, leave_bytes: int) -> Path:
    """Fill ``folder``'s file system but ``leave_bytes``; the filler file."""
    filler = folder / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(folder).free - leave_bytes))
    return filler


def test_a_checkpoint_that_finds_no_space_fails_in_one_line_and_keeps_the_previous_one(small_fs):
    path = small_fs / "checkpoints" / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"state_dict": {"w": torch.ones(1000)}}, path)
    filler = fill(small_fs, leave_bytes=64 * 1024)
    with pytest.raises(NoSpaceError) as refused:
        writer.save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}}, path)
    assert str(refused.value).startswith(f"[Errno 28] No space left on device: writing {path} failed (")
    assert str(refused.value).endswith("left on its file system; the file needs about 400.0 kB)")
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(1000)), "the previous one"
    assert sorted(item.name for item in path.parent.iterdir()) == ["last.ckpt"], "no partial file left"
    filler.unlink()
    # metrics.json (and every file the engine writes whole: summary.csv, ddp.json) alike.
    fill(small_fs, leave_bytes=0)
    with pytest.raises(NoSpaceError, match=rf"^\[Errno 28\] No space left on device: writing {small_fs}/metrics.json"):
        write_json(small_fs / "metrics.json", {"status": "completed"})
    assert not (small_fs / "metrics.json").exists() and not list(small_fs.glob(".metrics.json.*"))


def test_a_run_whose_disk_fills_ends_in_one_line_and_resumes_once_space_is_freed(small_fs, sensor_data):
    probe = ("+callbacks.fill._target_=probes.FillTheDisk", "+callbacks.fill.step=4",
             "+callbacks.fill.leave_bytes=12288")  # fmt: skip
    result = run_cli(TRAIN, *sensor_data, *RUN, *probe, log_dir=small_fs)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Logging error" not in output, "no traceback from the logging itself"
    run = only(small_fs / "runs")
    failed = json.loads((run / "metrics.json").read_text())
    assert failed["status"] == "failed" and failed["rank"] == 0
    assert failed["error"].startswith("NoSpaceError: [Errno 28] No space left on device: writing "), failed["error"]
    assert (
        f"{run / 'checkpoints' / 'last.ckpt'} failed (" in failed["error"] and "the file needs about" in failed["error"]
    )
    last = result.stdout.strip().splitlines()[-1]  # the run's last line (torch's own notes go to stderr)
    assert "JobFailedError: rank 0 failed: NoSpaceError: [Errno 28] No space left on device: writing" in last, last
    point = resume_point(run)
    assert point == run / "checkpoints" / "last.ckpt"
    assert torch.load(point, weights_only=True)["global_step"] == 2, "the step-2 save, complete"
    assert f"Last complete checkpoint: {point} (global step 2)" in output

    (run / "filler").unlink()
    resumed = run_cli(TRAIN, f"hydra.run.dir={run}", "ckpt_path=last", log_dir=small_fs)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-8000:]
    assert json.loads((run / "metrics.json").read_text())["status"] == "completed"


def test_a_run_without_its_last_checkpoint_resumes_from_its_newest_epoch_checkpoint(sensor_run, tmp_path):
    """As where its first last.ckpt could not be written: ckpt_path=last continues from epoch_<N>.ckpt."""
    log_dir, _ = sensor_run
    run = tmp_path / "run"
    shutil.copytree(only(log_dir / "runs"), run)
    (run / "checkpoints" / "last.ckpt").unlink()
    write_json(run / "metrics.json", {"status": "failed", "rank": 0, "error": "NoSpaceError: ..."})
    (epoch,) = (run / "checkpoints").glob("epoch_*.ckpt")
    assert resume_point(run) == epoch
    resumed = run_cli(TRAIN, f"hydra.run.dir={run}", "ckpt_path=last", log_dir=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"Restoring states from the checkpoint path at {epoch}" in resumed.stdout + resumed.stderr
    assert json.loads((run / "metrics.json").read_text())["status"] == "completed"
