"""The LightningModule that trains a network (:mod:`ddp_engine.vision.networks`).

Every DDP process builds the same module; Lightning wraps it in DistributedDataParallel, which
averages gradients over the process group with AllReduce before each optimizer step.
"""

from collections.abc import Callable, Mapping

import lightning as L
import torch
import torch.nn.functional as F
from ddp_engine.api import build_lr_scheduler, logs_this_step, needs_total_steps
from ddp_engine.vision.spec import CHECKPOINT_KEY, DataSpec
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class MNISTClassifier(L.LightningModule):
    """Trains ``net`` with cross-entropy and logs loss and accuracy.

    Logged (TensorBoard tags): ``train/loss`` and ``train/acc`` every ``log_every_n_steps``
    optimizer steps, measured on rank 0's micro-batch; ``val/loss``, ``val/acc``, ``test/loss``,
    ``test/acc`` once per epoch, over every sample of the split (torchmetrics states are summed
    over all processes before ``compute``, so each sample counts exactly once).

    Args:
        net: module mapping ``(N, C, H, W)`` images to ``(N, num_classes)`` logits, built for the data
            (:func:`ddp_engine.models.build.build_model` gives it the data's shape and class count).
        optimizer: ``functools.partial`` of a ``torch.optim.Optimizer`` missing only the parameters
            (Hydra ``_partial_: true``).
        scheduler: partial of a ``torch.optim.lr_scheduler`` missing only the optimizer, or None
            (constant learning rate).
            If it takes ``total_steps`` (``OneCycleLR``) and the config does not set it, it gets
            the run's number of optimizer steps, which only the Trainer knows.
        scheduler_interval: ``"step"`` or ``"epoch"``: how often the scheduler steps.
        label_smoothing: the training loss's label smoothing ε (``F.cross_entropy``'s: the target puts
            ``1 - ε + ε / C`` on its class and ``ε / C`` on each other; default 0.1). ``val/loss`` and
            ``test/loss`` stay plain cross-entropy, comparable across recipes.
        channels_last: hold ``net``'s 4-D weights, and so its activations, channels-last (NHWC), the
            layout CPU and GPU convolution kernels run fastest on (default True). A 1-channel image
            batch is the same memory either way; another is converted as it enters.
        compile: compile ``net`` with ``torch.compile`` (``nn.Module.compile``, in place, so
            checkpoint keys stay those of the plain module) before training (default False).
            Worth it on GPUs; the first steps then include the compilation (tens of seconds).
        data_spec: the data set's facts (:class:`~ddp_engine.vision.spec.DataSpec`, or its
            :meth:`~ddp_engine.vision.spec.DataSpec.to_dict`): the class count of the metrics. Every
            checkpoint keeps it (key :data:`~ddp_engine.vision.spec.CHECKPOINT_KEY`), so that
            ``predict`` and ``export`` know the classes, image shape and normalization the network
            was trained for.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None,
        scheduler_interval: str = "step",
        label_smoothing: float = 0.1,
        channels_last: bool = True,
        compile: bool = False,
        *,
        data_spec: DataSpec | Mapping,
    ) -> None:
        super().__init__()
        # No save_hyperparameters(): the partials would be pickled into every checkpoint, which then
        # no longer loads with torch.load(weights_only=True). The run's composed config (saved by
        # Hydra and logged by the entry point) is the record of how this module was built.
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing
        self.channels_last = channels_last
        self.compile_net = compile
        self.data_spec = data_spec if isinstance(data_spec, DataSpec) else DataSpec.from_dict(data_spec)
        self.val_acc = MulticlassAccuracy(self.data_spec.num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(self.data_spec.num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def configure_model(self) -> None:
        # Called by Lightning in every process before DDP wraps the module.
        if self.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net:
            self.net.compile()

    def forward(self, images: Tensor) -> Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        # The accuracy of this one micro-batch, as a plain tensor op: a torchmetrics Metric would
        # keep and merge state on every step for a value that is never accumulated. Per-step values
        # stay local to each rank: syncing them would add an AllReduce to every step.
        # Computed only at the steps whose values Lightning writes (every trainer.log_every_n_steps):
        # at the others it would be dropped, after costing a measurable share of a small model's step.
        if logs_this_step(self.trainer):
            accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
            metrics = {"train/loss": loss.detach(), "train/acc": accuracy}
            self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the predicted classes ``(N,)`` int64, for callbacks such as
        :class:`~ddp_engine.vision.callbacks.MisclassificationReport`."""
        return self._evaluate(batch, self.test_loss, self.test_acc, "test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        """``(images,)``, normalized ``(N, C, H, W)`` float32 images as in training (labels, if the
        batch has them, are ignored) -> ``(N, num_classes)`` float32 class probabilities (softmax of the logits)."""
        return self(batch[0]).softmax(dim=1)

    def _evaluate(
        self, batch: tuple[Tensor, Tensor], loss_metric: MeanMetric, acc_metric: MulticlassAccuracy, split: str
    ) -> Tensor:
        images, labels = batch
        logits = self(images)
        # Weighted by batch size, so the epoch value is the mean over samples even when the
        # last batch, or one rank's shard, is smaller.
        loss_metric.update(F.cross_entropy(logits, labels), weight=labels.numel())
        acc_metric.update(logits, labels)
        # Logging the metric objects makes Lightning call compute() (which syncs over all
        # processes) once at the end of the epoch, not once per step.
        self.log(f"{split}/loss", loss_metric, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{split}/acc", acc_metric, on_step=False, on_epoch=True, prog_bar=True)
        return logits.argmax(dim=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = self.data_spec.to_dict()

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(params=self.parameters())
        total_steps = self.trainer.estimated_stepping_batches if needs_total_steps(self.scheduler_factory) else None
        scheduler = build_lr_scheduler(self.scheduler_factory, optimizer, total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval, "name": "train/lr"},
        }
