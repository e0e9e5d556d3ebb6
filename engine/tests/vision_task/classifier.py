"""The test task's LightningModule, and the synthetic image data sets it learns.

:class:`ImageClassifier` is what the image machinery asks of a classifier: ``forward`` gives
``(N, num_classes)`` logits of ``(N, C, H, W)`` normalized images, ``test_step`` returns the
predicted classes (the misclassification figures), ``predict_step`` the class probabilities
(``predict``), and every checkpoint keeps the data spec (``predict`` and ``export`` read it).
"""

from collections.abc import Mapping
from pathlib import Path

import lightning as L
import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from ddp_engine.api import build_lr_scheduler, needs_total_steps
from ddp_engine.vision.spec import CHECKPOINT_KEY, DataSpec


class ImageClassifier(L.LightningModule):
    """Trains ``net`` with cross-entropy; logs ``train/loss`` every step and ``val/loss``,
    ``val/acc``, ``test/loss``, ``test/acc`` per epoch over every sample of the split.

    Args:
        net: ``(N, C, H, W)`` images -> ``(N, num_classes)`` logits, built for the data.
        optimizer: a ``torch.optim`` partial missing only the parameters.
        scheduler: a ``torch.optim.lr_scheduler`` partial missing only the optimizer, or None.
        data_spec: the data's :class:`~ddp_engine.vision.spec.DataSpec` (or its dict).
    """

    def __init__(self, net: nn.Module, optimizer, scheduler=None, *, data_spec: DataSpec | Mapping) -> None:
        super().__init__()
        self.net, self.optimizer_factory, self.scheduler_factory = net, optimizer, scheduler
        self.data_spec = data_spec if isinstance(data_spec, DataSpec) else DataSpec.from_dict(data_spec)
        classes = self.data_spec.num_classes
        self.metrics = nn.ModuleDict({f"{split}_acc": MulticlassAccuracy(classes, average="micro")
                                      for split in ("val", "test")})  # fmt: skip
        self.losses = nn.ModuleDict({f"{split}_loss": MeanMetric() for split in ("val", "test")})

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch[0]).softmax(dim=1)

    def _evaluate(self, batch: tuple[Tensor, Tensor], split: str) -> Tensor:
        images, labels = batch
        logits = self(images)
        self.losses[f"{split}_loss"].update(F.cross_entropy(logits, labels), weight=labels.numel())
        self.metrics[f"{split}_acc"].update(logits, labels)
        self.log(f"{split}/loss", self.losses[f"{split}_loss"], on_step=False, on_epoch=True)
        self.log(f"{split}/acc", self.metrics[f"{split}_acc"], on_step=False, on_epoch=True)
        return logits.argmax(dim=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = self.data_spec.to_dict()

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(params=self.parameters())
        total_steps = self.trainer.estimated_stepping_batches if needs_total_steps(self.scheduler_factory) else None
        schedule = {"scheduler": build_lr_scheduler(self.scheduler_factory, optimizer, total_steps), "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}


#: The colours of the synthetic folder data set's classes (RGB), one class each.
COLOURS = {"red": (230, 40, 40), "green": (40, 210, 60), "blue": (50, 70, 230), "yellow": (230, 220, 50),
           "magenta": (220, 50, 210)}  # fmt: skip


def make_image_folder(
    root: Path,
    counts: dict[str, int] | None = None,
    size: tuple[int, int] = (32, 32),
    label_noise: float = 0.0,
    seed: int = 0,
) -> Path:
    """A folder data set of RGB PNGs (``root/<split>/<class>/<n>.png``) that a small network learns
    in a few steps.

    Each image is dark noise plus a 9x9 patch of its class's colour (:data:`COLOURS`: five classes)
    at a random place, so that a random crop or a flip keeps its class. ``counts``: images per
    class of each split (default 48 for ``train``, 14 for ``test``). A fraction ``label_noise`` of
    each split's images is put into another class's folder, which keeps the accuracy below 100%
    (so that counting a sample twice would change it). Returns ``root``.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    for split, per_class in (counts or {"train": 48, "test": 14}).items():
        for index in range(per_class * len(names)):
            label = index % len(names)
            pixels = rng.integers(0, 50, (*size, 3))
            top, left = rng.integers(0, size[0] - 9), rng.integers(0, size[1] - 9)
            pixels[top : top + 9, left : left + 9] = np.clip(COLOURS[names[label]] + rng.integers(-25, 26, 3), 0, 255)
            folder = names[rng.integers(len(names))] if rng.random() < label_noise else names[label]
            (root / split / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8), "RGB").save(root / split / folder / f"{split}{index:04d}.png")
    return root
