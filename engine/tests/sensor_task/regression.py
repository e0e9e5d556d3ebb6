"""The task of the engine's test project: a regression on float sensor windows ``(3, 128)`` read
from a ``.npz`` file, with an MSE loss and MSE / MAE metrics. Written as a cloner would write their
own task, against the engine's public seams only (the DataModule base ``ShardedDataModule``, a
LightningModule, the YAMLs in ``conf/``); nothing of the engine is edited to run it."""

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError
from typing_extensions import override

from ddp_engine.api import GatherDataset, ShardedDataModule, build_lr_scheduler, needs_total_steps

#: Channels and length of one window.
CHANNELS, LENGTH = 3, 128


def make_sensor_windows(path: Path, n_train: int = 600, n_val: int = 97, n_test: int = 131, seed: int = 0) -> Path:
    """A ``.npz`` file of float32 windows ``(N, 3, 128)`` and targets ``(N, 1)``: the target is a
    smooth function of each channel's mean level and its first half's trend, plus noise, so that a
    small 1-D convolution learns it in a few epochs and the MSE stays above 0 (double counting a
    sample would change it). Split sizes divide by neither 2 nor 3. Returns ``path``."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        level = rng.normal(0, 1, (n, CHANNELS, 1))
        trend = rng.normal(0, 1, (n, CHANNELS, 1)) * np.linspace(-1, 1, LENGTH)
        windows = level + trend + rng.normal(0, 0.3, (n, CHANNELS, LENGTH))
        target = 1.5 * level[:, 0] - level[:, 1] + 0.5 * trend[:, 2, -1:] + rng.normal(0, 0.1, (n, 1))
        arrays[f"{split}_x"], arrays[f"{split}_y"] = windows.astype(np.float32), target.astype(np.float32)
    np.savez(path, **arrays)
    return path


class SensorDataModule(ShardedDataModule):
    """The windows of a ``.npz`` file (``train_x``, ``train_y``, ``val_x`` ...): float32 ``(N, 3, 128)``
    inputs and ``(N, 1)`` targets, served whole batches at a time.

    Args:
        path: the ``.npz`` file.
        **kwargs: the engine's DataModule arguments (``global_batch_size``, ``num_workers``, ...).
    """

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = Path(path)

    @override
    def model_arguments(self) -> dict[str, Any]:
        return {"net": {"channels": CHANNELS, "length": LENGTH, "outputs": 1}}

    @override
    def summary(self) -> str:
        return f"sensor windows {CHANNELS}x{LENGTH} from {self.path}"

    @override
    def prepare_data(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(f"data.path={self.path} is not a file")

    @override
    def setup(self, stage: str) -> None:
        with np.load(self.path) as arrays:
            split = {name: GatherDataset(torch.from_numpy(arrays[f"{name}_x"]), torch.from_numpy(arrays[f"{name}_y"]))
                     for name in ("train", "val", "test")}  # fmt: skip
        self.train_set, self.val_set, self.test_set = split["train"], split["val"], split["test"]


class SensorNet(nn.Module):
    """``(N, channels, length)`` float windows -> ``(N, outputs)``: one 1-D convolution, average
    pooling to 8 steps, dropout (``dropout``: its probability, 0 for none), a linear layer."""

    def __init__(self, channels: int, length: int, outputs: int, hidden: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(channels, hidden, kernel_size=5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(8), nn.Flatten(),
            nn.Dropout(dropout),
        )  # fmt: skip
        self.head = nn.Linear(hidden * 8, outputs)

    def forward(self, windows: Tensor) -> Tensor:
        return self.head(self.features(windows))


class Regressor(L.LightningModule):
    """Trains ``net`` with the mean squared error; logs ``train/loss`` every step and ``val/mse``,
    ``val/mae``, ``test/mse``, ``test/mae`` per epoch over every sample of the split (torchmetrics
    states, summed over the processes in float64, so that the value does not depend on how the
    samples were split across them)."""

    def __init__(self, net: nn.Module, optimizer, scheduler=None) -> None:
        super().__init__()
        self.net, self.optimizer_factory, self.scheduler_factory = net, optimizer, scheduler
        self.metrics = nn.ModuleDict({
            f"{split}_{name}": metric().set_dtype(torch.float64)
            for split in ("val", "test") for name, metric in (("mse", MeanSquaredError), ("mae", MeanAbsoluteError))
        })  # fmt: skip

    def forward(self, windows: Tensor) -> Tensor:
        return self.net(windows)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        windows, targets = batch
        loss = F.mse_loss(self(windows), targets)
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: tuple[Tensor, Tensor], split: str) -> None:
        windows, targets = batch
        predictions = self(windows).double()
        for name in ("mse", "mae"):
            metric = self.metrics[f"{split}_{name}"]
            metric.update(predictions, targets.double())
            self.log(f"{split}/{name}", metric, on_step=False, on_epoch=True)

    def configure_optimizers(self) -> dict:
        """``optimizer`` over the parameters, and ``scheduler`` (a ``torch.optim.lr_scheduler``
        partial, or None) stepped every optimizer step, over the run's steps where it takes them."""
        optimizer = self.optimizer_factory(params=self.parameters())
        total_steps = self.trainer.estimated_stepping_batches if needs_total_steps(self.scheduler_factory) else None
        scheduler = build_lr_scheduler(self.scheduler_factory, optimizer, total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"},
        }
