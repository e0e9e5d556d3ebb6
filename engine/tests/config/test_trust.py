"""What a run folder's saved files may build (:mod:`ddp_engine.config.trust`): the classes and
functions of the trusted modules and of the task's, found by the object a name reaches, not its text."""

from dataclasses import replace

import pytest

from ddp_engine.api import register
from ddp_engine.config import trust
from ddp_engine.config.trust import check_target
from ddp_engine.core.errors import ConfigValueError


@pytest.mark.parametrize("target", [
    "torch.optim.AdamW", "torch.optim.lr_scheduler.OneCycleLR", "torch.nn.Linear", "datetime.timedelta",
    "lightning.pytorch.Trainer", "lightning.pytorch.callbacks.ModelCheckpoint", "torchvision.transforms.v2.Resize",
    "torchmetrics.classification.MulticlassAccuracy", "ddp_engine.vision.networks.ResNet",
    "sensor_task.regression.SensorNet",
])  # fmt: skip
def test_the_libraries_and_the_tasks_classes_are_trusted(target):
    check_target(target, "config.yaml:1")


@pytest.mark.parametrize("target", [
    "torch.load", "torch.nn.functional.torch.load", "torch.nn.Module.__subclasses__", "os.system",
    "ddp_engine.launch.supervisor.supervise", "torchmetrics.text.BERTScore", "${oc.env:TARGET}", "builtins.eval",
])  # fmt: skip
def test_what_loads_files_or_runs_code_is_not(target):
    with pytest.raises(ConfigValueError, match=r"config.yaml:1: _target_: "):
        check_target(target, "config.yaml:1")


def test_a_task_names_the_modules_of_other_libraries_it_builds_from(monkeypatch, test_task):
    with pytest.raises(ConfigValueError):
        check_target("json.JSONDecoder", "config.yaml:1")
    register(replace(test_task, trusted_modules=("json",)))
    check_target("json.JSONDecoder", "config.yaml:1")
    assert "json" not in trust.TRUSTED_MODULES
