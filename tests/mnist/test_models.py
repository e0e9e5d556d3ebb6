"""The template's network, the CNN, adapts to the data set's shape and classes, keeps the parameters
of earlier checkpoints, and refuses images too small for it. The image machinery's own networks
(MLP, ResNet) are the engine's tests (engine/tests/vision/test_networks.py)."""

import pytest
import torch
from ddp_engine.core.errors import ConfigValueError

from mnist_ddp.networks import CNN

#: ``(in_channels, image_size, num_classes)``: MNIST's, CIFAR's with 5 classes, and an odd one.
SHAPES = [(1, (28, 28), 10), (3, (32, 32), 5), (4, (20, 24), 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: f"{shape[0]}x{shape[1][0]}x{shape[1][1]}-{shape[2]}")
def test_the_cnn_maps_the_datas_images_to_its_classes(shape):
    channels, size, classes = shape
    net = CNN(channels, size, classes)
    assert net(torch.randn(5, channels, *size)).shape == (5, classes)


def test_the_cnn_on_mnist_keeps_the_parameters_of_earlier_checkpoints():
    # The layers and shapes the CNN had when it took (N, 1, 28, 28) only: old checkpoints still load.
    # A run's saved config names every argument of the CNN it trained: these were the template's first.
    old = CNN(1, (28, 28), 10, channels=(32, 64), hidden=128, dropout=0.5, batch_norm=False)
    shapes = {name: tuple(tensor.shape) for name, tensor in old.state_dict().items()}
    assert shapes == {
        "features.0.weight": (32, 1, 5, 5), "features.0.bias": (32,), "features.3.weight": (64, 32, 5, 5),
        "features.3.bias": (64,), "classifier.1.weight": (128, 1024), "classifier.1.bias": (128,),
        "classifier.4.weight": (10, 128), "classifier.4.bias": (10,),
    }  # fmt: skip


def test_images_too_small_for_the_cnn_are_refused_naming_the_fix():
    with pytest.raises(
        ConfigValueError, match=r"model=cnn takes images of at least 16x16 pixels; the data's are 12x12"
    ):
        CNN(1, (12, 12), 10)
