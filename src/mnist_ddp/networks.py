"""The task's network: a small CNN mapping ``(N, C, H, W)`` float32 images to ``(N, num_classes)`` logits.

Its first three arguments, ``in_channels``, ``image_size`` and ``num_classes``, come from the data set
(:meth:`ddp_engine.vision.spec.DataSpec.network_arguments`), never from a YAML; the rest are set in
``conf/model/cnn.yaml``. Another network (``model=mlp``, ``model=resnet``: :mod:`ddp_engine.vision.networks`,
or one of your own) takes the same three first arguments.
"""

from collections.abc import Sequence

from ddp_engine.api import ConfigValueError
from torch import Tensor, nn


class CNN(nn.Module):
    """Two 5x5 conv blocks and a two-layer classifier head (about 0.15 M parameters on MNIST by default).

    Shapes: input ``(N, C, H, W)`` float32 -> conv/[BatchNorm]/ReLU/max-pool ``(N, c1, (H - 4) // 2,
    (W - 4) // 2)`` -> conv/[BatchNorm]/ReLU/max-pool ``(N, c2, h, w)`` with ``h = ((H - 4) // 2 - 4) // 2``
    (4 for 28, 5 for 32) -> linear ``(N, hidden)`` -> dropout -> logits ``(N, num_classes)``.

    Args:
        in_channels: ``C``, channels of the input images (from the data).
        image_size: ``(H, W)`` of the input images in pixels (from the data); at least 16 each.
        num_classes: logits out (from the data).
        channels: output channels ``(c1, c2)`` of the two conv layers (default ``(24, 32)``).
        hidden: width of the hidden linear layer (default 256).
        dropout: dropout probability before the last layer (default 0: the net is deterministic,
            as the DDP equivalence checks need).
        batch_norm: BatchNorm2d after each conv (default False). Under DDP each process normalizes
            with its own micro-batch's statistics unless ``trainer.sync_batchnorm=true`` (GPUs only).

    Raises:
        ConfigValueError: for images smaller than 16x16, which two 5x5 convs and two poolings
            would reduce to nothing.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (24, 32),
        hidden: int = 256,
        dropout: float = 0.0,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        c1, c2 = channels
        # Each block: a 5x5 conv without padding (-4 pixels), then a 2x2 max-pool (halves, rounding down).
        height, width = (((size - 4) // 2 - 4) // 2 for size in image_size)
        if min(height, width) < 1:
            raise ConfigValueError(
                f"model=cnn takes images of at least 16x16 pixels; the data's are {image_size[0]}x{image_size[1]}. "
                "Resize them (data.image_size for a folder of images) or choose another model."
            )

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            norm = [nn.BatchNorm2d(c_out)] if batch_norm else []
            return [nn.Conv2d(c_in, c_out, kernel_size=5), *norm, nn.ReLU(), nn.MaxPool2d(2)]

        self.features = nn.Sequential(*block(in_channels, c1), *block(c1, c2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * height * width, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )  # fmt: skip

    def forward(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` float32 images -> ``(N, num_classes)`` float32 logits."""
        return self.classifier(self.features(images))
