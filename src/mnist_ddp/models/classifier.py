"""The LightningModule that trains a network (:mod:`mnist_ddp.models.networks`).

Every DDP process builds the same module; Lightning wraps it in DistributedDataParallel, which
averages gradients over the process group with AllReduce before each optimizer step.
"""

import inspect
from collections.abc import Callable, Mapping

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from mnist_ddp.core.compat import saved_loader_states
from mnist_ddp.core.errors import ConfigValueError
from mnist_ddp.data.spec import CHECKPOINT_KEY, DataSpec


class MNISTClassifier(L.LightningModule):
    """Trains ``net`` with cross-entropy and logs loss and accuracy.

    Logged (TensorBoard tags): ``train/loss`` and ``train/acc`` every ``log_every_n_steps``
    optimizer steps, measured on rank 0's micro-batch; ``val/loss``, ``val/acc``, ``test/loss``,
    ``test/acc`` once per epoch, over every sample of the split (torchmetrics states are summed
    over all processes before ``compute``, so each sample counts exactly once).

    Args:
        net: module mapping ``(N, C, H, W)`` images to ``(N, num_classes)`` logits, built for the data
            (:func:`mnist_ddp.models.build.build_model` gives it the data's shape and class count).
        optimizer: ``functools.partial`` of a ``torch.optim.Optimizer`` missing only the parameters
            (Hydra ``_partial_: true``).
        scheduler: partial of a ``torch.optim.lr_scheduler`` missing only the optimizer, or None
            (constant learning rate).
            If it takes ``total_steps`` (``OneCycleLR``) and the config does not set it, it gets
            the run's number of optimizer steps, which only the Trainer knows.
        scheduler_interval: ``"step"`` or ``"epoch"``: how often the scheduler steps.
        compile: compile ``net`` with ``torch.compile`` (``nn.Module.compile``, in place, so
            checkpoint keys stay those of the plain module) before training (default False).
            Worth it on GPUs; the first steps then include the compilation (tens of seconds).
        data_spec: the data set's facts (:class:`~mnist_ddp.data.spec.DataSpec`, or its
            :meth:`~mnist_ddp.data.spec.DataSpec.to_dict`): the class count of the metrics. Every
            checkpoint keeps it (key :data:`~mnist_ddp.data.spec.CHECKPOINT_KEY`), so that
            ``predict`` and ``export`` know the classes, image shape and normalization the network
            was trained for.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None,
        scheduler_interval: str = "step",
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
        self.compile_net = compile
        # Optimizer steps of the schedule in the checkpoint fit resumes from (set by on_load_checkpoint).
        self.resumed_schedule_steps: int | None = None
        self.data_spec = data_spec if isinstance(data_spec, DataSpec) else DataSpec.from_dict(data_spec)
        self.val_acc = MulticlassAccuracy(self.data_spec.num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(self.data_spec.num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer over this module's parameters (``model.optimizer``).

        Raises:
            ValueError, TypeError: as torch's optimizer refuses its arguments (a negative learning
                rate: ``Invalid learning rate: -0.1``).
        """
        return self.optimizer_factory(params=self.parameters())

    @property
    def schedule_needs_total_steps(self) -> bool:
        """Whether the scheduler takes ``total_steps`` (``OneCycleLR``) and the config leaves it to the run."""
        if self.scheduler_factory is None:
            return False
        bound = getattr(self.scheduler_factory, "keywords", {})
        return "total_steps" in inspect.signature(self.scheduler_factory).parameters and "total_steps" not in bound

    def build_scheduler(
        self, optimizer: torch.optim.Optimizer, total_steps: int | None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The learning-rate scheduler of ``optimizer`` (``model.scheduler``; a constant one when
        None, so that LearningRateMonitor logs the rate as train/lr either way). ``total_steps``:
        the run's optimizer steps, used when :attr:`schedule_needs_total_steps`.

        Raises:
            ValueError, TypeError: as torch's scheduler refuses its arguments.
        """
        if self.scheduler_factory is None:
            return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
        kwargs = {"total_steps": total_steps} if self.schedule_needs_total_steps else {}
        return self.scheduler_factory(optimizer=optimizer, **kwargs)

    def configure_model(self) -> None:
        # Called by Lightning in every process before DDP wraps the module.
        if self.compile_net:
            self.net.compile()

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        # The accuracy of this one micro-batch, as a plain tensor op: a torchmetrics Metric would
        # keep and merge state on every step for a value that is never accumulated. Per-step values
        # stay local to each rank: syncing them would add an AllReduce to every step.
        if self._train_step_metrics_written():
            accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
            metrics = {"train/loss": loss.detach(), "train/acc": accuracy}
            self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _train_step_metrics_written(self) -> bool:
        """Whether Lightning writes this step's on-step values to the loggers: every
        ``trainer.log_every_n_steps`` optimizer steps, at a stop, and in ``fast_dev_run`` (the rule of
        its ``LoggerConnector.should_update_logs``). A value logged at any other step is dropped, and
        logging it costs a sixth of a small model's step (``benchmarks/per_step.py``); the progress
        bar shows the last written values."""
        trainer = self.trainer
        every = trainer.log_every_n_steps
        due = every > 0 and (trainer.global_step + 1) % every == 0
        return due or trainer.should_stop or bool(trainer.fast_dev_run)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the predicted classes ``(N,)`` int64, for callbacks such as
        :class:`~mnist_ddp.callbacks.misclassified.MisclassificationReport`."""
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
        # Every replica is seeded alike and draws the same number of random numbers (dropout
        # masks of equal shapes), so rank 0's generator state is every rank's. Restored on resume,
        # it makes the resumed run draw the masks the uninterrupted run would have drawn.
        checkpoint["rng_state"] = {"torch": torch.get_rng_state()}
        checkpoint[CHECKPOINT_KEY] = self.data_spec.to_dict()
        if self.device.type == "cuda":
            checkpoint["rng_state"]["cuda"] = torch.cuda.get_rng_state(self.device)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Called before configure_optimizers when fit resumes: keep the schedule's saved length
        # for the check there, and restore the random generator state (see on_save_checkpoint).
        saved = [state.get("total_steps") for state in checkpoint.get("lr_schedulers", [])]
        self.resumed_schedule_steps = saved[0] if saved else None
        if saved_loader_states(checkpoint) is None:
            # Checkpoints of versions before mnist_ddp.data.sharding: written at epochs' ends only.
            rank_zero_info(
                f"The checkpoint holds no position inside an epoch (saved at the end of epoch {checkpoint['epoch']} "
                "by an earlier version): training resumes at the start of the next epoch."
            )
        rng = checkpoint.get("rng_state", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)

    def _check_resumed_schedule(self, total_steps: int) -> None:
        """Raises ConfigValueError when resuming a schedule of another length: a one-cycle schedule
        cannot be extended, so trainer.max_epochs, the batch size and the process count must stay."""
        saved = self.resumed_schedule_steps
        if saved is not None and saved != total_steps:
            raise ConfigValueError(
                f"ckpt_path: the checkpoint's learning-rate schedule spans {saved} optimizer steps, this run "
                f"{total_steps}. Resume with the original run's trainer.max_epochs, trainer.max_steps, "
                "trainer.limit_train_batches, data.global_batch_size and trainer.accumulate_grad_batches (its "
                ".hydra/overrides.yaml), or resume in place (hydra.run.dir=<run> ckpt_path=last), which keeps them. "
                "A one-cycle schedule cannot be lengthened: to train for longer, start a new run with more epochs."
            )

    def configure_optimizers(self) -> dict:
        optimizer = self.build_optimizer()
        total_steps = None
        if self.schedule_needs_total_steps:
            total_steps = self.trainer.estimated_stepping_batches
            self._check_resumed_schedule(total_steps)
        scheduler = self.build_scheduler(optimizer, total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval, "name": "train/lr"},
        }
