"""The throughput callback's arithmetic: windows of steps, the straggler rank, peak GPU memory (mocked: no GPU here)."""

from types import SimpleNamespace

import pytest
import torch

from ddp_engine.callbacks import rank_metrics, throughput
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.data.sharded import count_samples


def test_throughput_windows_straggler_arithmetic_and_peak_gpu_memory(monkeypatch):
    """The callback's arithmetic on a simulated GPU: no GPU exists here, so the callback is told it
    runs on one and torch.cuda's memory and synchronize calls are replaced (tensors stay on the
    CPU); so are the clock and the gather (rank 1 reports twice rank 0's samples, seconds and memory)."""
    now, synced = [0.0], []
    monkeypatch.setattr(throughput, "_on_gpu", lambda module: True)
    monkeypatch.setattr(rank_metrics, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synced.append(now[0]))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 512 * 2**20)
    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    trainer = SimpleNamespace(world_size=2, global_step=0, current_epoch=0, is_global_zero=True,
                              log_every_n_steps=2, num_training_batches=3, loggers=[logger])  # fmt: skip
    module = SimpleNamespace(device=torch.device("cpu"), all_gather=lambda t: torch.stack([t, 2 * t]))
    batch = (torch.zeros(32, 1, 28, 28), torch.zeros(32, dtype=torch.long))

    monitor = throughput.DistributedThroughputMonitor()
    monitor.on_train_epoch_start(trainer, module)
    for batch_idx, seconds in enumerate([1.0, 2.0, 4.0]):
        now[0], trainer.global_step = seconds, batch_idx + 1
        monitor.on_train_batch_end(trainer, module, None, batch, batch_idx)
    now[0] = 5.0
    monitor.on_train_epoch_end(trainer, module)

    def rates(overall: float, rank_0: float, rank_1: float) -> dict[str, float]:
        return {"throughput/samples_per_sec": overall, "throughput/rank_0/samples_per_sec": rank_0,
                "throughput/rank_1/samples_per_sec": rank_1}  # fmt: skip

    # Window 1: steps 1-2, rank 0 64 samples in 2 s, rank 1 128 in 4 s: 192 samples / 4 s overall.
    # Window 2: the epoch's last step, 32 samples in 2 s and 64 in 4 s. Steps are logged 0-based.
    assert logged == [
        (1, rates(48.0, 32.0, 32.0)),
        (2, rates(24.0, 16.0, 16.0)),
        (2, {"time/epoch_s": 5.0, "memory/rank_0/peak_mib": 512.0, "memory/rank_1/peak_mib": 1024.0}),
    ]
    assert synced == [0.0, 2.0, 2.0, 4.0, 4.0, 5.0], "the GPU is synchronized before each clock reading"


def test_an_epoch_resumed_in_its_middle_is_timed_from_the_resume(monkeypatch):
    # Lightning calls no on_train_epoch_start for the epoch a fit resumes inside; the clock (here
    # a stand-in at 1,000 s of uptime) must not count from zero.
    now = [1000.0]
    monkeypatch.setattr(rank_metrics, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append(metrics))
    trainer = SimpleNamespace(world_size=1, global_step=7, current_epoch=0, is_global_zero=True, loggers=[logger])
    module = SimpleNamespace(device=torch.device("cpu"))
    monitor = throughput.DistributedThroughputMonitor()
    monitor.on_train_start(trainer, module)
    now[0] = 1003.5
    monitor.on_train_epoch_end(trainer, module)
    assert logged == [{"time/epoch_s": 3.5}]


def test_a_batch_is_counted_by_its_first_tensors_rows_or_by_the_datamodules_hook():
    # The default count: the first tensor's rows, inside tuples, lists and mappings.
    rows = torch.zeros(5, 3)
    assert [count_samples(batch) for batch in (rows, (rows, rows[:, 0]), [{"x": rows}, 1], {"a": (rows,)})] == [5] * 4
    trainer = SimpleNamespace(datamodule=None, global_step=0, log_every_n_steps=50, num_training_batches=9)
    monitor = throughput.DistributedThroughputMonitor()
    monitor.on_train_batch_end(trainer, None, None, {"inputs": rows, "mask": rows}, 0)
    assert monitor._window_samples == 5
    # A DataModule's own count wins: a batch of 2 sequences of 7 tokens flattened to (14, ...).
    trainer.datamodule = SimpleNamespace(batch_samples=lambda batch: 2)
    monitor.on_train_batch_end(trainer, None, None, torch.zeros(14, 4), 1)
    assert monitor._window_samples == 7
    # A batch it cannot count is refused in one line that names the hook to provide.
    trainer.datamodule = None
    with pytest.raises(ConfigValueError) as refused:
        monitor.on_train_batch_end(trainer, None, None, ("text", 3), 2)
    assert str(refused.value) == (
        "The throughput monitor cannot count the samples of a training batch (no tensor with a first dimension "
        "to count samples by in a tuple batch): give the DataModule a method batch_samples(batch) -> int "
        "(ShardedDataModule's counts the first tensor's rows)."
    )
