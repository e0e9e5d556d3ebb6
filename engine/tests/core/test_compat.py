"""The private APIs of the libraries (``ddp_engine.core.compat``) still behave as the engine relies
on, each asserted on the real object: a ``DistributedDataParallel`` module and a ``Trainer.fit`` over
one 1-process gloo group, a real TensorBoard event file read back by TensorBoard's reader, an
OmegaConf schema. A failure names the private API and says that the library changed, so that an
upgrade shows at once what to mend in ``core/compat.py``. And no module outside ``core/compat.py``
uses a private attribute of a library: the scan of the engine's packages and of its test tasks,
written as a cloner writes a task (a project scans its own task with the same functions,
``private_uses``).
"""

import ast
import inspect
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import lightning as L
import pytest
import torch
import torch.distributed as dist
import vision_task
from hydra.plugins.sweeper import Sweeper
from hydra.utils import get_class
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf
from private_api import hidden_private_api
from private_uses import (
    compat_imports,
    defined_classes,
    library_private_names_touched,
    package_private_uses,
    private_uses,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams, scalar

import ddp_engine
import sensor_task
from ddp_engine.callbacks.ddp_report import DDPSettingsReport
from ddp_engine.callbacks.memory import MemoryFootprint
from ddp_engine.callbacks.step_anatomy import StepAnatomy
from ddp_engine.config.checks import basic_sweeper
from ddp_engine.core import compat
from ddp_engine.distributed.checkpoint_io import at_optimizer_step_boundary
from ddp_engine.distributed.footprint import ddp_bucket_bytes
from ddp_engine.distributed.strategy import CommHookDDPStrategy
from ddp_engine.models.step_logging import logs_this_step

#: The process group's timeout, set when it is built and read back.
TIMEOUT = timedelta(seconds=1234)
#: The fit: 4 batches per epoch, 2 epochs, an optimizer step every 2 batches.
BATCHES, EPOCHS, ACCUMULATE = 4, 2, 2
#: The bucket size set through the strategy's DDP arguments after it was built.
BUCKET_CAP_MB = 2


def changed(private: str, what: str) -> str:
    """The message of a failed check: the library's behaviour behind ``private`` changed."""
    return f"{private}: the library's behaviour changed ({what}); update ddp_engine/core/compat.py"


@pytest.fixture(scope="module")
def process_group():
    """A 1-process gloo group on a free port, with :data:`TIMEOUT`; destroyed after the module."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=TIMEOUT)
    yield
    dist.destroy_process_group()


class StatefulLoader(DataLoader):
    """A loader with a state, which Lightning saves in its checkpoints."""

    def state_dict(self) -> dict:
        return {"served": 3}

    def load_state_dict(self, state: dict) -> None:
        pass


class Tiny(L.LightningModule):
    """A linear layer; records the fetched-batch count of each training batch in ``on_after_batch_transfer``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.ready: list[int] = []

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training:
            self.ready.append(compat.epoch_batches_ready(self.trainer))
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Recorder(L.Callback):
    """Records what the compat functions read during the fit; saves ``save_now``'s checkpoint at step 1."""

    def __init__(self, save_now: ModelCheckpoint) -> None:
        self.save_now = save_now
        self.batches: list[tuple[int, int, bool, int]] = []  # (batch_idx, processed, boundary, global_step)
        self.saved_at: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.skipped = compat.skip_sigterm_broadcast(trainer)
        self.ddp = trainer.strategy.model
        self.logging_data = compat.ddp_logging_data(trainer.strategy.model)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        boundary = at_optimizer_step_boundary(trainer, batch_idx)
        self.batches.append((batch_idx, compat.epoch_batches_processed(trainer), boundary, trainer.global_step))
        if boundary and self.saved_at is None:
            compat.save_checkpoint_now(self.save_now, trainer)
            self.saved_at = trainer.global_step


@dataclass
class Fit:
    trainer: L.Trainer
    module: Tiny
    recorder: Recorder
    epoch_end: ModelCheckpoint
    save_now: ModelCheckpoint
    configure_ddp_calls: int


@pytest.fixture(scope="module")
def fit(process_group, tmp_path_factory) -> Fit:
    """A real ``Trainer.fit`` on CPU with the engine's DDP strategy over the module's gloo group."""
    root = tmp_path_factory.mktemp("fit")
    epoch_end = ModelCheckpoint(dirpath=root / "epochs", filename="{epoch}", save_top_k=-1, every_n_train_steps=1000)
    compat.also_save_at_epoch_end(epoch_end)
    save_now = ModelCheckpoint(dirpath=root / "now", filename="now", every_n_train_steps=999)
    recorder = Recorder(save_now)
    # Lightning's own strategy registers no hook on CPU.
    strategy = CommHookDDPStrategy(comm_hook="fp16", bucket_cap_mb=BUCKET_CAP_MB)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, strategy=strategy, max_epochs=EPOCHS, accumulate_grad_batches=ACCUMULATE,
        callbacks=[recorder, epoch_end, save_now], logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False, default_root_dir=root,
    )  # fmt: skip
    module = Tiny()
    loader = StatefulLoader(TensorDataset(torch.randn(2 * BATCHES, 4)), batch_size=2)
    environ = dict(os.environ)  # Lightning's launcher exports the rendezvous variables into this process
    try:
        with mock.patch.object(
            CommHookDDPStrategy, "configure_ddp", autospec=True, side_effect=CommHookDDPStrategy.configure_ddp
        ) as configure_ddp:
            trainer.fit(module, train_dataloaders=loader)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return Fit(trainer, module, recorder, epoch_end, save_now, configure_ddp.call_count)


# --- Lightning ------------------------------------------------------------------------------------


def test_the_epoch_loops_batch_counters_count_the_epochs_batches(fit):
    private = "trainer.fit_loop.epoch_loop.batch_progress.current"
    expected = list(range(BATCHES)) * EPOCHS
    assert fit.module.ready == expected, changed(f"{private}.ready", "not the batch's index in on_after_batch_transfer")
    processed = [entry[1] for entry in fit.recorder.batches]
    assert processed == [index + 1 for index in expected], changed(
        f"{private}.processed", "not the epoch's trained batches, this one counted, in on_train_batch_end"
    )
    # The boundary built on it is where Lightning's optimizer steps: global_step advanced at that batch.
    steps = [0] + [entry[3] for entry in fit.recorder.batches]
    stepped = [after > before for before, after in zip(steps, steps[1:])]
    assert [entry[2] for entry in fit.recorder.batches] == stepped, changed(
        f"{private}.processed", "its count modulo accumulate_grad_batches is not where the optimizer steps"
    )


def test_the_sigterm_flag_broadcast_is_a_per_step_method_of_the_epoch_loop(fit):
    private = "_TrainingEpochLoop._broadcast_sigterm_tensor"
    loop = fit.trainer.fit_loop.epoch_loop
    method = getattr(type(loop), "_broadcast_sigterm_tensor", None)
    assert method is not None and fit.recorder.skipped, changed(private, "gone")
    assert list(inspect.signature(method).parameters) == ["self"], changed(private, "it takes arguments")
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(type(loop).advance), changed(
        private, "the loop's advance() no longer calls it through the instance at each step"
    )
    with mock.patch("torch.distributed.broadcast", wraps=dist.broadcast) as broadcast:
        method(loop)
        assert broadcast.call_count == 1, changed(private, "it does not broadcast the flag")
        loop._broadcast_sigterm_tensor()  # the instance's, replaced by skip_sigterm_broadcast
        assert broadcast.call_count == 1, changed(private, "replacing it on the instance does not skip it")


def test_a_model_checkpoint_with_a_step_trigger_also_saves_at_each_epochs_end(fit):
    saved = sorted(path.name for path in Path(fit.epoch_end.dirpath).iterdir())
    assert saved == [f"epoch={epoch}.ckpt" for epoch in range(EPOCHS)], changed(
        "ModelCheckpoint._every_n_epochs", f"set to 1 after the constructor, the epoch ends saved {saved}"
    )


def test_a_model_checkpoint_saves_now_when_asked(fit):
    private = "ModelCheckpoint._save_topk_checkpoint(trainer, ModelCheckpoint._monitor_candidates(trainer))"
    path = Path(fit.save_now.dirpath) / "now.ckpt"
    assert fit.recorder.saved_at == 1 and path.is_file(), changed(private, f"no {path} written")
    assert fit.save_now.best_model_path == str(path), changed(private, "best_model_path is not the file saved")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["global_step"] == fit.recorder.saved_at, changed(private, "the file is not the state at the call")


def test_lightning_saves_the_training_loaders_state_where_compat_reads_it(fit):
    private = 'checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]'
    checkpoint = torch.load(Path(fit.epoch_end.dirpath) / "epoch=0.ckpt", map_location="cpu", weights_only=True)
    assert compat.saved_loader_states(checkpoint) == [{"served": 3}], changed(
        private, "the loader's state is not there"
    )
    assert compat.saved_loader_states({"state_dict": {}}) is None


class StepLogger(Logger):
    """A logger that keeps the ``train/x`` values Lightning writes to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[float] = []

    name, version = "steps", 0

    def log_hyperparams(self, params: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train/x" in metrics:
            self.written.append(metrics["train/x"])


class LogsEveryStep(L.LightningModule):
    """Logs its batch number as ``train/x`` at every step, and records whether compat said it is written."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.said: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.said.append(compat.logs_this_step(self.trainer))
        self.log("train/x", float(batch_idx), on_step=True, on_epoch=False)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_the_steps_whose_logged_values_are_written_are_those_compat_names(tmp_path):
    private = "trainer._logger_connector.should_update_logs"
    logger, module = StepLogger(), LogsEveryStep()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, log_every_n_steps=3, logger=logger, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(torch.randn(10, 4)), batch_size=1))
    assert module.said == [step % 3 == 2 for step in range(10)], changed(private, "not every log_every_n_steps")
    said = [float(step) for step, written in enumerate(module.said) if written]
    assert logger.written == said, changed(private, f"values written at steps {logger.written}, not {said}")


def test_without_lightnings_logging_rule_every_step_logs(monkeypatch, caplog):
    # As a Lightning release may do: the Trainer's logger connector no longer has should_update_logs
    # (Lightning itself reads its connector everywhere: it cannot be removed from a real Trainer).
    # The training step (the classifier's, through ddp_engine.models.step_logging) then logs at every
    # step, and the log says it once.
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    trainer = SimpleNamespace(_logger_connector=None)
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert [logs_this_step(trainer) for _ in range(3)] == [True, True, True]
    lost = [record.getMessage() for record in caplog.records if "missing or changed" in record.getMessage()]
    assert len(lost) == 1 and lost[0].startswith("Trainer._logger_connector.should_update_logs is missing"), lost


def test_the_test_tasks_modules_use_no_private_api_through_compat():
    # The classes a cloner writes (the LightningModule, DataModules, figures), as the test tasks
    # write them, reach the engine's public modules only: compat is the engine's own.
    found = [place for task in TASKS for place in compat_imports(task)]
    assert found == [], f"a test task imports ddp_engine.core.compat: {found}"


def test_the_scan_finds_an_import_of_compat(tmp_path):
    planted = tmp_path / "task"
    planted.mkdir()
    (planted / "model.py").write_text(
        "from ddp_engine.core import compat\nfrom ddp_engine.core.compat import declared_type\n"
        "import ddp_engine.core.compat\nfrom ddp_engine.core import errors\nfrom ddp_engine.api import Task\n"
    )
    assert compat_imports(planted) == ["task/model.py:1", "task/model.py:2", "task/model.py:3"]


def test_the_strategy_wraps_the_model_once_with_its_ddp_options_and_hook(fit):
    # DDPStrategy.configure_ddp, public, is where the strategy wraps the model; Lightning calls it once a fit.
    assert fit.configure_ddp_calls == 1
    assert isinstance(fit.recorder.ddp, DistributedDataParallel)
    assert fit.recorder.ddp.bucket_bytes_cap == BUCKET_CAP_MB * 2**20
    assert fit.recorder.logging_data.get("comm_hook") == "fp16_compress_hook"


# --- torch ----------------------------------------------------------------------------------------


def test_ddp_logging_data_holds_what_the_ddp_report_reads(process_group):
    private = "DistributedDataParallel._get_ddp_logging_data()"
    # The sizes as the DDP report parses them: comma-separated bytes, summing to the parameters.
    model = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 2))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    data = compat.ddp_logging_data(ddp)
    assert data.get("comm_hook") == "fp16_compress_hook", changed(private, "no comm_hook, the hook's name")
    assert "has_sync_bn" in data and not data["has_sync_bn"], changed(private, "no has_sync_bn")
    parameter_bytes = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())

    def bucket_sizes(key: str, at_least: int) -> list[int]:
        sizes = [int(size) for size in str(data.get(key)).split(",")]  # as the DDP report parses them
        assert len(sizes) >= at_least and sum(sizes) == parameter_bytes, changed(private, f"{key} is {data.get(key)!r}")
        return sizes

    bucket_sizes("bucket_sizes", at_least=1)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(3):  # DDP rebuilds its buckets at the second forward; the record follows a step later
        ddp(torch.randn(8, 1024)).sum().backward()
        optimizer.step()
        data = compat.ddp_logging_data(ddp)
    assert data.get("has_rebuilt_buckets"), changed(private, "has_rebuilt_buckets not set after the rebuild")
    bucket_sizes("rebuilt_bucket_sizes", at_least=1)


def test_ddp_times_the_iterations_compat_samples_and_records_them_at_the_next_forward(process_group):
    private = "DistributedDataParallel._set_ddp_runtime_logging_sample_rate / _get_ddp_logging_data() timings"
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)))
    compat.sample_ddp_runtime_every(ddp, 4)
    timings = ("forward_compute_time", "backward_compute_time", "backward_comm_time")
    timings += ("backward_compute_comm_overlap_time",)
    recorded = []
    for _ in range(16):
        ddp(torch.randn(32, 256)).sum().backward()  # each forward records the iteration before it, if sampled
        data = compat.ddp_logging_data(ddp)
        recorded.append(data.get("iteration"))
        assert all(data.get(key, 0) >= 0 for key in timings), changed(private, f"a timing is missing: {data}")
    assert all(key in data for key in timings), changed(private, "no per-iteration timings")
    # The first 10 iterations, then every 4th: iteration 12 is the latest sampled at forward 16.
    assert recorded == [*range(11), 10, 12, 12, 12, 12], changed(private, f"sampled iterations {recorded}")
    assert data["backward_compute_comm_overlap_time"] <= data["backward_comm_time"], changed(private, "overlap > comm")


def test_without_ddps_logging_data_a_fit_completes_and_its_reports_say_what_is_missing(
    process_group, tmp_path, monkeypatch, caplog
):
    # As a torch release may do: DDP's private sampling setter is gone and its logging record holds
    # none of what it held (gone altogether, Lightning's own teardown would fail: it reads the record
    # too; see the test below for that case alone). The engine's DDP report, step anatomy and
    # memory callbacks use both on the default path; the fit completes, ddp.json says null where the
    # figures came from them, the buckets' bytes are counted from the parameters instead, and the
    # log says once what was lost.
    monkeypatch.delattr(DistributedDataParallel, "_set_ddp_runtime_logging_sample_rate")
    monkeypatch.setattr(DistributedDataParallel, "_get_ddp_logging_data", lambda self: {})
    # And the process group's timeout is nowhere compat can read it (hidden from its accessor).
    monkeypatch.setattr(compat, "_private", hidden_private_api(compat._private, {"_timeout"}))
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    report = tmp_path / "ddp.json"
    callbacks = [
        DDPSettingsReport(str(report)),
        StepAnatomy(str(report), log_every_n_steps=2),
        MemoryFootprint(str(report)),
    ]
    trainer = L.Trainer(
        accelerator="cpu", devices=1, strategy=CommHookDDPStrategy(comm_hook="fp16"), max_steps=6, log_every_n_steps=2,
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, use_distributed_sampler=False, default_root_dir=tmp_path,
    )  # fmt: skip
    module = Tiny()
    environ = dict(os.environ)  # Lightning's launcher exports the rendezvous variables into this process
    try:
        with caplog.at_level(logging.WARNING, logger=compat.__name__):
            trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4))
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert trainer.global_step == 6 and trainer.state.finished
    saved = json.loads(report.read_text())
    assert saved["backend"] == "gloo" and saved["world_size"] == 1 and saved["sync_batchnorm"] is False
    assert saved["timeout_s"] is None
    assert saved["comm_hook"] is None and saved["bucket_sizes_bytes"] is None
    assert saved["allreduce_bytes_per_step"] is None and saved["allreduce_sent_bytes_per_rank"] is None
    parameter_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    assert saved["memory"]["first_step"]["ranks"][0]["ddp_buckets"] == parameter_bytes
    assert "step_anatomy_ms" not in saved  # no DDP timings: no window, and no made-up figure
    lost = [record.getMessage() for record in caplog.records if "missing or changed" in record.getMessage()]
    assert sorted(message.split(" is missing")[0] for message in lost) == [
        "Backend.Options._timeout",
        "DistributedDataParallel._get_ddp_logging_data",
        "DistributedDataParallel._set_ddp_runtime_logging_sample_rate",
    ], lost  # each once


def test_without_the_logging_record_method_compat_gives_an_empty_record_and_says_so(process_group, monkeypatch, caplog):
    monkeypatch.delattr(DistributedDataParallel, "_get_ddp_logging_data")
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)
    ddp = DistributedDataParallel(nn.Linear(4, 2))
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert compat.ddp_logging_data(ddp) == {} and compat.ddp_logging_data(ddp) == {}
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("DistributedDataParallel._get_ddp_logging_data is missing")
    assert ddp_bucket_bytes(ddp) == (4 * 2 + 2) * 4  # counted from the parameters instead: weight and bias, fp32


def test_the_process_group_timeout_is_read_back(process_group):
    assert compat.process_group_timeout(torch.device("cpu")) == TIMEOUT, changed(
        "Backend.Options._timeout", "not the timeout the process group was built with"
    )


def test_a_scheduler_moved_onto_another_optimizer_schedules_it_without_torchs_warnings():
    private = "LRScheduler's _wrapped_by_lr_sched / _opt_called step tracking"
    layer = nn.Linear(4, 2)
    first = torch.optim.SGD(layer.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(first, max_lr=0.1, total_steps=10)
    second = torch.optim.SGD([dict(group) for group in first.param_groups], lr=0.1)
    compat.retarget_lr_scheduler(scheduler, second)
    with warnings.catch_warnings():
        # torch warns when the scheduler's optimizer.step lacks its mark, or was not called first.
        warnings.simplefilter("error")
        for _ in range(3):
            layer(torch.ones(1, 4)).sum().backward()
            second.step()
            scheduler.step()
    reference = torch.optim.lr_scheduler.OneCycleLR(
        torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1), max_lr=0.1, total_steps=10
    )
    for _ in range(3):
        reference.optimizer.step()
        reference.step()
    assert second.param_groups[0]["lr"] == reference.get_last_lr()[0] != first.param_groups[0]["lr"], changed(
        private, "the moved scheduler does not set the new optimizer's rate"
    )


def test_the_consolidated_zero_state_is_what_release_frees(process_group):
    private = "ZeroRedundancyOptimizer._all_state_dicts"
    layer = nn.Linear(4, 2)
    optimizer = ZeroRedundancyOptimizer(layer.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    layer(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    optimizer.consolidate_state_dict(to=0)
    assert len(optimizer.state_dict()["state"]) == 2
    compat.release_consolidated_state(optimizer)
    # torch refuses a state_dict() without a consolidated state: the copy was the one it had.
    with pytest.raises(RuntimeError, match="has not been consolidated"):
        optimizer.state_dict()
    assert len(optimizer.optim.state) == 2, changed(private, "releasing it dropped the rank's own state")


def test_a_summary_written_through_the_tensorboard_file_writer_is_read_back(tmp_path):
    private = "SummaryWriter._get_file_writer()"
    writer = SummaryWriter(str(tmp_path))
    writer.close()  # closed, as Lightning's logger closes it at the end of a stage: reopened
    experiment, session_start, _ = hparams({"lr": 0.1}, {"val/acc": 0.0})
    for summary in (experiment, session_start, scalar("loss", 0.5)):
        compat.tensorboard_file_writer(writer).add_summary(summary, global_step=3)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(point.step, point.value) for point in events.Scalars("loss")] == [(3, 0.5)], changed(private, "no scalar")
    assert set(events.PluginTagToContent("hparams")) == {"_hparams_/experiment", "_hparams_/session_start_info"}, (
        changed(private, "TensorBoard does not read back the HPARAMS summaries")
    )


# --- OmegaConf ------------------------------------------------------------------------------------


@dataclass
class Tracker:
    uri: str = "x"


@dataclass
class Schema:
    tracker: Tracker | None = None
    untyped: Any = None


def test_the_optuna_search_starts_at_the_job_number_and_asks_the_trials_compat_sets(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
    from optuna.samplers import TPESampler

    private = "OptunaSweeper.sweeper (OptunaSweeperImpl): job_idx, n_trials"
    sweeper = OptunaSweeper(
        sampler=TPESampler(seed=0), direction="maximize", storage=None, study_name="compat", n_trials=5, n_jobs=1,
        max_failure_rate=0.0, search_space=None, custom_search_space=None, params={"x": "interval(0, 1)"},
    )  # fmt: skip
    search = compat.optuna_search(sweeper)
    assert (search.storage, search.study_name, search.n_trials) == (None, "compat", 5), changed(private, "settings")
    assert hasattr(search.sampler, "reseed_rng"), changed(f"{private}.sampler", "not the sampler built")
    launched = []

    class Launcher:  # stands in for the one setup() instantiates, which runs the jobs
        def launch(self, overrides, initial_job_idx):
            launched.append((initial_job_idx, len(overrides)))
            returned = JobReturn(overrides=list(overrides[0]), status=JobStatus.COMPLETED)
            returned.return_value = 0.5
            return [returned]

    search.launcher, search.hydra_context = Launcher(), object()  # the context only passes through
    search.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    search.job_idx, search.n_trials = 7, 2
    search.sweep([])
    assert launched == [(7, 1), (8, 1)], changed(private, f"jobs launched {launched}, not 2 from job 7")


def test_the_declared_type_of_a_null_node_is_its_schemas():
    cfg = OmegaConf.structured(Schema)
    assert compat.declared_type(cfg, "tracker") is Tracker, changed("Node._metadata.ref_type", "not the schema's type")
    assert compat.declared_type(cfg, "untyped") is Any and compat.declared_type(cfg, "absent") is None


# --- the fence ------------------------------------------------------------------------------------

#: The folders of the engine's test tasks, written against its public modules only, as a cloner writes a task.
TASKS = tuple(Path(task.__file__).parent for task in (sensor_task, vision_task))
#: The engine's package, its Hydra plugins and the test tasks: compat is the engine's, and no other
#: module uses a private API.
ENGINE = Path(ddp_engine.__file__).parent
PACKAGES = (ENGINE, ENGINE.parent / "hydra_plugins", *TASKS)
COMPAT = Path(compat.__file__)


def test_no_module_outside_compat_uses_a_private_api():
    found = [place for package in PACKAGES for place in package_private_uses(package, skip={COMPAT})]
    assert all(package.is_dir() for package in PACKAGES) and COMPAT.is_file()
    assert not found, "private APIs used outside ddp_engine/core/compat.py (add a function there):\n" + "\n".join(found)


def test_the_scan_finds_a_private_use(tmp_path):
    planted = (
        "def f(trainer, node):\n    trainer.fit_loop.epoch_loop.x\n    node._get_node('a')\n    getattr(node, '_x')\n"
    )
    assert sorted(line for line, _ in private_uses(ast.parse(planted))) == [2, 3, 4]
    allowed = "import os\ndef f(self, cfg):\n    os._exit(1)\n    cfg._target_\n    self._own = 1\n"
    assert private_uses(ast.parse(allowed)) == []
    # A private module, imported or named by its class path.
    modules = (
        "from hydra._internal.utils import x\nimport torch._dynamo\n"
        "A = 'hydra._internal.core_plugins.basic_sweeper.BasicSweeper'\nB = 'data._target_'\nC = 'a.b.C'\n"
    )
    assert sorted(line for line, _ in private_uses(ast.parse(modules))) == [1, 2, 3]
    # In a package's modules, the skipped one left out.
    package = tmp_path / "package"
    package.mkdir()
    (package / "uses.py").write_text(planted)
    (package / "skipped.py").write_text(planted)
    assert sorted(package_private_uses(package, skip={package / "skipped.py"})) == [
        "package/uses.py:2: .epoch_loop (Lightning's loops)",
        "package/uses.py:3: node._get_node",
        "package/uses.py:4: getattr(node, '_x')",
    ]


def test_hydras_basic_sweeper_is_read_from_its_stored_config():
    # Its class lives in hydra._internal: the sweep checks read its path from Hydra's ConfigStore.
    assert issubclass(get_class(basic_sweeper()), Sweeper) and basic_sweeper().endswith(".BasicSweeper")


def test_subclasses_of_library_classes_touch_no_private_name_of_theirs():
    found = library_private_names_touched(
        defined_classes([ddp_engine, sensor_task, vision_task]), own={"ddp_engine", "sensor_task", "vision_task"}
    )
    assert not found, (
        "private names of a library's base class, used or overridden by a subclass (go through "
        "ddp_engine/core/compat.py):\n" + "\n".join(found)
    )


def test_the_scan_finds_a_private_name_of_a_library_base_class_in_a_subclass():
    class Planted(DistributedDataParallel):
        def _get_ddp_logging_data(self):  # overrides torch's private method
            return self._module_parameters  # and reads a private name torch's class has

    assert library_private_names_touched([Planted], own={"ddp_engine"}) == [
        f"{__name__}.{Planted.__qualname__}: _get_ddp_logging_data (line 2 of the class)",
        f"{__name__}.{Planted.__qualname__}: _module_parameters (line 3 of the class)",
    ]
    assert library_private_names_touched([Planted], own={"ddp_engine", "torch"}) == []


@pytest.mark.processes
def test_the_exit_handlers_run_when_asked_once_in_a_process_that_ends_with_os_exit():
    # A child process: running this one's handlers would end pytest's own.
    code = textwrap.dedent("""
        import atexit, os
        from ddp_engine.core.compat import run_exit_handlers
        atexit.register(print, "handler ran")
        run_exit_handlers()
        run_exit_handlers()
        os._exit(0)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "handler ran\n"), changed("atexit._run_exitfuncs", result.stderr)


def rendezvous_event_names(monkeypatch) -> list[str]:
    """The names of the events a real one-node c10d rendezvous records (torch's dynamic rendezvous
    over its TCP store, as the supervisor's agent runs it)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    names = []
    record = dynamic_rendezvous.construct_and_record_rdzv_event

    def spy(*args, **kwargs):
        names.append(kwargs["name"])
        return record(*args, **kwargs)

    parameters = RendezvousParameters("c10d", "localhost:0", run_id="compat", min_nodes=1, max_nodes=1, timeout=30)
    with monkeypatch.context() as patched:
        patched.setattr(dynamic_rendezvous, "construct_and_record_rdzv_event", spy)
        handler = get_rendezvous_handler(parameters)
        info = handler.next_rendezvous()
        handler.shutdown()
    assert (info.rank, info.world_size) == (0, 1)
    return names


def test_the_rendezvous_names_its_events_by_frame_as_by_inspect_stack(monkeypatch):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from ddp_engine.core.compat import name_rendezvous_events_by_frame

    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)  # restored after
    by_stack = rendezvous_event_names(monkeypatch)
    name_rendezvous_events_by_frame()
    assert dynamic_rendezvous.get_method_name.__module__ == "ddp_engine.core.compat"
    by_frame = rendezvous_event_names(monkeypatch)
    assert "DynamicRendezvousHandler.next_rendezvous" in by_stack, changed(
        "dynamic_rendezvous.get_method_name", by_stack
    )
    assert by_frame == by_stack, changed("dynamic_rendezvous.get_method_name", f"{by_frame} != {by_stack}")


def test_hydras_main_takes_the_mode_it_is_told_and_composes_the_config_once(monkeypatch, tmp_path):
    import hydra
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    from ddp_engine.core.compat import tell_hydra_the_mode

    (tmp_path / "app.yaml").write_text("value: 1\n")
    ran, composed = [], []
    compose = Hydra.compose_config
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *a, **k: composed.append(1) or compose(self, *a, **k))
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)  # restored after

    @hydra.main(config_path=str(tmp_path), config_name="app", version_base="1.3")
    def app(cfg) -> None:
        ran.append(cfg.value)

    def run_app(*overrides: str) -> None:
        quiet = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "hydra.output_subdir=null"]
        monkeypatch.setattr(sys, "argv", ["app", f"hydra.run.dir={tmp_path}/run", *quiet, *overrides])
        app()

    run_app("value=2")
    assert (ran, len(composed)) == ([2], 2), changed("Hydra.get_mode", "Hydra's main composes once to read the mode")
    tell_hydra_the_mode(None)
    run_app("value=3")
    assert (ran, len(composed)) == ([2, 3], 3), changed("Hydra.get_mode", f"composed {len(composed) - 2} more times")
    tell_hydra_the_mode(RunMode.MULTIRUN)  # the mode told is the mode run: a sweep of one job here
    run_app("value=4", f"hydra.sweep.dir={tmp_path}/sweep")
    assert ran == [2, 3, 4] and (tmp_path / "sweep" / "0").is_dir(), changed(
        "Hydra.get_mode", "the mode told is not run"
    )
