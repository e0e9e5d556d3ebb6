"""Lightning callbacks the benchmarks add to the template's runs: :class:`LoopTimer` times the
training loop the way the reference times its own; :class:`BatchNormStats` records every rank's
BatchNorm statistics for the SyncBatchNorm check of ``benchmarks/gpu_check.py``.

The harness adds them to a training run from the command line, through the template's own
callbacks group (``+callbacks.loop_timer._target_=benchmarks.probe.LoopTimer``); nothing in
``src/`` knows about them.
"""

import json
import resource
import time
from pathlib import Path

import lightning as L
import torch
from torch.nn.modules.batchnorm import _BatchNorm


class LoopTimer(L.Callback):
    """Writes ``<dirpath>/loop-timer-rank<r>.json`` on every rank when fit ends:

    - ``first_step_unix``: when the first training batch started (Unix time, seconds), after it
      was fetched and before its forward pass, as in ``benchmarks/reference_ddp.py``;
    - ``train_loop_s``: from then to the end of the last optimizer step (seconds, this rank's
      clock; validation runs after the last step, so it is outside);
    - ``batch_starts_s``: when each training batch started, in seconds after the first (one per
      batch), so that a harness can leave out warm-up steps;
    - ``train_samples``: training samples this rank ran in that time;
    - ``peak_rss_mib``: this process's peak resident set size so far (``ru_maxrss``, MiB);
    - ``torch_threads``: ``torch.get_num_threads()``, the intra-op threads this process computed with.

    Args:
        dirpath: folder for the JSON files (created if missing).
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
        self.first_step = self.first_step_unix = self.last_step_end = None
        self.samples = 0
        self.batch_starts: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self.first_step is None:
            self.first_step, self.first_step_unix = now, time.time()
        self.batch_starts.append(now - self.first_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.last_step_end = time.perf_counter()
        self.samples += len(batch[0])

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        figures = {
            "first_step_unix": self.first_step_unix,
            "train_loop_s": self.last_step_end - self.first_step,
            "train_samples": self.samples,
            "batch_starts_s": self.batch_starts,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
            "torch_threads": torch.get_num_threads(),
        }
        (self.dirpath / f"loop-timer-rank{trainer.global_rank}.json").write_text(json.dumps(figures, indent=2))


class BatchNormStats(L.Callback):
    """Writes ``<dirpath>/bn-stats-rank<r>.json`` on every rank when fit ends: for each BatchNorm
    layer (by module name), its class (``SyncBatchNorm`` once Lightning converted it, with
    ``trainer.sync_batchnorm=true``) and its ``running_mean`` and ``running_var`` as they were right
    after the last training step.

    Why then: with ``strategy.broadcast_buffers=true`` (the default) DDP copies rank 0's buffers to
    every rank before each training forward pass, so they agree whatever the layers; the last step's
    own update is what tells SyncBatchNorm (the statistics of the global batch, the same on every
    rank) from BatchNorm (each rank's own micro-batch). Validation and test run in eval mode and
    leave them unchanged.

    Args:
        dirpath: folder for the JSON files (created if missing).
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
        self.layers: dict[str, dict] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        # Copies on the device; a few hundred floats per step, for the short runs of the check.
        self.layers = {
            name: {"class": type(module).__name__, "running_mean": module.running_mean.detach().clone(),
                   "running_var": module.running_var.detach().clone()}
            for name, module in pl_module.named_modules() if isinstance(module, _BatchNorm)
        }  # fmt: skip

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        layers = {
            name: {key: value if isinstance(value, str) else value.float().tolist() for key, value in stats.items()}
            for name, stats in self.layers.items()
        }
        (self.dirpath / f"bn-stats-rank{trainer.global_rank}.json").write_text(json.dumps(layers, indent=1))
