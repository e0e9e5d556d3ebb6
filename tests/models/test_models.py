"""The networks adapt to the data set's shape and classes, and swapping the network is a config change
only: ``model=mlp`` trains with the same DataModule, LightningModule and Trainer as the CNN, and
learns (one process, in this process: the DDP paths are the same for every network and are tested
with the CNN)."""

import pytest
import torch
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.models.build import build_model
from ddp_engine.vision.networks import MLP, ResNet
from ddp_engine.vision.spec import DataSpec
from helpers import CONFIG_DIR, IDX_DATA, fit_and_test_in_process
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mnist_ddp.networks import CNN

register_configs()

#: ``(in_channels, image_size, num_classes)``: MNIST's, CIFAR's with 5 classes, and an odd one.
SHAPES = [(1, (28, 28), 10), (3, (32, 32), 5), (4, (20, 24), 3)]


@pytest.mark.parametrize("network", [CNN, MLP, ResNet], ids=lambda network: network.__name__)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: f"{shape[0]}x{shape[1][0]}x{shape[1][1]}-{shape[2]}")
def test_every_network_maps_the_datas_images_to_its_classes(network, shape):
    channels, size, classes = shape
    net = network(channels, size, classes)
    assert net(torch.randn(5, channels, *size)).shape == (5, classes)


def test_the_cnn_on_mnist_keeps_the_parameters_of_earlier_checkpoints():
    # The layers and shapes the CNN had when it took (N, 1, 28, 28) only: old checkpoints still load.
    shapes = {name: tuple(tensor.shape) for name, tensor in CNN(1, (28, 28), 10).state_dict().items()}
    assert shapes == {
        "features.0.weight": (32, 1, 5, 5), "features.0.bias": (32,), "features.3.weight": (64, 32, 5, 5),
        "features.3.bias": (64,), "classifier.1.weight": (128, 1024), "classifier.1.bias": (128,),
        "classifier.4.weight": (10, 128), "classifier.4.bias": (10,),
    }  # fmt: skip
    net = MLP(1, (28, 28), 10, hidden=(64, 32), dropout=0.0)
    assert [layer.out_features for layer in net.modules() if isinstance(layer, torch.nn.Linear)] == [64, 32, 10]


def test_images_too_small_for_a_network_are_refused_naming_the_fix():
    with pytest.raises(
        ConfigValueError, match=r"model=cnn takes images of at least 16x16 pixels; the data's are 12x12"
    ):
        CNN(1, (12, 12), 10)
    with pytest.raises(ConfigValueError, match=r"model=resnet takes images of at least 4x4 pixels"):
        ResNet(3, (2, 2), 10)


def test_a_network_without_the_datas_arguments_is_refused_by_name():
    spec = DataSpec(("a", "b"), (1, 8, 8), (0.5,), (0.25,))
    model = OmegaConf.create({
        "_target_": "mnist_ddp.model.MNISTClassifier", "net": {"_target_": "torch.nn.Flatten"},
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}, "scheduler": None,
    })  # fmt: skip
    refused = r"model.net: torch.nn.Flatten does not take in_channels. It is built for the data with in_channels, "
    with pytest.raises(ConfigValueError, match=refused + r"image_size, num_classes as arguments \(DataSpec"):
        build_model(model, spec)


def test_model_mlp_trains_through_the_same_datamodule_and_module(synthetic_data_dir, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            IDX_DATA, "model=mlp", f"data.data_dir={synthetic_data_dir}", "data.val_size=200",
            "data.global_batch_size=32",
        ])  # fmt: skip
    assert cfg.model.net._target_ == "ddp_engine.vision.networks.MLP"
    _, test = fit_and_test_in_process(cfg, tmp_path)
    # The synthetic digits are bright patches whose position is the class; 2% of test labels are noise.
    assert test["test/acc"] >= 0.9, test
