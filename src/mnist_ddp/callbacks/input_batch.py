"""What the network is fed: one training batch of an image classification task, as an image."""

import lightning as L
from ddp_engine.api import log_figure, media_loggers
from typing_extensions import override

from mnist_ddp.callbacks.figures import image_grid


class InputBatchFigure(L.Callback):
    """Image ``train/input_batch`` at the first training step (not again when a run resumes from a
    checkpoint): up to ``max_images`` images of global rank 0's first batch as the network gets
    them (augmented, if the data set is), un-normalized, each titled with its class name (a wrong
    label or a blank image shows here).

    A callback of the image classification task (``task.callbacks.input_batch``): batches are
    ``(images (N, C, H, W) float32, labels (N,) int64)``, and the DataModule's ``spec``
    (:class:`~mnist_ddp.data.spec.DataSpec`) gives the class names and the normalization.

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
