"""``python -m mnist_ddp.plan`` through the real command line: a plan of 8 nodes x 8 GPUs on this
machine (no GPU: the devices are the planned cluster's), its figures against the CNN's own tensors;
at world size 2, against what a real 2-process run of the same command line measured of itself
(its ddp.json: the memory report and the DDP report); a layout whose global batch does not split,
refused as the training refuses it; a layout that cannot start, refused in its step."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, cli_command, cli_env, run_cli

from mnist_ddp.networks import CNN

pytestmark = pytest.mark.processes

PLAN = "mnist_ddp.plan"
#: The default recipe's network (conf/model/cnn.yaml) on MNIST's images: its parameter tensors.
CNN_TENSORS = {
    name: param.numel() for name, param in CNN(in_channels=1, image_size=(28, 28), num_classes=10).named_parameters()
}


def plan_of(result: subprocess.CompletedProcess, log_dir: Path) -> dict:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = (log_dir / "plans").iterdir()
    return json.loads((run_dir / "metrics.json").read_text())["plan"]


def test_a_plan_of_8_nodes_x_8_gpus_splits_the_batch_scales_the_rate_and_counts_the_cnns_bytes(
    synthetic_data, tmp_path
):
    result = run_cli(
        *synthetic_data, "trainer.accelerator=gpu", "trainer.num_nodes=8", "trainer.devices=8",
        "data.global_batch_size=512", "lr_scaling.rule=linear", "plan.global_rank=9",
        module=PLAN, log_dir=tmp_path,
    )  # fmt: skip
    plan = plan_of(result, tmp_path)
    assert plan["world_size"] == 64 and plan["per_device_batch_size"] == 8 and plan["global_rank"] == 9
    assert plan["learning_rate"] == pytest.approx(0.01 * 512 / 128)  # model.optimizer.lr at reference batch 128
    parameter_bytes = 4 * sum(CNN_TENSORS.values())
    assert plan["step_ran"] and plan["parameters"] == plan["gradients"] == parameter_bytes
    # AdamW: two float32 moments per parameter, and a 4-byte step count per tensor.
    assert plan["optimizer_state"] == 2 * parameter_bytes + 4 * len(CNN_TENSORS)
    # ZeRO-1 over 64 ranks: 8 tensors, one per rank at most; the largest rank holds the largest's state.
    assert plan["optimizer_state_zero1"] == 2 * 4 * max(CNN_TENSORS.values()) + 4
    # At least the first convolution's output (24 channels of 24 x 24) of the 8 images is kept for the backward.
    assert plan["activations_batch_size"] == 8 and plan["activations"] > 8 * 24 * 24 * 24 * 4
    # No communication hook: the buckets hold each gradient once; a ring AllReduce sends 2 (W - 1) / W of it.
    assert plan["allreduce_bytes_per_step"] == parameter_bytes
    assert plan["allreduce_sent_bytes_per_rank"] == round(2 * 63 / 64 * parameter_bytes)
    assert plan["allreduce_seconds"] == pytest.approx(plan["allreduce_sent_bytes_per_rank"] * 8 / 100e9)
    # No device named: the table has no fit row, and says how to add it.
    assert plan["device_memory"] is None and "  fits " not in result.stdout
    assert "(no device memory given: add plan.device=<name>" in result.stdout
    assert "Plan: 8 nodes x 8 devices = world_size 64, as global rank 9" in result.stdout


def test_a_plan_that_does_not_fit_its_device_prints_its_table_then_one_refusal_and_keeps_its_figures(
    synthetic_data, tmp_path
):
    result = run_cli(*synthetic_data, "trainer.accelerator=gpu", "trainer.num_nodes=2", "trainer.devices=4",
                     "plan.device_memory_gib=0.001", module=PLAN, log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 1 and re.search(r"  fits device \(1.02 MiB\) +NO \d+% +NO \d+%", result.stdout)
    assert (
        result.stderr.strip().splitlines()[-1].startswith("Error: the planned layout does not fit: each device holds ")
    ), result.stderr[-2000:]
    (run_dir,) = (tmp_path / "plans").iterdir()
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "refused" and record["error"] in result.stderr
    assert record["plan"]["world_size"] == 8 and record["plan"]["total"] > 0.001 * 2**30


def test_a_plan_at_world_size_2_agrees_with_what_the_2_process_run_measured(
    synthetic_run, synthetic_data_dir, tmp_path
):
    # The same command line as that run's, planned instead of trained. Measured here: both count 615,016
    # bytes of parameters, of gradients and of DDP buckets, 1,230,064 of AdamW's state, and AllReduce
    # 615,016 bytes per step (to the byte); the test allows the 10%.
    log_dir, _ = synthetic_run
    result = run_cli(
        f"data.data_dir={synthetic_data_dir}", "data.val_size=200", "data.global_batch_size=64",
        "trainer.accelerator=cpu", "trainer.devices=2", "plan.device_memory_gib=0.01",
        module=PLAN, log_dir=tmp_path,
    )  # fmt: skip
    plan = plan_of(result, tmp_path)
    (run_dir,) = (log_dir / "runs").iterdir()
    report = json.loads((run_dir / "ddp.json").read_text())
    measured = report["memory"]["first_step"]["ranks"][0]
    planned = {key: plan[key] for key in ("parameters", "gradients", "ddp_buckets", "optimizer_state")}
    print(f"planned {planned}, AllReduce {plan['allreduce_bytes_per_step']}; measured {measured}, "
          f"AllReduce {report['allreduce_bytes_per_step']}")  # fmt: skip
    for key, value in planned.items():
        assert value == pytest.approx(measured[key], rel=0.1), key
    assert plan["allreduce_bytes_per_step"] == pytest.approx(report["allreduce_bytes_per_step"], rel=0.1)
    assert plan["allreduce_sent_bytes_per_rank"] == pytest.approx(report["allreduce_sent_bytes_per_rank"], rel=0.1)
    # 10 MiB of device memory: the fit row, and the total is within it.
    assert plan["device_memory"] == round(0.01 * 2**30) and plan["total"] < plan["device_memory"]
    assert "fits device (10.2 MiB)" in result.stdout


def test_a_global_batch_that_does_not_split_is_refused_as_the_training_refuses_it_before_torch(
    synthetic_data, tmp_path
):
    layout = ("trainer.accelerator=cpu", "trainer.devices=3", "data.global_batch_size=100")
    command = cli_command(*synthetic_data, *layout, log_dir=tmp_path / "plan", module=PLAN)
    command[1:1] = ["-X", "importtime"]  # Python lists every module it imports on stderr
    planned = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    trained = run_cli(*synthetic_data, *layout, log_dir=tmp_path / "train", timeout=120)
    imported = {line.rsplit("|", 1)[-1].strip() for line in planned.stderr.splitlines() if line.startswith("import ")}
    assert "hydra" in imported and "torch" not in imported
    errors = [line for line in planned.stderr.splitlines() if not line.startswith("import time:")]
    assert planned.returncode == trained.returncode == 1
    assert (
        errors
        == trained.stderr.splitlines()
        == [
            "Error: data.global_batch_size=100 does not split evenly over world_size=3 processes x "
            "trainer.accumulate_grad_batches=1: it must be a multiple of 3. Use data.global_batch_size=99 or 102."
        ]
    )
    assert not (tmp_path / "plan").exists() and not (tmp_path / "train").exists()


def test_a_layout_whose_rank_gets_no_training_batch_fails_in_the_planned_step(synthetic_data, tmp_path):
    # 1,000 training images over 1,024 processes: global rank 1,023's shard is empty, and the
    # one-cycle schedule over its zero steps cannot be built, as it would fail in that process.
    result = run_cli(
        *synthetic_data, "trainer.accelerator=gpu", "trainer.num_nodes=16", "trainer.devices=64",
        "data.global_batch_size=1024", "plan.global_rank=1023", module=PLAN, log_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        result.stdout.strip()
        .splitlines()[-1]
        .endswith(
            "UsageError: the planned layout does not start: global rank 1023 of world_size=1024 failed in its first "
            "training step: ValueError: Expected positive integer total_steps, but got 0"
        )
    )
    assert "Plan:" not in result.stdout
