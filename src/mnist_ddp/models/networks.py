"""The networks: each maps ``(N, 1, 28, 28)`` float32 images to ``(N, NUM_CLASSES)`` logits.

Add yours here (or in a module of your own) and name it in a ``conf/model/*.yaml``'s ``net._target_``.
"""

from collections.abc import Sequence

from torch import Tensor, nn

from mnist_ddp.data.idx import NUM_CLASSES


class CNN(nn.Module):
    """Two 5x5 conv blocks and a two-layer classifier head (about 0.18 M parameters by default).

    Shapes: input ``(N, 1, 28, 28)`` float32 -> conv/[BatchNorm]/ReLU/max-pool ``(N, c1, 12, 12)`` ->
    conv/[BatchNorm]/ReLU/max-pool ``(N, c2, 4, 4)`` -> linear ``(N, hidden)`` -> dropout -> logits ``(N, 10)``.

    Args:
        channels: output channels ``(c1, c2)`` of the two conv layers (default ``(32, 64)``).
        hidden: width of the hidden linear layer (default 128).
        dropout: dropout probability before the last layer (default 0.5; 0 makes the net
            deterministic, as the DDP equivalence checks need).
        batch_norm: BatchNorm2d after each conv (default False). Under DDP each process normalizes
            with its own micro-batch's statistics unless ``trainer.sync_batchnorm=true`` (GPUs only).
    """

    def __init__(
        self, channels: Sequence[int] = (32, 64), hidden: int = 128, dropout: float = 0.5, batch_norm: bool = False
    ) -> None:
        super().__init__()
        c1, c2 = channels

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            norm = [nn.BatchNorm2d(c_out)] if batch_norm else []
            return [nn.Conv2d(c_in, c_out, kernel_size=5), *norm, nn.ReLU(), nn.MaxPool2d(2)]

        self.features = nn.Sequential(*block(1, c1), *block(c1, c2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * 4 * 4, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, NUM_CLASSES),
        )  # fmt: skip

    def forward(self, images: Tensor) -> Tensor:
        """``(N, 1, 28, 28)`` float32 images -> ``(N, 10)`` float32 logits."""
        return self.classifier(self.features(images))


class MLP(nn.Module):
    """A multilayer perceptron on the flattened image: the model group's second option
    (``model=mlp``), which shows that swapping the network is a config change only.

    Shapes: input ``(N, 1, 28, 28)`` float32 -> flatten ``(N, 784)`` -> for each hidden width
    ``h``: linear ``(N, h)`` -> ReLU -> dropout -> linear -> logits ``(N, 10)``.

    Args:
        hidden: widths of the hidden layers (default ``(256, 128)``).
        dropout: dropout probability after each hidden layer (default 0.2).
        in_features: pixels per image (default 28 * 28).
    """

    def __init__(self, hidden: Sequence[int] = (256, 128), dropout: float = 0.2, in_features: int = 28 * 28) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU(), nn.Dropout(dropout)]
            in_features = width
        self.layers = nn.Sequential(*layers, nn.Linear(in_features, NUM_CLASSES))

    def forward(self, images: Tensor) -> Tensor:
        """``(N, 1, 28, 28)`` float32 images -> ``(N, 10)`` float32 logits."""
        return self.layers(images)
