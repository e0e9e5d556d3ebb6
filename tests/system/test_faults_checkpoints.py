"""A bad checkpoint given to the commands stops them before any DDP process launches, as one
error naming ``ckpt_path`` (each kind of bad checkpoint is checked in process: unit/test_checkpoints.py)."""

from conftest import ranks_in_log, run_cli


def test_resuming_from_another_models_checkpoint_stops_before_any_process_launches(
    checkpoint, synthetic_data_dir, tmp_path
):
    result = run_cli(f"data.data_dir={synthetic_data_dir}", "trainer.accelerator=cpu", "trainer.devices=2",
                     "data.global_batch_size=64", "model=mlp", f"ckpt_path={checkpoint}", log_dir=tmp_path)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    assert f"CheckpointError: ckpt_path={checkpoint} was saved from another model configuration: missing keys" in output
    (run,) = (tmp_path / "runs").iterdir()
    assert ranks_in_log(run) == {0}, "a second process was launched"


def test_evaluating_a_truncated_checkpoint_stops_before_any_process_launches(checkpoint, synthetic_data_dir, tmp_path):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(checkpoint.read_bytes()[:1000])
    result = run_cli(f"data.data_dir={synthetic_data_dir}", "trainer.accelerator=cpu", "trainer.devices=2",
                     f"ckpt_path={broken}", log_dir=tmp_path / "logs", module="mnist_ddp.eval")  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    assert f"CheckpointError: ckpt_path={broken} cannot be read as a checkpoint (truncated or corrupt" in output
    (run,) = (tmp_path / "logs" / "evals").iterdir()
    assert ranks_in_log(run, job="eval") == {0}, "a second process was launched"
