"""Networks for image tasks: each maps ``(N, C, H, W)`` float32 images to ``(N, num_classes)`` logits.

Each takes the data's shape and class count as its first three arguments, ``in_channels`` (``C``),
``image_size`` (``(H, W)``) and ``num_classes``, which an image DataModule fills from its data set
(:meth:`ddp_engine.vision.spec.DataSpec.network_arguments`): they are never written in a YAML. The
rest are the network's own, set in the task's ``conf/model/*.yaml`` (``net._target_``).
"""

from collections.abc import Sequence

from torch import Tensor, nn

from ddp_engine.api import ConfigValueError


class MLP(nn.Module):
    """A multilayer perceptron on the flattened image: the model group's second option
    (``model=mlp``), which shows that swapping the network is a config change only.

    Shapes: input ``(N, C, H, W)`` float32 -> flatten ``(N, C * H * W)`` -> for each hidden width
    ``h``: linear ``(N, h)`` -> ReLU -> dropout -> linear -> logits ``(N, num_classes)``.

    Args:
        in_channels, image_size, num_classes: the data's (the module's docstring).
        hidden: widths of the hidden layers (default ``(256, 128)``).
        dropout: dropout probability after each hidden layer (default 0.2).
    """

    def __init__(
        self,
        in_channels: int,
        image_size: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (256, 128),
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        in_features = in_channels * image_size[0] * image_size[1]
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU(), nn.Dropout(dropout)]
            in_features = width
        self.layers = nn.Sequential(*layers, nn.Linear(in_features, num_classes))

    def forward(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` float32 images -> ``(N, num_classes)`` float32 logits."""
        return self.layers(images)


class BasicBlock(nn.Module):
    """A residual block of two 3x3 convs with BatchNorm, ``x + F(x)`` (He et al. 2016, "Deep Residual
    Learning for Image Recognition", figure 2); a strided 1x1 conv on the shortcut where the block
    changes the width or the resolution (their option B, projections; their CIFAR networks use
    option A, zero-padded identity shortcuts without parameters: B is the common choice in code, and
    adds 2.8 k parameters to the ResNet-8)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
        )  # fmt: skip
        self.shortcut = (
            nn.Identity()
            if stride == 1 and c_in == c_out
            else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
        )
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        """``(N, c_in, H, W)`` -> ``(N, c_out, H / stride, W / stride)``."""
        return self.relu(self.residual(x) + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet for 32x32 images such as CIFAR-10: the CIFAR variant of He et al. 2016
    (section 4.2): a 3x3 stem, three stages of :class:`BasicBlock` (the second and third halve the
    resolution and widen), global average pooling and a linear layer. ``blocks=(3, 3, 3)`` is their
    ResNet-20 (0.27 M parameters); the default ``(1, 1, 1)``, a ResNet-8, is sized for CPUs.

    Shapes: input ``(N, C, H, W)`` float32 -> stem ``(N, w1, H, W)`` -> stages ``(N, w1, H, W)``,
    ``(N, w2, H/2, W/2)``, ``(N, w3, H/4, W/4)`` -> average pool ``(N, w3)`` -> logits ``(N, num_classes)``.
    Global pooling makes it take any image size of at least 4x4.

    Args:
        in_channels, image_size, num_classes: the data's (the module's docstring); ``image_size`` is
            not needed by the layers and only checked.
        widths: channels ``(w1, w2, w3)`` of the three stages (default ``(16, 32, 64)``, the paper's).
        blocks: residual blocks per stage (default ``(1, 1, 1)``).

    Raises:
        ConfigValueError: for images smaller than 4x4 pixels.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: Sequence[int],
        num_classes: int,
        widths: Sequence[int] = (16, 32, 64),
        blocks: Sequence[int] = (1, 1, 1),
    ) -> None:
        super().__init__()
        if min(image_size) < 4:
            raise ConfigValueError(
                f"model=resnet takes images of at least 4x4 pixels; the data's are {image_size[0]}x{image_size[1]}."
            )
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
        ]  # fmt: skip
        c_in = widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks)):
            for index in range(count):
                layers.append(BasicBlock(c_in, width, stride=2 if stage > 0 and index == 0 else 1))
                c_in = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(c_in, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` float32 images -> ``(N, num_classes)`` float32 logits."""
        return self.classifier(self.features(images))
