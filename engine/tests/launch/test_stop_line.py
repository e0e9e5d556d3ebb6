"""The line a stopped run ends with names the checkpoint its printed resume continues from and the
epoch as the run's log counts them (``Epoch 0 done``), in each phase: training, the final test of
the best checkpoint, an evaluation of its own. A real Trainer in this process, with the template's
checkpoint callbacks and stop handling (``stop_on_signals``); the signal is a call of the
callback's ``stop``, which a real signal's handler makes."""

import logging
import os
import signal
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, TensorDataset

from ddp_engine.callbacks.signals import StopOnSignal, stop_on_signals
from ddp_engine.distributed.checkpoint_io import LastCheckpoint


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StopAt(L.Callback):
    """Stops the run through ``stopper`` at the start of the test, or of ``epoch`` of the training."""

    def __init__(self, stopper: StopOnSignal, epoch: int | None = None) -> None:
        self.stopper, self.epoch = stopper, epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            self.stopper.stop(signal.SIGINT)

    def on_test_start(self, trainer, pl_module) -> None:
        if self.epoch is None:
            self.stopper.stop(signal.SIGINT)


def trainer_in(run_dir, *callbacks) -> L.Trainer:
    best = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="epoch_{epoch:03d}", monitor="val/loss", mode="max",
        auto_insert_metric_name=False,
    )  # fmt: skip
    last = LastCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=100, train_time_interval=None,
                          time_check_every_n_steps=50)  # fmt: skip
    return L.Trainer(
        default_root_dir=run_dir, accelerator="cpu", devices=1, max_epochs=2, logger=False, callbacks=[best, last,
        *callbacks], enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def signals_logger(monkeypatch):
    """The callback's logger on, at rank 0: another test's logging config in the same pytest worker
    (Hydra's, ``disable_existing_loggers``) may have turned it off, or left Lightning's rank elsewhere."""
    monkeypatch.setattr(logging.getLogger("ddp_engine.callbacks.signals"), "disabled", False)
    monkeypatch.setattr(rank_zero_only, "rank", 0)


@pytest.fixture
def data():
    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def stopped_line(caplog) -> str:
    (line,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Stopped by")]
    return line


def test_a_stop_in_the_final_test_names_last_ckpt_and_the_last_epoch(tmp_path, data, caplog):
    stopper = StopOnSignal()
    trainer = trainer_in(tmp_path, stopper)
    model = Tiny()
    trainer.fit(model, data, data)
    checkpoints = tmp_path / "checkpoints"
    # The best checkpoint (mode=max of a loss: epoch 0's) written after last.ckpt, as a rewrite would.
    (best,) = checkpoints.glob("epoch_*.ckpt")
    later = time.time() + 10
    os.utime(best, (later, later))
    trainer.callbacks.append(StopAt(stopper))
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit), stop_on_signals(trainer):
        trainer.test(model, data)
    line = stopped_line(caplog)
    assert line.startswith("Stopped by SIGINT during the final test, after epoch 1 (global step 4). "), line
    assert f"Last complete checkpoint: {checkpoints / 'last.ckpt'} (global step 4). " in line, line


def test_a_stop_while_training_names_the_epoch_in_progress(tmp_path, data, caplog):
    stopper = StopOnSignal()
    trainer = trainer_in(tmp_path, stopper, StopAt(stopper, epoch=1))
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit), stop_on_signals(trainer):
        trainer.fit(Tiny(), data, data)
    line = stopped_line(caplog)
    assert line.startswith("Stopped by SIGINT in epoch 1 at global step 2. "), line
    # last.ckpt of epoch 0's end: the resume trains again the steps after it (none here).
    assert f"Last complete checkpoint: {tmp_path / 'checkpoints' / 'last.ckpt'} (global step 2). " in line, line


def test_a_stop_of_an_evaluation_names_its_test(tmp_path, data, caplog):
    stopper = StopOnSignal()
    trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False,
                        callbacks=[stopper, StopAt(stopper)], enable_progress_bar=False)  # fmt: skip
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit), stop_on_signals(trainer):
        trainer.test(Tiny(), data)
    assert stopped_line(caplog).startswith("Stopped by SIGINT during the test, before any checkpoint was saved.")
