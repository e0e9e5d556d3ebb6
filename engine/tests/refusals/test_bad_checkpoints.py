"""Bad checkpoints: a path that does not exist, a file cut short or corrupt, a file that would run
code when unpickled, a checkpoint of another model. Each is one error naming ``ckpt_path``; nothing
is loaded without ``weights_only``.

The checkpoint here is a real one (refusals/conftest.checkpoint): the image test task's module
trained for two steps by Lightning in this process and saved by ``trainer.save_checkpoint``.
"""

import argparse
import os
import pickle
import zipfile
from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from vision_task.task import TASK

from ddp_engine.api import register
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import CheckpointError, UsageError
from ddp_engine.distributed.checkpoint_io import check_checkpoint
from ddp_engine.models.build import build_model as build_model_for
from ddp_engine.vision.spec import CHECKPOINT_KEY, checkpoint_data_spec, read_data_spec


@pytest.fixture(autouse=True)
def test_task():
    """The image test task, registered for each test in place of the regression."""
    register(TASK)
    register_configs()
    return TASK


@pytest.fixture
def build_model(image_data):
    """``build_model(*overrides)``: the default model (for the image folder's shape) with ``overrides``."""

    def build(*overrides: str) -> L.LightningModule:
        with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*image_data, *overrides])
        return build_model_for(cfg.model, instantiate(cfg.data))

    return build


def test_a_checkpoint_of_this_model_passes(checkpoint, build_model):
    check_checkpoint(checkpoint, build_model())


def test_a_missing_checkpoint_is_named(tmp_path, build_model):
    with pytest.raises(CheckpointError, match=f"ckpt_path={tmp_path / 'gone.ckpt'}: no such file"):
        check_checkpoint(tmp_path / "gone.ckpt", build_model())


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "pickle overwritten"])
def test_a_truncated_or_corrupt_checkpoint_is_refused(checkpoint, tmp_path, damage, build_model):
    data = checkpoint.read_bytes()
    broken = tmp_path / "broken.ckpt"
    if damage == "pickle overwritten":
        # A whole zip archive whose pickle is noise: torch.load's weights-only unpickler refuses it,
        # and torch's scan for refused objects finds none.
        with zipfile.ZipFile(checkpoint) as original, zipfile.ZipFile(broken, "w") as copy:
            for entry in original.infolist():
                content = original.read(entry)
                copy.writestr(entry, os.urandom(len(content)) if entry.filename.endswith("/data.pkl") else content)
    else:
        broken.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    with pytest.raises(CheckpointError, match=f"ckpt_path={broken} cannot be read as a checkpoint") as error:
        check_checkpoint(broken, build_model())
    unpickled = "corrupt: its pickled data does not parse: " if damage == "pickle overwritten" else "corrupt: "
    assert f"checkpoint (truncated or {unpickled}" in str(error.value)


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(checkpoint, tmp_path, build_model):
    marker = tmp_path / "code-ran"
    state = torch.load(checkpoint, weights_only=True)
    malicious = tmp_path / "malicious.ckpt"
    torch.save({**state, "payload": RunsCode(marker), "config": argparse.Namespace(lr=0.1)}, malicious)
    with pytest.raises(CheckpointError, match="holds Python objects other than tensors and plain values") as error:
        check_checkpoint(malicious, build_model())
    # Every refused object, by module and name (os.system's module is posix, or nt on Windows).
    assert f"values (argparse.Namespace, {os.system.__module__}.system), which" in str(error.value)
    assert not marker.exists(), "loading ran the checkpoint's code"


def test_a_torch_that_cannot_name_refused_objects_gets_both_causes(checkpoint, tmp_path, monkeypatch, build_model):
    # torch before 2.6 has no get_unsafe_globals_in_checkpoint: the message claims neither cause.
    malicious = tmp_path / "malicious.ckpt"
    torch.save({**torch.load(checkpoint, weights_only=True), "payload": RunsCode(tmp_path / "ran")}, malicious)
    with pytest.raises(pickle.UnpicklingError) as refusal:
        torch.load(malicious, weights_only=True)
    monkeypatch.delattr(torch.serialization, "get_unsafe_globals_in_checkpoint")
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(malicious, build_model())
    message = str(error.value)
    assert f"ckpt_path={malicious} cannot be loaded with weights_only: it is corrupt, or it holds Python " in message
    assert f"torch.load says: {' '.join(str(refusal.value).split())} Use a checkpoint" in message, "torch's words"
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=resnet"], "missing keys (56): net.classifier.bias, net.classifier.weight, net.features.0.weight, "
         "net.features.1.bias, net.features.1.num_batches_tracked, net.features.1.running_mean, ...; unexpected "
         "keys (4): net.layers.1.bias, net.layers.1.weight, net.layers.4.bias, net.layers.4.weight."),
        (["model.net.hidden=[32]"], "other shapes (3): net.layers.1.bias (64,) in the checkpoint, (32,) in the "
         "model, net.layers.1.weight (64, 3072) in the checkpoint, (32, 3072) in the model, net.layers.4.weight "
         "(5, 64) in the checkpoint, (5, 32) in the model."),
    ],
)  # fmt: skip
def test_a_checkpoint_of_another_model_lists_the_mismatched_keys(checkpoint, overrides, message, build_model):
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(checkpoint, build_model(*overrides))
    assert f"ckpt_path={checkpoint} was saved from another model configuration: " in str(error.value)
    assert message in str(error.value)


class RunsCode:
    """Unpickling this runs ``os.system``: what a checkpoint from an untrusted source can hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_the_commands_check_the_checkpoint_with_the_command_line(checkpoint, tmp_path, image_data):
    # Before Hydra creates the run directory: the training command against the model it builds,
    # eval against the model of the checkpoint's own run (when it left its config).
    command = ["trainer.accelerator=cpu", f"ckpt_path={checkpoint}", *image_data]
    with pytest.raises(CheckpointError, match="was saved from another model configuration: missing keys"):
        check_command_line("config", [*command, "model=resnet"])
    check_command_line("config", command)
    check_command_line("eval", command)
    with pytest.raises(CheckpointError, match="no such file"):
        check_command_line("eval", ["trainer.accelerator=cpu", f"ckpt_path={tmp_path / 'none.ckpt'}", *image_data])
    with pytest.raises(CheckpointError, match=f"ckpt_path={tmp_path} is a folder. Pass a .ckpt file"):
        check_command_line("eval", ["trainer.accelerator=cpu", f"ckpt_path={tmp_path}", *image_data])
    # "last" resumes a training run in place; evaluation takes a file.
    with pytest.raises(UsageError, match="ckpt_path=last: evaluation needs a checkpoint file"):
        check_command_line("eval", ["trainer.accelerator=cpu", "ckpt_path=last", *image_data])


def test_a_checkpoint_without_a_data_spec_is_applied_with_its_runs_data_set(
    checkpoint, tmp_path, image_data, build_model
):
    # A checkpoint that keeps no data spec (its module records none): eval, predict and export take
    # the data set's from the config, for which the network's layers are the same.
    old = tmp_path / "old.ckpt"
    state = torch.load(checkpoint, weights_only=True)
    del state[CHECKPOINT_KEY]
    torch.save(state, old)
    assert read_data_spec(old) is None
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose(config_name="eval", overrides=[f"ckpt_path={old}", *image_data])
    assert checkpoint_data_spec(old, cfg.data) == read_data_spec(checkpoint) == instantiate(cfg.data).spec
    check_checkpoint(old, build_model())
    for command in ("eval", "export"):
        check_command_line(command, ["trainer.accelerator=cpu", f"ckpt_path={old}", *image_data][command == "export" :])
    predict = [
        "trainer.accelerator=cpu",
        "trainer.devices=1",
        f"ckpt_path={old}",
        *image_data,
        f"input={tmp_path / 'in.png'}",
    ]
    torchvision.io.write_png(torch.zeros(3, 32, 32, dtype=torch.uint8), str(tmp_path / "in.png"))
    check_command_line("predict", predict)
