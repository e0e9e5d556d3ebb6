"""Which ``data`` keys a resume in place may change, and which an evaluation may set, are what the
task's DataModule declares (``ShardedDataModule.loading_keys``: where the data is and how it loads),
not names the engine knows: a DataModule that declares none of its own (the regression's) keeps
every key of its own fixed, and one that declares its file's key lets it move."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ddp_engine.config.resume import resume_arguments
from ddp_engine.config.saved_run import apply_run_settings
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import ConfigValueError
from sensor_task.regression import SensorDataModule
from sensor_task.task import TASK


class MovableSensorDataModule(SensorDataModule):
    """The regression's data, whose file may move between a run and its resume or evaluation."""

    loading_keys = (*SensorDataModule.loading_keys, "path")


def saved_run(tmp_path, data_target: str = "sensor_task.regression.SensorDataModule"):
    """A training run's directory as ``python -m sensor_task.train`` leaves it (its composed config
    and overrides), with a checkpoint path in it."""
    register_configs()
    overrides = ["data.path=/data/windows.npz", f"data._target_={data_target}"]
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    (tmp_path / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), tmp_path / ".hydra" / "overrides.yaml")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch_000.ckpt").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(
    "key", ["data.path=/elsewhere/windows.npz", "data.global_batch_size=96", "data.shuffle_seed=3"]
)
def test_a_resume_that_changes_a_data_key_its_datamodule_does_not_declare_is_refused(tmp_path, key):
    run = saved_run(tmp_path)
    with pytest.raises(ConfigValueError) as refused:
        resume_arguments(run, [key])
    name, value = key.split("=")
    assert str(refused.value).startswith(f"{key}: the run in {run} has {name}=")
    assert "Leave " + name + " out to resume it" in str(refused.value)


def test_a_resume_may_change_the_engines_loading_keys_and_those_a_datamodule_declares(tmp_path):
    assert resume_arguments(saved_run(tmp_path / "a"), ["data.num_workers=2"])[-1] == "data.num_workers=2"
    run = saved_run(tmp_path / "b", f"{__name__}.MovableSensorDataModule")
    trusted = f"trusted_targets=[{__name__}]"  # a DataModule of this test module, not of the task's package
    assert resume_arguments(run, ["data.path=/moved/windows.npz", trusted])[-2:] == [
        "data.path=/moved/windows.npz",
        trusted,
    ]


def evaluated_data(run, *overrides: str):
    """The ``data`` node an evaluation of ``run``'s checkpoint uses, with ``overrides``."""
    overrides = (f"ckpt_path={run / 'checkpoints' / 'epoch_000.ckpt'}", *overrides)
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose("eval", overrides=list(overrides))
    apply_run_settings(cfg, overrides, "eval")
    return cfg.data


def test_an_evaluation_uses_the_runs_data_and_sets_only_its_datamodules_loading_keys(tmp_path):
    run = saved_run(tmp_path / "a")
    data = evaluated_data(run, "data.num_workers=1", "data.global_batch_size=16")
    assert (data.path, data.num_workers, data.global_batch_size) == ("/data/windows.npz", 1, 16)
    with pytest.raises(
        ConfigValueError, match=r"^data.path=/elsewhere.npz: the checkpoint's run trained on data.path="
    ):
        evaluated_data(run, "data.path=/elsewhere.npz")
    moved = evaluated_data(saved_run(tmp_path / "b", f"{__name__}.MovableSensorDataModule"), "data.path=/moved.npz",
                           f"trusted_targets=[{__name__}]")  # fmt: skip
    assert moved.path == "/moved.npz"
