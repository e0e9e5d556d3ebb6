"""The composed config and its schema: typos and wrong types are refused while composing."""

import inspect
import re
import shutil
from pathlib import Path

import lightning as L
import pytest
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.compose import composed_jobs, trainer_arguments, with_trainer_arguments
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import UsageError
from ddp_engine.run.trainer import build_trainer
from helpers import CONFIG_DIR, IDX_DATA, with_template_task
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ProgressBar, Timer
from omegaconf import open_dict
from torch.nn import BatchNorm2d

register_configs()


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=with_template_task(overrides))


def test_default_config_composes_every_group():
    cfg = compose_config()
    assert set(cfg) >= {"data", "model", "trainer", "strategy", "logger", "callbacks", "paths", "seed"}
    assert cfg.data.global_batch_size == 128
    assert cfg.trainer.devices == "auto" and cfg.trainer.use_distributed_sampler is False
    assert cfg.strategy._target_ == "ddp_engine.distributed.strategy.CommHookDDPStrategy"
    assert cfg.callbacks.model_checkpoint.monitor == "val/acc"


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
        cfg = compose(config_name="config", overrides=[IDX_DATA])
    assert cfg.trainer.max_epochs == 7 and cfg.strategy._target_.startswith("ddp_engine.")


@pytest.mark.parametrize(
    "override", ["data.global_batch_size=big", "trainer.max_epochs=1.5", "trainer.sync_batchnorm=maybe"]
)
def test_a_wrong_type_is_refused_naming_the_key_and_value(override):
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


REFUSED = [
    (
        "data.global_batchsize=64",
        "Unknown key data.global_batchsize (keys of data: _target_, class_names, crop_padding",
    ),
    # OmegaConf's own words after the key (a pattern): only the key and the value are the template's to assert.
    ("trainer.max_epochs=three", re.compile(r"trainer\.max_epochs: .*'three'")),
    ("trainer.devices=0", "trainer.devices=0 is not a positive process count on CPU."),
    ("data.global_batch_size=-64", "data.global_batch_size must be at least 1, got -64."),
    # The template's options among those listed: a project's own conf/model/*.yaml is listed too.
    ("model=transformer", lists_options("model=transformer", "cnn", "mlp", "resnet")),
    ("+data.shuffle=true", "Unknown key data.shuffle (keys of data: _target_"),
    # Built once before launch as every process will: torch's own checks, as one line.
    # torch's own sentence between the key and the arguments (a pattern): only its value is asserted.
    (
        "model.optimizer.lr=-0.1",
        re.compile(r"model\.optimizer: .*-0\.1.* \(its arguments: model\.optimizer\.lr=-0\.1,"),
    ),
    ("trainer.max_epochs=0", "trainer.max_epochs=0 trains nothing: set at least 1"),
    ("+foo=bar", "Unknown key foo (keys of the config: callbacks, ckpt_path, data, launcher,"),
    ("+trainer.devics=2", "Unknown key trainer.devics (trainer takes the arguments of lightning.pytorch.Trainer)."),
    # OmegaConf's own sentence (a pattern): the key, the value and every allowed value.
    ("strategy.comm_hook=fp32", re.compile(r"strategy\.comm_hook: .*'fp32'.*none, fp16, bf16, powersgd")),
]


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_preflight_names_the_problem_and_what_is_allowed(override, message):
    with pytest.raises(UsageError) as error:
        check_command_line("config", [IDX_DATA, "trainer.accelerator=cpu", override])
    if isinstance(message, re.Pattern):
        assert message.match(str(error.value)), str(error.value)
    else:
        assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("option", ["sharded", "image"])
def test_a_data_option_that_builds_no_datamodule_is_refused_by_name(option):
    # The engine's data/sharded.yaml and the image data sets' image.yaml hold the keys the data sets
    # share, and name no _target_.
    with pytest.raises(UsageError) as error:
        check_command_line("config", [f"data={option}", "trainer.accelerator=cpu"])
    assert str(error.value).startswith(f"data={option} builds no DataModule (it names no _target_)"), str(error.value)


def test_a_bad_sweep_job_is_refused_before_the_sweep_starts():
    with pytest.raises(UsageError, match="data.global_batch_size=127 does not split evenly"):
        check_command_line("config", ["-m", "trainer.accelerator=cpu", "data.global_batch_size=128,127"])


def test_presets_set_what_they_say():
    # experiment=long: a wider CNN for longer; debug=fast_dev_run: Lightning's one-batch smoke run.
    # (What the presets do in a real run: config/test_hydra_cli.py, run/test_mnist_accuracy.py.)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=long", "debug=fast_dev_run"])
    assert cfg.model.net.hidden == 256 and cfg.trainer.fast_dev_run is True
    # Presets in order, the command line last: debug=limit's 2 epochs win over experiment=fast's
    # one, the command line's global batch over the preset's.
    overrides = ["experiment=fast", "debug=limit", "data.global_batch_size=32"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    assert (cfg.trainer.max_epochs, cfg.trainer.limit_train_batches, cfg.trainer.limit_test_batches) == (2, 20, 5)
    assert cfg.data.global_batch_size == 32 and cfg.model.optimizer.lr == 0.01
    assert any(isinstance(layer, BatchNorm2d) for layer in instantiate(cfg.model.net, 1, [28, 28], 10).modules()), (
        "experiment=fast"
    )
    # experiment=resnet: the ResNet for small natural images, with the seeded crop and flip.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["data=folder", "data.root=/x", "experiment=resnet"])
    assert cfg.model.net._target_ == "ddp_engine.vision.networks.ResNet" and cfg.model.optimizer.nesterov is True
    assert (cfg.data.crop_padding, cfg.data.horizontal_flip, cfg.trainer.max_epochs) == (4, True, 15)


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [("data.global_batchsize=64", "data.global_batch_size"), ("+trainer.devics=2", "trainer.devices"),
     ("+strategy.bucket_cap=1", "strategy.bucket_cap_mb")],
)  # fmt: skip
def test_an_unknown_key_names_the_nearest_known_one(override, suggestion):
    with pytest.raises(UsageError, match=f"Did you mean {suggestion}?"):
        check_command_line("config", [IDX_DATA, "trainer.accelerator=cpu", override])


def test_open_nodes_and_trainer_arguments_outside_the_schema_are_accepted(tmp_path, synthetic_data):
    # Open on purpose: a callback, an optimizer's keyword argument, an environment variable for the
    # workers. A Trainer argument the schema leaves out needs no "+" (written in by the preflight).
    overrides = ["trainer.accelerator=cpu", "+callbacks.stop._target_=lightning.pytorch.callbacks.EarlyStopping",
                 "+callbacks.stop.monitor=val/loss", "+model.optimizer.amsgrad=true", "+launcher.env.NCCL_DEBUG=INFO",
                 "trainer.max_time=00:00:10:00"]  # fmt: skip
    check_command_line("config", [*overrides, *synthetic_data])
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


def test_a_datamodule_of_ones_own_gets_its_keys_checked_against_its_signature(tmp_path):
    # Its YAML, as docs/customizing.md writes one, in a config folder Hydra also searches.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.yaml").write_text(
        "defaults:\n  - image\n  - _self_\n_target_: custom_datamodules.TensorDataModule\ntrain_size: 30\n"
    )
    mine = ["data=mine", f"hydra.searchpath=[file://{tmp_path}]"]
    (job,) = composed_jobs("config", mine)  # its own key and the base class's, reached through **kwargs
    assert job.cfg.data.train_size == 30 and job.cfg.data.crop_padding == 0
    with pytest.raises(UsageError) as typo:
        composed_jobs("config", [*mine, "+data.train_sise=3"])
    assert str(typo.value) == (
        "Unknown key data.train_sise (custom_datamodules.TensorDataModule takes crop_padding, global_batch_size, "
        "horizontal_flip, num_workers, on_device, prepare_data_per_node, seed, shuffle_seed, test_size, train_size, "
        "val_size). Did you mean data.train_size?"
    )
    # Its describe() raising what its reading raises: one line before launch, naming the class.
    (tmp_path / "data" / "missing.yaml").write_text(
        "defaults:\n  - image\n  - _self_\n_target_: custom_datamodules.MissingFile\n"
    )
    with pytest.raises(UsageError) as missing:
        check_command_line(
            "config", ["data=missing", f"hydra.searchpath=[file://{tmp_path}]", "trainer.accelerator=cpu"]
        )
    assert str(missing.value) == (
        "data: MissingFile.describe() failed: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/nonexistent/images.npz'"
    )
    # Its class named on top of the MNIST data set's keys: refused, pointing to a YAML of its own.
    with pytest.raises(
        UsageError,
        match=r"^data._target_=custom_datamodules.TensorDataModule: the keys of this data "
        r"option are mnist_ddp.data.MNISTDataModule's. A DataModule of your own gets a YAML",
    ):
        composed_jobs("config", [IDX_DATA, "data._target_=custom_datamodules.TensorDataModule"])
