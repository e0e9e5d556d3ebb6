"""The image networks (``ddp_engine.vision.networks``) adapt to the data set's shape and classes, and
swapping the network is a config change only: ``model=mlp`` trains with the same DataModule,
LightningModule and Trainer as ``model=resnet``, and learns (one process, in this process: the DDP
paths are the same for every network and are tested through the commands)."""

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.models.build import build_model
from ddp_engine.vision.networks import MLP, ResNet
from ddp_engine.vision.spec import DataSpec

#: ``(in_channels, image_size, num_classes)``: MNIST's, CIFAR's with 5 classes, and an odd one.
SHAPES = [(1, (28, 28), 10), (3, (32, 32), 5), (4, (20, 24), 3)]


@pytest.mark.parametrize("network", [MLP, ResNet], ids=lambda network: network.__name__)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: f"{shape[0]}x{shape[1][0]}x{shape[1][1]}-{shape[2]}")
def test_every_network_maps_the_datas_images_to_its_classes(network, shape):
    channels, size, classes = shape
    net = network(channels, size, classes)
    assert net(torch.randn(5, channels, *size)).shape == (5, classes)


def test_the_mlp_has_the_hidden_layers_it_is_given():
    net = MLP(1, (28, 28), 10, hidden=(64, 32), dropout=0.0)
    assert [layer.out_features for layer in net.modules() if isinstance(layer, torch.nn.Linear)] == [64, 32, 10]


def test_images_too_small_for_a_network_are_refused_naming_the_fix():
    with pytest.raises(ConfigValueError, match=r"model=resnet takes images of at least 4x4 pixels"):
        ResNet(3, (2, 2), 10)


def test_a_network_without_the_datas_arguments_is_refused_by_name():
    spec = DataSpec(("a", "b"), (1, 8, 8), (0.5,), (0.25,))
    model = OmegaConf.create({
        "_target_": "vision_task.classifier.ImageClassifier", "net": {"_target_": "torch.nn.Flatten"},
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}, "scheduler": None,
    })  # fmt: skip
    refused = r"model.net: torch.nn.Flatten does not take in_channels. It is built for the data with in_channels, "
    with pytest.raises(ConfigValueError, match=refused + r"image_size, num_classes as arguments \(DataSpec"):
        build_model(model, spec)


def fit_and_test_in_process(cfg, root_dir, max_epochs: int) -> dict:
    """Build ``cfg``'s model and DataModule as the entry point does (Hydra ``instantiate``), train
    them in this process (one CPU device, no logger or checkpoints) and test them: the test metrics."""
    L.seed_everything(0)
    datamodule = instantiate(cfg.data)
    model = build_model(cfg.model, datamodule.spec)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        default_root_dir=root_dir,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    (test,) = trainer.test(model, datamodule=datamodule, verbose=False)
    return test


def test_model_mlp_trains_through_the_same_datamodule_and_module(test_task, image_folder, tmp_path):
    with initialize_config_dir(config_dir=str(test_task.configs()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "data=folder", "model=mlp", f"data.root={image_folder}", f"data.cache_dir={tmp_path / 'cache'}",
            "data.global_batch_size=32",
        ])  # fmt: skip
    assert cfg.model.net._target_ == "ddp_engine.vision.networks.MLP"
    assert cfg.model._target_ == "vision_task.classifier.ImageClassifier"
    test = fit_and_test_in_process(cfg, tmp_path, max_epochs=3)
    # The classes are colours; 5% of the test images lie in another class's folder.
    assert test["test/acc"] >= 0.9, test
