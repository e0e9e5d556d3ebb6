"""A bad checkpoint given to a command stops it before any run directory or process exists, as one
line naming ``ckpt_path`` (each kind of bad checkpoint, and the training command's check, are
checked in process: refusals/test_bad_checkpoints.py)."""

import pytest
from harness import run_cli

pytestmark = pytest.mark.processes


def test_evaluating_a_truncated_checkpoint_is_one_line_before_anything_starts(checkpoint, image_data, tmp_path):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(checkpoint.read_bytes()[:1000])
    result = run_cli("vision_task.eval", *image_data, "trainer.accelerator=cpu", "trainer.devices=2",
                     f"ckpt_path={broken}", log_dir=tmp_path / "logs")  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: ckpt_path={broken} cannot be read as a checkpoint (truncated or corrupt")
    assert not (tmp_path / "logs").exists(), "no run directory"
