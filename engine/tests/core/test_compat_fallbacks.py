"""What a run keeps when a private name of a library that ``ddp_engine.core.compat`` reads is gone, as
a release that renames it would leave it: each is hidden in turn through compat's one accessor
(``compat._private``; the libraries themselves still use it, so the run is otherwise unchanged),
the engine's path that uses it runs in a real in-process fit, and the log says once what is lost.

The command-line training with every such name hidden at once is test_training_without_private_apis.py's.
"""

import logging
import math
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities import rank_zero_only
from private_api import hidden_private_api, lost_lines

from ddp_engine.core import compat
from ddp_engine.distributed.checkpoint_io import LastCheckpoint, at_optimizer_step_boundary
from ddp_engine.loggers.tensorboard_logger import TensorBoardLogger
from sensor_task.regression import Regressor, SensorDataModule, SensorNet, make_sensor_windows

#: Training windows, batches per optimizer step, global batch: 16 batches of 4 per epoch, 6 steps.
TRAIN_WINDOWS, ACCUMULATE, GLOBAL_BATCH = 64, 3, 12


@pytest.fixture
def hide(monkeypatch, caplog):
    """The set of private names that compat finds missing while it holds them; each loss said anew."""
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    hidden: set[str] = set()
    monkeypatch.setattr(compat, "_private", hidden_private_api(compat._private, hidden))
    caplog.set_level(logging.WARNING, logger=compat.__name__)
    return hidden


def fit(root: Path, callbacks: list[L.Callback], epochs: int = 2, **trainer_options) -> L.Trainer:
    """A real fit of the engine's test task on CPU, 1 process, ``epochs`` epochs of 16 batches."""
    data = SensorDataModule(
        str(make_sensor_windows(root / "windows.npz", n_train=TRAIN_WINDOWS, n_val=8, n_test=8)),
        global_batch_size=GLOBAL_BATCH,
    )
    module = Regressor(SensorNet(channels=3, length=128, outputs=1), optimizer=partial(torch.optim.SGD, lr=0.01))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, accumulate_grad_batches=ACCUMULATE, callbacks=callbacks,
        logger=trainer_options.pop("logger", False), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, use_distributed_sampler=False, default_root_dir=root, **trainer_options,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return trainer


class Positions(L.Callback):
    """At each optimizer-step boundary: the training loader's saved position, with Lightning's count
    of the epoch's batches and with it hidden (``hide``)."""

    def __init__(self, hide: set[str]) -> None:
        self.hide, self.pairs = hide, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if at_optimizer_step_boundary(trainer, batch_idx):
            seen = trainer.train_dataloader.state_dict()
            self.hide.add("batch_progress")
            self.pairs.append((seen, trainer.train_dataloader.state_dict()))
            self.hide.discard("batch_progress")


def test_without_lightnings_batch_count_a_checkpoint_saves_the_same_position_inside_the_epoch(tmp_path, hide, caplog):
    positions = Positions(hide)
    fit(tmp_path, [positions])
    # 16 batches an epoch, a step every 3: boundaries after batches 3, 6, ..., 15, in both epochs.
    assert len(positions.pairs) == 2 * (16 // ACCUMULATE)
    assert [lightnings["samples"] for lightnings, _ in positions.pairs[:5]] == [12, 24, 36, 48, 60]
    assert all(without == lightnings for lightnings, without in positions.pairs), positions.pairs
    assert lost_lines(caplog) == ["Trainer.fit_loop.epoch_loop.batch_progress"]


def test_without_lightnings_epoch_trigger_last_ckpt_is_still_saved_at_each_epochs_end(tmp_path, hide, caplog):
    hide.add("_every_n_epochs")
    last = LastCheckpoint(str(tmp_path / "kept"), every_n_train_steps=4, train_time_interval=None,
                          time_check_every_n_steps=1)  # fmt: skip
    trainer = fit(tmp_path, [last], epochs=1)
    # Six optimizer steps, a save every 4, and the epoch end's at step 6: by the engine itself.
    saved = torch.load(tmp_path / "kept" / "last.ckpt", weights_only=False)
    assert (trainer.global_step, saved["global_step"], saved["epoch"]) == (6, 6, 0)
    assert lost_lines(caplog) == ["ModelCheckpoint._every_n_epochs"]


class SaveNow(L.Callback):
    """Asks ``last`` for a checkpoint at the second optimizer step, as a stop signal does, and
    records the step saved in its file then."""

    def __init__(self, last: LastCheckpoint) -> None:
        self.last, self.saved_step = last, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if at_optimizer_step_boundary(trainer, batch_idx) and trainer.global_step == 2:
            self.last.save(trainer)
            self.saved_step = torch.load(Path(self.last.dirpath) / "last.ckpt", weights_only=False)["global_step"]


def test_without_the_callbacks_own_save_a_checkpoint_asked_for_is_written_by_the_trainer(tmp_path, hide, caplog):
    hide.add("_save_topk_checkpoint")
    last = LastCheckpoint(str(tmp_path / "kept"), every_n_train_steps=None, train_time_interval=None,
                          time_check_every_n_steps=1)  # fmt: skip
    saving = SaveNow(last)
    fit(tmp_path, [saving, last], epochs=1)
    # Written at step 2 through Trainer.save_checkpoint, into the callback's own file name.
    assert saving.saved_step == 2
    assert lost_lines(caplog) == ["ModelCheckpoint._save_topk_checkpoint"]


def test_without_the_sigterm_broadcast_the_stop_callback_leaves_the_loop_as_it_is(tmp_path, hide, caplog):
    from ddp_engine.callbacks.signals import StopOnSignal

    hide.add("_broadcast_sigterm_tensor")
    trainer = fit(tmp_path, [StopOnSignal()], epochs=1)
    assert trainer.state.finished and trainer.global_step == math.ceil(16 / ACCUMULATE)
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)  # not replaced
    assert lost_lines(caplog) == ["_TrainingEpochLoop._broadcast_sigterm_tensor"]


def test_without_the_summary_writers_file_writer_tensorboard_gets_the_runs_scalars(tmp_path, hide, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hide.add("_get_file_writer")
    logger = TensorBoardLogger(str(tmp_path), name="", version="", purge_step=0)
    fit(tmp_path, [], epochs=1, logger=logger, log_every_n_steps=1)
    logger.finalize("success")
    events = EventAccumulator(str(tmp_path)).Reload()
    assert [event.step for event in events.Scalars("train/loss")] == list(range(math.ceil(16 / ACCUMULATE)))
    assert lost_lines(caplog) == ["SummaryWriter._get_file_writer"]


def test_without_zeros_consolidated_state_list_release_leaves_it_and_says_so(hide, caplog):
    from types import SimpleNamespace

    hide.add("_all_state_dicts")
    optimizer = SimpleNamespace(_all_state_dicts=[{"state": 1}])
    compat.release_consolidated_state(optimizer)
    compat.release_consolidated_state(optimizer)
    assert optimizer._all_state_dicts == [{"state": 1}]
    assert lost_lines(caplog) == ["ZeroRedundancyOptimizer._all_state_dicts"]
