"""How fast a DDP run trains, measured by every process: is every device pulling its weight?"""

import logging

import lightning as L
import torch

from ddp_engine.callbacks.rank_metrics import clock, gather_rows, log_on_rank_zero
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.data.sharded import count_samples

log = logging.getLogger(__name__)


class DistributedThroughputMonitor(L.Callback):
    """Logs training throughput of the whole run and of each rank, epoch time and peak GPU memory.

    Lightning's own ``ThroughputMonitor`` times global rank 0 alone and reports rank 0's rate
    times world_size as the global rate, so a rank that lags (a slower GPU, a busy host) cannot
    show there. Here every rank times its own steps, and the figures are gathered to rank 0 with
    one ``all_gather`` of a few numbers per window (negligible next to the gradient AllReduce of
    every step). A window is ``log_every_n_steps`` optimizer steps, or what is left of the epoch;
    validation is not in any window.

    Tags, on the optimizer-step axis of ``train/loss`` and ``val/*`` (written by global rank 0):

    - ``throughput/samples_per_sec``: training samples of all ranks in the window divided by
      the window's wall time on the slowest rank (samples/s).
    - ``throughput/rank_{r}/samples_per_sec``: samples of global rank ``r`` divided by its own
      time for the window (samples/s); one tag per rank.
    - ``time/epoch_s``: wall time of each training epoch, from its start to its end, including
      the validation that ends it (seconds, global rank 0's clock).
    - ``memory/rank_{r}/peak_mib``: the most GPU memory held by tensors on global rank ``r``
      during the epoch (``torch.cuda.max_memory_allocated``; MiB = 2**20 bytes). GPU runs only.

    Rank 0 also logs ``Epoch <n> done in <seconds> s`` into the job's log file after each epoch.

    A batch's samples are counted by the DataModule's ``batch_samples(batch)``
    (:meth:`ddp_engine.data.sharded.ShardedDataModule.batch_samples`: the rows of its first tensor),
    or, without one, as that default does.

    Raises:
        ConfigValueError: at the first training batch, when its samples cannot be counted, naming
            the hook to give the DataModule.

    Args:
        log_every_n_steps: optimizer steps per throughput window (default None: the Trainer's
            ``log_every_n_steps``, so throughput is logged on the steps ``train/loss`` is).
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        self.log_every_n_steps = log_every_n_steps
        self._epoch_start = self._window_start = 0.0
        self._window_start_step = 0
        self._window_samples = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed inside an epoch gets no on_train_epoch_start for that epoch: its clocks
        # start here (its time/epoch_s is the part after the resume).
        self._epoch_start = self._start_window(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _on_gpu(pl_module):
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._epoch_start = self._start_window(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._window_samples += _samples(trainer, batch)
        every = self.log_every_n_steps or trainer.log_every_n_steps
        step = trainer.global_step
        window_full = step > self._window_start_step and step % every == 0
        if window_full or batch_idx + 1 == trainer.num_training_batches:
            self._end_window(trainer, pl_module)
            self._start_window(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = {"time/epoch_s": clock(pl_module.device, _on_gpu(pl_module)) - self._epoch_start}
        if _on_gpu(pl_module):
            peak = torch.tensor([torch.cuda.max_memory_allocated(pl_module.device) / 2**20], device=pl_module.device)
            for rank, (mib,) in enumerate(gather_rows(trainer, pl_module, peak).tolist()):
                metrics[f"memory/rank_{rank}/peak_mib"] = mib
        log_on_rank_zero(trainer, metrics)
        # One line per epoch in the job's log too, for whoever follows it there (a SLURM output file).
        if trainer.is_global_zero:
            log.info(
                f"Epoch {trainer.current_epoch} done in {metrics['time/epoch_s']:.1f} s "
                f"(global step {trainer.global_step})"
            )

    def _start_window(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        self._window_start = clock(pl_module.device, _on_gpu(pl_module))
        self._window_start_step = trainer.global_step
        self._window_samples = 0
        return self._window_start

    def _end_window(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seconds = clock(pl_module.device, _on_gpu(pl_module)) - self._window_start
        local = torch.tensor([self._window_samples, seconds], dtype=torch.float64, device=pl_module.device)
        samples, seconds = gather_rows(trainer, pl_module, local).T  # (world_size,) each
        metrics = {"throughput/samples_per_sec": (samples.sum() / seconds.max()).item()}
        for rank, rate in enumerate((samples / seconds).tolist()):
            metrics[f"throughput/rank_{rank}/samples_per_sec"] = rate
        log_on_rank_zero(trainer, metrics)


def _on_gpu(pl_module: L.LightningModule) -> bool:
    return pl_module.device.type == "cuda"


def _samples(trainer: L.Trainer, batch: object) -> int:
    """The samples in ``batch``, counted by the DataModule's ``batch_samples`` or :func:`count_samples`."""
    datamodule = getattr(trainer, "datamodule", None)
    count = getattr(datamodule, "batch_samples", None) or count_samples
    try:
        return int(count(batch))
    except (TypeError, IndexError, KeyError) as error:
        raise ConfigValueError(
            f"The throughput monitor cannot count the samples of a training batch ({error}): give the "
            f"DataModule a method batch_samples(batch) -> int (ShardedDataModule's counts the first tensor's rows)."
        ) from None
