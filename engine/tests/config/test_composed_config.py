"""The composed config and its schema, on the test tasks: typos and wrong types are refused while
composing, values that need objects built are refused before launch, each as one line naming the
key and what is allowed."""

import inspect
import re
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ProgressBar, Timer
from omegaconf import open_dict
from typing_extensions import override
from vision_task.task import TASK as VISION_TASK

from ddp_engine.api import register
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.compose import composed_jobs, trainer_arguments, with_trainer_arguments
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import UsageError
from ddp_engine.run.trainer import build_trainer
from sensor_task.regression import SensorDataModule
from sensor_task.task import TASK

CONFIG_DIR = TASK.configs()


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def use(task) -> None:
    """Register ``task`` in place of the regression, for a test of the image task's data options."""
    register(task)
    register_configs()


def test_default_config_composes_every_group():
    cfg = compose_config()
    assert set(cfg) >= {"data", "model", "trainer", "strategy", "logger", "callbacks", "paths", "seed"}
    assert cfg.data.global_batch_size == 48
    assert cfg.trainer.devices == "auto" and cfg.trainer.use_distributed_sampler is False
    assert cfg.strategy._target_ == "ddp_engine.distributed.strategy.CommHookDDPStrategy"
    # The task's objective (a regression's: the lowest validation MSE) chooses the best checkpoint.
    assert (cfg.callbacks.model_checkpoint.monitor, cfg.callbacks.model_checkpoint.mode) == ("val/mse", "min")


def test_the_engines_groups_come_after_the_projects_conf(tmp_path):
    # The engine ships its groups (ddp_engine/conf/, on Hydra's search path by its plugin); a YAML of
    # the same group and name in the project's conf/ replaces the engine's whole.
    import ddp_engine.conf

    engine_trainer = Path(ddp_engine.conf.__file__).parent / "trainer" / "default.yaml"
    assert not (CONFIG_DIR / "trainer").exists() and compose_config().trainer.max_epochs == 3
    shutil.copytree(CONFIG_DIR, tmp_path / "conf")
    (tmp_path / "conf" / "trainer").mkdir()
    own = engine_trainer.read_text().replace("max_epochs: 3\n", "max_epochs: 7\n")
    (tmp_path / "conf" / "trainer" / "default.yaml").write_text(own)
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        cfg = compose(config_name="config")
    assert cfg.trainer.max_epochs == 7 and cfg.strategy._target_.startswith("ddp_engine.")


@pytest.mark.parametrize(
    ("task", "override"),
    # A data key is typed where its data set has a schema: the image folder's (the regression's has none).
    [(VISION_TASK, "data.global_batch_size=big"), (TASK, "trainer.max_epochs=1.5"),
     (TASK, "trainer.sync_batchnorm=maybe")],
    ids=lambda value: getattr(value, "package", value),
)  # fmt: skip
def test_a_wrong_type_is_refused_naming_the_key_and_value(task, override):
    use(task)
    key, value = override.split("=")
    with pytest.raises(UsageError, match=f"^{key}: .*{value}"):
        composed_jobs("config", [override])


def test_the_trainer_arguments_read_from_lightnings_source_are_its_signatures():
    # Read without importing Lightning (command_line.trainer_arguments): they must be the real ones.
    assert trainer_arguments() == frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    assert {"max_time", "gradient_clip_val", "devices"} <= trainer_arguments()


@pytest.mark.parametrize(("option", "backend"), [("ddp", None), ("ddp_nccl", "nccl")])
def test_strategy_options_compose(option, backend):
    cfg = compose_config(f"strategy={option}")
    assert cfg.strategy.process_group_backend == backend
    assert cfg.strategy.timeout.seconds == 1800 and cfg.strategy.comm_hook.value == "none"


@pytest.mark.parametrize(("override", "allowed"), [("strategy.comm_hook=fp32", "none, fp16, bf16, powersgd"),
                                                   ("lr_scaling.rule=cubic", "none, linear, sqrt")])  # fmt: skip
def test_an_unknown_choice_is_refused_with_the_allowed_values(override, allowed):
    with pytest.raises(UsageError) as error:
        composed_jobs("config", [override])
    # OmegaConf's own sentence: the key, the value and each allowed value, not its words.
    key, value = override.split("=")
    message = str(error.value)
    assert message.startswith(f"{key}: ") and f"'{value}'" in message, message
    assert all(re.search(rf"\b{name}\b", message) for name in allowed.split(", ")), message


def test_enable_progress_bar_false_and_no_logger_leave_their_callbacks_out(tmp_path):
    # Lightning refuses a RichProgressBar callback beside enable_progress_bar=False, and a
    # LearningRateMonitor without a logger.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        overrides = [
            "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false",
            "logger=[]",
            f"paths.log_dir={tmp_path}",
        ]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    trainer, _ = build_trainer(cfg)
    assert trainer.progress_bar_callback is None
    assert not any(isinstance(callback, ProgressBar | LearningRateMonitor) for callback in trainer.callbacks)
    assert trainer.loggers == []


def lists_options(choice: str, *options: str) -> re.Pattern:
    """The refusal of ``choice``, an option its group lacks: the options it lists include ``options``."""
    group = choice.partition("=")[0]
    # One lookahead per option: from the list's start, any options, then this one, then ", " or ";".
    includes = "".join(rf"(?=(?:[\w-]+, )*{re.escape(option)}[,;])" for option in options)
    return re.compile(
        rf"{re.escape(choice)}: no such option \(available: {includes}[\w, -]+; yours go in conf/{group}/\)\.$"
    )


#: The regression's DataModule has no schema: its keys are its constructor's, up its bases.
SENSOR_KEYS = (
    "sensor_task.regression.SensorDataModule takes global_batch_size, num_workers, on_device, path, "
    "prepare_data_per_node, shuffle_seed)"
)

REFUSED = [
    ("data.global_batchsize=64", f"Unknown key data.global_batchsize ({SENSOR_KEYS}"),
    # OmegaConf's own words after the key (a pattern): only the key and the value are the engine's to assert.
    ("trainer.max_epochs=three", re.compile(r"trainer\.max_epochs: .*'three'")),
    ("trainer.devices=0", "trainer.devices=0 is not a positive process count on CPU."),
    ("data.global_batch_size=-64", "data.global_batch_size must be at least 1, got -64."),
    # The task's options among those listed: a project's own conf/model/*.yaml is listed too.
    ("model=transformer", lists_options("model=transformer", "regressor")),
    ("+data.shuffle=true", f"Unknown key data.shuffle ({SENSOR_KEYS}"),
    # Built once before launch as every process will: torch's own checks, as one line.
    # torch's own sentence between the key and the arguments (a pattern): only its value is asserted.
    (
        "model.optimizer.lr=-0.1",
        re.compile(r"model\.optimizer: .*-0\.1.* \(its arguments: model\.optimizer\.lr=-0\.1\)"),
    ),
    ("trainer.max_epochs=0", "trainer.max_epochs=0 trains nothing: set at least 1"),
    ("+foo=bar", "Unknown key foo (keys of the config: callbacks, ckpt_path, data, launcher,"),
    ("+trainer.devics=2", "Unknown key trainer.devics (trainer takes the arguments of lightning.pytorch.Trainer)."),
    # OmegaConf's own sentence (a pattern): the key, the value and every allowed value.
    ("strategy.comm_hook=fp32", re.compile(r"strategy\.comm_hook: .*'fp32'.*none, fp16, bf16, powersgd")),
]


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_preflight_names_the_problem_and_what_is_allowed(override, message, sensor_data):
    with pytest.raises(UsageError) as error:
        check_command_line("config", [*sensor_data, "trainer.accelerator=cpu", override])
    if isinstance(message, re.Pattern):
        assert message.match(str(error.value)), str(error.value)
    else:
        assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_an_unknown_key_of_a_data_set_with_a_schema_lists_the_schemas_keys():
    # The image folder data set's keys are typed by its schema (ddp_engine.vision.schema).
    use(VISION_TASK)
    with pytest.raises(UsageError) as error:
        check_command_line("config", ["data.root=/data/images", "trainer.accelerator=cpu", "data.global_batchsize=64"])
    assert str(error.value) == (
        "Unknown key data.global_batchsize (keys of data: _target_, cache_dir, channels, crop_padding, "
        "global_batch_size, horizontal_flip, image_size, in_memory_limit_mib, mean, num_workers, on_device, "
        "prepare_data_per_node, root, shuffle_seed, split_seed, std, val_size). Did you mean data.global_batch_size?"
    )


@pytest.mark.parametrize(("task", "option"), [(TASK, "sharded"), (VISION_TASK, "image")], ids=["sharded", "image"])
def test_a_data_option_that_builds_no_datamodule_is_refused_by_name(task, option):
    # The engine's data/sharded.yaml and the image data sets' image.yaml hold the keys the data sets
    # share, and name no _target_.
    use(task)
    with pytest.raises(UsageError) as error:
        check_command_line("config", [f"data={option}", "trainer.accelerator=cpu"])
    assert str(error.value).startswith(f"data={option} builds no DataModule (it names no _target_)"), str(error.value)


def test_a_bad_sweep_job_is_refused_before_the_sweep_starts(sensor_data):
    with pytest.raises(UsageError, match="data.global_batch_size=127 does not split evenly"):
        check_command_line("config", ["-m", *sensor_data, "trainer.accelerator=cpu", "data.global_batch_size=128,127"])


def test_the_engines_debug_presets_set_what_they_say_and_the_command_line_wins():
    # debug=fast_dev_run: Lightning's one-batch smoke run; debug=limit: 2 short epochs.
    assert compose_config("debug=fast_dev_run").trainer.fast_dev_run is True
    cfg = compose_config("debug=limit")
    limits = (cfg.trainer.max_epochs, cfg.trainer.limit_train_batches, cfg.trainer.limit_val_batches,
              cfg.trainer.limit_test_batches)  # fmt: skip
    assert limits == (2, 20, 5, 5)
    # The preset comes after the task's config.yaml, the command line after the preset.
    cfg = compose_config("debug=limit", "trainer.limit_train_batches=3")
    assert (cfg.trainer.max_epochs, cfg.trainer.limit_train_batches) == (2, 3)


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [("data.global_batchsize=64", "data.global_batch_size"), ("+trainer.devics=2", "trainer.devices"),
     ("+strategy.bucket_cap=1", "strategy.bucket_cap_mb")],
)  # fmt: skip
def test_an_unknown_key_names_the_nearest_known_one(override, suggestion, sensor_data):
    with pytest.raises(UsageError, match=f"Did you mean {suggestion}?"):
        check_command_line("config", [*sensor_data, "trainer.accelerator=cpu", override])


def test_open_nodes_and_trainer_arguments_outside_the_schema_are_accepted(tmp_path, sensor_data):
    # Open on purpose: a callback, an optimizer's keyword argument, an environment variable for the
    # workers. A Trainer argument the schema leaves out needs no "+" (written in by the preflight).
    overrides = ["trainer.accelerator=cpu", "+callbacks.stop._target_=lightning.pytorch.callbacks.EarlyStopping",
                 "+callbacks.stop.monitor=val/mae", "+model.optimizer.amsgrad=true", "+launcher.env.NCCL_DEBUG=INFO",
                 "trainer.max_time=00:00:10:00"]  # fmt: skip
    check_command_line("config", [*overrides, *sensor_data])
    assert with_trainer_arguments(overrides)[-1] == "+trainer.max_time=00:00:10:00"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*with_trainer_arguments(overrides), f"paths.log_dir={tmp_path}"],
                      return_hydra_config=True)  # fmt: skip
    cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    trainer, _ = build_trainer(cfg)
    (timer,) = (callback for callback in trainer.callbacks if isinstance(callback, Timer))
    assert timer._duration == 600, "max_time reached the Trainer"
    assert any(isinstance(callback, EarlyStopping) for callback in trainer.callbacks)


class EveryNthWindow(SensorDataModule):
    """A DataModule of one's own: the regression's windows, every ``every``-th of them. The
    engine's arguments (``global_batch_size``, ...) come through ``**kwargs``, as engine/docs/tasks.md
    writes a DataModule of one's own."""

    def __init__(self, every: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.every = every


class ShapeFromFile(SensorDataModule):
    """A DataModule of one's own that reads its windows' shape from its file when the model is built."""

    @override
    def model_arguments(self) -> dict:
        with np.load(self.path) as arrays:
            _, channels, length = arrays["train_x"].shape
        return {"net": {"channels": channels, "length": length, "outputs": 1}}


def test_a_datamodule_of_ones_own_gets_its_keys_checked_against_its_signature(tmp_path):
    # Its YAML, as engine/docs/tasks.md writes one, in a config folder Hydra also searches.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.yaml").write_text(
        f"defaults:\n  - sharded\n  - _self_\n_target_: {__name__}.EveryNthWindow\npath: /data/windows.npz\nevery: 3\n"
    )
    mine = ["data=mine", f"hydra.searchpath=[file://{tmp_path}]"]
    (job,) = composed_jobs("config", mine)  # its own key and the engine's, reached through **kwargs
    assert job.cfg.data.every == 3 and job.cfg.data.num_workers == 0
    with pytest.raises(UsageError) as typo:
        composed_jobs("config", [*mine, "+data.evry=2"])
    assert str(typo.value) == (
        f"Unknown key data.evry ({__name__}.EveryNthWindow takes every, global_batch_size, num_workers, on_device, "
        "path, prepare_data_per_node, shuffle_seed). Did you mean data.every?"
    )
    # Its model_arguments() raising what its reading raises: one line before launch, naming the class.
    (tmp_path / "data" / "missing.yaml").write_text(
        f"defaults:\n  - sharded\n  - _self_\n_target_: {__name__}.ShapeFromFile\npath: /nonexistent/windows.npz\n"
    )
    with pytest.raises(UsageError) as missing:
        check_command_line(
            "config", ["data=missing", f"hydra.searchpath=[file://{tmp_path}]", "trainer.accelerator=cpu"]
        )
    assert str(missing.value) == (
        "data: ShapeFromFile.model_arguments() failed: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/nonexistent/windows.npz'"
    )


def test_a_datamodule_of_ones_own_named_on_top_of_a_data_set_with_a_schema_is_refused():
    # The image folder data set's keys are its schema's: another class would get them, not its own.
    use(VISION_TASK)
    with pytest.raises(
        UsageError,
        match=rf"^data._target_={__name__}.EveryNthWindow: the keys of this data option are "
        r"ddp_engine.vision.folder.ImageFolderDataModule's. A DataModule of your own gets a YAML",
    ):
        composed_jobs("config", ["data.root=/data/images", f"data._target_={__name__}.EveryNthWindow"])
