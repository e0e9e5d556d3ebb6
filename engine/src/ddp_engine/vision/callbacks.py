"""The figures of an image classification task: what the network is fed (:class:`InputBatchFigure`)
and where it fails (:class:`MisclassificationReport`), written to every tracker that takes images."""

import lightning as L
import torch
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from ddp_engine.api import log_figure, media_loggers
from ddp_engine.vision.figures import confusion_matrix_figure, image_grid


class MisclassificationReport(L.Callback):
    """At the end of each test, images of where the model fails, over the whole test set.

    Every rank contributes its shard; global rank 0 writes, at the current optimizer step:

    - ``test/confusion_matrix``: counts of (true, predicted) class pairs, rows true and columns
      predicted. torchmetrics sums the matrix over all ranks, and the test sampler gives each
      image to exactly one rank, so the counts add up to the test set size for any world_size.
    - ``test/misclassified``: up to ``max_images`` misclassified test images, each titled
      ``true → predicted``: the first ``max_images`` of each rank's shard, gathered in rank order.
      Not written when every test image is classified correctly.

    ``test_step`` must return the predicted classes of its batch, ``(N,)`` int64, and batches
    must be ``(images (N, C, H, W), labels (N,))``. The class count, class names, image shape and
    normalization are the DataModule's (its ``spec``: :class:`~ddp_engine.vision.spec.DataSpec`).

    Args:
        max_images: most misclassified images shown (default 64).
    """

    def __init__(self, max_images: int = 64) -> None:
        self.max_images = max_images
        self._confusion: MulticlassConfusionMatrix | None = None
        self._wrong: list[tuple[Tensor, Tensor, Tensor]] = []  # (images, labels, preds) per batch

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._confusion = MulticlassConfusionMatrix(trainer.datamodule.spec.num_classes).to(pl_module.device)
        self._wrong = []

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Tensor, batch, batch_idx, dataloader_idx=0
    ) -> None:
        images, labels = batch
        self._confusion.update(outputs, labels)
        kept = sum(len(batch_labels) for _, batch_labels, _ in self._wrong)
        wrong = (outputs != labels).nonzero().flatten()[: self.max_images - kept]
        if len(wrong):
            self._wrong.append((images[wrong], labels[wrong], outputs[wrong]))

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Both are collectives over the process group: every rank runs them, rank 0 writes.
        matrix = self._confusion.compute()
        images, labels, preds = self._gather_wrong(trainer, pl_module)
        if not trainer.is_global_zero or not media_loggers(trainer):
            return
        spec = trainer.datamodule.spec
        names = spec.class_names
        log_figure(trainer, "test/confusion_matrix", confusion_matrix_figure(matrix, names), trainer.global_step)
        if len(images):
            titles = [f"{names[true]} → {names[pred]}" for true, pred in zip(labels.tolist(), preds.tolist())]
            figure = image_grid(spec.denormalize(images), titles, heading="true class → predicted class")
            log_figure(trainer, "test/misclassified", figure, trainer.global_step)

    def _gather_wrong(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[Tensor, Tensor, Tensor]:
        """Every rank's misclassified images, the first ``max_images`` in rank order: images
        ``(K, C, H, W)``, true and predicted classes ``(K,)``."""
        shape = trainer.datamodule.spec.input_shape
        # all_gather needs the same shapes on every rank: pad to max_images, marking padding with label -1.
        padded = {
            "images": torch.zeros(self.max_images, *shape, device=pl_module.device),
            "labels": torch.full((self.max_images,), -1, dtype=torch.long, device=pl_module.device),
            "preds": torch.full((self.max_images,), -1, dtype=torch.long, device=pl_module.device),
        }
        if self._wrong:
            for key, values in zip(padded, map(torch.cat, zip(*self._wrong))):
                padded[key][: len(values)] = values
        gathered = pl_module.all_gather(padded)  # each (world_size, max_images, ...)
        images = gathered["images"].reshape(-1, *shape)
        labels, preds = gathered["labels"].reshape(-1), gathered["preds"].reshape(-1)
        keep = (labels >= 0).nonzero().flatten()[: self.max_images]
        return images[keep], labels[keep], preds[keep]


class InputBatchFigure(L.Callback):
    """Image ``train/input_batch`` at the first training step (not again when a run resumes from a
    checkpoint): up to ``max_images`` images of global rank 0's first batch as the network gets
    them (augmented, if the data set is), un-normalized, each titled with its class name (a wrong
    label or a blank image shows here).

    A callback of the image classification task (``task.callbacks.input_batch``): batches are
    ``(images (N, C, H, W) float32, labels (N,) int64)``, and the DataModule's ``spec``
    (:class:`~ddp_engine.vision.spec.DataSpec`) gives the class names and the normalization.

    Args:
        max_images: images in the figure (default 64).
    """

    def __init__(self, max_images: int = 64) -> None:
        self.max_images = max_images

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step != 0 or batch_idx != 0 or trainer.current_epoch != 0 or not trainer.is_global_zero:
            return
        if not media_loggers(trainer):
            return
        images, labels = batch[0][: self.max_images], batch[1][: self.max_images]
        spec = trainer.datamodule.spec
        titles = [spec.class_names[label] for label in labels.tolist()]
        figure = image_grid(spec.denormalize(images), titles, heading="label")
        log_figure(trainer, "train/input_batch", figure, step=0)
