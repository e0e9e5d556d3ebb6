"""What a run folder's saved files may build (:mod:`ddp_engine.config.trust`): the classes and
functions of the trusted modules and of the task's, found by the object a name reaches, not its text."""

import sys
from dataclasses import replace

import pytest

from ddp_engine.api import register
from ddp_engine.config import trust
from ddp_engine.config.trust import check_saved_config, check_saved_overrides, check_target
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


@pytest.mark.parametrize(("text", "refusal"), [
    ("model:\n  net: \"${oc.create:'{_target_: os.system, command: touch x}'}\"\n", "builds config from a string"),
    ("data: {x: 1}\nmodel: !!python/object/apply:os.system ['touch x']\n", "cannot be read as a run's config"),
    ("shared: &planted {_target_: os.system}\nmodel:\n  net: *planted\n", "_target_: os.system"),
    ("model:\n  <<: {_target_: os.system}\n", "_target_: os.system"),
    ("model:\n  net: {_target_: torch.nn.Linear, _target_: os.system}\n", "duplicate key"),
    ("model: ${planted}\nplanted:\n  _target_: os.system\n", "model: a run saves its model as a node of its own"),
    ("data: ${planted}\nplanted: {_target_: os.system}\n", "data: a run saves its data as a node of its own"),
    ("- model\n", "not a run's config"),
])  # fmt: skip
def test_a_saved_config_that_hides_a_target_is_refused_in_one_line(tmp_path, text, refusal):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigValueError, match=refusal) as refused:
        check_saved_config(path)
    assert str(refused.value).startswith(f"{path}") and "\n" not in str(refused.value)


@pytest.mark.parametrize(("text", "refusal"), [
    ("- \"model.net=${oc.create:'{_target_: os.system}'}\"\n", "builds config from a string"),
    ("model: resnet\n", "not a run's overrides"),
    ("- [model=resnet]\n", "not an override"),
    ("- 'model.net=[unclosed'\n", "not an override"),
    ("- hydra.job.env_set.LD_PRELOAD=./x.so\n", "never set Hydra's own keys"),
    ("- +launcher.env.PYTHONPATH=${hydra:runtime.output_dir}\n", "the environment of a run's processes"),
    ("- data=/tmp/planted\n", "never a path to a file"),
])  # fmt: skip
def test_saved_overrides_that_reach_past_the_project_are_refused_in_one_line(tmp_path, text, refusal):
    path = tmp_path / "overrides.yaml"
    path.write_text(text)
    with pytest.raises(ConfigValueError, match=refusal) as refused:
        check_saved_overrides(path)
    assert str(refused.value).startswith(f"{path}") and "\n" not in str(refused.value)


def test_only_torchvisions_data_sets_download_idx_files():
    """A data YAML's ``download`` (a run folder's too) names a class to import: torchvision's data sets only."""
    from ddp_engine.vision.idx import import_class

    imported = "this" in sys.modules
    with pytest.raises(ValueError, match="is not a class of torchvision.datasets"):
        import_class("this.Nothing")
    assert ("this" in sys.modules) == imported, "nothing imported"
    assert import_class("torchvision.datasets.MNIST").__name__ == "MNIST"
