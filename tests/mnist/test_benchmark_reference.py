"""The benchmarks' parts that need no training run: the hand-written reference builds the default
recipe's model with the same initial weights; the per-step and scaling harnesses refuse counts that
leave no timed step; the scaling harness's runs compose to the world size, hook and global batch
they name."""

import argparse
from pathlib import Path

import pytest
import torch
from ddp_engine.config.schema import register_configs
from helpers import CONFIG_DIR
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from benchmarks import per_step, scaling
from benchmarks.reference_ddp import make_model


def test_reference_builds_the_default_recipes_model_with_the_same_initial_weights():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config")
    torch.manual_seed(3)
    template = instantiate(cfg.model.net, 1, [28, 28], 10)  # MNIST's channels, size and classes
    torch.manual_seed(3)
    reference = make_model()
    template_params, reference_params = list(template.parameters()), list(reference.parameters())
    assert [p.shape for p in template_params] == [p.shape for p in reference_params]
    assert all(torch.equal(a, b) for a, b in zip(template_params, reference_params))
    template.eval(), reference.eval()
    images = torch.randn(5, 1, 28, 28)
    assert torch.equal(template(images), reference(images)), "same layers in the same order, dropout included"


@pytest.mark.parametrize(
    ("flag", "value", "least"), [("--steps", "0", 1), ("--warmup", "-1", 0), ("--repeats", "0", 1)]
)
def test_per_step_refuses_counts_that_leave_no_timed_step(flag, value, least, capsys):
    # A negative warm-up would index the timer's batch starts from the end: a wrong figure, not an error.
    with pytest.raises(SystemExit) as refused:
        per_step.main([flag, value])
    assert refused.value.code == 2
    assert f"{flag} {value}: at least {least}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "least"), [("--steps", "5", 10), ("--warmup", "-1", 0), ("--world-sizes", "0", 1)]
)
def test_scaling_refuses_counts_that_leave_no_timed_window(flag, value, least, capsys):
    with pytest.raises(SystemExit) as refused:
        scaling.main([flag, value])
    assert refused.value.code == 2
    assert f"{flag} {value}: at least {least}" in capsys.readouterr().err


def test_a_scaling_run_is_the_batchnorm_cnn_on_its_world_size_with_its_hook_and_per_device_batch():
    options = argparse.Namespace(gpu=False, per_device_batch=32, warmup=20, steps=100)
    command = scaling.command(4, "powersgd", Path("/tmp/run"), Path("/data"), options)
    assert command[1:3] == ["-m", "mnist_ddp.train"]
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[a for a in command[3:] if not a.startswith("hydra.")])
    assert (cfg.trainer.devices, cfg.strategy.comm_hook, cfg.data.global_batch_size) == (4, "powersgd", 128)
    assert cfg.trainer.limit_train_batches == 120 and cfg.trainer.log_every_n_steps == scaling.WINDOW
    assert cfg.model.net.batch_norm and cfg.model.net.channels == [32, 64], "the CNN with BatchNorm"
