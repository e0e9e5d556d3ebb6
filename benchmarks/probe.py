"""A Lightning callback that times the template's training loop the way the reference times its own.

The harness adds it to a training run from the command line, through the template's own
callbacks group (``+callbacks.loop_timer._target_=benchmarks.probe.LoopTimer``); nothing in
``src/`` knows about it.
"""

import json
import resource
import time
from pathlib import Path

import lightning as L
import torch


class LoopTimer(L.Callback):
    """Writes ``<dirpath>/loop-timer-rank<r>.json`` on every rank when fit ends:

    - ``first_step_unix``: when the first training batch started (Unix time, seconds), after it
      was fetched and before its forward pass, as in ``benchmarks/reference_ddp.py``;
    - ``train_loop_s``: from then to the end of the last optimizer step (seconds, this rank's
      clock; validation runs after the last step, so it is outside);
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

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self.first_step is None:
            self.first_step, self.first_step_unix = time.perf_counter(), time.time()

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
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
            "torch_threads": torch.get_num_threads(),
        }
        (self.dirpath / f"loop-timer-rank{trainer.global_rank}.json").write_text(json.dumps(figures, indent=2))
