"""The template's presets (conf/experiment/) set what they say, composed after the task's config
and before the command line. (The composed config and its schema, on the engine's test tasks:
engine/tests/config/test_composed_config.py.)"""

from ddp_engine.config.schema import register_configs
from helpers import CONFIG_DIR
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.nn import BatchNorm2d

register_configs()


def test_presets_set_what_they_say():
    # experiment=long: a wider CNN for longer; debug=fast_dev_run: Lightning's one-batch smoke run.
    # (What the presets do in a real run: run/test_mnist_accuracy.py.)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=long", "debug=fast_dev_run"])
    assert cfg.model.net.hidden == 256 and cfg.trainer.fast_dev_run is True
    # Presets in order, the command line last: debug=limit's 2 epochs win over experiment=long's
    # 15, the command line's global batch over the preset's.
    overrides = ["experiment=long", "debug=limit", "data.global_batch_size=32"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    assert (cfg.trainer.max_epochs, cfg.trainer.limit_train_batches, cfg.trainer.limit_test_batches) == (2, 20, 5)
    assert cfg.data.global_batch_size == 32 and cfg.model.optimizer.lr == 0.005
    assert any(isinstance(layer, BatchNorm2d) for layer in instantiate(cfg.model.net, 1, [28, 28], 10).modules()), (
        "experiment=long"
    )
    # experiment=fast names the default recipe: the same config as none.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        named, default = compose("config", overrides=["experiment=fast"]), compose("config")
    assert named.model == default.model and named.data == default.data and named.trainer == default.trainer
    # experiment=medium: the wider CNN, three epochs, without label smoothing.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=medium"])
    net = instantiate(cfg.model.net, 1, [28, 28], 10)
    assert [layer.out_channels for layer in net.modules() if hasattr(layer, "out_channels")] == [32, 64]
    assert (cfg.trainer.max_epochs, cfg.model.label_smoothing, cfg.model.optimizer.lr) == (3, 0.0, 0.003)
    # experiment=resnet: the ResNet for small natural images, with the seeded crop and flip.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["data=folder", "data.root=/x", "experiment=resnet"])
    assert cfg.model.net._target_ == "ddp_engine.vision.networks.ResNet" and cfg.model.optimizer.nesterov is True
    assert (cfg.data.crop_padding, cfg.data.horizontal_flip, cfg.trainer.max_epochs) == (4, True, 15)
